// The plan executors set up on one communicator, each under the slot the
// selector names for a plan choice (dispatch/selector.hpp, planSlotOf), so
// that every entry point of the communicator (pyccl.<collective>, the
// torch.ops.pyccl kernels) runs the one pyccl.registry set up at the plan's
// first use. Setting one up is collective and allocates, so it happens on the
// Python path; the runs after it need no Python.
//
// Thread-safe: lookups and additions take a mutex. The table holds the
// executors; the communicator that owns the table closes them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "executor/executor.hpp"

namespace pyccl {

/// One set-up plan: its executor and how its calls are shaped.
struct SetUpPlan {
  std::shared_ptr<PlanExecutor> executor;
  bool reduces = true;        ///< the plan reduces (else it moves data, of any dtype)
  uint64_t inputChunks = 1;   ///< chunks the input splits into
  uint64_t outputChunks = 1;  ///< chunks of the output, of the input chunks' size
};

class PlanRunners {
 public:
  /// Keeps `runner` under `key`, replacing any runner there.
  void add(const std::string& key, SetUpPlan runner) {
    std::lock_guard<std::mutex> lock(mu_);
    runners_[key] = std::move(runner);
  }
  /// The runner under `key`, if one is set up.
  std::optional<SetUpPlan> find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = runners_.find(key);
    if (it == runners_.end()) return std::nullopt;
    return it->second;
  }
  /// The keys of the runners set up, sorted.
  std::vector<std::string> keys() const;
  /// Forgets every runner (its owner closes them).
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    runners_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, SetUpPlan> runners_;
};

inline std::vector<std::string> PlanRunners::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(runners_.size());
  for (const auto& [key, runner] : runners_) out.push_back(key);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace pyccl
