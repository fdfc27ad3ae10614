// The all-reduce algorithms (see collective_context.hpp for the scratch
// protocol), each a body that runs as a CUDA kernel and, in host mode, on CPU
// threads (one per block):
//
//  - one-phase all-pairs with LL packets (1PA LL, small messages): every rank
//    writes its input as LL16 packets into each peer's scratch, then reduces
//    the packets it received; no barrier, the packet flags carry the order.
//    With a per-destination input stride the same body is the LL
//    reduce-scatter (chunk q of the input goes to rank q);
//  - two-phase all-pairs with LL packets (2PA LL, mid-size messages): chunk q
//    of the input goes to rank q as packets, rank q reduces it and sends the
//    result to every rank as packets; half the traffic of 1PA, one more hop;
//  - one-phase all-pairs with HB (1PA HB): each rank stores its whole input
//    into every peer's staging, one barrier, and each rank reduces every
//    rank's copy locally into its output. (N-1)/N times the traffic of 2PA
//    per rank, half the barriers and no copy-out: on 2 ranks the traffic is
//    the same, so it is 2PA HB with less work (vLLM's one-stage kernel on 2
//    GPUs, with stores instead of loads);
//  - two-phase all-pairs with HB (2PA HB), in rounds of a fixed size, two
//    barriers each. Pull: stage the input in scratch, barrier, each rank
//    reduces its 1/N chunk reading all peers at once (registers), barrier,
//    each rank gathers the other chunks from their owners. Push: each rank
//    stores chunk q into rank q's scratch, barrier, rank q reduces it locally
//    and stores the result into every rank's scratch, barrier, each rank
//    copies the results out. Push sends only stores over NVLink;
//  - 2PA HB zero-copy, on symmetric buffers and graph buffers (below).
//
// Contributions are combined in rank order on every rank: results are
// bitwise identical across ranks. The LL reduction itself (reduceLL) lives
// in collective_context.hpp, as the LL reduce-scatter shares it.
//
// Zero-copy 2PA HB. When the input and the output of every rank lie in
// symmetric buffers (registered with the engine on every rank, the call at
// the same offset on every rank, as torch's symmetric memory), no byte goes
// through scratch:
//
//   barrier   every rank's input is ready (its kernel started after the work
//             before it on its stream), and every rank's output is free;
//   reduce    rank r reads chunk r of every rank's input at once (16-byte
//             loads over NVLink, in registers), reduces in rank order, and
//             stores the result into chunk r of every rank's output;
//   barrier   every rank's writes into this rank's output have landed, and
//             every peer is done reading this rank's input.
//
// One call covers the whole message (no pieces), so the two barriers are the
// only synchronization whatever the size. In place is safe: only rank r's
// thread for an element reads and then writes that element of chunk r.
//
// The same body runs on graph buffers (engine/graph_buffers.hpp): plain
// tensors of a call captured in a CUDA graph, whose every rank's pointers are
// registered after the capture and read from device memory at each replay.
// There the ranks' tensors lie at offsets of their own, so alignment is
// checked on every rank's pointers, and null pointers (a replay before the
// registration) skip the call and report it instead of reading through them.
//
// Block b of every rank barriers with block b of the others through the HB
// barrier words and call counters (collective_context.hpp); the barriers of
// all blocks together order the whole buffers, because a rank's kernel
// completes only after each of its blocks saw every peer's block of the same
// index arrive, and a peer's block arrives only after its loads and stores.
#include "algorithms/allreduce.hpp"

#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/gpu_runtime.hpp"
#include "device/kernel_launch.cuh"
#endif

namespace pyccl {

/// 1PA LL all-reduce of `count` elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceOnePhaseLL(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                           uint32_t block, uint32_t tid, uint32_t numThreads) {
  reduceLL<T, Op>(c, input, 0, output, count, block, tid, numThreads);
}

