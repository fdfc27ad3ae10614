// The plan interpreter: one thread block runs its list of plan ops. The same
// body runs as the CUDA kernel (executor.cu) and, in host mode, on a CPU
// thread per thread block (executor.cpp).
//
// Synchronization, per op kind:
//  - signal: the block syncs (its writes happen before), then one thread per
//    channel adds 1 to the counter on the channel's destination rank with
//    release order;
//  - wait: one thread per channel spins (acquire, bounded, abortable) until
//    the local counter reaches calls x signals-per-call + ordinal, then the
//    block syncs;
//  - barrier: the same with a per-rank counter that every thread block of the
//    group adds to;
//  - LL packets carry a flag derived from the call count, in one of two
//    phases of the packet region by the call's parity.
// Counters only grow, so CUDA-graph replays and back-to-back calls need no
// host reset; the per-thread-block call counter lives in device memory.
#pragma once

#include <cstring>

#include "channels/copy_device.hpp"
#include "channels/memory_channel_device.hpp"  // syncBlock
#include "channels/packet_device.hpp"
#include "collectives/reduce_types.hpp"
#include "executor/plan_format.hpp"

namespace pyccl {
namespace plan_detail {

PYCCL_HOST_DEVICE char* chunkPtr(const PlanContext& c, const PlanChunk& ch) {
  return c.buffers[ch.rank][ch.buffer] + static_cast<uint64_t>(ch.index) * c.chunkBytes;
}

/// The LL packets of chunk `index` (+ `j`) of `rank`'s scratch: each chunk
/// has its own 16-byte aligned slot of 2 x (chunk bytes rounded up to 8).
PYCCL_HOST_DEVICE LL16Packet* packetPtr(const PlanContext& c, int rank, int64_t index, uint64_t call) {
  const uint64_t slot = 2 * ((c.chunkBytes + 7) / 8 * 8);
  return reinterpret_cast<LL16Packet*>(c.packets[rank] + (call & 1) * c.packetPhaseBytes +
                                       static_cast<uint64_t>(index) * slot);
}

/// Whether a wait of this communicator already gave up: later waits then
/// return at once, so every thread still passes every block sync (uniform
/// control flow) and the call ends quickly; the host raises the error.
PYCCL_HOST_DEVICE bool failedAlready(const PlanContext& c) {
  return c.abort.errorRecord != nullptr &&
         loadFlagVolatile(reinterpret_cast<const volatile uint32_t*>(&c.abort.errorRecord->status)) != 0;
}

PYCCL_HOST_DEVICE uint32_t packetFlag(uint64_t call) { return static_cast<uint32_t>(call % 0xfffffffeull) + 1; }

PYCCL_HOST_DEVICE float applyReduce(int op, float a, float b) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kMin: return Reducer<ReduceOp::kMin>::apply(a, b);
    case ReduceOp::kMax: return Reducer<ReduceOp::kMax>::apply(a, b);
    case ReduceOp::kProd: return Reducer<ReduceOp::kProd>::apply(a, b);
    default: return a + b;
  }
}

template <typename T>
PYCCL_HOST_DEVICE T elementAt(const char* base, uint64_t i) {
  T v;
  const char* p = base + i * sizeof(T);
  auto* d = reinterpret_cast<char*>(&v);
  for (uint32_t k = 0; k < sizeof(T); ++k) d[k] = p[k];
  return v;
}

/// 16-byte vector `v` of `base`. Host code goes through memcpy (which may
/// alias anything), so the optimizer cannot drop or reorder it under strict
/// aliasing; device code loads and stores the vector directly.
PYCCL_HOST_DEVICE detail::Vec16 loadVec(const char* base, uint64_t v) {
#if PYCCL_ON_DEVICE
  return reinterpret_cast<const detail::Vec16*>(base)[v];
#else
  detail::Vec16 x;
  std::memcpy(&x, base + v * 16, 16);
  return x;
#endif
}

PYCCL_HOST_DEVICE void storeVec(char* base, uint64_t v, const detail::Vec16& x) {
#if PYCCL_ON_DEVICE
  reinterpret_cast<detail::Vec16*>(base)[v] = x;
#else
  std::memcpy(base + v * 16, &x, 16);
#endif
}

