// The state every collective body shares: each rank's registered scratch
// buffer, mapped by every peer (MemoryChannel-style loads and stores, no
// proxy), its layout, and the per-block call counters.
//
// Collectives are launched with a fixed number of blocks per protocol; block b
// of every rank talks only to block b of the others and owns a fixed region of
// every scratch buffer. A per-block call counter in device memory gives the
// packet flags and barrier values, so CUDA-graph replays and back-to-back
// calls need no host synchronization, and its parity picks one of two scratch
// phases. A phase is rewritten only two calls later, and by then every peer
// has finished with it:
//  - LL: in every LL call each rank receives at least one packet from every
//    peer, sent from the peer's kernel for that call; the peer's kernel for
//    the call before it (same stream) has therefore completed.
//  - HB: every HB call barriers every block with every peer after staging.
//
// The same bodies run as CUDA kernels and, in host mode, on CPU threads.
//
// Below the context: the helpers the algorithm families (allreduce.cu,
// exchange.cu, fused_norm.cu, p2p.cu) share, and the one body two of them
// share, the LL reduction (reduceLL): the 1PA LL all-reduce, and with a
// per-destination stride the LL reduce-scatter.
#pragma once

#include "channels/memory_channel_device.hpp"  // copy, packets, syncBlock
#include "device/reduce_types.hpp"

