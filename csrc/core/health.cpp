#include "core/health.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/env_settings.hpp"
#include "core/logging.hpp"

namespace pyccl {
namespace {

constexpr uint64_t kCapturedBit = 0x80;
constexpr uint64_t kOpMask = 0x7f;
// How often the watchdog reads the error record (a load from pinned host memory).
constexpr auto kWatchPeriod = std::chrono::milliseconds(20);
// How long a reader waits for a failing wait to finish filling the record.
constexpr uint64_t kRecordFillNs = 100'000'000ull;

}  // namespace

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (int q : ranks) out += strCat(out.empty() ? "" : ", ", q);
  return out;
}

std::vector<int> ranksInMask(uint32_t mask) {
  std::vector<int> ranks;
  for (int q = 0; q < 32; ++q) {
    if (mask & (1u << q)) ranks.push_back(q);
  }
  return ranks;
}

const char* callOpName(CallOp op) {
  switch (op) {
    case CallOp::kNone: return "a wait outside pyccl's collectives (a channel or semaphore)";
    case CallOp::kAllReduce: return "all_reduce";
    case CallOp::kAllGather: return "all_gather";
    case CallOp::kAllToAll: return "all_to_all";
    case CallOp::kBroadcast: return "broadcast";
    case CallOp::kReduceScatter: return "reduce_scatter";
    case CallOp::kPlan: return "plan";
    case CallOp::kAllReduceRMSNorm: return "fused_all_reduce_rmsnorm";
    case CallOp::kSendRecv: return "send_recv";
  }
  return "unknown op";
}

uint64_t makeCallTag(CallOp op, uint64_t seq, bool captured) {
  return (seq << 8) | (captured ? kCapturedBit : 0) | static_cast<uint64_t>(op);
}

CallOp callTagOp(uint64_t tag) { return static_cast<CallOp>(tag & kOpMask); }

uint64_t callTagSequence(uint64_t tag) { return tag >> 8; }

std::string describeCallTag(uint64_t tag) {
  const auto op = static_cast<CallOp>(tag & kOpMask);
  if (op == CallOp::kNone) return callOpName(op);
  std::string out = strCat(callOpName(op), " call ", tag >> 8);
  if (tag & kCapturedBit) out += " (captured in a CUDA graph; it failed on a replay)";
  return out;
}

AsyncErrorHandling asyncErrorHandlingFromEnv() {
  const char* v = std::getenv("PYCCL_ASYNC_ERROR_HANDLING");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) return AsyncErrorHandling::kRaise;
  if (std::strcmp(v, "1") == 0) return AsyncErrorHandling::kTearDown;
  throw InvalidArgument(strCat("invalid argument 'PYCCL_ASYNC_ERROR_HANDLING': must be 0 (raise on the next call) "
                               "or 1 (abort the process), got '", v, "'"));
}

bool callChecksFromEnv() {
  if (envFlag("PYCCL_DEBUG", false)) return true;
  const char* torchDebug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  return torchDebug != nullptr && std::strcmp(torchDebug, "DETAIL") == 0;
}

CommunicatorHealth::CommunicatorHealth(std::string commName, int rank, std::chrono::milliseconds timeout,
                                       std::function<void()> raiseAbortFlag, DeviceErrorRecord* record, bool watch)
    : commName_(std::move(commName)),
      rank_(rank),
      timeout_(timeout),
      raiseAbortFlag_(std::move(raiseAbortFlag)),
      record_(record),
      handling_(asyncErrorHandlingFromEnv()) {
  if (watch) watchdog_ = std::thread([this] { this->watch(); });
}

CommunicatorHealth::~CommunicatorHealth() { stop(); }

void CommunicatorHealth::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

