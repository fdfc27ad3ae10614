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
    fifo.pushTransfer(kTriggerPut, channelId, dstOffset, srcOffset, bytes);
  }
  /// Queues a signal to the peer, ordered after this channel's earlier puts.
  PYCCL_HOST_DEVICE void signal() {
    fifo.push(ProxyTrigger::make(kTriggerSignal, channelId, 0, 0, 0));
  }
  /// put() then signal() in one trigger.
  PYCCL_HOST_DEVICE void putWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    fifo.pushTransfer(kTriggerPut | kTriggerSignal, channelId, dstOffset, srcOffset, bytes);
  }
  /// putWithSignal() then flush().
  PYCCL_HOST_DEVICE WaitStatus putWithSignalAndFlush(uint64_t dstOffset, uint64_t srcOffset,
                                                     uint64_t bytes) {
    return fifo.sync(fifo.pushTransfer(kTriggerPut | kTriggerSignal | kTriggerFlush, channelId, dstOffset,
                                       srcOffset, bytes));
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

};

}  // namespace pyccl