/// dst[i] = reduce(dst[i] if withDst, srcs...) for the op's elements; also
/// stores the result into extra destinations.
template <typename T>
PYCCL_HOST_DEVICE void reduceElements(const PlanContext& c, const PlanOp& op, int redOp, bool withDst, char* dst,
                                      char* const* extra, int numExtra, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kVec = 16 / sizeof(T);
  const uint64_t n = static_cast<uint64_t>(op.srcs[0].count) * c.chunkBytes / sizeof(T);
  const char* srcs[kPlanMaxOperands];
  uintptr_t bits = reinterpret_cast<uintptr_t>(dst);
  for (int s = 0; s < op.numSrcs; ++s) {
    srcs[s] = chunkPtr(c, op.srcs[s]);
    bits |= reinterpret_cast<uintptr_t>(srcs[s]);
  }
  for (int e = 0; e < numExtra; ++e) bits |= reinterpret_cast<uintptr_t>(extra[e]);
  // 16-byte vectors where every pointer allows them, element by element after.
  const uint64_t vectors = (bits & 15) == 0 ? n / kVec : 0;
  for (uint64_t v = tid; v < vectors; v += numThreads) {
    float acc[kVec];
    auto accumulate = [&](const char* base, bool first) {
      const detail::Vec16 raw = loadVec(base, v);
      for (uint32_t l = 0; l < kVec; ++l) {
        // Byte copies, not a cast: reading the vector's ints as T breaks strict aliasing.
        const float x = ElementTraits<T>::toFloat(elementAt<T>(reinterpret_cast<const char*>(&raw), l));
        acc[l] = first ? x : applyReduce(redOp, acc[l], x);
      }
    };
    accumulate(withDst ? dst : srcs[0], true);
    for (int s = withDst ? 0 : 1; s < op.numSrcs; ++s) accumulate(srcs[s], false);
    detail::Vec16 packed;
    for (uint32_t l = 0; l < kVec; ++l) {
      const T r = ElementTraits<T>::fromFloat(acc[l]);
      const char* from = reinterpret_cast<const char*>(&r);
      char* to = reinterpret_cast<char*>(&packed) + l * sizeof(T);
      for (uint32_t k = 0; k < sizeof(T); ++k) to[k] = from[k];
    }
    storeVec(dst, v, packed);
    for (int e = 0; e < numExtra; ++e) storeVec(extra[e], v, packed);
  }
  for (uint64_t i = vectors * kVec + tid; i < n; i += numThreads) {
    float acc = withDst ? ElementTraits<T>::toFloat(reinterpret_cast<const T*>(dst)[i])
                        : ElementTraits<T>::toFloat(elementAt<T>(srcs[0], i));
    for (int s = withDst ? 0 : 1; s < op.numSrcs; ++s) {
      acc = applyReduce(redOp, acc, ElementTraits<T>::toFloat(elementAt<T>(srcs[s], i)));
    }
    const T r = ElementTraits<T>::fromFloat(acc);
    reinterpret_cast<T*>(dst)[i] = r;
    for (int e = 0; e < numExtra; ++e) reinterpret_cast<T*>(extra[e])[i] = r;
  }
}

