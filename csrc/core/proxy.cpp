#include "core/proxy.hpp"

#include <chrono>
#include <cstring>

#include "core/env_settings.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"

namespace pyccl {

void checkPutRange(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint64_t localSize,
                   uint64_t remoteSize, int peer) {
  if (dstOffset + bytes > remoteSize || srcOffset + bytes > localSize || dstOffset + bytes < dstOffset ||
      srcOffset + bytes < srcOffset) {
    throw InvalidArgument(strCat("invalid argument 'put': [", srcOffset, ", +", bytes, ") -> [", dstOffset, ", +",
                                 bytes, ") is outside the buffers (", localSize, " bytes here, ", remoteSize,
                                 " at rank ", peer, ")"));
  }
}

Fifo::Fifo(int device, uint32_t size, AbortState abort) : device_(device), size_(size) {
  PYCCL_CHECK_ARG(size >= 2 && (size & (size - 1)) == 0, "fifo_size", "must be a power of two >= 2, got ", size);
  const size_t triggerBytes = sizeof(ProxyTrigger) * size;
  if (device < 0) {
    triggersHost_ = static_cast<ProxyTrigger*>(std::aligned_alloc(64, triggerBytes));
    std::memset(triggersHost_, 0, triggerBytes);
    tailHost_ = new uint64_t(0);
    deviceWords_ = new uint64_t[2]{0, 0};
    handle_.triggers = triggersHost_;
    handle_.tail = tailHost_;
  } else {
    triggersHost_ = static_cast<ProxyTrigger*>(gpu::allocPinnedMapped(triggerBytes));
    tailHost_ = static_cast<uint64_t*>(gpu::allocPinnedMapped(sizeof(uint64_t)));
    deviceWords_ = gpu::deviceMalloc(device, 2 * sizeof(uint64_t));
    handle_.triggers = static_cast<ProxyTrigger*>(gpu::devicePointerOf(triggersHost_));
    handle_.tail = static_cast<uint64_t*>(gpu::devicePointerOf(tailHost_));
  }
  handle_.head = static_cast<uint64_t*>(deviceWords_);
  handle_.tailCache = static_cast<uint64_t*>(deviceWords_) + 1;
  handle_.size = size;
  handle_.abort = abort;
}

Fifo::~Fifo() {
  if (device_ < 0) {
    std::free(triggersHost_);
    delete tailHost_;
    delete[] static_cast<uint64_t*>(deviceWords_);
  } else {
    gpu::freePinned(triggersHost_);
    gpu::freePinned(tailHost_);
    gpu::deviceFree(device_, deviceWords_);
  }
}

bool Fifo::take(ProxyTrigger* out) {
  ProxyTrigger* slot = &triggersHost_[tailValue_ & (size_ - 1)];
  const uint64_t snd = atomicLoadAcquire(&slot->snd);
  if (snd == 0) return false;
  out->snd = snd;
  out->fst = atomicLoadRelaxed(&slot->fst);
  // Clear before advancing the tail: a producer that wraps around writes a clean slot.
  atomicStoreRelaxed(&slot->fst, 0);
  atomicStoreRelaxed(&slot->snd, 0);
  return true;
}

void Fifo::advance() {
  ++tailValue_;
  atomicStoreRelease(tailHost_, tailValue_);
}

ProxyService::ProxyService(int device, uint32_t fifoSize, AbortState abort, std::string name,
                           FailureHandler onFailure)
    : device_(device),
      name_(std::move(name)),
      abort_(abort),
      onFailure_(std::move(onFailure)),
      spinNs_(proxySpinMicroseconds(device >= 0) * 1000),  // PYCCL_PROXY_SPIN_US
      fifo_(device, fifoSize, abort) {
  for (auto& c : channels_) c.store(nullptr);
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

ProxyService::~ProxyService() { stop(); }

void ProxyChannel::signalCounter(uint64_t) {
  throw InternalError(strCat("the ", transport(), " transport has no counter table to signal into"));
}

uint32_t ProxyService::addChannel(std::unique_ptr<ProxyChannel> channel) {
  std::lock_guard<std::mutex> lock(mu_);
  // The first id removeChannel freed, else a new one.
  uint32_t id = 0;
  while (id < owned_.size() && owned_[id]) ++id;
  PYCCL_CHECK_ARG(id < kTriggerMaxChannels, "channel", "a proxy serves at most ", kTriggerMaxChannels,
                  " port channels");
  channels_[id].store(channel.get(), std::memory_order_release);
  if (id == owned_.size()) {
    owned_.push_back(std::move(channel));
  } else {
    owned_[id] = std::move(channel);
  }
  return id;
}

void ProxyService::removeChannel(uint32_t id) {
  std::unique_ptr<ProxyChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PYCCL_CHECK_ARG(id < owned_.size() && owned_[id], "channel", "no channel ", id, " at proxy '", name_, "'");
    std::lock_guard<std::mutex> executing(executeMu_);
    channels_[id].store(nullptr, std::memory_order_release);
    channel = std::move(owned_[id]);
  }
  channel->shutdown();
}

std::string ProxyService::error() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(mu_));
  return error_;
}

