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
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda/atomic>
#define PYCCL_HOST_DEVICE __host__ __device__ __forceinline__
#define PYCCL_DEVICE __device__ __forceinline__
#else
#define PYCCL_HOST_DEVICE inline
#define PYCCL_DEVICE inline
#endif

/// Unrolls the next loop in device code (host compilers decide for themselves).
#if defined(__CUDA_ARCH__)
#define PYCCL_UNROLL _Pragma("unroll")
#else
#define PYCCL_UNROLL
#endif

namespace pyccl {

#if defined(__CUDA_ARCH__)
#define PYCCL_ON_DEVICE 1
#else
#define PYCCL_ON_DEVICE 0
#endif

/// `= {}` in host mode only, after an array that a loop fills and another reads
/// under one runtime bound (e.g. the world size). GCC cannot follow that bound
/// across the loops and warns that the rest may be read uninitialized
/// (-Wmaybe-uninitialized); zeroing them costs a host thread nothing, while in
/// a GPU kernel's loop it would be stores on the hot path: device code gets none.
#if defined(__CUDA_ARCH__)
#define PYCCL_HOST_ZEROED
#else
#define PYCCL_HOST_ZEROED = {}
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

/// Why a bounded wait gave up (or a kernel could not run its call).
/// kUnregistered is not a wait's: a zero-copy all-reduce captured under graph
/// buffers ran before their pointers were registered (engine/graph_buffers.hpp).
/// Nor is kMismatch: a receive met a send of another size (expected: the
/// receive's bytes, observed: the send's; algorithms/p2p.cu).
enum class WaitStatus : uint32_t { kOk = 0, kTimeout = 1, kAborted = 2, kUnregistered = 3, kMismatch = 4 };

/// What a device-side wait records when it gives up (first failure wins), so
/// the host can raise an error naming the call and the peers. Lives in
/// host-pinned memory, where the host's watchdog reads it without a CUDA call.
struct DeviceErrorRecord {
  uint32_t status;    ///< WaitStatus of the first failure; 0 while none
  int32_t peer;       ///< the rank whose signal never came (first failure)
  uint64_t expected;  ///< the value waited for
  uint64_t observed;  ///< the value last seen
  uint64_t call;      ///< the call tag of the failing wait's AbortState (0: not a collective call)
  uint32_t peerMask;  ///< every peer some wait gave up on (bit q: rank q)
  uint32_t complete;  ///< set (release) once the fields above hold the first failure
};

/// The abort flag and time bound shared by every wait of one communicator,
/// and the tag of the call a kernel runs (set per launch, so that a failure
/// names it).
struct AbortState {
  const volatile uint32_t* abortFlag;  ///< non-zero: give up at once (host-readable)
  uint64_t timeoutNs;                  ///< 0: never time out (not recommended)
  DeviceErrorRecord* errorRecord;      ///< may be null
  uint64_t call;                       ///< tag of the running call (core/health.hpp); 0: none
  /// The abort flag's copy in the GPU's own memory, which device code reads
  /// instead of abortFlag where set. abortFlag lies in mapped host memory:
  /// thousands of waiting threads reading it at once queue behind PCIe for
  /// hundreds of microseconds, which made every later call wait that long too.
  const volatile uint32_t* deviceAbortFlag;

  /// Whether the communicator was aborted (a relaxed read; it only ends waits).
  PYCCL_HOST_DEVICE bool aborted() const {
#if PYCCL_ON_DEVICE
    if (deviceAbortFlag != nullptr) return loadFlagVolatile(deviceAbortFlag) != 0;
#endif
    return abortFlag != nullptr && loadFlagVolatile(abortFlag) != 0;
  }

  /// Whether some wait of this communicator recorded a send that met a
  /// receive of another size (a relaxed read of the error record, which lies
  /// in host memory on GPUs: one thread of a block should ask, not every one).
  PYCCL_HOST_DEVICE bool mismatchRecorded() const {
    return errorRecord != nullptr &&
           loadFlagVolatile(&errorRecord->status) == static_cast<uint32_t>(WaitStatus::kMismatch);
  }

  /// Records the first failure, and adds `peer` to the set of peers waited on
  /// in vain. Safe against concurrent failing waits.
  PYCCL_HOST_DEVICE void record(WaitStatus status, int peer, uint64_t expected,
                                uint64_t observed) const {
    if (errorRecord == nullptr) return;
    const uint32_t bit = peer >= 0 && peer < 32 ? 1u << peer : 0u;
#if PYCCL_ON_DEVICE
    atomicOr(&errorRecord->peerMask, bit);
    if (atomicCAS(&errorRecord->status, 0u, static_cast<uint32_t>(status)) == 0u) {
      errorRecord->peer = peer;
      errorRecord->expected = expected;
      errorRecord->observed = observed;
      errorRecord->call = call;
      __threadfence_system();
      atomicExch(&errorRecord->complete, 1u);
    }
    __threadfence_system();
#else
    std::atomic_ref<uint32_t>(errorRecord->peerMask).fetch_or(bit);
    uint32_t zero = 0;
    if (std::atomic_ref<uint32_t>(errorRecord->status)
            .compare_exchange_strong(zero, static_cast<uint32_t>(status))) {
      errorRecord->peer = peer;
      errorRecord->expected = expected;
      errorRecord->observed = observed;
      errorRecord->call = call;
      std::atomic_ref<uint32_t>(errorRecord->complete).store(1, std::memory_order_release);
    }
#endif
  }
};

/// A wait's peer: a rank, or a function that names it when asked (a wait on
/// several peers names the one it still waits for).
template <typename Peer>
PYCCL_HOST_DEVICE int peerOf(const Peer& peer) {
  if constexpr (std::is_invocable_v<const Peer&>) {
    return peer();
  } else {
    return static_cast<int>(peer);
  }
}

/// The default `stop` of boundedPoll: never.
struct NeverStop {
  PYCCL_HOST_DEVICE bool operator()() const { return false; }
};

/// Polls `ready()` until it returns true, the abort flag rises, or the
/// timeout passes. The clock and the flag are read every `kCheckEvery` polls,
/// so the fast path stays one poll. On giving up it records (peer, expected,
/// lastSeen()) in the error record and says why. `stop()`, read as often as
/// the flag, ends the wait as aborted without a record (the caller's earlier
/// wait already gave up and was recorded). Host threads back off to yielding
/// and then short sleeps: other ranks may share the cores.
template <typename Ready, typename LastSeen, typename Peer, typename Stop = NeverStop>
PYCCL_HOST_DEVICE WaitStatus boundedPoll(Ready&& ready, LastSeen&& lastSeen, const AbortState& abort,
                                         Peer&& peer, uint64_t expected, Stop&& stop = Stop{}) {
  constexpr uint32_t kCheckEvery = 1024;
  if (ready()) return WaitStatus::kOk;
  const uint64_t start = nowNs();
  for (uint32_t polls = 1;; ++polls) {
    if (ready()) return WaitStatus::kOk;
    if (polls % kCheckEvery == 0) {
      if (stop()) return WaitStatus::kAborted;
      if (abort.aborted()) {
        abort.record(WaitStatus::kAborted, peerOf(peer), expected, lastSeen());
        return WaitStatus::kAborted;
      }
      if (pastDeadline(start, abort.timeoutNs)) {
        abort.record(WaitStatus::kTimeout, peerOf(peer), expected, lastSeen());
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