/// One op of thread block `tb`; false once a wait gave up (timeout or abort).
template <typename T>
PYCCL_HOST_DEVICE bool runOp(const PlanContext& c, const PlanOp& op, int callOp, uint64_t call, uint32_t tid,
                             uint32_t numThreads) {
  const int redOp = op.reduceOp >= 0 ? op.reduceOp : callOp;
  const uint64_t bytes = (op.numSrcs > 0 ? static_cast<uint64_t>(op.srcs[0].count) : 0) * c.chunkBytes;
  switch (static_cast<PlanOpKind>(op.kind)) {
    case PlanOpKind::kCopy:
    case PlanOpKind::kPut: {
      const char* src = chunkPtr(c, op.srcs[0]);
      for (int d = 0; d < op.numDsts; ++d) copyBytes(chunkPtr(c, op.dsts[d]), src, bytes, tid, numThreads);
      return true;
    }
    case PlanOpKind::kReduce:
      reduceElements<T>(c, op, redOp, true, chunkPtr(c, op.dsts[0]), nullptr, 0, tid, numThreads);
      return true;
    case PlanOpKind::kSwitchReduce:
      reduceElements<T>(c, op, redOp, false, chunkPtr(c, op.dsts[0]), nullptr, 0, tid, numThreads);
      return true;
    case PlanOpKind::kReducePut: {
      char* extra[kPlanMaxOperands];
      for (int d = 0; d < op.numDsts; ++d) extra[d] = chunkPtr(c, op.dsts[d]);
      reduceElements<T>(c, op, redOp, false, chunkPtr(c, op.srcs[0]), extra, op.numDsts, tid, numThreads);
      return true;
    }
    case PlanOpKind::kPutPackets: {
      const uint64_t perChunk = (c.chunkBytes + LL16Packet::kDataBytes - 1) / LL16Packet::kDataBytes;
      const uint64_t packets = perChunk * op.srcs[0].count;
      for (uint64_t p = tid; p < packets; p += numThreads) {
        const uint64_t j = p / perChunk, i = p % perChunk;
        uint32_t payload[2];
        packPayload<LL16Packet>(chunkPtr(c, op.srcs[0]) + j * c.chunkBytes, i, c.chunkBytes, payload);
        packetPtr(c, op.dsts[0].rank, op.dsts[0].index + j, call)[i].write(payload, packetFlag(call));
      }
      return true;
    }
    case PlanOpKind::kUnpack:
    case PlanOpKind::kReducePackets: {
      const uint64_t perChunk = (c.chunkBytes + LL16Packet::kDataBytes - 1) / LL16Packet::kDataBytes;
      const uint64_t packets = perChunk * op.srcs[0].count;
      bool ok = true;
      for (uint64_t p = tid; ok && p < packets; p += numThreads) {
        const uint64_t j = p / perChunk, i = p % perChunk;
        const LL16Packet* src = packetPtr(c, op.srcs[0].rank, op.srcs[0].index + j, call);
        char* dst = chunkPtr(c, op.dsts[0]) + j * c.chunkBytes;
        uint32_t payload[2];
        ok = !failedAlready(c) && boundedPoll([&] { return src[i].tryRead(packetFlag(call), payload); },
                         [&] { return static_cast<uint64_t>(i); }, c.abort, op.srcs[0].rank, packetFlag(call)) ==
             WaitStatus::kOk;
        if (!ok) break;
        if (static_cast<PlanOpKind>(op.kind) == PlanOpKind::kReducePackets) {
          constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
          const auto* lanes = reinterpret_cast<const T*>(payload);
          for (uint32_t l = 0; l < kLanes && i * kLanes + l < c.chunkBytes / sizeof(T); ++l) {
            T* d = reinterpret_cast<T*>(dst) + i * kLanes + l;
            *d = ElementTraits<T>::fromFloat(
                applyReduce(redOp, ElementTraits<T>::toFloat(*d), ElementTraits<T>::toFloat(lanes[l])));
          }
        } else {
          unpackPayload<LL16Packet>(dst, i, c.chunkBytes, payload);
        }
      }
      return ok;
    }
    case PlanOpKind::kSignal:
      syncBlock();  // the block's writes happen before the releasing adds (cumulativity)
      for (int k = static_cast<int>(tid); k < op.numChannels; k += static_cast<int>(numThreads)) {
        const int ch = op.channels[k];
        atomicAddRelease(&c.counters[c.channelDst[ch]][ch], 1);
      }
      return true;
    case PlanOpKind::kWait: {
      bool ok = true;
      for (int k = static_cast<int>(tid); k < op.numChannels; k += static_cast<int>(numThreads)) {
        const int ch = op.channels[k];
        const uint64_t target = call * static_cast<uint64_t>(c.signalsPerCall[ch]) + op.ordinals[k];
        uint64_t seen = 0;
        ok = ok && !failedAlready(c) &&
             spinUntilAtLeast(&c.counters[c.rank][ch], target, c.abort, c.channelSrc[ch], &seen) == WaitStatus::kOk;
      }
      syncBlock();
      return ok;
    }
    case PlanOpKind::kBarrier: {
      syncBlock();
      bool ok = true;
      if (tid == 0) {
        const int group = op.ordinals[0];
        uint64_t* counter = &c.counters[c.rank][c.numChannels + group];
        const uint64_t target = call * static_cast<uint64_t>(c.signalsPerCall[c.numChannels + group]) +
                                static_cast<uint64_t>(op.ordinals[1]) * op.ordinals[2];
        atomicAddRelease(counter, 1);
        uint64_t seen = 0;
        ok = !failedAlready(c) && spinUntilAtLeast(counter, target, c.abort, c.rank, &seen) == WaitStatus::kOk;
      }
      syncBlock();
      return ok;
    }
    case PlanOpKind::kSync:
      syncBlock();
      return true;
    case PlanOpKind::kFlush:  // puts complete within their op here
    default:
      return true;
  }
}

}  // namespace plan_detail

