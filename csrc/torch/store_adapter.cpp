#include "torch/store_adapter.hpp"

#include "core/errors.hpp"

namespace pyccl {

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  PYCCL_CHECK_ARG(store_, "store", "must be a torch.distributed Store, got None");
}

void C10dStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, value);
}

std::vector<uint8_t> C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  try {
    store_->wait({key}, timeout);
  } catch (const c10::Error& e) {
    // c10d reports a wait that ran out as DistStoreError (a c10::Error).
    throw TimeoutError(strCat("store key '", key, "' was not set within ", timeout.count(),
                              " ms: ", e.what_without_backtrace()));
  }
  return store_->get(key);
}

int64_t C10dStore::add(const std::string& key, int64_t delta) { return store_->add(key, delta); }

bool C10dStore::deleteKey(const std::string& key) {
  try {
    return store_->deleteKey(key);
  } catch (const c10::Error&) {
    return false;  // some stores cannot delete; the key is then only left behind
  }
}

bool C10dStore::check(const std::string& key) { return store_->check({key}); }

}  // namespace pyccl
