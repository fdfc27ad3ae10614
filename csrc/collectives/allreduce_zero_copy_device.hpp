// Zero-copy two-phase all-pairs all-reduce (2PA HB on symmetric buffers).
//
// When the input and the output of every rank lie in symmetric buffers
// (registered with the engine on every rank, the call at the same offset on
// every rank, as torch's symmetric memory), no byte goes through scratch:
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
// The same body runs on graph buffers (graph_buffers.hpp): plain tensors of a
// call captured in a CUDA graph, whose every rank's pointers are registered
// after the capture and read from device memory at each replay. There the
// ranks' tensors lie at offsets of their own, so alignment is checked on every
// rank's pointers, and null pointers (a replay before the registration) skip
// the call and report it instead of reading through them.
//
// Block b of every rank barriers with block b of the others through the HB
// barrier words and call counters (collective_context.hpp); the barriers of
// all blocks together order the whole buffers, because a rank's kernel
// completes only after each of its blocks saw every peer's block of the same
// index arrive, and a peer's block arrives only after its loads and stores.
#pragma once

#include "collectives/collective_context.hpp"

namespace pyccl {

/// Where each rank's input and output of a zero-copy call are, mapped here
/// (this rank's own at index rank). Plain data, passed to the kernel by value.
struct SymmetricPointers {
  const char* inputs[kMaxCollectiveRanks];
  char* outputs[kMaxCollectiveRanks];
};

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
      float acc[kVec] PYCCL_HOST_ZEROED;
      PYCCL_UNROLL
      for (int q = 0; q < kMaxCollectiveRanks; ++q) {
        if (q >= world) break;
        const auto* words = reinterpret_cast<const uint32_t*>(&raw[q]);
        for (uint32_t l = 0; l < kVec; ++l) {
          const float x = ElementTraits<T>::toFloat(detail::laneOf<T>(words, l));
          acc[l] = q == 0 ? x : Reducer<Op>::apply(acc[l], x);
        }
      }
      for (uint32_t l = 0; l < kVec; ++l) acc[l] = Reducer<Op>::finish(acc[l], world);
      const detail::Vec16 packed = detail::vectorOfLanes<T>(acc);
      // Staggered so that the ranks' stores spread over the links.
      for (int k = 0; k < world; ++k) {
        const int q = (c.rank + k) % world;
        *reinterpret_cast<detail::Vec16*>(p.outputs[q] + at) = packed;
      }
    }
    // What is left: the elements past the last whole vector, or all of them when unaligned.
    for (uint64_t e = begin + vectors * kVec + first; e < end; e += stride) {
      float acc = 0;
      for (int q = 0; q < world; ++q) {
        const float x = ElementTraits<T>::toFloat(reinterpret_cast<const T*>(p.inputs[q])[e]);
        acc = q == 0 ? x : Reducer<Op>::apply(acc, x);
      }
      const T r = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc, world));
      for (int q = 0; q < world; ++q) reinterpret_cast<T*>(p.outputs[q])[e] = r;
    }
  }
  // Release this block's loads and stores; acquire the peers' stores into this output.
  ok = detail::blockBarrier(c, block, 2 * call, tid, numThreads) && ok;
  if (tid == 0) c.hbCalls[block] = call;
}

}  // namespace pyccl
