// The health of one communicator: which call is which (a sequence number per
// call, and a tag kernels record when a wait gives up), whether the
// communicator is broken and why, and the watchdog that notices a GPU-side
// failure while the host is elsewhere (a CUDA graph replay, compute between
// collectives).
//
// A communicator breaks at its first failed wait (timeout or abort), when the
// user aborts it, or when its proxy thread dies. From then on every call
// fails at once with an error that names the first failure: the op, its
// sequence number and the peers that never arrived. The abort flag is raised
// too, so kernels already queued give up at their first wait instead of each
// waiting out the timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channels/device_common.hpp"
#include "core/errors.hpp"

namespace pyccl {

/// What a call of a communicator does; recorded in its tag.
enum class CallOp : uint8_t {
  kNone = 0,
  kAllReduce = 1,
  kAllGather = 2,
  kAllToAll = 3,
  kBroadcast = 4,
  kReduceScatter = 5,
  kPlan = 6,
  kAllReduceRMSNorm = 7,
  /// Sends and receives (CollectiveEngine::sendRecv); numbered per rank, not across ranks.
  kSendRecv = 8,
};

const char* callOpName(CallOp op);

/// The tag of call `seq` doing `op`: what a failed wait records (AbortState::call).
/// `captured`: enqueued into a CUDA graph being captured (the failure happens on a replay).
uint64_t makeCallTag(CallOp op, uint64_t seq, bool captured);
/// The op and sequence number a tag holds.
CallOp callTagOp(uint64_t tag);
uint64_t callTagSequence(uint64_t tag);
/// The ranks whose bits are set in `mask` (bit q: rank q), ascending.
std::vector<int> ranksInMask(uint32_t mask);
/// "0, 2, 3": `ranks` for a message.
std::string rankList(const std::vector<int>& ranks);

/// "all_reduce call 12", with " (captured in a CUDA graph; failed on a replay)" where so.
std::string describeCallTag(uint64_t tag);

/// How the watchdog handles a failure it finds (PYCCL_ASYNC_ERROR_HANDLING).
enum class AsyncErrorHandling {
  kRaise,     ///< 0 (default): log it, break the communicator; the next call (or Work.wait) raises
  kTearDown,  ///< 1: log it and abort the process, as ProcessGroupNCCL does by default
};
/// Reads PYCCL_ASYNC_ERROR_HANDLING; throws InvalidArgument naming it for a bad value.
AsyncErrorHandling asyncErrorHandlingFromEnv();
/// Whether every collective checks op, dtype, count and sequence number across
/// ranks before it runs: PYCCL_DEBUG=1, or TORCH_DISTRIBUTED_DEBUG=DETAIL.
bool callChecksFromEnv();

class CommunicatorHealth {
 public:
  /// `raiseAbortFlag` raises every copy of the communicator's abort flag (it
  /// must not throw); `record` is the communicator's (a host address). Both
  /// outlive this object's stop(). `watch`: start the watchdog thread (GPU
  /// communicators; in host mode a failed wait raises in the calling thread).
  CommunicatorHealth(std::string commName, int rank, std::chrono::milliseconds timeout,
                     std::function<void()> raiseAbortFlag, DeviceErrorRecord* record, bool watch);
  ~CommunicatorHealth();
  CommunicatorHealth(const CommunicatorHealth&) = delete;
  CommunicatorHealth& operator=(const CommunicatorHealth&) = delete;

  /// The next call's sequence number (1, 2, ...): every call of the
  /// communicator, whichever engine makes it, so ranks making the same calls
  /// in the same order agree on it.
  uint64_t nextSequence() { return sequence_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t lastSequence() const { return sequence_.load(std::memory_order_relaxed); }

  /// Throws if the communicator is broken (the error of the first failure) or
  /// a wait gave up: before a call (`refusing`: the message says `op` was
  /// refused), or after a host-mode call ran (the failure is its own).
  void check(const char* op, bool refusing);
  /// Breaks the communicator with `code` and `message` (the first reason
  /// wins), logs it once and raises the abort flag. A failure of this rank's
  /// own (not a user's abort, not `fromPeer`: a peer's verdict) is published
  /// to the peers through the publisher, if one is set (verdicts.hpp).
  void fail(ErrorCode code, const std::string& message, bool fromPeer = false);
  /// Where this rank's own failures are published; set once, before any call.
  void setPublisher(std::function<void(ErrorCode, const std::string&)> publish) { publish_ = std::move(publish); }
  /// Called once, after the communicator broke and said why (the flight recorder's dump); set once, before
  /// any call. It gets the failure's code.
  void setOnBroken(std::function<void(ErrorCode)> onBroken) { onBroken_ = std::move(onBroken); }
  /// Whether the communicator is broken.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  /// The first failure, if any (what check() would throw), after reading the record.
  std::optional<std::string> failure();
  /// Stops the watchdog (idempotent); the flag and record may go after it.
  void stop();

 private:
  /// Turns a failure in the record, once complete, into the broken state.
  /// Returns whether the communicator is broken afterwards.
  bool absorbRecord();
  [[noreturn]] void throwFailure(const char* op, bool refusing) const;
  void watch();

  std::string commName_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::function<void()> raiseAbortFlag_;
  std::function<void(ErrorCode, const std::string&)> publish_;
  std::function<void(ErrorCode)> onBroken_;
  DeviceErrorRecord* record_;
  AsyncErrorHandling handling_;

  std::atomic<uint64_t> sequence_{0};
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  ErrorCode code_ = ErrorCode::kInternal;
  std::string message_;

  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace pyccl
