// How the plan interpreter (interpreter.hpp) reaches its operands: chunk and
// packet addresses in the call's phase of the buffers, bounded waits that
// give up together once one has, the reduce ops, and element and vector
// access that stays within strict aliasing. Shared by the kernel and host mode.
#pragma once

#include <cstring>

#include "channels/copy_device.hpp"
#include "channels/packet_device.hpp"
#include "device/reduce_types.hpp"
#include "executor/plan_format.hpp"

namespace pyccl {
namespace plan_detail {

/// Chunk `ch` in call `call`'s phase of the buffers.
PYCCL_HOST_DEVICE char* chunkPtr(const PlanContext& c, const PlanChunk& ch, uint64_t call) {
  const int slot = c.slot[ch.rank];
  char* base = c.buffers[0][slot][ch.buffer];
  // A branch, not a select: a select would wait for the call count even where
  // the phase does not matter.
  if ((c.phasedBuffers >> (slot * 3 + ch.buffer)) & 1u) base = c.buffers[call & 1][slot][ch.buffer];
  return base + static_cast<uint64_t>(ch.index) * c.chunkBytes;
}

/// The LL packets of chunk `index` (+ `j`) of `rank`'s scratch: each chunk
/// has its own 16-byte aligned slot of 2 x (chunk bytes rounded up to 8).
PYCCL_HOST_DEVICE LL16Packet* packetPtr(const PlanContext& c, int rank, int64_t index, uint64_t call) {
  const uint64_t slot = 2 * ((c.chunkBytes + 7) / 8 * 8);
  return reinterpret_cast<LL16Packet*>(c.packets[c.slot[rank]] + (call & 1) * c.packetPhaseBytes +
                                       static_cast<uint64_t>(index) * slot);
}

/// Whether operand `k` of `op` (a source, else a destination) is a region of
/// LL packets rather than a chunk of a buffer: the packet ops' sent and
/// received sides.
PYCCL_HOST_DEVICE bool isPacketOperand(const PlanOp& op, bool source, int k) {
  switch (static_cast<PlanOpKind>(op.kind)) {
    case PlanOpKind::kPutPackets:
      return !source;
    case PlanOpKind::kUnpack:
    case PlanOpKind::kReducePackets:
      return source;
    case PlanOpKind::kReducePutPackets:  // srcs[0]: where the reduction starts; dsts[0]: the result
      return k > 0;
    default:
      return false;
  }
}

/// Every operand address of one op in both call parities (a chunk's, or for
/// packet operands their packets', isPacketOperand), and whether each
/// parity's are all 16-byte aligned. Made before the call's ops run
/// (resolveOperands; on GPUs before the PDL wait, while the previous kernel
/// finishes), so an op starts from ready addresses: resolving them and
/// checking their alignment at the op took a reduction about 800 cycles
/// (2 x H200, 1PA HB plan), and a packet op's first packet waited for its
/// resolution.
struct ResolvedOp {
  const char* srcs[2][kPlanMaxOperands];
  char* dsts[2][kPlanMaxOperands];
  uint32_t allAligned[2];
  uint32_t unused[2];  // a multiple of 16 bytes: arrays of these stay aligned
};
static_assert(sizeof(ResolvedOp) % 16 == 0, "ResolvedOp arrays keep 16-byte alignment");

/// ops[0, count) resolved into `to`, one (op, parity) per thread at a time;
/// the caller syncs the threads before any op reads them.
PYCCL_HOST_DEVICE void resolveOperands(const PlanContext& c, const PlanOp* ops, int32_t count, ResolvedOp* to,
                                       uint32_t tid, uint32_t numThreads) {
  for (uint32_t i = tid; i < 2u * static_cast<uint32_t>(count); i += numThreads) {
    const PlanOp& op = ops[i / 2];
    ResolvedOp& r = to[i / 2];
    const uint64_t parity = i & 1;  // as a call count: chunkPtr gives that parity's addresses
    uintptr_t bits = 0;
    auto address = [&](const PlanChunk& ch, bool source, int k) -> char* {
      if (isPacketOperand(op, source, k)) return reinterpret_cast<char*>(packetPtr(c, ch.rank, ch.index, parity));
      return chunkPtr(c, ch, parity);
    };
    for (int k = 0; k < op.numSrcs; ++k) {
      r.srcs[parity][k] = address(op.srcs[k], true, k);
      bits |= reinterpret_cast<uintptr_t>(r.srcs[parity][k]);
    }
    for (int k = 0; k < op.numDsts; ++k) {
      r.dsts[parity][k] = address(op.dsts[k], false, k);
      bits |= reinterpret_cast<uintptr_t>(r.dsts[parity][k]);
    }
    r.allAligned[parity] = (bits & 15) == 0 ? 1u : 0u;
  }
}

/// An op's operand addresses in call `call`: from its ResolvedOp where it has
/// one, else resolved here. src and dst are chunk operands, srcPackets and
/// dstPackets packet operands (isPacketOperand).
struct OpOperands {
  const PlanContext& c;
  const PlanOp& op;
  const ResolvedOp* resolved;
  uint64_t call;

