// The proxy of PortChannels: a CPU thread per communicator (one device) that
// executes the triggers GPU threads push into its FIFO, through one
// ProxyChannel per PortChannel (copy engine, socket, RDMA, or host memcpy).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "channels/fifo_device.hpp"

namespace pyccl {

/// How one PortChannel moves data; called from the proxy thread only.
class ProxyChannel {
 public:
  virtual ~ProxyChannel() = default;
  /// Starts a copy of `bytes` from this rank's src+srcOffset to the peer's dst+dstOffset.
  virtual void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) = 0;
  /// Bumps the peer's semaphore after every earlier put has landed.
  virtual void signal() = 0;
  /// Adds 1 to counter `slot` of the peer's counter table, after every
  /// earlier put has landed (the plan interpreter's signals across nodes).
  /// Only transports made with a counter table take it.
  virtual void signalCounter(uint64_t slot);
  /// Returns once every earlier put has completed (sources reusable).
  virtual void flush() = 0;
  /// Short name for logs and errors ("cuda_ipc", "socket", ...).
  virtual const char* transport() const = 0;
  /// Stops any thread the channel runs (after the proxy thread stopped), so
  /// nothing touches the communicator's memory afterwards. Idempotent.
  virtual void shutdown() {}
};

/// Throws InvalidArgument unless [srcOffset, +bytes) lies in the local
/// buffer and [dstOffset, +bytes) in the peer's (overflow included): the
/// check of transports that address the peer's memory by offset.
void checkPutRange(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint64_t localSize,
                   uint64_t remoteSize, int peer);

/// The FIFO's memory: triggers and tail host-pinned (GPU) or heap (host mode);
/// head and the producers' tail cache in device memory (GPU) or heap.
class Fifo {
 public:
  Fifo(int device, uint32_t size, AbortState abort);
  ~Fifo();
  Fifo(const Fifo&) = delete;
  Fifo& operator=(const Fifo&) = delete;

  FifoDeviceHandle deviceHandle() const { return handle_; }
  /// Proxy side: the trigger at the tail, if filled (the slot is then cleared).
  bool take(ProxyTrigger* out);
  /// Proxy side: publishes that the trigger at the tail was executed.
  void advance();
  uint64_t tail() const { return tailValue_; }

 private:
  int device_;
  uint32_t size_;
  ProxyTrigger* triggersHost_ = nullptr;  // host address of the triggers
  uint64_t* tailHost_ = nullptr;          // host address of the tail
  void* deviceWords_ = nullptr;           // head + tail cache
  uint64_t tailValue_ = 0;
  FifoDeviceHandle handle_{};
};

class ProxyService {
 public:
  /// Called once, from the proxy thread, with the error that stopped it.
  using FailureHandler = std::function<void(const std::string&)>;
  /// Starts the proxy thread for `device` (-1: host mode). `onFailure` (may be
  /// empty) hears of an error that stops the thread; the abort flag is raised
  /// either way, so no wait on the proxy's progress waits forever.
  ProxyService(int device, uint32_t fifoSize, AbortState abort, std::string name, FailureHandler onFailure = {});
  /// Stops the thread (see stop()).
  ~ProxyService();
  ProxyService(const ProxyService&) = delete;
  ProxyService& operator=(const ProxyService&) = delete;

  /// Registers a channel; its id goes into the triggers. Thread-safe.
  uint32_t addChannel(std::unique_ptr<ProxyChannel> channel);
  /// Shuts channel `id` down and frees its id, after the trigger in progress
  /// (if it is this channel's) finished; no trigger for it may be queued.
  void removeChannel(uint32_t id);
  FifoDeviceHandle fifoHandle() const { return fifo_.deviceHandle(); }
  /// Stops the thread within about a millisecond: the trigger in progress
  /// finishes, those still queued are dropped (counted and logged); then every
  /// channel is shut down. Idempotent.
  void stop();
  bool running() const { return running_.load(); }
  uint64_t executed() const { return executed_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  /// The error that stopped the proxy, if any ("" while healthy).
  std::string error() const;
  /// Makes the proxy thread fail with `reason` at its next poll, as a failing
  /// transfer would (for fault-injection tests).
  void injectFailure(const std::string& reason);

 private:
  void run();
  void execute(const ProxyTrigger& t);

  int device_;
  std::string name_;
  AbortState abort_;
  FailureHandler onFailure_;
  uint64_t spinNs_;  ///< busy-poll this long after the last trigger before sleeping
  Fifo fifo_;
  std::array<std::atomic<ProxyChannel*>, kTriggerMaxChannels> channels_{};
  std::vector<std::unique_ptr<ProxyChannel>> owned_;
  std::mutex mu_;
  std::mutex executeMu_;  ///< held by the proxy thread while it executes a trigger
  std::atomic<bool> stopRequested_{false};
  std::atomic<bool> failureInjected_{false};
  std::string injectedReason_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> executed_{0};
  std::atomic<uint64_t> dropped_{0};
  std::string error_;
  std::thread thread_;
};

/// A channel between two host-mode ranks of one node: memcpy into the peer's
/// mapped memory, then a release store into its semaphore.
std::unique_ptr<ProxyChannel> makeHostCopyChannel(char* src, char* dst, uint64_t* remoteInbound);

#ifdef PYCCL_WITH_CUDA
/// A channel between two GPUs of one node: copy-engine transfers on a stream
/// of `device`, and a semaphore store ordered after them on the same stream.
std::unique_ptr<ProxyChannel> makeCudaIpcChannel(int device, char* src, char* dst,
                                                 uint64_t* remoteInbound);
#endif

}  // namespace pyccl
