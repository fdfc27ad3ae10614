// Shared building blocks of the device-side API: host/device qualifiers,
// scoped atomics, a nanosecond clock, and the abort/timeout state that every
// bounded spin-wait checks. Written once for both compilers: under nvcc the
// atomics are cuda::atomic_ref at system scope (peers reach this memory over
// NVLink/PCIe, and host threads may too); in host mode they are std::atomic_ref
// on shared memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__CUDACC__)
#include <cuda/atomic>
#define PYCCL_HOST_DEVICE __host__ __device__ __forceinline__
#define PYCCL_DEVICE __device__ __forceinline__
#else
#define PYCCL_HOST_DEVICE inline
#define PYCCL_DEVICE inline
#endif

namespace pyccl {

#if defined(__CUDA_ARCH__)
#define PYCCL_ON_DEVICE 1
#else
#define PYCCL_ON_DEVICE 0
#endif

/// Loads with acquire order: later reads see everything the releasing writer
/// wrote before its matching release store.
PYCCL_HOST_DEVICE uint64_t atomicLoadAcquire(const uint64_t* p) {
#if PYCCL_ON_DEVICE
  return cuda::atomic_ref<const uint64_t, cuda::thread_scope_system>(*p).load(
      cuda::memory_order_acquire);
#else
  return std::atomic_ref<const uint64_t>(*p).load(std::memory_order_acquire);
#endif
}

/// Loads with no ordering (for polling loops that order with a fence after).
PYCCL_HOST_DEVICE uint64_t atomicLoadRelaxed(const uint64_t* p) {
#if PYCCL_ON_DEVICE
  return cuda::atomic_ref<const uint64_t, cuda::thread_scope_system>(*p).load(
      cuda::memory_order_relaxed);
#else
  return std::atomic_ref<const uint64_t>(*p).load(std::memory_order_relaxed);
#endif
}

/// Stores with release order: everything this thread wrote before is visible
/// to a reader that observes the value with acquire order.
PYCCL_HOST_DEVICE void atomicStoreRelease(uint64_t* p, uint64_t value) {
#if PYCCL_ON_DEVICE
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(value,
                                                                  cuda::memory_order_release);
#else
  std::atomic_ref<uint64_t>(*p).store(value, std::memory_order_release);
#endif
}

PYCCL_HOST_DEVICE void atomicStoreRelaxed(uint64_t* p, uint64_t value) {
#if PYCCL_ON_DEVICE
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(value,
                                                                  cuda::memory_order_relaxed);
#else
  std::atomic_ref<uint64_t>(*p).store(value, std::memory_order_relaxed);
#endif
}

/// Adds with release order (a reduction: no value comes back, so on the
/// device it is a fire-and-forget `red`, as cheap to issue as a store).
PYCCL_HOST_DEVICE void atomicAddRelease(uint64_t* p, uint64_t value) {
#if PYCCL_ON_DEVICE
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).fetch_add(value, cuda::memory_order_release);
#else
  std::atomic_ref<uint64_t>(*p).fetch_add(value, std::memory_order_release);
#endif
}

PYCCL_HOST_DEVICE void atomicAddRelaxed(uint64_t* p, uint64_t value) {
#if PYCCL_ON_DEVICE
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).fetch_add(value, cuda::memory_order_relaxed);
#else
  std::atomic_ref<uint64_t>(*p).fetch_add(value, std::memory_order_relaxed);
#endif
}

PYCCL_HOST_DEVICE uint32_t loadFlagVolatile(const volatile uint32_t* p) { return *p; }

