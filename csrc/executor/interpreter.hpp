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
//    phases of the packet region by the call's parity;
//  - to a rank on another node (PlanContext::remoteRanks), a put and a signal
//    are triggers in the proxy's FIFO, pushed by one thread after a block
//    sync (release: the block's writes happen before the proxy reads them);
//    the proxy executes triggers in order, and one connection per peer
//    carries them, so a signal lands after the data of earlier puts. Each
//    thread block flushes the FIFO before its call ends (sources reusable).
// Counters only grow, so CUDA-graph replays and back-to-back calls need no
// host reset; the per-thread-block call counter lives in device memory.
#pragma once

#include "channels/memory_channel_device.hpp"  // syncBlock
#include "executor/plan_access.hpp"
#include "executor/plan_packets.hpp"

namespace pyccl {
namespace plan_detail {

/// dst[i] = reduce(dst[i] if withDst, srcs...) for the op's elements; also
/// stores the result into dsts[firstExtra], ... `LoadBatch` inputs are loaded
/// before any is reduced (more of them take more registers). `reduce`:
/// SumReduction or AnyReduction (withReduction).
template <typename T, int LoadBatch, typename Reduce>
PYCCL_HOST_DEVICE void reduceElements(const OpOperands& ops, Reduce reduce, bool withDst, char* dst, int firstExtra,
                                      uint32_t tid, uint32_t numThreads) {
  constexpr uint32_t kVec = 16 / sizeof(T);
  const PlanOp& op = ops.op;
  const uint64_t n = static_cast<uint64_t>(op.srcs[0].count) * ops.c.chunkBytes / sizeof(T);
  // What is reduced, in order: dst (where read), then every source.
  const char* inputs[kPlanMaxOperands + 1];
  int numInputs = 0;
  if (withDst) inputs[numInputs++] = dst;
  for (int s = 0; s < op.numSrcs; ++s) inputs[numInputs++] = ops.src(s);
  char* extra[kPlanMaxOperands];
  const int numExtra = op.numDsts - firstExtra;
  for (int e = 0; e < numExtra; ++e) extra[e] = ops.dst(firstExtra + e);
  // 16-byte vectors where every pointer allows them (dst is a source or a
  // destination of the op), element by element after.
  const uint64_t vectors = ops.allAligned() ? n / kVec : 0;
  for (uint64_t v = tid; v < vectors; v += numThreads) {
    float acc[kVec] PYCCL_HOST_ZEROED;  // set by the first input (there is always one)
    // The inputs are mostly peers' memory: a batch of loads is issued before
    // any is used, so their latencies overlap (a loop that reduces as it
    // loads waits out one NVLink read per source).
    for (int k0 = 0; k0 < numInputs; k0 += LoadBatch) {
      detail::Vec16 raw[LoadBatch];
      for (int b = 0; b < LoadBatch; ++b) {
        if (k0 + b < numInputs) raw[b] = loadVec(inputs[k0 + b], v);
      }
      for (int b = 0; b < LoadBatch && k0 + b < numInputs; ++b) {
        PYCCL_UNROLL
        for (uint32_t l = 0; l < kVec; ++l) {
          const float x = detail::laneOfVector<T>(raw[b], l);
          acc[l] = k0 + b == 0 ? x : reduce(acc[l], x);
        }
      }
    }
    const detail::Vec16 packed = detail::vectorOfLanes<T>(acc);
    storeVec(dst, v, packed);
    for (int e = 0; e < numExtra; ++e) storeVec(extra[e], v, packed);
  }
  for (uint64_t i = vectors * kVec + tid; i < n; i += numThreads) {
    float acc = ElementTraits<T>::toAcc(elementAt<T>(inputs[0], i));
    for (int k = 1; k < numInputs; ++k) acc = reduce(acc, ElementTraits<T>::toAcc(elementAt<T>(inputs[k], i)));
    const T r = ElementTraits<T>::fromAcc(acc);
    reinterpret_cast<T*>(dst)[i] = r;
    for (int e = 0; e < numExtra; ++e) reinterpret_cast<T*>(extra[e])[i] = r;
  }
}

/// dsts[k] = srcs[k] for every pair of the op (`bytes` each). Where each
/// thread has few vectors per pair, it loads `LoadBatch` pairs' vectors before
/// it stores any, so reads from several peers overlap; larger copies go pair
/// by pair (copyBytes keeps four loads in flight itself).
template <int LoadBatch>
PYCCL_HOST_DEVICE void copyPairs(const OpOperands& ops, uint64_t bytes, uint32_t tid, uint32_t numThreads) {
  const char* srcs[kPlanMaxOperands];
  char* dsts[kPlanMaxOperands];
  const int n = ops.op.numSrcs;
  for (int k = 0; k < n; ++k) {
    srcs[k] = ops.src(k);
    dsts[k] = ops.dst(k);
  }
  const uint64_t vectors = bytes / 16;
  if (!ops.allAligned() || vectors >= 4ull * numThreads) {
    for (int k = 0; k < n; ++k) copyBytes(dsts[k], srcs[k], bytes, tid, numThreads);
    return;
  }
  for (uint64_t v = tid; v < vectors; v += numThreads) {
    for (int k0 = 0; k0 < n; k0 += LoadBatch) {
      detail::Vec16 raw[LoadBatch];
      for (int b = 0; b < LoadBatch; ++b) {
        if (k0 + b < n) raw[b] = loadVec(srcs[k0 + b], v);
      }
      for (int b = 0; b < LoadBatch && k0 + b < n; ++b) storeVec(dsts[k0 + b], v, raw[b]);
    }
  }
  const uint64_t done = vectors * 16;
  for (int k = 0; k < n; ++k) copyBytes(dsts[k] + done, srcs[k] + done, bytes - done, tid, numThreads);
}

/// Rank `rank` is on another node: reached only through the proxy.
PYCCL_HOST_DEVICE bool isRemote(const PlanContext& c, int rank) { return ((c.remoteRanks >> rank) & 1u) != 0; }

/// The counters of `rank` on this node (its slot's), mapped here.
PYCCL_HOST_DEVICE uint64_t* countersOf(const PlanContext& c, int rank) { return c.counters[c.slot[rank]]; }

/// This rank's counters.
PYCCL_HOST_DEVICE uint64_t* ownCounters(const PlanContext& c) { return countersOf(c, c.rank); }

/// Pushes `trigger`; false (the call fails) if the FIFO stayed full past the timeout.
PYCCL_HOST_DEVICE bool pushTrigger(const PlanContext& c, ProxyTrigger trigger, uint64_t* pos = nullptr) {
  FifoDeviceHandle fifo = c.fifo;
  const uint64_t at = fifo.push(trigger);
  if (pos != nullptr) *pos = at;
  return waitSucceeded(c, at == ~0ull ? WaitStatus::kTimeout : WaitStatus::kOk);
}

/// Queues a put of `bytes` of this rank's region at `src` to offset
/// `dstOffset` of `peer`'s region (one thread).
PYCCL_HOST_DEVICE bool proxyPut(const PlanContext& c, int peer, uint64_t dstOffset, const char* src, uint64_t bytes) {
  FifoDeviceHandle fifo = c.fifo;
  const uint64_t pos = fifo.pushTransfer(kTriggerPut, static_cast<uint32_t>(c.proxyChannel[peer]), dstOffset,
                                         static_cast<uint64_t>(src - c.regionBase), bytes);
  return waitSucceeded(c, pos == ~0ull ? WaitStatus::kTimeout : WaitStatus::kOk);
}

/// Adds 1 to counter `counter` of remote `peer` (one thread), after the puts queued before.
PYCCL_HOST_DEVICE bool proxySignal(const PlanContext& c, int peer, int64_t counter) {
  return pushTrigger(c, ProxyTrigger::make(kTriggerSignal, static_cast<uint32_t>(c.proxyChannel[peer]),
                                           static_cast<uint64_t>(counter) + 1, 0, 0));
}

/// Waits until the proxy has executed every trigger queued so far (one thread).
PYCCL_HOST_DEVICE bool proxyFlush(const PlanContext& c) {
  int peer = 0;
  while (!isRemote(c, peer)) ++peer;
  uint64_t pos = 0;
  if (!pushTrigger(c, ProxyTrigger::make(kTriggerFlush, static_cast<uint32_t>(c.proxyChannel[peer]), 0, 0, 0), &pos)) {
    return false;
  }
  FifoDeviceHandle fifo = c.fifo;
  return waitSucceeded(c, fifo.sync(pos));
}

/// Puts to other nodes go out in pieces of this size, so the proxy sends one
/// piece while the block copies the next into the send mirror (and the
/// receiving kernel applies one while the next arrives).
constexpr uint64_t kAcrossNodesPiece = 1ull << 20;

/// A put with a destination on another node. Piece by piece, the block
/// copies each source that leaves the node into the send mirror (host
/// memory, where the proxy reads it without a CUDA call), fences, and thread
/// 0 queues the transfers. Destinations on this node it copies itself.
PYCCL_HOST_DEVICE bool putAcrossNodes(const PlanContext& c, const PlanOp& op, uint64_t call, uint64_t bytes,
                                      uint32_t tid, uint32_t numThreads) {
  syncBlock();  // the block's writes of the sources happen before the copies
  auto source = [&](int d) { return chunkPtr(c, op.srcs[op.numSrcs > 1 ? d : 0], call); };
  for (int d = 0; d < op.numDsts; ++d) {
    if (!isRemote(c, op.dsts[d].rank)) copyBytes(chunkPtr(c, op.dsts[d], call), source(d), bytes, tid, numThreads);
  }
  bool ok = true;
  for (uint64_t at = 0; at < bytes; at += kAcrossNodesPiece) {
    const uint64_t n = bytes - at < kAcrossNodesPiece ? bytes - at : kAcrossNodesPiece;
    bool mirrored = false;  // one source for every destination: mirrored once
    for (int d = 0; d < op.numDsts; ++d) {
      if (!isRemote(c, op.dsts[d].rank) || mirrored) continue;
      const char* src = source(d) + at;
      copyBytes(c.sendMirror + (src - c.regionBase), src, n, tid, numThreads);
      mirrored = op.numSrcs == 1;
    }
    fenceSystem();  // every thread's mirror writes reach host memory before thread 0's trigger
    syncBlock();
    if (tid != 0) continue;
    for (int d = 0; d < op.numDsts; ++d) {
      if (!isRemote(c, op.dsts[d].rank)) continue;
      const uint64_t dst = reinterpret_cast<uint64_t>(chunkPtr(c, op.dsts[d], call)) + at;  // an offset
      ok = proxyPut(c, op.dsts[d].rank, dst, source(d) + at, n) && ok;
    }
  }
  return ok;
}

/// The counter of this rank that `peer` adds to: ranks on other nodes add to
/// the far table (host memory, written by their receiver threads).
PYCCL_HOST_DEVICE const uint64_t* counterFrom(const PlanContext& c, int peer, int index) {
  return isRemote(c, peer) ? &c.farCounters[index] : &ownCounters(c)[index];
}

/// After a wait: the puts that the op's peers on other nodes sent before
/// their signals are copied into the region (by the whole block).
PYCCL_HOST_DEVICE bool applyInboxes(const PlanContext& c, const PlanOp& op, uint32_t tid, uint32_t numThreads) {
  bool ok = true;
  uint64_t done = 0;  // peers applied already (an op may wait on one peer's channels twice)
  for (int k = 0; k < op.numChannels; ++k) {
    const int peer = op.peers[k];
    if (!isRemote(c, peer) || ((done >> peer) & 1u) != 0) continue;
    done |= 1ull << peer;
    ok = c.inbox.apply(peer, c.abort, tid, numThreads) && ok;
  }
  return ok;
}

/// A wait on channels of which some are signalled from other nodes. Thread
/// 0 polls the counters and the inboxes of those peers (bounded); whenever
/// puts have landed, the block applies them while it still waits, so the
/// copy out of host memory overlaps the pieces still arriving. Returns once
/// every counter arrived and what came before is applied.
PYCCL_HOST_DEVICE bool waitAcrossNodes(const PlanContext& c, const PlanOp& op, uint64_t call, uint32_t tid,
                                       uint32_t numThreads) {
#if PYCCL_ON_DEVICE
  __shared__ uint32_t state;  // 0: apply and poll again, 1: all arrived, 2: gave up
#else
  uint32_t state = 0;  // host mode: a block is one thread
#endif
  auto target = [&](int k) { return call * static_cast<uint64_t>(op.perCall[k]) + op.ordinals[k]; };
  while (true) {
    if (tid == 0) {
      int missing = 0;
      uint64_t seen = 0;
      bool all = false;
      auto ready = [&] {
        all = true;
        for (int k = 0; k < op.numChannels && all; ++k) {
          seen = atomicLoadAcquire(counterFrom(c, op.peers[k], op.channels[k]));
          all = seen >= target(k);
          missing = k;
        }
        if (all) return true;
        for (int k = 0; k < op.numChannels; ++k) {
          if (isRemote(c, op.peers[k]) && c.inbox.pending(op.peers[k])) return true;
        }
        return false;
      };
      const WaitStatus status = boundedPoll(ready, [&] { return seen; }, c.abort, [&] { return op.peers[missing]; },
                                            target(missing), [&] { return failedAlready(c); });
      state = !waitSucceeded(c, status) ? 2u : all ? 1u : 0u;
    }
    syncBlock();
    const uint32_t now = state;
    const bool applied = applyInboxes(c, op, tid, numThreads);  // syncs the block before state is written again
    if (now != 0) return now == 1 && applied;
  }
}

/// Op kinds of a lean plan: packet ops, copies and synchronization.
PYCCL_HOST_DEVICE bool isLeanOp(int32_t kind) {
  switch (static_cast<PlanOpKind>(kind)) {
    case PlanOpKind::kCopy:
    case PlanOpKind::kPut:
    case PlanOpKind::kPutPackets:
    case PlanOpKind::kUnpack:
    case PlanOpKind::kReducePackets:
    case PlanOpKind::kReducePutPackets:
    case PlanOpKind::kSignal:
    case PlanOpKind::kWait:
    case PlanOpKind::kBarrier:
    case PlanOpKind::kSync:
    case PlanOpKind::kFlush:
      return true;
    default:
      return false;
  }
}

/// One op of thread block `tb`; false once a wait gave up (timeout or abort).
/// `Lean`: the plan has only isLeanOp kinds and no rank on another node, so
/// the other ops and the proxy's paths are left out of the code.
template <typename T, int LoadBatch, bool Lean>
PYCCL_HOST_DEVICE bool runOp(const PlanContext& c, const PlanOp& op, const ResolvedOp* resolved, int callOp,
                             uint64_t call, uint32_t tid, uint32_t numThreads) {
  const OpOperands ops{c, op, resolved, call};
  // Packet ops start from the resolved addresses in the lean kernel only. In
  // the full kernel the same change made the HB ops 0.2-0.3 us slower (2 x
  // H200, docs/performance.md#history): one function, whose code it changed.
  const OpOperands packetOps{c, op, Lean ? resolved : nullptr, call};
  const int redOp = op.reduceOp >= 0 ? op.reduceOp : callOp;
  const uint64_t bytes = (op.numSrcs > 0 ? static_cast<uint64_t>(op.srcs[0].count) : 0) * c.chunkBytes;
  switch (static_cast<PlanOpKind>(op.kind)) {
    case PlanOpKind::kCopy:
    case PlanOpKind::kPut: {
      if (!Lean && c.remoteRanks != 0) {
        bool remote = false;
        for (int d = 0; d < op.numDsts; ++d) remote = remote || isRemote(c, op.dsts[d].rank);
        if (remote) return putAcrossNodes(c, op, call, bytes, tid, numThreads);
      }
      if (op.numSrcs > 1) {  // pairs (the DSL's multi_get and multi_put of several chunks)
        copyPairs<LoadBatch>(ops, bytes, tid, numThreads);
        return true;
      }
      const char* src = ops.src(0);
      for (int d = 0; d < op.numDsts; ++d) copyBytes(ops.dst(d), src, bytes, tid, numThreads);
      return true;
    }
    case PlanOpKind::kReduce:
      if constexpr (!Lean) {
        // dsts[0] is reduced into; the others get the result too (the DSL's copy_to).
        withReduction(redOp, [&](auto reduce) {
          reduceElements<T, LoadBatch>(ops, reduce, true, ops.dst(0), 1, tid, numThreads);
        });
      }
      return true;
    case PlanOpKind::kSwitchReduce:  // one destination; in host mode and here, loads like any reduction
    case PlanOpKind::kReduceTo:
      if constexpr (!Lean) {
        withReduction(redOp, [&](auto reduce) {
          reduceElements<T, LoadBatch>(ops, reduce, false, ops.dst(0), 1, tid, numThreads);
        });
      }
      return true;
    case PlanOpKind::kReducePut:
      if constexpr (!Lean) {
        withReduction(redOp, [&](auto reduce) {  // srcs[0] is the result; every dst gets it too
          reduceElements<T, LoadBatch>(ops, reduce, false, const_cast<char*>(ops.src(0)), 0, tid, numThreads);
        });
      }
      return true;
    case PlanOpKind::kPutPackets:
      putPackets(packetOps, tid, numThreads);
      return true;
    case PlanOpKind::kUnpack:
      return unpackPackets(packetOps, tid, numThreads);
    case PlanOpKind::kReducePackets:
    case PlanOpKind::kReducePutPackets:  // one call site: one inlined copy of the body
      return reducePackets<T>(packetOps, redOp, tid, numThreads);
    case PlanOpKind::kSignal:
      syncBlock();  // the block's writes happen before the releasing adds (cumulativity)
      for (int k = static_cast<int>(tid); k < op.numChannels; k += static_cast<int>(numThreads)) {
        if (!Lean && isRemote(c, op.peers[k])) {
          proxySignal(c, op.peers[k], op.channels[k]);
        } else {
          // One thread block signals a channel (checked when packed), so the
          // count the waits expect is stored, not added: a posted store where
          // an atomic add may wait for its reply across NVLink.
          atomicStoreRelease(&countersOf(c, op.peers[k])[op.channels[k]],
                             call * static_cast<uint64_t>(op.perCall[k]) + op.ordinals[k]);
        }
      }
      return true;
    case PlanOpKind::kWait: {
      if (!Lean && c.remoteRanks != 0) {
        bool far = false;
        for (int k = 0; k < op.numChannels; ++k) far = far || isRemote(c, op.peers[k]);
        if (far) return waitAcrossNodes(c, op, call, tid, numThreads);
      }
      bool ok = true;
      for (int k = static_cast<int>(tid); k < op.numChannels; k += static_cast<int>(numThreads)) {
        const uint64_t target = call * static_cast<uint64_t>(op.perCall[k]) + op.ordinals[k];
        ok = ok && planSpin(c, &ownCounters(c)[op.channels[k]], target, op.peers[k]);
      }
      syncBlock();
      return ok;
    }
    case PlanOpKind::kBarrier: {
      syncBlock();
      bool ok = true;
      if (tid == 0) {
        const int group = op.ordinals[0];
        uint64_t* counter = &ownCounters(c)[c.numChannels + group];
        const uint64_t target = call * static_cast<uint64_t>(op.perCall[0]) +
                                static_cast<uint64_t>(op.ordinals[1]) * op.ordinals[2];
        atomicAddRelease(counter, 1);
        ok = planSpin(c, counter, target, c.rank);
      }
      syncBlock();
      return ok;
    }
    case PlanOpKind::kSync:
      syncBlock();
      return true;
    case PlanOpKind::kFlush: {  // puts by loads and stores complete within their op
      if (Lean || c.remoteRanks == 0) return true;
      syncBlock();
      bool ok = true;
      if (tid == 0) ok = proxyFlush(c);
      syncBlock();
      return ok;
    }
    default:
      return true;
  }
}

}  // namespace plan_detail

namespace plan_detail {

/// All thread blocks of this rank meet at `counter` (monotonic: every block
/// of the rank has passed `passed` such barriers before this one).
PYCCL_HOST_DEVICE void rankBarrier(const PlanContext& c, uint64_t* counter, uint64_t passed, uint32_t tid) {
  syncBlock();
  if (tid == 0) {
    atomicAddRelease(counter, 1);
    planSpin(c, counter, (passed + 1) * static_cast<uint64_t>(c.numThreadBlocks), c.rank);
  }
  syncBlock();
}

/// [begin, end) of `bytes`: thread block `tb`'s share of a copy made by all of them.
PYCCL_HOST_DEVICE void blockShare(const PlanContext& c, uint32_t tb, uint64_t bytes, uint64_t* begin, uint64_t* end) {
  const uint64_t per = (bytes / c.numThreadBlocks + 15) / 16 * 16;
  *begin = tb * per < bytes ? tb * per : bytes;
  *end = *begin + per < bytes ? *begin + per : bytes;
}

/// The ranks meet: thread block 0 tells every peer that this rank entered the
/// call (so it finished the previous one, copy-out included) and waits until
/// every peer has entered it; the other thread blocks wait for thread block 0.
PYCCL_HOST_DEVICE void entryBarrier(const PlanContext& c, uint64_t call, uint32_t tb, uint32_t tid,
                                    uint32_t numThreads) {
  uint64_t* counters = ownCounters(c);
  const int world = c.worldSize;
  if (tb == 0) {
    syncBlock();
    if (tid == 0) {
      for (int q = 0; q < world; ++q) {
        if (q == c.rank) continue;
        if (isRemote(c, q)) {
          proxySignal(c, q, c.entryBase + c.rank);
        } else {
          atomicAddRelease(&countersOf(c, q)[c.entryBase + c.rank], 1);
        }
      }
    }
    for (int q = static_cast<int>(tid); q < world; q += static_cast<int>(numThreads)) {
      if (q != c.rank) planSpin(c, counterFrom(c, q, c.entryBase + q), call + 1, q);
    }
    syncBlock();
    if (tid == 0) atomicAddRelease(&counters[c.entryBase + world], 1);
  } else {
    if (tid == 0) planSpin(c, &counters[c.entryBase + world], call + 1, c.rank);
    syncBlock();
  }
}

}  // namespace plan_detail

/// Shared memory a plan kernel's block gives its ops (within the default
/// per-block limit with the context, so no opt-in is needed).
constexpr uint64_t kStagedOpsBytes = 44 << 10;

/// Whether every block's ops fit in shared memory at once: then ops run from
/// there; else one op at a time through a window.
PYCCL_HOST_DEVICE constexpr bool opsFit(int maxOpsPerBlock) {
  return static_cast<uint64_t>(maxOpsPerBlock) * sizeof(PlanOp) <= kStagedOpsBytes;
}

/// Whether their resolved addresses fit beside them too: then every op starts
/// from ready addresses (in host mode too, so that CI runs the same path);
/// else each op resolves its own.
PYCCL_HOST_DEVICE constexpr bool addressesFit(int maxOpsPerBlock) {
  return static_cast<uint64_t>(maxOpsPerBlock) * (sizeof(PlanOp) + sizeof(plan_detail::ResolvedOp)) <=
         kStagedOpsBytes;
}

/// Runs call `call` of the plan (the thread block's count of completed calls,
/// read after the previous kernel finished) on thread block `tb`, whose
/// `count` ops `opAt(i)` returns (a `const PlanOp&`, in order), with their
/// chunk addresses in `resolved[i]` where `resolved` is not null
/// (resolveOperands; else each op resolves its own):
///  1. where the input is staged (or an in-place plan works on the user's
///     output), its share of the input copy, then a barrier of this rank's
///     thread blocks;
///  2. where the plan needs it, the ranks meet (entry barrier);
///  3. the plan's ops;
///  4. where the output is staged, a barrier of this rank's thread blocks,
///     then its share of the copy into the user's output.
/// Without staging and entry barrier a call is only the plan's ops, which is
/// what the hand-written kernels of the same algorithm do. `LoadBatch`: see
/// reduceElements; `Lean`: see runOp.
template <typename T, int LoadBatch, bool Lean, typename OpAt>
PYCCL_HOST_DEVICE void runPlanCall(const PlanContext& c, OpAt&& opAt, const plan_detail::ResolvedOp* resolved,
                                   int32_t count, int callOp, uint32_t tb, uint64_t call, uint32_t tid,
                                   uint32_t numThreads) {
  const bool stagedIn = c.copiesInput;  // from the host: no branch here waits for the call count
  // Only calls that stage pass rank barriers: the others never read the count.
  uint64_t barriers = stagedIn || c.outputStaged ? c.rankBarriers[tb] : 0;
  uint64_t* rankCounter = &plan_detail::ownCounters(c)[c.entryBase + c.worldSize + 1];
  uint64_t b = 0, e = 0;
  if (stagedIn) {
    char* input = c.buffers[call & 1][c.slot[c.rank]][0];
    plan_detail::blockShare(c, tb, c.inputBytes, &b, &e);
    if (e > b) copyBytes(input + b, c.userInput + b, e - b, tid, numThreads);
    plan_detail::rankBarrier(c, rankCounter, barriers++, tid);
  }
  if (c.entryBarrier) plan_detail::entryBarrier(c, call, tb, tid, numThreads);

  // No early exit on a failed wait: every thread must reach every block sync.
  for (int32_t i = 0; i < count; ++i) {
    plan_detail::runOp<T, LoadBatch, Lean>(c, opAt(i), resolved != nullptr ? resolved + i : nullptr, callOp, call,
                                           tid, numThreads);
  }

  if (c.outputStaged) {
    plan_detail::rankBarrier(c, rankCounter, barriers++, tid);
    plan_detail::blockShare(c, tb, c.outputBytes, &b, &e);
    if (e > b) copyBytes(c.userOutput + b, c.buffers[call & 1][c.slot[c.rank]][1] + b, e - b, tid, numThreads);
  }
  // The proxy has read every source of this block's puts before the call
  // ends (a later call may overwrite them).
  if (!Lean && c.remoteRanks != 0) {
    syncBlock();
    if (tid == 0) plan_detail::proxyFlush(c);
  }
  // Every thread read the call count before any of them passes this sync.
  syncBlock();
  if (tid == 0) {
    c.calls[tb] = call + 1;
    if (stagedIn || c.outputStaged) c.rankBarriers[tb] = barriers;
  }
}

}  // namespace pyccl
