// The plan interpreter's packet ops (LL protocol): put_packets, unpack,
// reduce_packets and reduce_put_packets. Each has two forms:
//  - any shape: operands of several chunks and up to kPlanMaxOperands of
//    them, addressed from the op (shared memory) packet by packet;
//  - one batch, for ops over one chunk with at most kPacketPollBatch sources
//    and destinations (the library's LL plans on up to 5 ranks): the operands'
//    addresses (in the lean kernel resolved before the call where they fit,
//    ResolvedOp; see runOp) are held in registers over the packet loop, a
//    packet's start and result move as whole words, and the sum is its own
//    loop. A poll's spin loop makes the compiler reload what it reads from
//    shared memory, so the any-shape form rebuilt every operand's address
//    after every poll; resolving all kPlanMaxOperands slots the same way
//    spilled.
// Both forms give packet p to thread p mod threads (packetOf), so an op that
// reads the packets another packet op of the block wrote, chunk for chunk,
// reads only what the same thread wrote; the forms may follow each other.
#pragma once

#include "executor/plan_access.hpp"

namespace pyccl {
namespace plan_detail {

/// reduce_packets (and, with packet destinations, reduce_put_packets), any
/// shape: `out` = `start` reduced with the packets of srcs[0, numSrcs). One
/// packet index per thread: poll it in every source (kPacketPollBatch
/// sources at a time), reduce in fp32 in source order, store once, and send
/// the result from registers to every packet destination (2PA LL's
/// reduce-then-send: no store and reload in between).
template <typename T>
PYCCL_HOST_DEVICE bool reducePacketsAnyShape(const PlanContext& c, const PlanChunk& out, const PlanChunk& start,
                                             const PlanChunk* srcs, int numSrcs, const PlanChunk* dsts, int numDsts,
                                             int redOp, uint64_t call, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T) > 0 ? LL16Packet::kDataBytes / sizeof(T) : 1;
  const uint64_t perChunk = packetsFor<LL16Packet>(c.chunkBytes);
  const uint64_t packets = perChunk * out.count;
  const uint64_t chunkElems = c.chunkBytes / sizeof(T);
  const uint32_t flag = packetFlag(call);
  bool ok = true;
  char* const outBase = chunkPtr(c, out, call);
  const char* const startBase = chunkPtr(c, start, call);
  for (uint64_t p = tid; ok && p < packets; p += numThreads) {
    uint64_t j, i;
    packetOf(p, perChunk, out.count, &j, &i);
    float acc[kLanes];
    const uint32_t lanes = chunkElems - i * kLanes < kLanes ? static_cast<uint32_t>(chunkElems - i * kLanes) : kLanes;
    T* elems = reinterpret_cast<T*>(outBase + j * c.chunkBytes) + i * kLanes;  // this packet's elements
    const T* first = reinterpret_cast<const T*>(startBase + j * c.chunkBytes) + i * kLanes;
    for (uint32_t l = 0; l < lanes; ++l) acc[l] = ElementTraits<T>::toAcc(first[l]);
    for (int s0 = 0; ok && s0 < numSrcs; s0 += kPacketPollBatch) {
      uint32_t payloads[kPacketPollBatch][2];
      ok = pollSourcePackets(c, srcs, numSrcs, s0, j, i, call, flag, payloads);
      PYCCL_UNROLL
      for (int k = 0; k < kPacketPollBatch; ++k) {
        if (!ok || s0 + k >= numSrcs) break;
        for (uint32_t l = 0; l < lanes; ++l) {
          const float x = ElementTraits<T>::toAcc(elementAt<T>(reinterpret_cast<const char*>(payloads[k]), l));
          acc[l] = applyReduce(redOp, acc[l], x);
        }
      }
    }
    if (!ok) break;
    uint32_t result[2] = {0, 0};  // zero past the chunk's end, as packPayload pads
    for (uint32_t l = 0; l < lanes; ++l) {
      const T r = ElementTraits<T>::fromAcc(acc[l]);
      elems[l] = r;
      setElementAt<T>(reinterpret_cast<char*>(result), l, r);
    }
    for (int d = 0; d < numDsts; ++d) packetPtr(c, dsts[d].rank, dsts[d].index + j, call)[i].write(result, flag);
  }
  return ok;
}

/// Operands that the one-batch forms hold in registers.
constexpr int kResolvedOperands = kPacketPollBatch;

/// Whether an op over `count` chunks with `a` and `b` operands (sources,
/// destinations) takes the one-batch form.
PYCCL_HOST_DEVICE bool takesOneBatch(const PlanContext& c, int32_t count, int a, int b) {
  return !c.genericPacketOps && count == 1 && a <= kResolvedOperands && b <= kResolvedOperands;
}

/// The packet sources of a one-batch op, in registers before its packet
/// loop: where the op's srcs[first, first + n) lie in this call's phase, and
/// who sends them.
struct ResolvedPacketSources {
  const LL16Packet* from[kResolvedOperands];
  int peers[kResolvedOperands];