/// Nanoseconds from an arbitrary origin; monotonic within one process/GPU.
PYCCL_HOST_DEVICE uint64_t nowNs() {
#if PYCCL_ON_DEVICE
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

/// Whether more than `timeoutNs` passed since `start` (0: never). Signed, so a
/// clock that steps backwards reads as "not yet" rather than wrapping around.
PYCCL_HOST_DEVICE bool pastDeadline(uint64_t start, uint64_t timeoutNs) {
  return timeoutNs != 0 && static_cast<int64_t>(nowNs() - start) > static_cast<int64_t>(timeoutNs);
}

/// Why a bounded wait gave up.
enum class WaitStatus : uint32_t { kOk = 0, kTimeout = 1, kAborted = 2 };

/// What a device-side wait records when it gives up (first failure wins), so
/// the host can raise an error naming the peer. Lives in host-pinned memory.
struct DeviceErrorRecord {
  uint32_t status;    ///< WaitStatus of the first failure; 0 while none
  int32_t peer;       ///< the rank whose signal never came
  uint64_t expected;  ///< the value waited for
  uint64_t observed;  ///< the value last seen
};

/// The abort flag and time bound shared by every wait of one communicator.
struct AbortState {
  const volatile uint32_t* abortFlag;  ///< non-zero: give up at once
  uint64_t timeoutNs;                  ///< 0: never time out (not recommended)
  DeviceErrorRecord* errorRecord;      ///< may be null

  PYCCL_HOST_DEVICE bool aborted() const {
    return abortFlag != nullptr && loadFlagVolatile(abortFlag) != 0;
  }

  /// Records the first failure. Safe against concurrent failing waits.
  PYCCL_HOST_DEVICE void record(WaitStatus status, int peer, uint64_t expected,
                                uint64_t observed) const {
    if (errorRecord == nullptr) return;
#if PYCCL_ON_DEVICE
    if (atomicCAS(&errorRecord->status, 0u, static_cast<uint32_t>(status)) == 0u) {
      errorRecord->peer = peer;
      errorRecord->expected = expected;
      errorRecord->observed = observed;
      __threadfence_system();
    }
#else
    uint32_t zero = 0;
    if (std::atomic_ref<uint32_t>(errorRecord->status)
            .compare_exchange_strong(zero, static_cast<uint32_t>(status))) {
      errorRecord->peer = peer;
      errorRecord->expected = expected;
      errorRecord->observed = observed;
    }
#endif
  }
};

/// Polls `ready()` until it returns true, the abort flag rises, or the
/// timeout passes. The clock and the flag are read every `kCheckEvery` polls,
/// so the fast path stays one poll. On giving up it records (peer, expected,
/// lastSeen()) in the error record and says why. Host threads back off to
/// yielding and then short sleeps: other ranks may share the cores.
template <typename Ready, typename LastSeen>
PYCCL_HOST_DEVICE WaitStatus boundedPoll(Ready&& ready, LastSeen&& lastSeen, const AbortState& abort,
                                         int peer, uint64_t expected) {
  constexpr uint32_t kCheckEvery = 1024;
  if (ready()) return WaitStatus::kOk;
  const uint64_t start = nowNs();
  for (uint32_t polls = 1;; ++polls) {
    if (ready()) return WaitStatus::kOk;
    if (polls % kCheckEvery == 0) {
      if (abort.aborted()) {
        abort.record(WaitStatus::kAborted, peer, expected, lastSeen());
        return WaitStatus::kAborted;
      }
      if (pastDeadline(start, abort.timeoutNs)) {
        abort.record(WaitStatus::kTimeout, peer, expected, lastSeen());
        return WaitStatus::kTimeout;
      }
#if !PYCCL_ON_DEVICE
      if (polls >= 16 * kCheckEvery) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
#endif
    }
  }
}

/// Spins until `*counter >= target` (acquire), bounded like boundedPoll.
PYCCL_HOST_DEVICE WaitStatus spinUntilAtLeast(const uint64_t* counter, uint64_t target,
                                              const AbortState& abort, int peer,
                                              uint64_t* observed) {
  uint64_t value = 0;
  const WaitStatus status = boundedPoll(
      [&] {
        value = atomicLoadAcquire(counter);
        return value >= target;
      },
      [&] { return value; }, abort, peer, target);
  *observed = value;
  return status;
}

}  // namespace pyccl
