#include "torch/store_adapter.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/errors.hpp"

namespace pyccl {

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  PYCCL_CHECK_ARG(store_, "store", "must be a torch.distributed Store, got None");
}

void C10dStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, value);
}

std::vector<uint8_t> C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  // Polls instead of store_->wait: a TCPStore client holds its one lock for
  // the whole of a wait, so a rank setting up two groups from two threads
  // would block one group's set() behind the other's wait, and two ranks
  // doing so in crossed order would deadlock.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(50);
  while (!store_->check({key})) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(strCat("store key '", key, "' was not set within ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
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
