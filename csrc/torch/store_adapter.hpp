// Backs pyccl's Store interface with a c10d::Store, so a communicator
// rendezvous through the store that init_process_group already made.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/store.hpp"

namespace pyccl {

class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store);
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::string& key) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace pyccl
