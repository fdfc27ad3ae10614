// Semaphores between two ranks: 64-bit, monotonically increasing counters in
// registered memory. The signalling side owns an `outbound` count and stores
// it into the peer's `inbound` counter; the waiting side owns an `expected`
// count and waits until `inbound` reaches it. One writer per counter, so a
// release store (no read-modify-write across the link) suffices.
#pragma once

#include "channels/device_common.hpp"

namespace pyccl {

/// One slot of a semaphore in registered memory (64 bytes, one per peer pair).
struct SemaphoreSlot {
  uint64_t inbound;   ///< written by the peer, read here
  uint64_t outbound;  ///< signals sent to the peer so far
  uint64_t expected;  ///< signals waited for so far
  uint64_t reserved[5];
};
static_assert(sizeof(SemaphoreSlot) == 64, "SemaphoreSlot must be 64 bytes");

/// The semaphore between this rank and `peer`, as a kernel (or a host-mode
/// thread) uses it. Plain data: copy it into kernel arguments.
struct SemaphoreDeviceHandle {
  SemaphoreSlot* local;     ///< this rank's slot (inbound written by the peer)
  uint64_t* remoteInbound;  ///< the peer's slot's inbound, mapped here
  AbortState abort;
  int peer;
  /// 1: signal with an atomic add on the peer's counter (host mode, NVLink),
  /// which keeps the read of this rank's count off the peer's critical path;
  /// 0: store the incremented count (links without native P2P atomics).
  uint32_t remoteAtomics;

  /// Signals the peer. Release: every write this thread made before (including
  /// puts to the peer's memory) is visible to the peer once its wait returns.
  /// Call from one thread; order other threads' writes first (e.g. __syncthreads()).
  PYCCL_HOST_DEVICE void signal() {
    if (remoteAtomics) {
      atomicAddRelease(remoteInbound, 1);
      local->outbound += 1;  // the peer's count already moved; keep ours in step
      return;
    }
    const uint64_t next = local->outbound + 1;
    atomicStoreRelease(remoteInbound, next);
    local->outbound = next;
  }

  /// Signals with relaxed order: no ordering of earlier writes. For signals
  /// that carry no data, or after an explicit fence.
  PYCCL_HOST_DEVICE void relaxedSignal() {
    if (remoteAtomics) {
      atomicAddRelaxed(remoteInbound, 1);
      local->outbound += 1;
      return;
    }
    const uint64_t next = local->outbound + 1;
    atomicStoreRelaxed(remoteInbound, next);
    local->outbound = next;
  }

  /// Waits for the next signal from the peer. Acquire: data the peer wrote
  /// before signalling is visible after it returns kOk. Bounded by the
  /// communicator's timeout and abort flag; on failure the error is recorded.
  PYCCL_HOST_DEVICE WaitStatus wait() {
    const uint64_t target = local->expected + 1;
    local->expected = target;
    uint64_t observed = 0;
    return spinUntilAtLeast(&local->inbound, target, abort, peer, &observed);
  }

  /// Waits like wait() but with relaxed order: for signals that carry no data
  /// (or when the caller fences itself).
  PYCCL_HOST_DEVICE WaitStatus relaxedWait() {
    const uint64_t target = local->expected + 1;
    local->expected = target;
    if (atomicLoadRelaxed(&local->inbound) >= target) return WaitStatus::kOk;
    uint64_t observed = 0;
    return spinUntilAtLeast(&local->inbound, target, abort, peer, &observed);
  }

  /// Whether the next signal has arrived; consumes it if so. Never blocks.
  PYCCL_HOST_DEVICE bool poll() {
    const uint64_t target = local->expected + 1;
    if (atomicLoadAcquire(&local->inbound) < target) return false;
    local->expected = target;
    return true;
  }

  /// Signals received so far (acquire).
  PYCCL_HOST_DEVICE uint64_t received() const { return atomicLoadAcquire(&local->inbound); }
};

}  // namespace pyccl