namespace pyccl {

constexpr int kMaxCollectiveRanks = 8;

/// Everything a collective kernel needs; plain data, passed by value.
struct CollectiveContext {
  int rank;
  int worldSize;
  char* scratch[kMaxCollectiveRanks];  ///< every rank's scratch, mapped here (own included)
  // LL: [phase 2][source rank W][block][llBlockPackets] LL16 packets at llOffset,
  // and a second such region at ll2Offset (the gather phase of the 2PA LL all-reduce).
  uint64_t llOffset;
  uint64_t ll2Offset;
  uint64_t llBlockPackets;
  uint32_t llBlocks;        ///< blocks the LL layout has room for
  uint32_t llActiveBlocks;  ///< blocks this LL call runs on (<= llBlocks; the grid size)
  uint32_t hbBlocks;        ///< blocks the HB layout has room for (the grid of 2PA HB and the exchanges)
  uint32_t hbActiveBlocks;  ///< blocks a 1PA HB call runs on (<= hbBlocks; the grid size)
  /// HB direction (2PA HB all-reduce and the HB exchanges): 0 pulls (each
  /// rank stages its own input and the receivers read it), 1 pushes (each
  /// rank stores chunk q straight into rank q's staging; the all-reduce's
  /// owners store results into every rank's scratch).
  uint32_t hbPush;
  // HB: staging [phase 2][block][slot W][hbSubBytes], result [phase 2][block][slot 1 or W
  // (push)][hbSubBytes], barrier words [block][source rank] (uint64).
  uint64_t hbStagingOffset;
  uint64_t hbResultOffset;
  uint64_t hbBarrierOffset;
  uint64_t hbSubBytes;
  uint32_t* llCalls;  ///< [llBlocks] calls completed per block (this rank's device memory)
  uint64_t* hbCalls;  ///< [hbBlocks]
  // P2P (p2p.cu): HB rings [source rank W][block][slot][16 + p2pSliceBytes] at p2pDataOffset, LL
  // rings [source rank W][block][slot][p2pLLSlotPackets] LL16 packets at p2pLLOffset, ready counts [source
  // rank W][block] at p2pReadyOffset, ack counts [destination rank W][block] at p2pAckOffset (uint64).
  uint64_t p2pDataOffset;
  uint64_t p2pLLOffset;
  uint64_t p2pLLSlotPackets;
  uint64_t p2pLLMaxBytes;   ///< transfers of at most this many bytes go as packets
  uint64_t p2pLLLaneBytes;  ///< a multiple of 8
  uint64_t p2pReadyOffset;
  uint64_t p2pAckOffset;
  uint64_t p2pSliceBytes;  ///< a multiple of 16
  uint32_t p2pBlocks;      ///< blocks per transfer
  uint32_t p2pSlots;       ///< slots per ring
  uint64_t* p2pSent;       ///< [W][p2pBlocks] chunks sent per (destination, block) (this rank's device memory)
  uint64_t* p2pReceived;   ///< [W][p2pBlocks] chunks received per (source, block)
  AbortState abort;
};

namespace detail {

/// The LL packets that `source` sends to `owner` on `block` in `phase`.
PYCCL_HOST_DEVICE LL16Packet* llPackets(const CollectiveContext& c, int owner, uint32_t phase, int source,
                                        uint32_t block) {
  const uint64_t index = ((static_cast<uint64_t>(phase) * c.worldSize + source) * c.llBlocks + block) * c.llBlockPackets;
  return reinterpret_cast<LL16Packet*>(c.scratch[owner] + c.llOffset) + index;
}

/// The same in the second LL region.
PYCCL_HOST_DEVICE LL16Packet* ll2Packets(const CollectiveContext& c, int owner, uint32_t phase, int source,
                                         uint32_t block) {
  return reinterpret_cast<LL16Packet*>(reinterpret_cast<char*>(llPackets(c, owner, phase, source, block)) +
                                       (c.ll2Offset - c.llOffset));
}

/// Polls packet `slot` of `block`'s share of this rank's LL region (the
/// second one if `second`) in `phase` from every rank q in [q0, q0 +
/// kPacketPollBatch) with `receives(q)` (never this rank), together
/// (pollPacketBatch), into payloads[q - q0]; the others' payloads are zero.
/// Returns the mask of ranks polled (bit q - q0). `ok` turns false once a
/// wait gives up, and no wait starts while it is false.
template <typename Receives>
PYCCL_HOST_DEVICE uint32_t pollPeerPackets(const CollectiveContext& c, bool second, uint32_t phase, uint32_t block,
                                           uint64_t slot, int q0, uint32_t flag, Receives&& receives,
                                           uint32_t (&payloads)[kPacketPollBatch][2], bool& ok) {
  const LL16Packet* src[kPacketPollBatch];
  int peers[kPacketPollBatch];
  uint32_t polled = 0;
  PYCCL_UNROLL
  for (int k = 0; k < kPacketPollBatch; ++k) {
    const int q = q0 + k;
    peers[k] = q;
    payloads[k][0] = payloads[k][1] = 0;
    src[k] = nullptr;
    if (q < c.worldSize && q != c.rank && receives(q)) {
      src[k] = &(second ? ll2Packets(c, c.rank, phase, q, block) : llPackets(c, c.rank, phase, q, block))[slot];
      polled |= 1u << k;
    }
  }
  if (ok) ok = pollPacketBatch(src, peers, flag, payloads, c.abort, slot) == WaitStatus::kOk;
  return polled;
}

/// HB staging slot `slot` of `owner`'s scratch for `block` in `phase` (hbSubBytes, 16-byte aligned).
PYCCL_HOST_DEVICE char* hbStaging(const CollectiveContext& c, int owner, uint32_t phase, uint32_t block, int slot) {
  return c.scratch[owner] + c.hbStagingOffset +
         ((static_cast<uint64_t>(phase) * c.hbBlocks + block) * c.worldSize + slot) * c.hbSubBytes;
}

/// HB result slot `slot` of `owner`'s scratch for `block` in `phase`: the pull
/// layout has one slot (the owner's reduced chunk), the push layout one per
/// rank (the chunk that rank `slot` reduced).
PYCCL_HOST_DEVICE char* hbResult(const CollectiveContext& c, int owner, uint32_t phase, uint32_t block, int slot) {
  const uint64_t slots = c.hbPush ? static_cast<uint64_t>(c.worldSize) : 1;
  return c.scratch[owner] + c.hbResultOffset + ((static_cast<uint64_t>(phase) * c.hbBlocks + block) * slots + slot) *
                                                   c.hbSubBytes;
}

/// True on every thread of the block if `ok` is true on every thread (a block
/// barrier too); in host mode a block is one thread.
PYCCL_HOST_DEVICE bool blockAll(bool ok) {
#if PYCCL_ON_DEVICE
  return __syncthreads_and(ok) != 0;
#else
  return ok;
#endif
}

/// Packets [lo, hi) of `packets` that block `block` of `blocks` handles.
PYCCL_HOST_DEVICE void blockShare(uint64_t packets, uint32_t blocks, uint32_t block, uint64_t* lo, uint64_t* hi) {
  const uint64_t per = (packets + blocks - 1) / blocks;
  *lo = block * per < packets ? block * per : packets;
  *hi = *lo + per < packets ? *lo + per : packets;
}

/// Sets lane `lane` of packed words to `v` through bytes (char may alias
/// anything: the words stay readable as words under strict aliasing).
template <typename T>
PYCCL_HOST_DEVICE void setLaneOf(uint32_t* words, uint32_t lane, T v) {
  auto* bytes = reinterpret_cast<unsigned char*>(words) + lane * sizeof(T);
  const auto* src = reinterpret_cast<const unsigned char*>(&v);
  for (uint32_t k = 0; k < sizeof(T); ++k) bytes[k] = src[k];
}

/// Packet `slot` of `block`'s share of this rank's LL region in `phase`,
/// reduced over every rank in rank order in accumulator lanes (reduce_types.hpp): the peers' packets
/// polled kPacketPollBatch ranks at a time (one round trip per batch once
/// they have landed, not one per peer), this rank's from own(payload). `ok`
/// turns false, and stays so, once a wait gives up (the lanes are then
/// meaningless).
template <typename T, ReduceOp Op, typename Own>
PYCCL_HOST_DEVICE void reducePolledPacket(const CollectiveContext& c, uint32_t phase, uint32_t block, uint64_t slot,
                                          Own&& own, uint32_t flag, bool& ok,
                                          AccOf<T> (&acc)[LL16Packet::kDataBytes / sizeof(T)]) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  for (int q0 = 0; q0 < c.worldSize; q0 += kPacketPollBatch) {
    uint32_t payloads[kPacketPollBatch][2];
    pollPeerPackets(c, false, phase, block, slot, q0, flag, [](int) { return true; }, payloads, ok);
    PYCCL_UNROLL
    for (int k = 0; k < kPacketPollBatch; ++k) {
      const int q = q0 + k;
      if (q >= c.worldSize) break;
      if (q == c.rank) own(payloads[k]);
      for (uint32_t l = 0; l < kLanes; ++l) {
        const AccOf<T> v = ElementTraits<T>::toAcc(laneOf<T>(payloads[k], l));
        acc[l] = q == 0 ? v : Reducer<Op>::apply(acc[l], v);
      }
    }
  }
}

/// Barrier of block `block` with block `block` of every peer, at `value`
/// (monotonic per block). Release/acquire: this block's earlier writes are
/// visible to the peers' blocks after it, and theirs to this one. Returns the
/// same on every thread of the block: false if any wait gave up.
PYCCL_HOST_DEVICE bool blockBarrier(const CollectiveContext& c, uint32_t block, uint64_t value, uint32_t tid,
                                    uint32_t numThreads) {
  syncBlock();  // the block's writes happen before the releasing stores below (cumulativity)
  for (uint32_t q = tid; q < static_cast<uint32_t>(c.worldSize); q += numThreads) {
    if (static_cast<int>(q) == c.rank) continue;
    auto* words = reinterpret_cast<uint64_t*>(c.scratch[q] + c.hbBarrierOffset);
    atomicStoreRelease(&words[static_cast<uint64_t>(block) * c.worldSize + c.rank], value);
  }
  bool ok = true;
  for (uint32_t q = tid; q < static_cast<uint32_t>(c.worldSize); q += numThreads) {
    if (static_cast<int>(q) == c.rank) continue;
    auto* words = reinterpret_cast<uint64_t*>(c.scratch[c.rank] + c.hbBarrierOffset);
    uint64_t seen = 0;
    ok = spinUntilAtLeast(&words[static_cast<uint64_t>(block) * c.worldSize + q], value, c.abort,
                          static_cast<int>(q), &seen) == WaitStatus::kOk && ok;
  }
  return blockAll(ok);
}

/// Reduces `n` elements of the `world` 16-byte aligned sources in rank order
/// (in the accumulator of T, reduce_types.hpp) and stores the result at each of the `numDsts`
/// destinations (any alignment, in the order given). 16-byte vectors,
/// registers only.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void reduceSources(const char* const* sources, int world, uint64_t n, char* const* dsts,
                                     int numDsts, uint32_t tid, uint32_t numThreads) {
  constexpr uint64_t kVec = 16 / sizeof(T);
  const uint64_t vectors = n / kVec;
  uint32_t alignedDsts = 0;  // bit d: destination d takes 16-byte stores
  for (int d = 0; d < numDsts; ++d) {
    if ((reinterpret_cast<uintptr_t>(dsts[d]) & 15) == 0) alignedDsts |= 1u << d;
  }
  for (uint64_t v = tid; v < vectors; v += numThreads) {
    AccOf<T> acc[kVec] = {};
    for (int q = 0; q < world; ++q) {
      const Vec16 raw = reinterpret_cast<const Vec16*>(sources[q])[v];
      const auto* words = reinterpret_cast<const uint32_t*>(&raw);
      for (uint32_t l = 0; l < kVec; ++l) {
        const AccOf<T> x = ElementTraits<T>::toAcc(laneOf<T>(words, l));
        acc[l] = q == 0 ? x : Reducer<Op>::apply(acc[l], x);
      }
    }
    for (uint32_t l = 0; l < kVec; ++l) acc[l] = finishReduction<T, Op>(acc[l], world);
    const Vec16 packed = vectorOfLanes<T>(acc);
    auto store = [&](char* d, bool aligned) {
      if (aligned) {
        reinterpret_cast<Vec16*>(d)[v] = packed;
      } else {
        for (uint32_t l = 0; l < kVec; ++l) reinterpret_cast<T*>(d)[v * kVec + l] = ElementTraits<T>::fromAcc(acc[l]);
      }
    };
    for (int d = 0; d < numDsts; ++d) store(dsts[d], (alignedDsts >> d) & 1);
  }
  for (uint64_t k = vectors * kVec + tid; k < n; k += numThreads) {
    AccOf<T> acc = 0;
    for (int q = 0; q < world; ++q) {
      const AccOf<T> x = ElementTraits<T>::toAcc(reinterpret_cast<const T*>(sources[q])[k]);
      acc = q == 0 ? x : Reducer<Op>::apply(acc, x);
    }
    const T r = ElementTraits<T>::fromAcc(finishReduction<T, Op>(acc, world));
    for (int d = 0; d < numDsts; ++d) reinterpret_cast<T*>(dsts[d])[k] = r;
  }
}