  PYCCL_HOST_DEVICE ResolvedPacketSources(const OpOperands& ops, int first, int n) {
    PYCCL_UNROLL
    for (int k = 0; k < kResolvedOperands; ++k) {
      from[k] = k < n ? ops.srcPackets(first + k) : nullptr;
      peers[k] = k < n ? ops.op.srcs[first + k].rank : 0;
    }
  }

  /// Polls packet `i` of every source together into payloads; false if the
  /// wait gave up or an earlier one did.
  PYCCL_HOST_DEVICE bool poll(const PlanContext& c, uint64_t i, uint32_t flag,
                              uint32_t (&payloads)[kResolvedOperands][2]) const {
    const LL16Packet* src[kResolvedOperands];
    PYCCL_UNROLL
    for (int k = 0; k < kResolvedOperands; ++k) src[k] = from[k] != nullptr ? from[k] + i : nullptr;
    return waitSucceeded(c, pollPacketBatch(src, peers, flag, payloads, c.abort, i, [&] { return failedAlready(c); }));
  }
};

/// The payload's lane `l` as fp32.
template <typename T>
PYCCL_HOST_DEVICE float laneAt(const uint32_t (&words)[2], uint32_t l) {
  return ElementTraits<T>::toAcc(detail::laneOf<T>(words, l));
}

/// One batch: the op's dsts[0] = `startBase` (one of its chunks) reduced
/// (`reduce`) with the packets of its srcs[firstSrc, firstSrc + numSrcs),
/// the result also sent as packets to its dsts[1, 1 + numDsts). Padding lanes
/// past the chunk's end are zero in the start (packPayload pads) and in every
/// packet, and every reduce op keeps zeros zero: the result's padding is
/// zero, as a sent packet's must be.
template <typename T, typename Reduce>
PYCCL_HOST_DEVICE bool reducePacketsOneBatch(const OpOperands& ops, const char* startBase, int firstSrc, int numSrcs,
                                             int numDsts, Reduce&& reduce, uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kLanes = LL16Packet::kDataBytes / sizeof(T);
  static_assert(kLanes >= 1, "an element fits in a packet");
  const PlanContext& c = ops.c;
  const uint64_t bytes = c.chunkBytes;
  const uint64_t packets = packetsFor<LL16Packet>(bytes);
  const uint32_t flag = packetFlag(ops.call);
  char* const outBase = ops.dst(0);
  const ResolvedPacketSources sources(ops, firstSrc, numSrcs);
  LL16Packet* to[kResolvedOperands];
  PYCCL_UNROLL
  for (int k = 0; k < kResolvedOperands; ++k) to[k] = k < numDsts ? ops.dstPackets(1 + k) : nullptr;
  for (uint64_t i = tid; i < packets; i += numThreads) {
    uint32_t first[2];
    packPayload<LL16Packet>(startBase, i, bytes, first);  // its load waits with the polls
    uint32_t payloads[kResolvedOperands][2];
    if (!sources.poll(c, i, flag, payloads)) return false;
    float acc[kLanes];
    PYCCL_UNROLL
    for (uint32_t l = 0; l < kLanes; ++l) acc[l] = laneAt<T>(first, l);
    PYCCL_UNROLL
    for (int k = 0; k < kResolvedOperands; ++k) {
      if (k >= numSrcs) break;
      PYCCL_UNROLL
      for (uint32_t l = 0; l < kLanes; ++l) acc[l] = reduce(acc[l], laneAt<T>(payloads[k], l));
    }
    uint32_t result[2];
    detail::packLanes<T>(acc, result);
    unpackPayload<LL16Packet>(outBase, i, bytes, result);
    PYCCL_UNROLL
    for (int d = 0; d < kResolvedOperands; ++d) {
      if (to[d] != nullptr) to[d][i].write(result, flag);
    }
  }
  return true;
}

/// reduce_packets (a second destination is where the reduction starts, the
/// plan's init) and reduce_put_packets (srcs[0] is; dsts[1..] get the result
/// as packets). The one-batch form has the sum as a constant (withReduction).
template <typename T>
PYCCL_HOST_DEVICE bool reducePackets(const OpOperands& ops, int redOp, uint32_t tid, uint32_t numThreads) {
  const PlanContext& c = ops.c;
  const PlanOp& op = ops.op;
  const uint64_t call = ops.call;
  const int puts = static_cast<PlanOpKind>(op.kind) == PlanOpKind::kReducePutPackets ? 1 : 0;
  const int startDst = op.numDsts > 1 ? 1 : 0;
  const PlanChunk& start = puts ? op.srcs[0] : op.dsts[startDst];
  const PlanChunk* srcs = op.srcs + puts;
  const int numSrcs = op.numSrcs - puts, numDsts = puts ? op.numDsts - 1 : 0;
  if (takesOneBatch(c, op.dsts[0].count, numSrcs, numDsts)) {
    bool ok = true;
    const char* startBase = puts ? ops.src(0) : ops.dst(startDst);
    withReduction(redOp, [&](auto reduce) {
      ok = reducePacketsOneBatch<T>(ops, startBase, puts, numSrcs, numDsts, reduce, tid, numThreads);
    });
    return ok;
  }
  return reducePacketsAnyShape<T>(c, op.dsts[0], start, srcs, numSrcs, op.dsts + 1, numDsts, redOp, call, tid,
                                  numThreads);
}

/// put_packets: srcs[d] to dsts[d] where the op has several sources (pairs),
/// else srcs[0] to every destination. One batch: every source's packet is
/// loaded before any is sent, so the loads wait together.
PYCCL_HOST_DEVICE void putPackets(const OpOperands& ops, uint32_t tid, uint32_t numThreads) {
  const PlanContext& c = ops.c;
  const PlanOp& op = ops.op;
  const uint64_t call = ops.call;
  const uint64_t bytes = c.chunkBytes;
  const uint64_t perChunk = packetsFor<LL16Packet>(bytes);
  const uint32_t flag = packetFlag(call);
  const bool pairs = op.numSrcs > 1;
  if (takesOneBatch(c, op.srcs[0].count, op.numSrcs, op.numDsts)) {
    const char* from[kResolvedOperands];
    LL16Packet* to[kResolvedOperands];
    PYCCL_UNROLL
    for (int d = 0; d < kResolvedOperands; ++d) {
      from[d] = d < op.numSrcs ? ops.src(d) : nullptr;
      to[d] = d < op.numDsts ? ops.dstPackets(d) : nullptr;
    }
    for (uint64_t i = tid; i < perChunk; i += numThreads) {
      uint32_t payloads[kResolvedOperands][2];
      PYCCL_UNROLL
      for (int d = 0; d < kResolvedOperands; ++d) {
        if (from[d] != nullptr) packPayload<LL16Packet>(from[d], i, bytes, payloads[d]);
      }
      PYCCL_UNROLL
      for (int d = 0; d < kResolvedOperands; ++d) {
        if (to[d] != nullptr) to[d][i].write(payloads[pairs ? d : 0], flag);
      }
    }
    return;
  }
  const uint64_t packets = perChunk * op.srcs[0].count;
  for (uint64_t p = tid; p < packets; p += numThreads) {
    uint64_t j, i;
    packetOf(p, perChunk, op.srcs[0].count, &j, &i);
    uint32_t payload[2];
    for (int d = 0; d < op.numDsts; ++d) {
      if (d == 0 || pairs) {
        packPayload<LL16Packet>(chunkPtr(c, op.srcs[pairs ? d : 0], call) + j * bytes, i, bytes, payload);
      }
      packetPtr(c, op.dsts[d].rank, op.dsts[d].index + j, call)[i].write(payload, flag);
    }
  }
}

/// unpack: dsts[k] from the packets in srcs[k], for every pair. One packet
/// index per thread, polled in every pair's source (kPacketPollBatch at a
/// time) before the next index.
PYCCL_HOST_DEVICE bool unpackPackets(const OpOperands& ops, uint32_t tid, uint32_t numThreads) {
  const PlanContext& c = ops.c;
  const PlanOp& op = ops.op;
  const uint64_t call = ops.call;
  const uint64_t bytes = c.chunkBytes;
  const uint64_t perChunk = packetsFor<LL16Packet>(bytes);
  const uint32_t flag = packetFlag(call);
  if (takesOneBatch(c, op.dsts[0].count, op.numSrcs, op.numDsts)) {
    const ResolvedPacketSources sources(ops, 0, op.numSrcs);
    char* to[kResolvedOperands];
    PYCCL_UNROLL
    for (int k = 0; k < kResolvedOperands; ++k) to[k] = k < op.numSrcs ? ops.dst(k) : nullptr;
    for (uint64_t i = tid; i < perChunk; i += numThreads) {
      uint32_t payloads[kResolvedOperands][2];
      if (!sources.poll(c, i, flag, payloads)) return false;
      PYCCL_UNROLL
      for (int k = 0; k < kResolvedOperands; ++k) {
        if (to[k] != nullptr) unpackPayload<LL16Packet>(to[k], i, bytes, payloads[k]);
      }
    }
    return true;
  }
  const uint64_t packets = perChunk * op.dsts[0].count;
  bool ok = true;
  for (uint64_t p = tid; ok && p < packets; p += numThreads) {
    uint64_t j, i;
    packetOf(p, perChunk, op.dsts[0].count, &j, &i);
    for (int k0 = 0; ok && k0 < op.numSrcs; k0 += kPacketPollBatch) {
      uint32_t payloads[kPacketPollBatch][2];
      ok = pollSourcePackets(c, op.srcs, op.numSrcs, k0, j, i, call, flag, payloads);
      PYCCL_UNROLL
      for (int k = 0; k < kPacketPollBatch; ++k) {
        if (!ok || k0 + k >= op.numSrcs) break;
        unpackPayload<LL16Packet>(chunkPtr(c, op.dsts[k0 + k], call) + j * bytes, i, bytes, payloads[k]);
      }
    }
  }
  return ok;
}

}  // namespace plan_detail
}  // namespace pyccl
