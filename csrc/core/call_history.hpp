// What a communicator did lately (its flight recorder), and labels on what
// it does now.
//
// The flight recorder keeps the last PYCCL_HISTORY_SIZE calls of a
// communicator (default 256; 0 keeps none): sequence number, op, bytes,
// dtype, the algorithm that ran, whether the call was captured into a CUDA
// graph, and when the host enqueued it. A communicator that breaks logs it
// once, each call with its state against the call that failed; pyccl's
// dump_history() returns it at any time. The host does not learn when the GPU
// finishes a call (that would take an event per call, as much host time as a
// launch), so on a healthy communicator every call reads "enqueued".
//
// Labels cover a call's host part, from the choice of its algorithm to its
// last launch: an NVTX range where an NVTX tool is attached (Nsight Systems
// sets NVTX_INJECTION64_PATH; PYCCL_NVTX=1 forces them, 0 turns them off),
// and a label through the hooks the layer above sets (the torch profiler's
// record_function). Both read "pyccl all_reduce 1pa_ll bfloat16 1024 B #12":
// op, algorithm, dtype, bytes and sequence number. Where neither is on, a
// call pays two flag checks and builds no text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/health.hpp"

namespace pyccl {

/// What a call is, besides its op and sequence number.
struct CallFacts {
  uint64_t bytes = 0;        ///< the whole buffer, as nccl-tests counts it
  const char* dtype = "";    ///< "bfloat16", ...; "" where the call moves bytes (it sees no elements)
  const char* algorithm = "";  ///< the kernel, protocol or plan that runs it
};

/// One call in the flight recorder.
struct CallRecord {
  uint64_t seq = 0;
  CallOp op = CallOp::kNone;
  uint64_t bytes = 0;
  std::string dtype;
  std::string algorithm;
  bool captured = false;      ///< enqueued into a CUDA graph being captured
  uint64_t enqueuedUs = 0;    ///< system clock, microseconds since the epoch
};

/// PYCCL_HISTORY_SIZE (default 256); InvalidArgument naming it for a bad value.
size_t historySizeFromEnv();

/// The last `capacity` calls of one communicator. Thread-safe.
class CallHistory {
 public:
  explicit CallHistory(size_t capacity);
  void add(CallRecord record);
  /// Oldest first.
  std::vector<CallRecord> snapshot() const;
  size_t capacity() const { return capacity_; }
  /// Calls recorded since the communicator was made (more than the snapshot holds once it wraps).
  uint64_t total() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<CallRecord> ring_;
  size_t next_ = 0;
  uint64_t total_ = 0;
};

/// A record's state against the failure of a broken communicator: "enqueued"
/// where `failedTag` is 0 (healthy, or broken by no call of its own), else
/// "failed", "before the failure" or "after the failure" (it gives up at its
/// first wait). Calls of another numbering (send_recv) than the failed one's read "enqueued".
const char* callState(const CallRecord& record, uint64_t failedTag);
/// The history as a table, one line per call, for a log.
std::string describeHistory(const std::vector<CallRecord>& records, uint64_t failedTag, uint64_t total);

/// Labels from the layer above (the torch profiler): `active()` says whether
/// one would be recorded now, `begin(text)` opens one and returns what `end` closes.
struct LabelHooks {
  bool (*active)() = nullptr;
  void* (*begin)(const std::string& text) = nullptr;
  void (*end)(void* label) = nullptr;
};
/// Set once, before calls are made (the Python module does when it loads).
void setLabelHooks(LabelHooks hooks);

/// The labels of one call while its host part runs (see the top of the file).
class CallLabel {
 public:
  CallLabel() = default;
  CallLabel(CallOp op, uint64_t seq, const CallFacts& facts);
  ~CallLabel();
  CallLabel(CallLabel&& other) noexcept;
  CallLabel& operator=(CallLabel&&) = delete;
  CallLabel(const CallLabel&) = delete;
  CallLabel& operator=(const CallLabel&) = delete;

 private:
  bool nvtx_ = false;
  void* hook_ = nullptr;
};

/// Whether calls open NVTX ranges (read once: PYCCL_NVTX, else whether a tool is attached).
bool nvtxLabelsOn();

}  // namespace pyccl