namespace plan_detail {

/// All thread blocks of this rank meet at `counter` (monotonic: `calls`
/// meetings before this one).
PYCCL_HOST_DEVICE void rankBarrier(const PlanContext& c, uint64_t* counter, uint64_t call, uint32_t tid) {
  syncBlock();
  if (tid == 0) {
    atomicAddRelease(counter, 1);
    uint64_t seen = 0;
    if (!failedAlready(c)) {
      spinUntilAtLeast(counter, (call + 1) * static_cast<uint64_t>(c.numThreadBlocks), c.abort, c.rank, &seen);
    }
  }
  syncBlock();
}

}  // namespace plan_detail

/// Runs one call of the plan on thread block `tb`:
///  1. its share of the copy of the user's input into this call's input
///     staging phase, then a barrier of this rank's thread blocks;
///  2. thread block 0 tells every peer that this rank entered the call (so
///     it finished the previous one, copy-out included) and waits until every
///     peer has entered it; the other thread blocks wait for thread block 0;
///  3. the plan's ops;
///  4. a barrier of this rank's thread blocks, then its share of the copy of
///     the output staging into the user's output.
template <typename T>
PYCCL_HOST_DEVICE void runPlanThreadBlock(const PlanContext& shared, int callOp, uint32_t tb, uint32_t tid,
                                          uint32_t numThreads) {
  const uint64_t call = shared.calls[tb];
  PlanContext c = shared;
  for (int q = 0; q < c.worldSize; ++q) {
    c.buffers[q][0] += (call & 1) * c.inputPhaseBytes;
    if (c.inPlace) c.buffers[q][1] = c.buffers[q][0];
  }
  uint64_t* counters = c.counters[c.rank];
  const int world = c.worldSize;
  auto share = [&](uint64_t bytes, uint64_t* begin, uint64_t* end) {
    const uint64_t per = (bytes / c.numThreadBlocks + 15) / 16 * 16;
    *begin = tb * per < bytes ? tb * per : bytes;
    *end = *begin + per < bytes ? *begin + per : bytes;
  };
  uint64_t b = 0, e = 0;
  share(c.inputBytes, &b, &e);
  if (e > b) copyBytes(c.buffers[c.rank][0] + b, c.userInput + b, e - b, tid, numThreads);
  plan_detail::rankBarrier(c, &counters[c.entryBase + world + 1], 2 * call, tid);

  if (tb == 0) {
    syncBlock();
    if (tid == 0) {
      for (int q = 0; q < world; ++q) {
        if (q != c.rank) atomicAddRelease(&c.counters[q][c.entryBase + c.rank], 1);
      }
    }
    for (int q = static_cast<int>(tid); q < world; q += static_cast<int>(numThreads)) {
      uint64_t seen = 0;
      if (q != c.rank && !plan_detail::failedAlready(c)) {
        spinUntilAtLeast(&counters[c.entryBase + q], call + 1, c.abort, q, &seen);
      }
    }
    syncBlock();
    if (tid == 0) atomicAddRelease(&counters[c.entryBase + world], 1);
  } else {
    if (tid == 0 && !plan_detail::failedAlready(c)) {
      uint64_t seen = 0;
      spinUntilAtLeast(&counters[c.entryBase + world], call + 1, c.abort, c.rank, &seen);
    }
    syncBlock();
  }

  // No early exit on a failed wait: every thread must reach every block sync.
  for (int32_t i = c.tbOffsets[tb]; i < c.tbOffsets[tb + 1]; ++i) {
    plan_detail::runOp<T>(c, c.ops[i], callOp, call, tid, numThreads);
  }

  plan_detail::rankBarrier(c, &counters[c.entryBase + world + 1], 2 * call + 1, tid);
  share(c.outputBytes, &b, &e);
  if (e > b) copyBytes(c.userOutput + b, c.buffers[c.rank][1] + b, e - b, tid, numThreads);
  syncBlock();
  if (tid == 0) shared.calls[tb] = call + 1;
}

}  // namespace pyccl
