// MemoryChannel: memory-mapped I/O to one peer. Threads of this GPU load and
// store the peer's registered memory directly (NVLink/PCIe P2P).
//
// A channel joins a local buffer (`src`, this rank's registered memory) with
// the peer's buffer (`dst`, mapped here) and a semaphore pair. Optionally it
// has packet buffers for the LL protocol: `localPackets` (this rank's, which
// the peer writes into) and `remotePackets` (the peer's, mapped here).
//
// Protocols:
//  - HB (high bandwidth): put()/get() copy with 16-byte vectors across many
//    threads; then one signal() (after a barrier) tells the peer the data is there.
//  - LL (low latency): putPackets() stores data with a flag in every packet;
//    the peer's readPackets() polls the flags, so no signal is needed.
//
// All offsets are in bytes. Nothing here checks bounds on the device: the
// host-side MemoryChannel checks what it can, kernels must stay in range.
#pragma once

#include "channels/copy_device.hpp"
#include "channels/packet_device.hpp"
#include "channels/semaphore_device.hpp"

namespace pyccl {

/// Makes the writes of all threads of the block visible to thread 0 before it
/// signals (a no-op in host mode, where a "block" is one CPU thread).
PYCCL_HOST_DEVICE void syncBlock() {
#if PYCCL_ON_DEVICE
  __syncthreads();
#endif
}

struct MemoryChannelDeviceHandle {
  SemaphoreDeviceHandle semaphore;
  char* src;            ///< this rank's registered buffer
  char* dst;            ///< the peer's registered buffer, mapped here
  char* localPackets;   ///< this rank's packet buffer (the peer writes it); may be null
  char* remotePackets;  ///< the peer's packet buffer, mapped here; may be null

  /// HB copy of `bytes` from src+srcOffset to the peer's dst+dstOffset by
  /// threads [tid, numThreads). Returns when this thread's stores are issued;
  /// a signal() ordered after a barrier makes them visible to the peer.
  PYCCL_HOST_DEVICE void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint32_t tid,
                             uint32_t numThreads) {
    copyBytes(dst + dstOffset, src + srcOffset, bytes, tid, numThreads);
  }

  /// HB copy of `bytes` from the peer's dst+dstOffset into src+srcOffset. The
  /// peer must have signalled (and this rank waited) for the data to be valid.
  PYCCL_HOST_DEVICE void get(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint32_t tid,
                             uint32_t numThreads) {
    copyBytes(src + srcOffset, dst + dstOffset, bytes, tid, numThreads);
  }

  /// Stores one element into the peer's buffer at element `index`.
  template <typename T>
  PYCCL_HOST_DEVICE void write(uint64_t index, const T& value) {
    reinterpret_cast<T*>(dst)[index] = value;
  }

  /// Loads one element of the peer's buffer at element `index`.
  template <typename T>
  PYCCL_HOST_DEVICE T read(uint64_t index) const {
    return reinterpret_cast<const T*>(dst)[index];
  }

  /// LL: packs `bytes` of src+srcOffset into the peer's packet buffer at byte
  /// offset `packetOffset`, each packet flagged with `flag`. Needs no signal.
  template <typename Packet = LL16Packet>
  PYCCL_HOST_DEVICE void putPackets(uint64_t packetOffset, uint64_t srcOffset, uint64_t bytes,
                                    uint32_t flag, uint32_t tid, uint32_t numThreads) {
    putPacketsTo(reinterpret_cast<Packet*>(remotePackets + packetOffset), src + srcOffset, bytes,
                 flag, tid, numThreads);
  }

  /// LL: waits for the packets at this rank's packet buffer + `packetOffset`
  /// flagged `flag` and unpacks their `bytes` of data to src+dstOffset.
  /// Acquire-like: the data is valid on return. Bounded by the timeout/abort.
  template <typename Packet = LL16Packet>
  PYCCL_HOST_DEVICE WaitStatus readPackets(uint64_t dstOffset, uint64_t packetOffset,
                                           uint64_t bytes, uint32_t flag, uint32_t tid,
                                           uint32_t numThreads) {
    return readPacketsFrom(src + dstOffset, reinterpret_cast<const Packet*>(localPackets + packetOffset),
                           bytes, flag, tid, numThreads, semaphore.abort, semaphore.peer);
  }

  /// Signals the peer; ordered after this thread's earlier writes (release).
  /// For a multi-thread put, call after a barrier, from one thread.
  PYCCL_HOST_DEVICE void signal() { semaphore.signal(); }
  /// Signals without ordering earlier writes.
  PYCCL_HOST_DEVICE void relaxedSignal() { semaphore.relaxedSignal(); }
  /// Waits for the peer's next signal (acquire), bounded by the timeout/abort.
  PYCCL_HOST_DEVICE WaitStatus wait() { return semaphore.wait(); }
  /// Waits without acquire order.
  PYCCL_HOST_DEVICE WaitStatus relaxedWait() { return semaphore.relaxedWait(); }
  /// Consumes the next signal if it has arrived; never blocks.
  PYCCL_HOST_DEVICE bool poll() { return semaphore.poll(); }
  /// The local source may be reused at once after put(): the copying threads
  /// have loaded it. Kept for symmetry with PortChannel.
  PYCCL_HOST_DEVICE void flush() {}

  /// put() by all threads of the block, a barrier, then thread 0 signals.
  /// Every thread of the block must call it with numThreads = block size.
  PYCCL_HOST_DEVICE void putWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                       uint32_t tid, uint32_t numThreads) {
    put(dstOffset, srcOffset, bytes, tid, numThreads);
    syncBlock();
    if (tid == 0) signal();
  }
};

}  // namespace pyccl
