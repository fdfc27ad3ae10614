// All-reduce bodies (see collective_context.hpp for the scratch protocol):
//
//  - one-phase all-pairs with LL packets (1PA LL, small messages): every rank
//    writes its input as LL16 packets into each peer's scratch, then reduces
//    the packets it received; no barrier, the packet flags carry the order.
//    With a per-destination input stride the same body is the LL
//    reduce-scatter (chunk q of the input goes to rank q);
//  - two-phase all-pairs with LL packets (2PA LL, mid-size messages): chunk q
//    of the input goes to rank q as packets, rank q reduces it and sends the
//    result to every rank as packets; half the traffic of 1PA, one more hop;
//  - two-phase all-pairs with HB (2PA HB): stage the input in scratch, barrier,
//    each rank reduces its 1/N chunk reading all peers at once (registers),
//    barrier, each rank gathers the other chunks from their owners.
//
// Contributions are combined in rank order on every rank: results are
// bitwise identical across ranks.
#pragma once

#include "collectives/collective_context.hpp"

namespace pyccl {

namespace detail {

/// Packet `i` (of this block's share starting at `lo`) reduced over every rank
/// in rank order, fp32 lanes: this rank's from `mine` (`mineBytes` of data),
/// the peers' as their packets arrive in its LL region. `ok` turns false, and
/// stays so, once a wait gives up (the lanes are then meaningless).
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void reduceArrivingPacket(const CollectiveContext& c, uint32_t phase, uint32_t block, uint64_t lo,
                                            uint64_t i, const char* mine, uint64_t mineBytes, uint32_t flag,
                                            bool& ok, float (&acc)[LL16Packet::kDataBytes / sizeof(T)]) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  for (int q = 0; q < c.worldSize; ++q) {
    uint32_t payload[2];
    if (q == c.rank) {
      packPayload<LL16Packet>(mine, i, mineBytes, payload);
    } else {
      const LL16Packet* p = &llPackets(c, c.rank, phase, q, block)[i - lo];
      if (ok) {
        ok = boundedPoll([&] { return p->tryRead(flag, payload); }, [&] { return static_cast<uint64_t>(i); },
                         c.abort, q, flag) == WaitStatus::kOk;
      }
      if (!ok) payload[0] = payload[1] = 0;
    }
    for (uint32_t l = 0; l < kLanes; ++l) {
      const float v = ElementTraits<T>::toFloat(laneOf<T>(payload, l));
      acc[l] = q == 0 ? v : Reducer<Op>::apply(acc[l], v);
    }
  }
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
    float acc[kLanes] = {};
    detail::reduceArrivingPacket<T, Op>(c, phase, block, lo, i, mine, bytes, flag, ok, acc);
    const uint64_t first = i * kLanes;
    for (uint32_t l = 0; l < kLanes && first + l < count; ++l) {
      out[first + l] = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc[l], c.worldSize));
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

/// 1PA LL all-reduce of `count` elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceLL(const CollectiveContext& c, const void* input, void* output, uint64_t count,
                                   uint32_t block, uint32_t tid, uint32_t numThreads) {
  reduceLL<T, Op>(c, input, 0, output, count, block, tid, numThreads);
}

/// Elements of `elementSize` bytes per 2PA LL call (the host splits larger messages).
PYCCL_HOST_DEVICE uint64_t allReduceLL2MaxCount(const CollectiveContext& c, uint64_t llMaxBytes,
                                                uint64_t elementSize) {
  return static_cast<uint64_t>(c.worldSize) * (llMaxBytes / elementSize);
}

/// 2PA LL all-reduce of `count` (<= allReduceLL2MaxCount) elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceLL2(const CollectiveContext& c, const void* input, void* output, uint64_t count,
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
    float acc[kLanes] = {};
    detail::reduceArrivingPacket<T, Op>(c, phase, block, lo, i, in + c.rank * chunkStride, myBytes, flag, ok, acc);
    uint32_t result[2];
    T* lanes = reinterpret_cast<T*>(result);
    for (uint32_t l = 0; l < kLanes; ++l) lanes[l] = ElementTraits<T>::fromFloat(Reducer<Op>::finish(acc[l], world));
    for (int k = 1; k < world; ++k) {
      detail::ll2Packets(c, (c.rank + k) % world, phase, c.rank, block)[i - lo].write(result, flag);
    }
    unpackPayload<LL16Packet>(out + c.rank * chunkStride, i, myBytes, result);
  }
  // 3. The other ranks' results.
  for (uint64_t i = lo + tid; i < hi; i += numThreads) {
    for (int k = 1; ok && k < world; ++k) {
      const int q = (c.rank + world - k) % world;
      const LL16Packet* p = &detail::ll2Packets(c, c.rank, phase, q, block)[i - lo];
      uint32_t payload[2];
      ok = boundedPoll([&] { return p->tryRead(flag, payload); }, [&] { return static_cast<uint64_t>(i); },
                       c.abort, q, flag) == WaitStatus::kOk;
      if (ok) unpackPayload<LL16Packet>(out + q * chunkStride, i, chunkBytes(q), payload);
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

/// Elements of `elementSize` bytes per HB call (the host splits larger messages into such pieces).
PYCCL_HOST_DEVICE uint64_t allReduceHBMaxCount(const CollectiveContext& c, uint64_t elementSize) {
  return static_cast<uint64_t>(c.worldSize) * c.hbBlocks * (c.hbSubBytes / elementSize);
}

/// 2PA HB all-reduce of `count` (<= allReduceHBMaxCount) elements, block `block`'s share.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void allReduceHB(const CollectiveContext& c, const void* input, void* output, uint64_t count,
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
  auto result = [&](int owner) {
    return c.scratch[owner] + c.hbResultOffset + (static_cast<uint64_t>(phase) * c.hbBlocks + block) * c.hbSubBytes;
  };
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);

  // 1. Stage this block's sub-slice of every chunk.
  for (int chunk = 0; chunk < world; ++chunk) {
    uint64_t b = 0, e = 0;
    subRange(chunk, &b, &e);
    if (e > b) {
      copyBytes(detail::hbStaging(c, c.rank, phase, block, chunk), in + b * sizeof(T), (e - b) * sizeof(T), tid,
                numThreads);
    }
  }
  bool ok = detail::blockBarrier(c, block, 2 * call - 1, tid, numThreads);

  // 2. Reduce this rank's chunk, reading every rank's staging at once.
  uint64_t b = 0, e = 0;
  subRange(c.rank, &b, &e);
  if (ok) {
    const char* sources[kMaxCollectiveRanks];
    for (int q = 0; q < world; ++q) sources[q] = detail::hbStaging(c, q, phase, block, c.rank);
    detail::reduceSources<T, Op>(sources, world, e - b, result(c.rank), out + b * sizeof(T), tid, numThreads);
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
