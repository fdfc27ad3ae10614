// The key-value store that ranks rendezvous through. The runtime sees only this
// interface; csrc/torch/store_adapter.* backs it with a c10d::Store, so pyccl
// reuses the store that init_process_group already made.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pyccl {

class Store {
 public:
  virtual ~Store() = default;
  /// Sets `key` to `value` (overwrites).
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Returns the value of `key`, waiting up to `timeout` for it to be set.
  /// Throws TimeoutError (naming the key) when it is not set in time.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Atomically adds `delta` to the integer at `key` (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// Removes `key`; returns whether it existed.
  virtual bool deleteKey(const std::string& key) = 0;
  /// Whether `key` is set now (no waiting).
  virtual bool check(const std::string& key) = 0;
};

}  // namespace pyccl
