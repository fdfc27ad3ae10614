// All-reduce bodies over every rank's registered scratch buffer, mapped by
// every peer (MemoryChannel-style loads and stores, no proxy):
//
//  - one-phase all-pairs with LL packets (1PA LL, small messages): every rank
//    writes its input as LL16 packets into each peer's scratch, then reduces
//    the packets it received; no barrier, the packet flags carry the order;
//  - two-phase all-pairs with HB (2PA HB): stage the input in scratch, barrier,
//    each rank reduces its 1/N chunk reading all peers at once (registers),
//    barrier, each rank gathers the other chunks from their owners.
//
// Both are launched with a fixed number of blocks per communicator; block b
// of every rank talks only to block b of the others and owns a fixed region
// of every scratch buffer. A per-block call counter in device memory gives
// the flags and barrier values (so CUDA-graph replays and back-to-back calls
// need no host synchronization), and its parity picks one of two scratch
// phases: a rank enters call f+2 on block b only after block b of every peer
// has finished call f, so a phase is never overwritten while still read.
// Contributions are combined in rank order on every rank: results are
// bitwise identical across ranks.
//
// The same bodies run as CUDA kernels and, in host mode, on CPU threads.
#pragma once

#include "channels/memory_channel_device.hpp"  // copy, packets, syncBlock
#include "collectives/reduce_types.hpp"

namespace pyccl {

constexpr int kMaxCollectiveRanks = 8;

/// Everything a collective kernel needs; plain data, passed by value.
struct AllReduceContext {
  int rank;
  int worldSize;
  char* scratch[kMaxCollectiveRanks];  ///< every rank's scratch, mapped here (own included)
  // LL: [phase 2][source rank W][block][llBlockPackets] LL16 packets at llOffset.
  uint64_t llOffset;
  uint64_t llBlockPackets;
  uint32_t llBlocks;
  uint32_t hbBlocks;
  // HB: staging [phase 2][block][chunk W][hbSubBytes], result [phase 2][block][hbSubBytes],
  // barrier words [block][source rank] (uint64).
  uint64_t hbStagingOffset;
  uint64_t hbResultOffset;
  uint64_t hbBarrierOffset;
  uint64_t hbSubBytes;
  uint32_t* llCalls;  ///< [llBlocks] calls completed per block (this rank's device memory)
  uint64_t* hbCalls;  ///< [hbBlocks]
  AbortState abort;
};

namespace detail {

PYCCL_HOST_DEVICE LL16Packet* llPackets(const AllReduceContext& c, int owner, uint32_t phase, int source,
                                        uint32_t block) {
  const uint64_t index = ((static_cast<uint64_t>(phase) * c.worldSize + source) * c.llBlocks + block) * c.llBlockPackets;
  return reinterpret_cast<LL16Packet*>(c.scratch[owner] + c.llOffset) + index;
}

template <typename T>
PYCCL_HOST_DEVICE T laneOf(const uint32_t* words, uint32_t lane) {
  T v;
  const auto* bytes = reinterpret_cast<const unsigned char*>(words) + lane * sizeof(T);
  auto* dst = reinterpret_cast<unsigned char*>(&v);
  for (uint32_t k = 0; k < sizeof(T); ++k) dst[k] = bytes[k];
  return v;
}

/// Barrier of block `block` with block `block` of every peer, at `value`
/// (monotonic per block). Release/acquire: this block's earlier writes are
/// visible to the peers' blocks after it, and theirs to this one.
PYCCL_HOST_DEVICE bool blockBarrier(const AllReduceContext& c, uint32_t block, uint64_t value, uint32_t tid,
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
  syncBlock();
  return ok;
}

}  // namespace detail

/// 1PA LL all-reduce of `count` elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceLL(const AllReduceContext& c, const void* input, void* output, uint64_t count,
                                   uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  const uint32_t flag = c.llCalls[block] + 1;
  const uint32_t phase = flag & 1;
  const uint64_t bytes = count * sizeof(T);
  const uint64_t packets = (bytes + LL16Packet::kDataBytes - 1) / LL16Packet::kDataBytes;
  const uint64_t per = (packets + c.llBlocks - 1) / c.llBlocks;
  const uint64_t lo = block * per;
  const uint64_t hi = lo + per < packets ? lo + per : packets;
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<T*>(output);

  // 1. This rank's packets into every peer (its slot of their scratch).
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    uint32_t payload[2];
    packPayload<LL16Packet>(in, i, bytes, payload);
    for (int k = 1; k < c.worldSize; ++k) {
      const int q = (c.rank + k) % c.worldSize;  // stagger the peers
      detail::llPackets(c, q, phase, c.rank, block)[i - lo].write(payload, flag);
    }
  }
  // 2. Reduce in rank order as the peers' packets arrive.
  bool ok = true;
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    float acc[kLanes];
    for (int q = 0; q < c.worldSize; ++q) {
      uint32_t payload[2];
      if (q == c.rank) {
        packPayload<LL16Packet>(in, i, bytes, payload);
      } else {
        const LL16Packet* p = &detail::llPackets(c, c.rank, phase, q, block)[i - lo];
        if (ok) {
          ok = boundedPoll([&] { return p->tryRead(flag, payload); }, [&] { return static_cast<uint64_t>(i); },
                           c.abort, q, flag) == WaitStatus::kOk;
        }
        if (!ok) payload[0] = payload[1] = 0;
      }
      for (uint32_t l = 0; l < kLanes; ++l) {
        const float v = ElementTraits<T>::toFloat(detail::laneOf<T>(payload, l));
        acc[l] = q == 0 ? v : Reducer<Op>::apply(acc[l], v);
      }
    }
    const uint64_t first = i * kLanes;
    for (uint32_t l = 0; l < kLanes && first + l < count; ++l) {
      out[first + l] = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc[l], c.worldSize));
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

