// All-pairs exchange bodies (see collective_context.hpp for the scratch
// protocol): all-gather, all-to-all and broadcast move bytes; the HB
// reduce-scatter reduces. The LL reduce-scatter is reduceLL with a
// per-destination stride (allreduce_device.hpp).
//
// A call moves one "chunk" per (source, destination) pair:
//  - all-gather: every rank sends `input` to every rank; the chunk from rank q
//    lands at output + q * outStride;
//  - all-to-all: rank r sends input + q * inStride to rank q, which stores it
//    at output + r * outStride;
//  - broadcast: `root` sends `input` to every rank's `output`;
//  - reduce-scatter: rank q receives input + q * inStride from every rank and
//    stores their reduction at `output`.
// LL: packets into the destination's scratch, flags carry the order (no
// barrier). HB, in rounds of one barrier each: pulling, each rank stages what
// it sends in its own scratch and reads what it receives from the senders';
// pushing (c.hbPush), each rank stores what it sends into the receivers'
// scratch and reads what it receives from its own.
#pragma once

#include "collectives/collective_context.hpp"

namespace pyccl {

enum class ExchangeKind : uint32_t { kAllGather = 0, kAllToAll = 1, kBroadcast = 2, kReduceScatter = 3 };

/// One exchange call; byte offsets and sizes. chunkBytes is at most the
/// protocol's per-call chunk (llMaxBytes for LL, hbBlocks * hbSubBytes for HB).
struct ExchangeArgs {
  const char* input;
  uint64_t inStride;  ///< bytes from the chunk for rank q to the one for rank q + 1 (0: one chunk for all)
  char* output;
  uint64_t outStride;  ///< bytes from the chunk from rank q to the one from rank q + 1
  uint64_t chunkBytes;
  int root;  ///< broadcast only
};

namespace detail {

PYCCL_HOST_DEVICE bool exchangeSends(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a) {
  return kind != ExchangeKind::kBroadcast || c.rank == a.root;
}

PYCCL_HOST_DEVICE bool exchangeReceivesFrom(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a,
                                            int q) {
  return q != c.rank && (kind != ExchangeKind::kBroadcast || q == a.root);
}

/// This rank's own chunk, block `block`'s byte range [begin, end): a local copy
/// (skipped when in place).
PYCCL_HOST_DEVICE void copyOwnChunk(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a,
                                    uint64_t begin, uint64_t end, uint32_t tid, uint32_t numThreads) {
  if (kind == ExchangeKind::kBroadcast && c.rank != a.root) return;
  const char* src = a.input + c.rank * a.inStride + begin;
  char* dst = a.output + (kind == ExchangeKind::kBroadcast ? 0 : c.rank * a.outStride) + begin;
  if (src != dst && end > begin) copyBytes(dst, src, end - begin, tid, numThreads);
}

}  // namespace detail

/// LL all-gather / all-to-all / broadcast, block `block`'s share.
PYCCL_HOST_DEVICE void exchangeLL(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a,
                                  uint32_t block, uint32_t tid, uint32_t numThreads) {
  constexpr uint64_t kData = LL16Packet::kDataBytes;
  const uint32_t flag = c.llCalls[block] + 1;
  const uint32_t phase = flag & 1;
  const uint64_t bytes = a.chunkBytes;
  uint64_t lo = 0, hi = 0;
  detail::blockShare(packetsFor<LL16Packet>(bytes), c.llActiveBlocks, block, &lo, &hi);

  // 1. Send. Ranks that send no data in a broadcast send one packet to every
  //    peer instead, so that every rank hears from every peer in every LL call
  //    (the scratch-phase rule of collective_context.hpp).
  if (detail::exchangeSends(kind, c, a)) {
    for (uint64_t i = lo + tid; i < hi; i += numThreads) {
      uint32_t payload[2];
      if (a.inStride == 0) packPayload<LL16Packet>(a.input, i, bytes, payload);
      for (int k = 1; k < c.worldSize; ++k) {
        const int q = (c.rank + k) % c.worldSize;
        if (a.inStride != 0) packPayload<LL16Packet>(a.input + q * a.inStride, i, bytes, payload);
        detail::llPackets(c, q, phase, c.rank, block)[i - lo].write(payload, flag);
      }
    }
  } else if (block == 0 && tid == 0) {
    const uint32_t empty[2] = {0, 0};
    for (int q = 0; q < c.worldSize; ++q) {
      if (q != c.rank) detail::llPackets(c, q, phase, c.rank, 0)[0].write(empty, flag);
    }
  }
  // In place, a thread may receive over input that another thread still sends.
  syncBlock();
  detail::copyOwnChunk(kind, c, a, lo * kData, hi * kData < bytes ? hi * kData : bytes, tid, numThreads);

  // 2. Receive, kPacketPollBatch senders at a time.
  bool ok = true;
  for (uint64_t i = lo + tid; ok && i < hi; i += numThreads) {
    for (int q0 = 0; ok && q0 < c.worldSize; q0 += kPacketPollBatch) {
      uint32_t payloads[kPacketPollBatch][2];
      const uint32_t polled = detail::pollPeerPackets(
          c, false, phase, block, i - lo, q0, flag, [&](int q) { return detail::exchangeReceivesFrom(kind, c, a, q); },
          payloads, ok);
      PYCCL_UNROLL
      for (int k = 0; k < kPacketPollBatch; ++k) {
        if (!ok || !(polled & (1u << k))) continue;
        char* to = a.output + (kind == ExchangeKind::kBroadcast ? 0 : (q0 + k) * a.outStride);
        unpackPayload<LL16Packet>(to, i, bytes, payloads[k]);
      }
    }
  }
  if (kind == ExchangeKind::kBroadcast && block == 0 && tid == 0) {
    for (int q = 0; ok && q < c.worldSize; ++q) {
      if (q == c.rank || q == a.root) continue;
      const LL16Packet* p = &detail::llPackets(c, c.rank, phase, q, 0)[0];
      uint32_t payload[2];
      ok = boundedPoll([&] { return p->tryRead(flag, payload); }, [] { return uint64_t{0}; }, c.abort, q, flag) ==
           WaitStatus::kOk;
    }
  }
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
}

/// Bytes of chunk per HB round (a kernel runs as many rounds as its chunk needs).
PYCCL_HOST_DEVICE uint64_t exchangeHBMaxChunk(const CollectiveContext& c) {
  return static_cast<uint64_t>(c.hbBlocks) * c.hbSubBytes;
}

namespace detail {

/// Block `block`'s byte range of a chunk (16-byte aligned sub-slices of at most hbSubBytes).
PYCCL_HOST_DEVICE void hbShare(const CollectiveContext& c, uint64_t chunkBytes, uint32_t block, uint64_t* begin,
                               uint64_t* end) {
  const uint64_t sub = ((chunkBytes + c.hbBlocks - 1) / c.hbBlocks + 15) / 16 * 16;
  *begin = block * sub < chunkBytes ? block * sub : chunkBytes;
  *end = *begin + sub < chunkBytes ? *begin + sub : chunkBytes;
}

/// Where block `block`'s share of the chunk that `from` sends to `to` is
/// staged in `phase`: in the sender's scratch when pulling (slot `to`, or
/// slot 0 for one chunk to all), in the receiver's when pushing (slot `from`).
PYCCL_HOST_DEVICE char* exchangeSlot(const CollectiveContext& c, const ExchangeArgs& a, uint32_t phase, uint32_t block,
                                     int from, int to) {
  if (c.hbPush) return hbStaging(c, to, phase, block, from);
  return hbStaging(c, from, phase, block, a.inStride == 0 ? 0 : to);
}

/// One HB round (`a.chunkBytes` at most exchangeHBMaxChunk) of an all-gather,
/// all-to-all or broadcast, call number `call`, block `block`'s share:
///   1. what this rank sends goes into the slots of exchangeSlot: pulling,
///      one local copy per distinct chunk; pushing, a store over NVLink per
///      receiver (nothing is staged locally);
///   2. the own chunk is copied locally; barrier (releases the staging
///      writes, acquires the peers');
///   3. what this rank receives is copied into the output from the slots
///      (pulling, loads over NVLink; pushing, local loads).
/// A slot of `phase` is rewritten two rounds later, after a barrier that
/// every reader of it reaches once it is done reading it.
PYCCL_HOST_DEVICE bool exchangeHBRound(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a,
                                       uint64_t call, uint32_t block, uint32_t tid, uint32_t numThreads) {
  const uint32_t phase = static_cast<uint32_t>(call & 1);
  const int world = c.worldSize;
  uint64_t begin = 0, end = 0;
  hbShare(c, a.chunkBytes, block, &begin, &end);
  if (end > begin && exchangeSends(kind, c, a)) {
    // Pulling one chunk for all receivers stages it once. Staggered, so that
    // the ranks' transfers spread over the links.
    const bool once = !c.hbPush && a.inStride == 0;
    for (int k = 1; k < world; ++k) {
      const int q = (c.rank + k) % world;
      copyBytes(exchangeSlot(c, a, phase, block, c.rank, q), a.input + q * a.inStride + begin, end - begin, tid,
                numThreads);
      if (once) break;
    }
  }
  copyOwnChunk(kind, c, a, begin, end, tid, numThreads);
  const bool ok = blockBarrier(c, block, 2 * call, tid, numThreads);
  for (int k = 1; ok && end > begin && k < world; ++k) {
    const int q = (c.rank + k) % world;
    if (!exchangeReceivesFrom(kind, c, a, q)) continue;
    char* dst = a.output + (kind == ExchangeKind::kBroadcast ? 0 : q * a.outStride) + begin;
    copyBytes(dst, exchangeSlot(c, a, phase, block, q, c.rank), end - begin, tid, numThreads);
  }
  return ok;
}

/// One HB round of a reduce-scatter: the chunk for rank q goes into
/// exchangeSlot (pulling, every chunk into this rank's staging, its own too,
/// so that every source is 16-byte aligned; pushing, a store into rank q's,
/// and the own chunk stays in the input where that is 16-byte aligned);
/// barrier; the chunks for this rank are reduced from the slots in rank
/// order into the output.
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE bool reduceScatterHBRound(const CollectiveContext& c, const ExchangeArgs& a, uint64_t call,
                                            uint32_t block, uint32_t tid, uint32_t numThreads) {
  const uint32_t phase = static_cast<uint32_t>(call & 1);
  const int world = c.worldSize;
  uint64_t begin = 0, end = 0;
  hbShare(c, a.chunkBytes, block, &begin, &end);
  const char* own = a.input + c.rank * a.inStride + begin;
  const bool ownInPlace = c.hbPush && (reinterpret_cast<uintptr_t>(own) & 15) == 0;
  for (int k = ownInPlace ? 1 : 0; end > begin && k < world; ++k) {
    const int q = (c.rank + k) % world;
    char* slot = c.hbPush ? hbStaging(c, q, phase, block, c.rank) : hbStaging(c, c.rank, phase, block, q);
    copyBytes(slot, a.input + q * a.inStride + begin, end - begin, tid, numThreads);
  }
  const bool ok = blockBarrier(c, block, 2 * call, tid, numThreads);
  if (ok && end > begin) {
    const char* sources[kMaxCollectiveRanks];
    for (int q = 0; q < world; ++q) {
      sources[q] = c.hbPush ? hbStaging(c, c.rank, phase, block, q) : hbStaging(c, q, phase, block, c.rank);
    }
    if (ownInPlace) sources[c.rank] = own;
    char* const dsts[1] = {a.output + begin};
    reduceSources<T, Op>(sources, world, (end - begin) / sizeof(T), dsts, 1, tid, numThreads);
  }
  return ok;
}

/// Runs `round(args, call)` over rounds of at most exchangeHBMaxChunk bytes
/// of the chunk, each with its own call number; block b of every rank meets
/// only block b of the others, so blocks run their rounds independently.
template <typename Round>
PYCCL_HOST_DEVICE void exchangeHBRounds(const CollectiveContext& c, const ExchangeArgs& a, uint32_t block,
                                        uint32_t tid, Round&& round) {
  const uint64_t perRound = exchangeHBMaxChunk(c) / 16 * 16;
  const uint64_t before = c.hbCalls[block];
  uint64_t rounds = 0;
  bool ok = true;
  // `ok` is the same on every thread of the block (blockBarrier), so all leave together.
  for (uint64_t done = 0; ok && done < a.chunkBytes; done += perRound) {
    ExchangeArgs piece = a;
    piece.input += done;
    piece.output += done;
    piece.chunkBytes = a.chunkBytes - done < perRound ? a.chunkBytes - done : perRound;
    ++rounds;
    ok = round(piece, before + rounds);
  }
  syncBlock();
  if (tid == 0) c.hbCalls[block] = before + rounds;
}

}  // namespace detail

/// HB all-gather / all-to-all / broadcast, block `block`'s share, in rounds
/// (detail::exchangeHBRound, pushing or pulling by c.hbPush).
PYCCL_HOST_DEVICE void exchangeHB(ExchangeKind kind, const CollectiveContext& c, const ExchangeArgs& a,
                                  uint32_t block, uint32_t tid, uint32_t numThreads) {
  detail::exchangeHBRounds(c, a, block, tid, [&](const ExchangeArgs& piece, uint64_t call) {
    return detail::exchangeHBRound(kind, c, piece, call, block, tid, numThreads);
  });
}

/// HB reduce-scatter of chunks of `a.chunkBytes` (one per rank), block
/// `block`'s share, in rounds (detail::reduceScatterHBRound).
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE void reduceScatterHB(const CollectiveContext& c, const ExchangeArgs& a, uint32_t block,
                                       uint32_t tid, uint32_t numThreads) {
  detail::exchangeHBRounds(c, a, block, tid, [&](const ExchangeArgs& piece, uint64_t call) {
    return detail::reduceScatterHBRound<T, Op>(c, piece, call, block, tid, numThreads);
  });
}

}  // namespace pyccl