  PYCCL_HOST_DEVICE const char* src(int k) const {
    return resolved != nullptr ? resolved->srcs[call & 1][k] : chunkPtr(c, op.srcs[k], call);
  }
  PYCCL_HOST_DEVICE char* dst(int k) const {
    return resolved != nullptr ? resolved->dsts[call & 1][k] : chunkPtr(c, op.dsts[k], call);
  }
  PYCCL_HOST_DEVICE const LL16Packet* srcPackets(int k) const {
    if (resolved != nullptr) return reinterpret_cast<const LL16Packet*>(resolved->srcs[call & 1][k]);
    return packetPtr(c, op.srcs[k].rank, op.srcs[k].index, call);
  }
  PYCCL_HOST_DEVICE LL16Packet* dstPackets(int k) const {
    if (resolved != nullptr) return reinterpret_cast<LL16Packet*>(resolved->dsts[call & 1][k]);
    return packetPtr(c, op.dsts[k].rank, op.dsts[k].index, call);
  }
  /// Every source and destination of the op is 16-byte aligned.
  PYCCL_HOST_DEVICE bool allAligned() const {
    if (resolved != nullptr) return resolved->allAligned[call & 1] != 0;
    uintptr_t bits = 0;
    for (int k = 0; k < op.numSrcs; ++k) bits |= reinterpret_cast<uintptr_t>(src(k));
    for (int k = 0; k < op.numDsts; ++k) bits |= reinterpret_cast<uintptr_t>(dst(k));
    return (bits & 15) == 0;
  }
};

/// Packet `p` of an op over `count` chunks of `perChunk` packets: chunk j,
/// packet i within it. Every packet op (put_packets, unpack, reduce_packets)
/// gives packet p to thread p mod threads, so an op that reads the packets
/// of chunks another packet op of the block just wrote, chunk for chunk, reads
/// only what the same thread wrote: lowering places no sync between them.
PYCCL_HOST_DEVICE void packetOf(uint64_t p, uint64_t perChunk, int32_t count, uint64_t* j, uint64_t* i) {
  if (count == 1) {  // the common case, without a 64-bit division
    *j = 0;
    *i = p;
  } else {
    *j = p / perChunk;
    *i = p - *j * perChunk;
  }
}

/// Whether a wait of this executor already gave up: later waits then give up
/// within a few polls, so every thread still passes every block sync
/// (uniform control flow) and the call ends quickly; the host raises the
/// error (from the communicator's error record). The flag is in device
/// memory: the error record is in host memory, a PCIe round trip per read.
PYCCL_HOST_DEVICE bool failedAlready(const PlanContext& c) { return atomicLoadRelaxed(c.failed) != 0; }

/// `status` is kOk; otherwise later waits are told to give up at once.
PYCCL_HOST_DEVICE bool waitSucceeded(const PlanContext& c, WaitStatus status) {
  if (status == WaitStatus::kOk) return true;
  atomicStoreRelaxed(c.failed, 1);
  return false;
}

/// Polls until `ready()` (bounded, abortable); false if the wait gave up or
/// an earlier one did. The failure flag is read with the abort flag, every
/// so many polls: a packet that arrives while the first poll missed is seen
/// at the next poll, not after a load of the flag.
template <typename Ready, typename LastSeen>
PYCCL_HOST_DEVICE bool planPoll(const PlanContext& c, Ready&& ready, LastSeen&& lastSeen, int peer,
                                uint64_t expected) {
  if (ready()) return true;
  return waitSucceeded(c, boundedPoll(ready, lastSeen, c.abort, peer, expected, [&] { return failedAlready(c); }));
}

/// Waits until `*counter >= target` (acquire), as planPoll.
PYCCL_HOST_DEVICE bool planSpin(const PlanContext& c, const uint64_t* counter, uint64_t target, int peer) {
  uint64_t value = 0;
  return planPoll(
      c,
      [&] {
        value = atomicLoadAcquire(counter);
        return value >= target;
      },
      [&] { return value; }, peer, target);
}

PYCCL_HOST_DEVICE uint32_t packetFlag(uint64_t call) { return static_cast<uint32_t>(call % 0xfffffffeull) + 1; }

/// Polls packet `i` of chunk `j` of the packet chunks srcs[first, first +
/// kPacketPollBatch) (of numSrcs) together (pollPacketBatch) into payloads;
/// false if the wait gave up or an earlier one did.
PYCCL_HOST_DEVICE bool pollSourcePackets(const PlanContext& c, const PlanChunk* srcs, int numSrcs, int first,
                                         uint64_t j, uint64_t i, uint64_t call, uint32_t flag,
                                         uint32_t (&payloads)[kPacketPollBatch][2]) {
  const LL16Packet* src[kPacketPollBatch];
  int peers[kPacketPollBatch];
  PYCCL_UNROLL
  for (int k = 0; k < kPacketPollBatch; ++k) {
    const bool used = first + k < numSrcs;
    const PlanChunk& ch = srcs[used ? first + k : 0];
    peers[k] = ch.rank;
    src[k] = used ? packetPtr(c, ch.rank, ch.index + j, call) + i : nullptr;
  }
  return waitSucceeded(c, pollPacketBatch(src, peers, flag, payloads, c.abort, i, [&] { return failedAlready(c); }));
}

PYCCL_HOST_DEVICE float applyReduce(int op, float a, float b) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kMin: return Reducer<ReduceOp::kMin>::apply(a, b);
    case ReduceOp::kMax: return Reducer<ReduceOp::kMax>::apply(a, b);
    case ReduceOp::kProd: return Reducer<ReduceOp::kProd>::apply(a, b);
    default: return a + b;
  }
}