/// Elements of `elementSize` bytes per HB call (the host splits larger messages into such pieces).
PYCCL_HOST_DEVICE uint64_t allReduceHBMaxCount(const AllReduceContext& c, uint64_t elementSize) {
  return static_cast<uint64_t>(c.worldSize) * c.hbBlocks * (c.hbSubBytes / elementSize);
}

/// 2PA HB all-reduce of `count` (<= allReduceHBMaxCount) elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceHB(const AllReduceContext& c, const void* input, void* output, uint64_t count,
                                   uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint64_t kVec = 16 / sizeof(T);
  const uint64_t call = c.hbCalls[block] + 1;
  const uint32_t phase = static_cast<uint32_t>(call & 1);
  const int world = c.worldSize;
  auto roundUp = [](uint64_t x, uint64_t m) { return (x + m - 1) / m * m; };
  const uint64_t chunkElems = roundUp((count + world - 1) / world, kVec);
  const uint64_t subElems = roundUp((chunkElems + c.hbBlocks - 1) / c.hbBlocks, kVec);
  // Sub-slice `block` of chunk `chunk`: [begin, end) elements of the message.
  auto subRange = [&](int chunk, uint64_t* begin, uint64_t* end) {
    const uint64_t chunkBegin = chunk * chunkElems;
    const uint64_t chunkEnd = chunkBegin + chunkElems < count ? chunkBegin + chunkElems : count;
    *begin = chunkBegin + block * subElems;
    *end = *begin + subElems;
    if (*begin > chunkEnd) *begin = chunkEnd;
    if (*end > chunkEnd) *end = chunkEnd;
  };
  auto staging = [&](int owner, int chunk) {
    return c.scratch[owner] + c.hbStagingOffset +
           ((static_cast<uint64_t>(phase) * c.hbBlocks + block) * world + chunk) * c.hbSubBytes;
  };
  auto result = [&](int owner) {
    return c.scratch[owner] + c.hbResultOffset + (static_cast<uint64_t>(phase) * c.hbBlocks + block) * c.hbSubBytes;
  };
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);

  // 1. Stage this block's sub-slice of every chunk.
  for (int chunk = 0; chunk < world; ++chunk) {
    uint64_t b = 0, e = 0;
    subRange(chunk, &b, &e);
    if (e > b) copyBytes(staging(c.rank, chunk), in + b * sizeof(T), (e - b) * sizeof(T), tid, numThreads);
  }
  bool ok = detail::blockBarrier(c, block, 2 * call - 1, tid, numThreads);

  // 2. Reduce this rank's chunk, reading every rank's staging at once.
  uint64_t b = 0, e = 0;
  subRange(c.rank, &b, &e);
  const uint64_t n = e - b;
  const uint64_t vectors = ok ? n / kVec : 0;
  char* mine = result(c.rank);
  const bool outAligned = ((reinterpret_cast<uintptr_t>(out + b * sizeof(T))) & 15) == 0;
  for (uint64_t v = tid; v < vectors; v += numThreads) {
    float acc[kVec];
    for (int q = 0; q < world; ++q) {
      const detail::Vec16 raw = reinterpret_cast<const detail::Vec16*>(staging(q, c.rank))[v];
      const auto* words = reinterpret_cast<const uint32_t*>(&raw);
      for (uint32_t l = 0; l < kVec; ++l) {
        const float x = ElementTraits<T>::toFloat(detail::laneOf<T>(words, l));
        acc[l] = q == 0 ? x : Reducer<Op>::apply(acc[l], x);
      }
    }
    detail::Vec16 packed;
    T* lanes = reinterpret_cast<T*>(&packed);
    for (uint32_t l = 0; l < kVec; ++l) lanes[l] = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc[l], world));
    reinterpret_cast<detail::Vec16*>(mine)[v] = packed;
    if (outAligned) {
      reinterpret_cast<detail::Vec16*>(out + b * sizeof(T))[v] = packed;
    } else {
      for (uint32_t l = 0; l < kVec; ++l) reinterpret_cast<T*>(out)[b + v * kVec + l] = lanes[l];
    }
  }
  for (uint64_t k = vectors * kVec + tid; ok && k < n; k += numThreads) {
    float acc = 0;
    for (int q = 0; q < world; ++q) {
      const float x = ElementTraits<T>::toFloat(reinterpret_cast<const T*>(staging(q, c.rank))[k]);
      acc = q == 0 ? x : Reducer<Op>::apply(acc, x);
    }
    const T r = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc, world));
    reinterpret_cast<T*>(mine)[k] = r;
    reinterpret_cast<T*>(out)[b + k] = r;
  }
  ok = detail::blockBarrier(c, block, 2 * call, tid, numThreads) && ok;

  // 3. Gather the other chunks from their owners.
  for (int k = 1; ok && k < world; ++k) {
    const int q = (c.rank + k) % world;
    uint64_t qb = 0, qe = 0;
    subRange(q, &qb, &qe);
    if (qe > qb) copyBytes(out + qb * sizeof(T), result(q), (qe - qb) * sizeof(T), tid, numThreads);
  }
  syncBlock();
  if (tid == 0) c.hbCalls[block] = call;
}

}  // namespace pyccl