/// 2PA LL all-reduce of `count` (<= allReduceTwoPhaseLLMaxCount) elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceTwoPhaseLL(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                           uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  const uint32_t flag = c.llCalls[block] + 1;
  const uint32_t phase = flag & 1;
  const int world = c.worldSize;
  // Chunks of whole packets; the last ones may be short or empty.
  const uint64_t chunkElems = ((count + world - 1) / world + kLanes - 1) / kLanes * kLanes;
  auto chunkBytes = [&](int q) -> uint64_t {
    const uint64_t begin = q * chunkElems;
    const uint64_t end = begin + chunkElems < count ? begin + chunkElems : count;
    return end > begin ? (end - begin) * sizeof(T) : 0;
  };
  const uint64_t chunkStride = chunkElems * sizeof(T);
  uint64_t lo = 0, hi = 0;
  detail::blockShare(chunkElems / kLanes, c.llActiveBlocks, block, &lo, &hi);
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  // In place is safe: thread t alone reads and writes packet i of every chunk, in that order.

  // 1. Chunk q to rank q.
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    for (int k = 1; k < world; ++k) {
      const int q = (c.rank + k) % world;
      uint32_t payload[2];
      packPayload<LL16Packet>(in + q * chunkStride, i, chunkBytes(q), payload);
      detail::llPackets(c, q, phase, c.rank, block)[i - lo].write(payload, flag);
    }
  }
  // 2. Reduce this rank's chunk in rank order; the result to every rank.
  bool ok = true;
  const uint64_t myBytes = chunkBytes(c.rank);
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    AccOf<T> acc[kLanes] = {};
    detail::reduceArrivingPacket<T, Op>(c, phase, block, lo, i, in + c.rank * chunkStride, myBytes, flag, ok, acc);
    for (uint32_t l = 0; l < kLanes; ++l) acc[l] = finishReduction<T, Op>(acc[l], world);
    uint32_t result[2];
    detail::packLanes<T>(acc, result);
    for (int k = 1; k < world; ++k) {
      detail::ll2Packets(c, (c.rank + k) % world, phase, c.rank, block)[i - lo].write(result, flag);
    }
    unpackPayload<LL16Packet>(out + c.rank * chunkStride, i, myBytes, result);
  }
  // 3. The other ranks' results, kPacketPollBatch ranks at a time.
  for (uint64_t i = lo + tid; ok && i < hi; i += numThreads) {
    for (int q0 = 0; ok && q0 < world; q0 += kPacketPollBatch) {
      uint32_t payloads[kPacketPollBatch][2];
      const uint32_t polled =
          detail::pollPeerPackets(c, true, phase, block, i - lo, q0, flag, [](int) { return true; }, payloads, ok);
      PYCCL_UNROLL
      for (int k = 0; k < kPacketPollBatch; ++k) {
        if (ok && (polled & (1u << k))) {
          unpackPayload<LL16Packet>(out + (q0 + k) * chunkStride, i, chunkBytes(q0 + k), payloads[k]);
        }
      }
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

namespace detail {

/// Runs `round(in, out, n, call)` over the message in rounds of at most
/// `perRound` elements, each with its own call number from this block's
/// counter, which then moves on past them. Stops after a round that returns
/// false (a wait gave up; the same on every thread of the block).
template <typename T, typename Round>
PYCCL_HOST_DEVICE void runHBRounds(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                   uint64_t perRound, uint32_t block, uint32_t tid, Round&& round) {
  const uint64_t before = c.hbCalls[block];
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  uint64_t rounds = 0;
  bool ok = true;
  for (uint64_t done = 0; ok && done < count; done += perRound) {
    const uint64_t n = count - done < perRound ? count - done : perRound;
    const uint64_t at = done * sizeof(T);
    ++rounds;
    ok = round(in + at, out + at, n, before + rounds);
  }
  syncBlock();
  if (tid == 0) c.hbCalls[block] = before + rounds;
}

/// One HB round of `count` elements: chunk q (a 16-byte multiple, the last
/// one short) belongs to rank q; block b handles sub-slice b of every chunk.
struct HBRound {
  uint64_t count, chunkElems, subElems;

  PYCCL_HOST_DEVICE HBRound(const CollectiveContext& c, uint64_t n, uint64_t vec) : count(n) {
    auto roundUp = [](uint64_t x, uint64_t m) { return (x + m - 1) / m * m; };
    chunkElems = roundUp((n + c.worldSize - 1) / c.worldSize, vec);
    subElems = roundUp((chunkElems + c.hbBlocks - 1) / c.hbBlocks, vec);
  }

  /// Sub-slice `block` of chunk `chunk`: [begin, end) elements of the round.
  PYCCL_HOST_DEVICE void sub(int chunk, uint32_t block, uint64_t* begin, uint64_t* end) const {
    const uint64_t chunkBegin = chunk * chunkElems < count ? chunk * chunkElems : count;
    const uint64_t chunkEnd = chunkBegin + chunkElems < count ? chunkBegin + chunkElems : count;
    *begin = chunkBegin + block * subElems;
    *end = *begin + subElems;
    if (*begin > chunkEnd) *begin = chunkEnd;
    if (*end > chunkEnd) *end = chunkEnd;
  }
};

/// HB round `call` of this block, in either direction (c.hbPush):
///   1. this block's sub-slice of chunk q goes into slot `rank` of rank q's
///      staging (push: a store over NVLink; the own chunk stays in the input
///      when that is 16-byte aligned) or into slot q of this rank's (pull);
///   2. barrier; reduce chunk `rank` from every rank's copy of it (push: the
///      local staging; pull: loads from every rank's staging) into the output
///      and the result slots (push: slot `rank` of every peer; pull: the one
///      slot of this rank);
///   3. barrier; copy the other chunks q into the output from their results
///      (push: local slot q; pull: rank q's slot, a load).
/// Push sends only stores over NVLink and copies nothing in.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE bool allReduceTwoPhaseHBRound(const CollectiveContext& c, const char* in, char* out, uint64_t count,
                                                uint64_t call, uint32_t block, uint32_t tid, uint32_t numThreads) {
  const uint32_t phase = static_cast<uint32_t>(call & 1);
  const int world = c.worldSize;
  const bool push = c.hbPush != 0;
  const HBRound round(c, count, 16 / sizeof(T));
  const bool ownChunkInPlace = push && (reinterpret_cast<uintptr_t>(in) & 15) == 0;
  uint64_t b = 0, e = 0;
  // Staggered so that the ranks' stores spread over the links.
  for (int k = ownChunkInPlace ? 1 : 0; k < world; ++k) {
    const int q = (c.rank + k) % world;
    round.sub(q, block, &b, &e);
    char* staged = push ? hbStaging(c, q, phase, block, c.rank) : hbStaging(c, c.rank, phase, block, q);
    if (e > b) copyBytes(staged, in + b * sizeof(T), (e - b) * sizeof(T), tid, numThreads);
  }
  // Release this block's staging writes; acquire the peers'.
  bool ok = blockBarrier(c, block, 2 * call - 1, tid, numThreads);
  round.sub(c.rank, block, &b, &e);
  if (ok && e > b) {
    const char* sources[kMaxCollectiveRanks];
    for (int q = 0; q < world; ++q) {
      sources[q] = push ? hbStaging(c, c.rank, phase, block, q) : hbStaging(c, q, phase, block, c.rank);
    }
    if (ownChunkInPlace) sources[c.rank] = in + b * sizeof(T);
    char* dsts[kMaxCollectiveRanks];
    int numDsts = 0;
    dsts[numDsts++] = out + b * sizeof(T);
    if (push) {
      for (int k = 1; k < world; ++k) dsts[numDsts++] = hbResult(c, (c.rank + k) % world, phase, block, c.rank);
    } else {
      dsts[numDsts++] = hbResult(c, c.rank, phase, block, 0);
    }
    reduceSources<T, Op>(sources, world, e - b, dsts, numDsts, tid, numThreads);
  }
  // Release the result writes; acquire the peers'.
  ok = blockBarrier(c, block, 2 * call, tid, numThreads) && ok;
  for (int k = 1; ok && k < world; ++k) {
    const int q = (c.rank + k) % world;
    round.sub(q, block, &b, &e);
    const char* result = push ? hbResult(c, c.rank, phase, block, q) : hbResult(c, q, phase, block, 0);
    if (e > b) copyBytes(out + b * sizeof(T), result, (e - b) * sizeof(T), tid, numThreads);
  }
  return ok;
}

}  // namespace detail

/// 2PA HB all-reduce of `count` elements, block `block`'s share: rounds of up
/// to allReduceTwoPhaseHBMaxCount elements, each with its own call number (two
/// barriers). Blocks run their rounds independently: block b of every rank
/// meets only block b of the others, so one block's reduction overlaps
/// another's transfers. In place is safe: a round reads its own piece of the
/// input before any rank writes that piece of the output (pull), or only the
/// thread that reads an element writes it (push).
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceTwoPhaseHB(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                           uint32_t block, uint32_t tid, uint32_t numThreads) {
  detail::runHBRounds<T>(c, input, output, count, allReduceTwoPhaseHBMaxCount(c, sizeof(T)), block, tid,
                         [&](const char* in, char* out, uint64_t n, uint64_t call) {
                           return detail::allReduceTwoPhaseHBRound<T, Op>(c, in, out, n, call, block, tid, numThreads);
                         });
}

namespace detail {

/// 1PA HB round `call` of this block: its slice of the round (a 16-byte
/// multiple of it, the last one short) goes into slot `rank` of every peer's
/// staging (stores over NVLink; into this rank's own slot too when the input
/// is not 16-byte aligned); barrier; the slice reduced from every rank's copy,
/// all local, into the output.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE bool allReduceOnePhaseHBRound(const CollectiveContext& c, const char* in, char* out, uint64_t count,
                                                uint64_t call, uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint64_t kVec = 16 / sizeof(T);
  const uint32_t phase = static_cast<uint32_t>(call & 1);
  const int world = c.worldSize;
  uint64_t lo = 0, hi = 0;  // in vectors, the last one short: clamped to `count` below
  detail::blockShare((count + kVec - 1) / kVec, c.hbActiveBlocks, block, &lo, &hi);
  const uint64_t b = lo * kVec < count ? lo * kVec : count;
  const uint64_t e = hi * kVec < count ? hi * kVec : count;
  const uint64_t bytes = (e - b) * sizeof(T);
  const bool ownInPlace = (reinterpret_cast<uintptr_t>(in) & 15) == 0;
  // Staggered so that the ranks' stores spread over the links.
  for (int k = ownInPlace ? 1 : 0; k < world && bytes != 0; ++k) {
    const int q = (c.rank + k) % world;
    copyBytes(hbStaging(c, q, phase, block, c.rank), in + b * sizeof(T), bytes, tid, numThreads);
  }
  // Release this block's stores into the peers' staging; acquire theirs into this rank's. One barrier
  // is enough for the two phases: a peer writes this phase again in call + 2, after the barrier of
  // call + 1, which this rank reaches only once its reduction below is done.
  const bool ok = blockBarrier(c, block, 2 * call, tid, numThreads);
  if (ok && bytes != 0) {
    const char* sources[kMaxCollectiveRanks];
    for (int q = 0; q < world; ++q) sources[q] = hbStaging(c, c.rank, phase, block, q);
    if (ownInPlace) sources[c.rank] = in + b * sizeof(T);
    char* dst = out + b * sizeof(T);
    reduceSources<T, Op>(sources, world, e - b, &dst, 1, tid, numThreads);
  }
  return ok;
}

}  // namespace detail