/// The sum (and avg, which sums), known at compile time: a reduction loop
/// over it has no branch per element.
struct SumReduction {
  PYCCL_HOST_DEVICE float operator()(float a, float b) const { return a + b; }
};

/// Any reduce op, chosen per element (applyReduce): through a jump table on
/// GPUs, a dozen instructions and an indirect branch per element and source.
struct AnyReduction {
  int op;
  PYCCL_HOST_DEVICE float operator()(float a, float b) const { return applyReduce(op, a, b); }
};

/// fn(reduction) with the sum as a constant where `op` sums, AnyReduction
/// otherwise: two copies of a reduction loop, not one per reduce op.
template <typename Fn>
PYCCL_HOST_DEVICE void withReduction(int op, Fn&& fn) {
  const auto kind = static_cast<ReduceOp>(op);
  if (kind == ReduceOp::kSum || kind == ReduceOp::kAvg) {
    fn(SumReduction{});
  } else {
    fn(AnyReduction{op});
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

/// Element `i` of `base` set to `v`, as elementAt reads it (byte copies: a
/// vector or packet payload written through a T* would break strict aliasing).
template <typename T>
PYCCL_HOST_DEVICE void setElementAt(char* base, uint64_t i, T v) {
  char* p = base + i * sizeof(T);
  const auto* from = reinterpret_cast<const char*>(&v);
  for (uint32_t k = 0; k < sizeof(T); ++k) p[k] = from[k];
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

}  // namespace plan_detail
}  // namespace pyccl
