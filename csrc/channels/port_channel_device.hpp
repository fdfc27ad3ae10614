// PortChannel: port-mapped I/O to one peer. A GPU thread pushes requests
// into the FIFO; the CPU proxy turns them into copy-engine transfers
// (cudaMemcpyAsync), socket sends or RDMA writes, and bumps the peer's
// semaphore after the data. The same semantics as MemoryChannel:
//   put()    one-sided, asynchronous, zero-copy;
//   signal() ordered after every put before it on this channel;
//   wait()   returns once the peer's matching signal arrived (data visible);
//   flush()  returns once this rank's source buffers may be reused.
// Call the methods from one thread (they each push one or more triggers).
#pragma once

#include "channels/fifo_device.hpp"
#include "channels/semaphore_device.hpp"

namespace pyccl {

struct PortChannelDeviceHandle {
  FifoDeviceHandle fifo;
  SemaphoreDeviceHandle semaphore;  ///< this rank's inbound side (the peer's proxy bumps it)
  uint32_t channelId;               ///< this channel's index at the proxy

  /// Queues a copy of `bytes` from this rank's src+srcOffset to the peer's
  /// dst+dstOffset. Returns at once; the source stays in use until flush().
  PYCCL_HOST_DEVICE void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    pushChunks(kTriggerPut, dstOffset, srcOffset, bytes);
  }
  /// Queues a signal to the peer, ordered after this channel's earlier puts.
  PYCCL_HOST_DEVICE void signal() {
    fifo.push(ProxyTrigger::make(kTriggerSignal, channelId, 0, 0, 0));
  }
  /// put() then signal() in one trigger.
  PYCCL_HOST_DEVICE void putWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    pushChunks(kTriggerPut | kTriggerSignal, dstOffset, srcOffset, bytes);
  }
  /// putWithSignal() then flush().
  PYCCL_HOST_DEVICE WaitStatus putWithSignalAndFlush(uint64_t dstOffset, uint64_t srcOffset,
                                                     uint64_t bytes) {
    return fifo.sync(pushChunks(kTriggerPut | kTriggerSignal | kTriggerFlush, dstOffset, srcOffset,
                                bytes));
  }
  /// Returns once every earlier put of this channel has completed (the local
  /// source may be reused). Bounded by the timeout/abort.
  PYCCL_HOST_DEVICE WaitStatus flush() {
    return fifo.sync(fifo.push(ProxyTrigger::make(kTriggerFlush, channelId, 0, 0, 0)));
  }
  /// Waits for the peer's next signal (acquire: its data is visible).
  PYCCL_HOST_DEVICE WaitStatus wait() { return semaphore.wait(); }
  /// Consumes the peer's next signal if it has arrived; never blocks.
  PYCCL_HOST_DEVICE bool poll() { return semaphore.poll(); }

 private:
  /// Pushes a transfer split into triggers of at most kTriggerMaxBytes; the
  /// signal/flush bits go on the last one. Returns the last position.
  PYCCL_HOST_DEVICE uint64_t pushChunks(uint32_t type, uint64_t dstOffset, uint64_t srcOffset,
                                        uint64_t bytes) {
    constexpr uint64_t kChunk = 1ull << 31;
    uint64_t pos = ~0ull;
    do {
      const uint64_t n = bytes > kChunk ? kChunk : bytes;
      const bool last = n == bytes;
      const uint32_t t = last ? type : (type & kTriggerPut);
      pos = fifo.push(ProxyTrigger::make(t, channelId, dstOffset, srcOffset, n));
      dstOffset += n;
      srcOffset += n;
      bytes -= n;
    } while (bytes > 0);
    return pos;
  }
};

}  // namespace pyccl
