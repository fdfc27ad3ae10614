// The inbox: puts from other nodes, landed in host memory, moved into this
// rank's registered memory by the kernel itself.
//
// Across nodes the proxy and the receiver threads make no CUDA call: any copy
// they issued could queue behind work the application put on the device
// after the kernel that waits for the copy (a `.cpu()` of the result, say,
// whose staged copy holds the copy engine's queue), and the kernel would
// wait forever. So, as NCCL does without GPUDirect, the data crosses host
// memory that both the CPU and the GPU reach (page-locked, mapped):
//   - the sender's kernel copies what it puts into its send mirror and then
//     queues the trigger; the proxy sends from there;
//   - the receiver thread writes the payload into the receive mirror (the
//     same offset as in the region), appends a ReceivedPut record, publishes
//     it, and only then adds to the signal's counter;
//   - a kernel that saw such a counter move applies the peer's published
//     records: it copies them from the receive mirror into the region.
// Records are applied under a per-peer lock in GPU memory, so concurrent
// waiters on one peer never copy the same record twice, and every waiter
// returns only once everything published before its signal is applied.
#pragma once

#include "channels/copy_device.hpp"
#include "channels/device_common.hpp"
#include "channels/memory_channel_device.hpp"  // syncBlock

#include <atomic>

namespace pyccl {

/// One put received from a peer: [offset, offset + bytes) of the region.
struct ReceivedPut {
  uint64_t offset;
  uint64_t bytes;
};

/// Records per peer in the ring. A sender runs at most one call ahead of the
/// receiver's kernel, so the ring holds two calls' puts from one peer.
constexpr uint64_t kInboxRecords = 4096;

/// A full barrier for memory the CPU reads: this thread's earlier writes
/// (to host memory too) are visible to the system before its later ones.
PYCCL_HOST_DEVICE void fenceSystem() {
#if PYCCL_ON_DEVICE
  __threadfence_system();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

struct InboxDeviceHandle {
  const ReceivedPut* records;  ///< [peer][kInboxRecords] (host memory, written by the receivers)
  const uint64_t* published;   ///< [peer] records written so far (host memory)
  uint64_t* consumed;          ///< [peer] records applied (host memory: the receivers' room in the ring)
  uint64_t* progress;          ///< [peer][2]: apply lock, records applied (this GPU's memory)
  const char* staged;          ///< the receive mirror: payloads at their region offsets (host memory)
  char* region;                ///< this rank's registered memory

  /// Whether `peer` has published records not applied yet (acquire: a
  /// caller that sees none may read what was applied).
  PYCCL_HOST_DEVICE bool pending(int peer) const {
    return atomicLoadAcquire(&progress[2 * peer + 1]) < atomicLoadAcquire(&published[peer]);
  }

  /// Copies every record `peer` has published into the region, by all
  /// `numThreads` threads of the block. Call after seeing a counter that
  /// the peer's receiver added to: the records before that signal are
  /// published, so they are applied when this returns (by this block or by
  /// another that held the lock). False if the lock stayed taken past the
  /// timeout (a holder only copies, so only a dead kernel holds it long).
  PYCCL_HOST_DEVICE bool apply(int peer, const AbortState& abort, uint32_t tid, uint32_t numThreads) const {
#if PYCCL_ON_DEVICE
    __shared__ uint64_t window[3];  // first record, end, whether this block holds the lock
#else
    uint64_t window[3] = {0, 0, 0};  // host mode: a block is one thread
#endif
    uint64_t* lock = &progress[2 * peer];
    uint64_t* applied = &progress[2 * peer + 1];
    if (tid == 0) {
      window[2] = 0;
      WaitStatus status = WaitStatus::kOk;
      if (pending(peer)) {
        status = boundedPoll([&] { return tryLock(lock); }, [] { return uint64_t{1}; }, abort, peer, 0);
        window[2] = status == WaitStatus::kOk ? 1 : 0;
      }
      window[0] = window[1] = 0;
      if (window[2] != 0) {
        window[0] = atomicLoadAcquire(applied);
        window[1] = atomicLoadAcquire(&published[peer]);  // at least what came before the signal
      }
      if (status != WaitStatus::kOk) window[2] = 2;
    }
    syncBlock();
    const uint64_t first = window[0], end = window[1], state = window[2];
    const ReceivedPut* ring = records + static_cast<uint64_t>(peer) * kInboxRecords;
    for (uint64_t i = first; i < end; ++i) {
      const ReceivedPut r = ring[i % kInboxRecords];
      copyBytes(region + r.offset, staged + r.offset, r.bytes, tid, numThreads);
    }
    if (state == 1) fenceSystem();  // the copies before the release of `applied`
    syncBlock();
    if (tid == 0 && state == 1) {
      atomicStoreRelease(applied, end);
      atomicStoreRelease(&consumed[peer], end);
      atomicStoreRelease(lock, 0);
    }
    syncBlock();
    return state != 2;
  }

 private:
  PYCCL_HOST_DEVICE static bool tryLock(uint64_t* lock) {
#if PYCCL_ON_DEVICE
    uint64_t expected = 0;
    return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*lock).compare_exchange_strong(
        expected, 1, cuda::memory_order_acquire, cuda::memory_order_relaxed);
#else
    uint64_t expected = 0;
    return std::atomic_ref<uint64_t>(*lock).compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                                                    std::memory_order_relaxed);
#endif
  }
};

}  // namespace pyccl