/// 1PA HB all-reduce of `count` elements, block `block`'s share (of
/// c.hbActiveBlocks): rounds of up to allReduceOnePhaseHBMaxCount elements, each with
/// its own call number and one barrier. In place is safe: only the thread
/// that reads an element of the input writes that element of the output, and
/// the stores into the peers read the input before the barrier.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceOnePhaseHB(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                           uint32_t block, uint32_t tid, uint32_t numThreads) {
  detail::runHBRounds<T>(c, input, output, count, allReduceOnePhaseHBMaxCount(c, sizeof(T)), block, tid,
                         [&](const char* in, char* out, uint64_t n, uint64_t call) {
                           return detail::allReduceOnePhaseHBRound<T, Op>(c, in, out, n, call, block, tid, numThreads);
                         });
}

/// Zero-copy 2PA all-reduce of `count` elements: block `block` of `numBlocks`
/// (the HB grid), thread `tid` of `numThreads`.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceZeroCopy(const CollectiveContext& c, const SymmetricPointers& p, uint64_t count,
                                         uint32_t block, uint32_t numBlocks, uint32_t tid, uint32_t numThreads) {
  constexpr uint64_t kVec = 16 / sizeof(T);
  const uint64_t call = c.hbCalls[block] + 1;
  const int world = c.worldSize;
  // Acquire: the peers' inputs and outputs are theirs to touch from here on.
  bool ok = detail::blockBarrier(c, block, 2 * call - 1, tid, numThreads);

  const uint64_t chunkElems = ((count + world - 1) / world + kVec - 1) / kVec * kVec;
  const uint64_t begin = static_cast<uint64_t>(c.rank) * chunkElems < count ? c.rank * chunkElems : count;
  const uint64_t end = begin + chunkElems < count ? begin + chunkElems : count;
  const uint64_t offset = begin * sizeof(T);
  // The same on every rank: every rank sees every rank's pointers, and a
  // mapping keeps its owner's offset within the 16 bytes.
  uintptr_t addressBits = 0;
  bool registered = true;
  for (int q = 0; q < world; ++q) {
    addressBits |= reinterpret_cast<uintptr_t>(p.inputs[q]) | reinterpret_cast<uintptr_t>(p.outputs[q]);
    registered = registered && p.inputs[q] != nullptr && p.outputs[q] != nullptr;
  }
  const bool aligned = (addressBits & 15) == 0;
  if (!registered) {
    if (block == 0 && tid == 0) c.abort.record(WaitStatus::kUnregistered, c.rank, 0, 0);
    ok = false;
  }
  const uint64_t first = static_cast<uint64_t>(block) * numThreads + tid;
  const uint64_t stride = static_cast<uint64_t>(numBlocks) * numThreads;
  const uint64_t vectors = aligned ? (end - begin) / kVec : 0;
  if (ok) {
    for (uint64_t v = first; v < vectors; v += stride) {
      const uint64_t at = offset + v * 16;
      detail::Vec16 raw[kMaxCollectiveRanks] PYCCL_HOST_ZEROED;
      // All loads first: `world` 16-byte requests in flight per thread.
      PYCCL_UNROLL
      for (int q = 0; q < kMaxCollectiveRanks; ++q) {
        if (q < world) raw[q] = *reinterpret_cast<const detail::Vec16*>(p.inputs[q] + at);
      }
      AccOf<T> acc[kVec] PYCCL_HOST_ZEROED;
      PYCCL_UNROLL
      for (int q = 0; q < kMaxCollectiveRanks; ++q) {
        if (q >= world) break;
        const auto* words = reinterpret_cast<const uint32_t*>(&raw[q]);
        for (uint32_t l = 0; l < kVec; ++l) {
          const AccOf<T> x = ElementTraits<T>::toAcc(detail::laneOf<T>(words, l));
          acc[l] = q == 0 ? x : Reducer<Op>::apply(acc[l], x);
        }
      }
      for (uint32_t l = 0; l < kVec; ++l) acc[l] = finishReduction<T, Op>(acc[l], world);
      const detail::Vec16 packed = detail::vectorOfLanes<T>(acc);
      // Staggered so that the ranks' stores spread over the links.
      for (int k = 0; k < world; ++k) {
        const int q = (c.rank + k) % world;
        *reinterpret_cast<detail::Vec16*>(p.outputs[q] + at) = packed;
      }
    }
    // What is left: the elements past the last whole vector, or all of them when unaligned.
    for (uint64_t e = begin + vectors * kVec + first; e < end; e += stride) {
      AccOf<T> acc = 0;
      for (int q = 0; q < world; ++q) {
        const AccOf<T> x = ElementTraits<T>::toAcc(reinterpret_cast<const T*>(p.inputs[q])[e]);
        acc = q == 0 ? x : Reducer<Op>::apply(acc, x);
      }
      const T r = ElementTraits<T>::fromAcc(finishReduction<T, Op>(acc, world));
      for (int q = 0; q < world; ++q) reinterpret_cast<T*>(p.outputs[q])[e] = r;
    }
  }
  // Release this block's loads and stores; acquire the peers' stores into this output.
  ok = detail::blockBarrier(c, block, 2 * call, tid, numThreads) && ok;
  if (tid == 0) c.hbCalls[block] = call;
}