void ProxyService::injectFailure(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    injectedReason_ = reason;
  }
  failureInjected_.store(true, std::memory_order_release);
}

void ProxyService::stop() {
  stopRequested_ = true;
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& channel : owned_) {
    if (channel) channel->shutdown();
  }
}

void ProxyService::execute(const ProxyTrigger& t) {
  ProxyChannel* channel = channels_[t.channel()].load(std::memory_order_acquire);
  if (channel == nullptr) {
    throw InternalError(strCat("proxy '", name_, "': trigger for unknown channel ", t.channel()));
  }
  const uint32_t type = t.type();
  if (type & kTriggerPut) channel->put(t.dstOffset(), t.srcOffset(), t.size());
  if (type & kTriggerSignal) {
    if (!(type & kTriggerPut) && t.dstOffset() != 0) {
      channel->signalCounter(t.dstOffset() - 1);
    } else {
      channel->signal();
    }
  }
  if (type & kTriggerFlush) channel->flush();
}

void ProxyService::run() {
  setLogRank(-1);
  if (device_ >= 0) {
#ifdef PYCCL_WITH_CUDA
    cudaSetDevice(device_);
#endif
    gpu::relaxCaptureModeOfThisThread();
  }
  using Clock = std::chrono::steady_clock;
  uint32_t polls = 0;
  auto lastWork = Clock::now();
  ProxyTrigger t{};
  try {
    while (!stopRequested_.load(std::memory_order_relaxed)) {
      if (failureInjected_.load(std::memory_order_relaxed)) {
        std::lock_guard<std::mutex> lock(mu_);
        throw InternalError(injectedReason_);
      }
      if (!fifo_.take(&t)) {
        // Poll, yielding every 256 polls, for spinNs_ after the last trigger;
        // then sleep in short steps, and in longer ones once idle for a second,
        // so an idle proxy gives its core back to the ranks.
        if (++polls < 256) continue;
        polls = 0;
        const auto idleNs = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - lastWork).count());
        if (idleNs < spinNs_) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(idleNs < 1'000'000'000ull ? 20 : 200));
        }
        continue;
      }
      polls = 0;
      lastWork = Clock::now();
      {
        std::lock_guard<std::mutex> executing(executeMu_);
        execute(t);
      }
      // Counted before the tail moves: a producer that saw the tail sees the count.
      executed_.fetch_add(1, std::memory_order_relaxed);
      fifo_.advance();
    }
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = e.what();
    }
    PYCCL_LOG(Error, "proxy '" << name_ << "' stopped: " << e.what());
    if (onFailure_) onFailure_(e.what());
    // Waiters on this proxy's progress must not wait forever.
    if (abort_.abortFlag != nullptr) {
      std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(abort_.abortFlag)).store(1);
    }
  }
  // Count what was left behind.
  uint64_t left = 0;
  while (fifo_.take(&t)) {
    ++left;
    fifo_.advance();
  }
  dropped_ = left;
  if (left > 0) PYCCL_LOG(Warn, "proxy '" << name_ << "' stopped with " << left << " triggers pending");
  running_ = false;
}

namespace {

class HostCopyChannel : public ProxyChannel {
 public:
  HostCopyChannel(char* src, char* dst, uint64_t* remoteInbound)
      : src_(src), dst_(dst), remoteInbound_(remoteInbound) {}
  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    std::memcpy(dst_ + dstOffset, src_ + srcOffset, bytes);
  }
  void signal() override { atomicStoreRelease(remoteInbound_, ++outbound_); }
  void flush() override {}
  const char* transport() const override { return "host"; }

 private:
  char* src_;
  char* dst_;
  uint64_t* remoteInbound_;
  uint64_t outbound_ = 0;
};

}  // namespace

std::unique_ptr<ProxyChannel> makeHostCopyChannel(char* src, char* dst, uint64_t* remoteInbound) {
  return std::make_unique<HostCopyChannel>(src, dst, remoteInbound);
}

}  // namespace pyccl