std::optional<std::string> CommunicatorHealth::failure() {
  if (!absorbRecord()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  return message_;
}

void CommunicatorHealth::fail(ErrorCode code, const std::string& message, bool fromPeer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.load(std::memory_order_relaxed)) return;
    code_ = code;
    message_ = message;
    broken_.store(true, std::memory_order_release);
  }
  // A user's abort is this rank's own business (peers learn of it by their timeout, as with NCCL); a failure is
  // every rank's: no peer may complete the call this rank gave up. First, as it only hands the verdict over:
  // raising the flag on a GPU takes a copy, and a caller that the failure reached meanwhile (another thread
  // checking the record) may already be closing the communicator.
  if (publish_ && !fromPeer && code != ErrorCode::kAborted) publish_(code, message);
  // Kernels already queued give up at their first wait instead of each
  // waiting out the timeout.
  raiseAbortFlag_();
  if (code == ErrorCode::kAborted) {
    PYCCL_LOG(Warn, "communicator '" << commName_ << "' is broken: " << message);
  } else {
    PYCCL_LOG(Error, "communicator '" << commName_ << "' is broken: " << message);
  }
  if (onBroken_) onBroken_(code);
}

bool CommunicatorHealth::absorbRecord() {
  if (broken()) return true;
  if (record_ == nullptr) return false;
  const uint32_t status = std::atomic_ref<uint32_t>(record_->status).load(std::memory_order_acquire);
  if (status == 0) return false;
  // The failing wait fills the record after claiming it; it takes nanoseconds.
  const uint64_t start = nowNs();
  while (std::atomic_ref<uint32_t>(record_->complete).load(std::memory_order_acquire) == 0 &&
         nowNs() - start < kRecordFillNs) {
    std::this_thread::yield();
  }
  const uint32_t mask = std::atomic_ref<uint32_t>(record_->peerMask).load(std::memory_order_acquire);
  const bool timedOut = status == static_cast<uint32_t>(WaitStatus::kTimeout);
  std::string message = strCat(describeCallTag(record_->call), " of communicator '", commName_, "' (rank ", rank_,
                               "): ");
  if (status == static_cast<uint32_t>(WaitStatus::kUnregistered)) {
    fail(ErrorCode::kInvalidArgument,
         message + "a CUDA graph captured under pyccl.graph_capture ran before its buffers were registered, so "
                   "the all-reduce was not computed; replay such a graph only after its graph_capture block has "
                   "exited");
    return true;
  }
  if (status == static_cast<uint32_t>(WaitStatus::kMismatch)) {
    fail(ErrorCode::kRemote, message + strCat("a receive of ", record_->expected, " bytes from rank ", record_->peer,
                                              " met a send of ", record_->observed, " bytes; a send and the "
                                              "receive it meets must have the same size"));
    return true;
  }
  if (timedOut) {
    message += strCat("no signal from rank ", record_->peer, " within the ", timeout_.count(),
                      " ms timeout (waited for ", record_->expected, ", saw ", record_->observed, ")");
  } else {
    message += strCat("aborted while waiting for rank ", record_->peer);
  }
  const std::string peers =
      rankList(ranksInMask(mask | (record_->peer >= 0 && record_->peer < 32 ? 1u << record_->peer : 0u)));
  message += strCat("; rank(s) waited on in vain: ", peers);
  fail(timedOut ? ErrorCode::kTimeout : ErrorCode::kAborted, message);
  return true;
}

void CommunicatorHealth::check(const char* op, bool refusing) {
  if (absorbRecord()) throwFailure(op, refusing);
}

void CommunicatorHealth::throwFailure(const char* op, bool refusing) const {
  ErrorCode code;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    code = code_;
    message = message_;
  }
  throwError(code, strCat(refusing ? strCat(op, ": refused, ") : std::string(), message,
                          ". The communicator is broken: every later call fails; make a new communicator "
                          "(process group)"));
}

void CommunicatorHealth::watch() {
  setLogRank(rank_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, kWatchPeriod, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    const bool wasBroken = broken();
    const bool isBroken = absorbRecord();
    lock.lock();
    // A user's abort() is not a fault: only a failure of its own tears down.
    if (isBroken && !wasBroken && handling_ == AsyncErrorHandling::kTearDown && code_ != ErrorCode::kAborted) {
      PYCCL_LOG(Error, "communicator '" << commName_ << "': PYCCL_ASYNC_ERROR_HANDLING=1, aborting the process");
      std::abort();
    }
  }
}

}  // namespace pyccl