// ---------------------------------------------------------------------------
// Launch: the grid, then host mode and GPUs.
// ---------------------------------------------------------------------------

namespace {

/// The blocks a call runs on: the call's LL blocks (1PA LL, 2PA LL), 1PA HB's,
/// or the whole HB layout's (2PA HB, zero-copy included).
uint32_t allReduceBlocks(const CollectiveContext& c, AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::kOnePhaseLL:
    case AllReduceAlgorithm::kTwoPhaseLL: return c.llActiveBlocks;
    case AllReduceAlgorithm::kOnePhaseHB: return c.hbActiveBlocks;
    case AllReduceAlgorithm::kTwoPhaseHB: return c.hbBlocks;
  }
  return c.hbBlocks;
}

}  // namespace

void allReduceHost(const CollectiveContext& context, const AllReduceCall& call) {
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    runHostBlocks(allReduceBlocks(context, call.algorithm), [&](uint32_t b) {
      switch (call.algorithm) {
        case AllReduceAlgorithm::kOnePhaseLL:
          allReduceOnePhaseLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseLL:
          allReduceTwoPhaseLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kOnePhaseHB:
          allReduceOnePhaseHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseHB:
          if (call.symmetric != nullptr || call.graphSlot != nullptr) {
            // Host memory in host mode, so a graph slot reads like the pointers themselves.
            const SymmetricPointers& p = call.symmetric != nullptr ? *call.symmetric : *call.graphSlot;
            allReduceZeroCopy<T, Op>(context, p, call.count, b, context.hbBlocks, 0, 1);
            break;
          }
          allReduceTwoPhaseHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
      }
    });
  });
}