/// Packet `i` (of this block's share starting at `lo`) reduced over every rank
/// in rank order (reducePolledPacket), this rank's from `mine` (`mineBytes` of data).
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void reduceArrivingPacket(const CollectiveContext& c, uint32_t phase, uint32_t block, uint64_t lo,
                                            uint64_t i, const char* mine, uint64_t mineBytes, uint32_t flag,
                                            bool& ok, AccOf<T> (&acc)[LL16Packet::kDataBytes / sizeof(T)]) {
  reducePolledPacket<T, Op>(
      c, phase, block, i - lo, [&](uint32_t (&payload)[2]) { packPayload<LL16Packet>(mine, i, mineBytes, payload); },
      flag, ok, acc);
}

}  // namespace detail

/// LL reduction of `count` elements, block `block`'s share: rank q receives
/// input + q * inStride (bytes) from every rank, and stores the reduction at
/// `output`. inStride 0 is the 1PA all-reduce; count elements apart, the
/// reduce-scatter.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void reduceLL(const CollectiveContext& c, const void* input, uint64_t inStride, void* output,
                                uint64_t count, uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  const uint32_t flag = c.llCalls[block] + 1;
  const uint32_t phase = flag & 1;
  const uint64_t bytes = count * sizeof(T);
  uint64_t lo = 0, hi = 0;
  detail::blockShare(packetsFor<LL16Packet>(bytes), c.llActiveBlocks, block, &lo, &hi);
  const auto* in = static_cast<const char*>(input);
  const char* mine = in + c.rank * inStride;
  auto* out = static_cast<T*>(output);

  // 1. Every peer's packets (its slot of their scratch).
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    uint32_t payload[2];
    if (inStride == 0) packPayload<LL16Packet>(in, i, bytes, payload);
    for (int k = 1; k < c.worldSize; ++k) {
      const int q = (c.rank + k) % c.worldSize;  // stagger the peers
      if (inStride != 0) packPayload<LL16Packet>(in + q * inStride, i, bytes, payload);
      detail::llPackets(c, q, phase, c.rank, block)[i - lo].write(payload, flag);
    }
  }
  // 2. Reduce in rank order as the peers' packets arrive.
  bool ok = true;
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    AccOf<T> acc[kLanes] = {};
    detail::reduceArrivingPacket<T, Op>(c, phase, block, lo, i, mine, bytes, flag, ok, acc);
    const uint64_t first = i * kLanes;
    for (uint32_t l = 0; l < kLanes && first + l < count; ++l) {
      out[first + l] = ElementTraits<T>::fromAcc(finishReduction<T, Op>(acc[l], c.worldSize));
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

}  // namespace pyccl
