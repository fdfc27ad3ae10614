#include "core/call_history.hpp"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "core/env_settings.hpp"
#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace pyccl {

namespace {

LabelHooks& hooks() {
  static LabelHooks h;
  return h;
}

#ifdef PYCCL_WITH_CUDA
nvtxDomainHandle_t nvtxDomain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("pyccl");
  return domain;
}
#endif

std::string labelText(CallOp op, uint64_t seq, const CallFacts& facts) {
  return strCat("pyccl ", callOpName(op), " ", facts.algorithm, " ", facts.dtype, *facts.dtype ? " " : "", facts.bytes,
                " B #", seq);
}

}  // namespace

size_t historySizeFromEnv() {
  return static_cast<size_t>(envCount("PYCCL_HISTORY_SIZE", 256, 1 << 20, "calls"));
}

CallHistory::CallHistory(size_t capacity) : capacity_(capacity) { ring_.reserve(capacity); }

void CallHistory::add(CallRecord record) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(record));
    return;
  }
  ring_[next_] = std::move(record);
  next_ = (next_ + 1) % capacity_;
}

std::vector<CallRecord> CallHistory::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CallRecord> out;
  out.reserve(ring_.size());
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

uint64_t CallHistory::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

const char* callState(const CallRecord& record, uint64_t failedTag) {
  if (failedTag == 0) return "enqueued";
  const CallOp failedOp = callTagOp(failedTag);
  const uint64_t failedSeq = callTagSequence(failedTag);
  // send_recv calls are numbered apart from the others: no order between the two numberings.
  if ((failedOp == CallOp::kSendRecv) != (record.op == CallOp::kSendRecv)) return "enqueued";
  if (record.seq == failedSeq && record.op == failedOp) return "failed";
  return record.seq < failedSeq ? "before the failure" : "after the failure";
}

std::string describeHistory(const std::vector<CallRecord>& records, uint64_t failedTag, uint64_t total) {
  std::ostringstream os;
  os << "the last " << records.size() << " of " << total << " calls (PYCCL_HISTORY_SIZE), oldest first:";
  for (const CallRecord& r : records) {
    const std::time_t seconds = static_cast<std::time_t>(r.enqueuedUs / 1000000);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    os << "\n  #" << r.seq << " " << callOpName(r.op) << " " << r.algorithm << " " << r.dtype
       << (r.dtype.empty() ? "" : " ") << r.bytes
       << " B" << (r.captured ? " (captured in a CUDA graph)" : "") << ", enqueued "
       << std::put_time(&tm, "%H:%M:%S") << "." << std::setw(6) << std::setfill('0') << r.enqueuedUs % 1000000
       << std::setfill(' ') << " UTC: " << callState(r, failedTag);
  }
  return os.str();
}

void setLabelHooks(LabelHooks h) { hooks() = h; }

bool nvtxLabelsOn() {
#ifdef PYCCL_WITH_CUDA
  static const bool on = [] {
    const char* tool = std::getenv("NVTX_INJECTION64_PATH");
    return envFlag("PYCCL_NVTX", tool != nullptr && *tool != '\0');
  }();
  return on;
#else
  return false;
#endif
}

CallLabel::CallLabel(CallOp op, uint64_t seq, const CallFacts& facts) {
  const LabelHooks& h = hooks();
  const bool hook = h.active != nullptr && h.active();
  nvtx_ = nvtxLabelsOn();
  if (!hook && !nvtx_) return;
  const std::string text = labelText(op, seq, facts);
#ifdef PYCCL_WITH_CUDA
  if (nvtx_) {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = text.c_str();
    nvtxDomainRangePushEx(nvtxDomain(), &attributes);
  }
#endif
  if (hook) hook_ = h.begin(text);
}

CallLabel::CallLabel(CallLabel&& other) noexcept : nvtx_(other.nvtx_), hook_(other.hook_) {
  other.nvtx_ = false;
  other.hook_ = nullptr;
}

CallLabel::~CallLabel() {
  if (hook_ != nullptr) hooks().end(hook_);
#ifdef PYCCL_WITH_CUDA
  if (nvtx_) nvtxDomainRangePop(nvtxDomain());
#endif
}

}  // namespace pyccl