#ifdef PYCCL_WITH_CUDA
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceOnePhaseLLKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceOnePhaseLL<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceTwoPhaseLLKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceTwoPhaseLL<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceOnePhaseHBKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceOnePhaseHB<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceTwoPhaseHBKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceTwoPhaseHB<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

// `buffers` on symmetric buffers; on graph buffers `graphSlot`, in device
// memory, which the registration after the capture fills in.
template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceZeroCopyKernel(CollectiveContext context, SymmetricPointers buffers,
                                                                const SymmetricPointers* graphSlot, uint64_t count) {
  if (graphSlot == nullptr) {
    collectiveKernelPrologue();
    allReduceZeroCopy<T, Op>(context, buffers, count, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
    return;
  }
  // Written once, before the first replay, so it may be read before the wait for the prior grid.
  __shared__ SymmetricPointers fromSlot;
  constexpr uint32_t kWords = sizeof(SymmetricPointers) / sizeof(uint64_t);
  if (threadIdx.x < kWords) {
    reinterpret_cast<uint64_t*>(&fromSlot)[threadIdx.x] = reinterpret_cast<const uint64_t*>(graphSlot)[threadIdx.x];
  }
  __syncthreads();
  collectiveKernelPrologue();
  allReduceZeroCopy<T, Op>(context, fromSlot, count, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace

void allReduceDevice(const CollectiveContext& context, const AllReduceCall& call, void* stream,
                     const KernelLaunch& launch) {
  auto s = static_cast<cudaStream_t>(stream);
  const uint32_t blocks = allReduceBlocks(context, call.algorithm);
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (call.algorithm == AllReduceAlgorithm::kOnePhaseLL) {
      launchCollectiveKernel(allReduceOnePhaseLLKernel<T, Op>, blocks, launch, s, context, call.input, call.output,
                             call.count);
    } else if (call.algorithm == AllReduceAlgorithm::kTwoPhaseLL) {
      launchCollectiveKernel(allReduceTwoPhaseLLKernel<T, Op>, blocks, launch, s, context, call.input, call.output,
                             call.count);
    } else if (call.algorithm == AllReduceAlgorithm::kOnePhaseHB) {
      launchCollectiveKernel(allReduceOnePhaseHBKernel<T, Op>, blocks, launch, s, context, call.input, call.output,
                             call.count);
    } else if (call.symmetric != nullptr || call.graphSlot != nullptr) {
      launchCollectiveKernel(allReduceZeroCopyKernel<T, Op>, blocks, launch, s, context,
                             call.symmetric != nullptr ? *call.symmetric : SymmetricPointers{}, call.graphSlot,
                             call.count);
    } else {
      launchCollectiveKernel(allReduceTwoPhaseHBKernel<T, Op>, blocks, launch, s, context, call.input, call.output,
                             call.count);
    }
  });
}

void allReduceKernels(std::vector<const void*>* out) {
  forEachReduction([&]<typename T, ReduceOp Op>() {
    for (const void* k : {reinterpret_cast<const void*>(allReduceOnePhaseLLKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceTwoPhaseLLKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceOnePhaseHBKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceTwoPhaseHBKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceZeroCopyKernel<T, Op>)}) {
      out->push_back(k);
    }
  });
}
#endif  // PYCCL_WITH_CUDA

// ---------------------------------------------------------------------------
// Names (docs, algorithm=, PYCCL_ALGO, tuning tables).
// ---------------------------------------------------------------------------

namespace {

// The algorithms by name, in the order the docs and tables list them (by size).
constexpr std::pair<AllReduceAlgorithm, const char*> kAllReduceNames[] = {
    {AllReduceAlgorithm::kOnePhaseLL, "1pa_ll"},
    {AllReduceAlgorithm::kTwoPhaseLL, "2pa_ll"},
    {AllReduceAlgorithm::kOnePhaseHB, "1pa_hb"},
    {AllReduceAlgorithm::kTwoPhaseHB, "2pa_hb"},
};

}  // namespace

const std::vector<std::string>& allReduceAlgorithmNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [algorithm, name] : kAllReduceNames) v.emplace_back(name);
    return v;
  }();
  return names;
}

AllReduceAlgorithm parseAllReduceAlgorithm(const std::string& name, const char* what) {
  for (const auto& [algorithm, known] : kAllReduceNames) {
    if (name == known) return algorithm;
  }
  throw InvalidArgument(strCat("invalid argument '", what, "': '", name,
                               "' is not an all-reduce algorithm (expected 1pa_ll, 2pa_ll, 1pa_hb or 2pa_hb)"));
}

const char* allReduceAlgorithmName(AllReduceAlgorithm a) {
  for (const auto& [algorithm, name] : kAllReduceNames) {
    if (algorithm == a) return name;
  }
  return "?";
}

}  // namespace pyccl
