// The all-pairs exchanges (see collective_context.hpp for the scratch
// protocol), each a body that runs as a CUDA kernel and, in host mode, on CPU
// threads (one per block): all-gather, all-to-all and broadcast move bytes, so
// one kernel per protocol serves every dtype; reduce-scatter reduces, one
// kernel per dtype and op. The LL reduce-scatter is the LL reduction of the
// 1PA LL all-reduce with a per-destination stride (reduceLL,
// collective_context.hpp).
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
#include "algorithms/exchange.hpp"

#include <string>

#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/gpu_runtime.hpp"
#include "device/kernel_launch.cuh"
#endif

namespace pyccl {

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

// ---------------------------------------------------------------------------
// Launch: host mode, then GPUs.
// ---------------------------------------------------------------------------

namespace {

/// The blocks a call runs on: the call's LL blocks, or the HB layout's.
uint32_t exchangeBlocks(const CollectiveContext& c, Protocol protocol) {
  return protocol == Protocol::kLL ? c.llActiveBlocks : c.hbBlocks;
}

}  // namespace

void exchangeHost(const CollectiveContext& context, const ExchangeCall& call) {
  const bool ll = call.protocol == Protocol::kLL;
  const uint32_t blocks = exchangeBlocks(context, call.protocol);
  const ExchangeArgs& a = call.args;
  if (call.kind != ExchangeKind::kReduceScatter) {
    runHostBlocks(blocks, [&](uint32_t b) {
      if (ll) {
        exchangeLL(call.kind, context, a, b, 0, 1);
      } else {
        exchangeHB(call.kind, context, a, b, 0, 1);
      }
    });
    return;
  }
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    runHostBlocks(blocks, [&](uint32_t b) {
      if (ll) {
        reduceLL<T, Op>(context, a.input, a.inStride, a.output, a.chunkBytes / sizeof(T), b, 0, 1);
      } else {
        reduceScatterHB<T, Op>(context, a, b, 0, 1);
      }
    });
  });
}

#ifdef PYCCL_WITH_CUDA
namespace {

__global__ void __launch_bounds__(1024) exchangeLLKernel(ExchangeKind kind, CollectiveContext context,
                                                         ExchangeArgs args) {
  collectiveKernelPrologue();
  exchangeLL(kind, context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

__global__ void __launch_bounds__(1024) exchangeHBKernel(ExchangeKind kind, CollectiveContext context,
                                                         ExchangeArgs args) {
  collectiveKernelPrologue();
  exchangeHB(kind, context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterLLKernel(CollectiveContext context, ExchangeArgs args) {
  collectiveKernelPrologue();
  reduceLL<T, Op>(context, args.input, args.inStride, args.output, args.chunkBytes / sizeof(T), blockIdx.x,
                  threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterHBKernel(CollectiveContext context, ExchangeArgs args) {
  collectiveKernelPrologue();
  reduceScatterHB<T, Op>(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void exchangeDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                    const KernelLaunch& launch) {
  auto s = static_cast<cudaStream_t>(stream);
  const bool ll = call.protocol == Protocol::kLL;
  const uint32_t blocks = exchangeBlocks(context, call.protocol);
  if (call.kind != ExchangeKind::kReduceScatter) {
    if (ll) {
      launchCollectiveKernel(exchangeLLKernel, blocks, launch, s, call.kind, context, call.args);
    } else {
      launchCollectiveKernel(exchangeHBKernel, blocks, launch, s, call.kind, context, call.args);
    }
    return;
  }
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (ll) {
      launchCollectiveKernel(reduceScatterLLKernel<T, Op>, blocks, launch, s, context, call.args);
    } else {
      launchCollectiveKernel(reduceScatterHBKernel<T, Op>, blocks, launch, s, context, call.args);
    }
  });
}

void exchangeKernels(std::vector<const void*>* out) {
  out->push_back(reinterpret_cast<const void*>(exchangeLLKernel));
  out->push_back(reinterpret_cast<const void*>(exchangeHBKernel));
  forEachReduction([&]<typename T, ReduceOp Op>() {
    out->push_back(reinterpret_cast<const void*>(reduceScatterLLKernel<T, Op>));
    out->push_back(reinterpret_cast<const void*>(reduceScatterHBKernel<T, Op>));
  });
}
#endif  // PYCCL_WITH_CUDA

// ---------------------------------------------------------------------------
// Names (docs, algorithm=, PYCCL_ALGO, tuning tables, the flight recorder).
// ---------------------------------------------------------------------------

Protocol parseProtocol(const std::string& name, const char* what) {
  if (name == "ll") return Protocol::kLL;
  if (name == "hb") return Protocol::kHB;
  throw InvalidArgument(strCat("invalid argument '", what, "': '", name, "' is not a protocol (expected ll or hb)"));
}

const char* protocolName(Protocol p) { return p == Protocol::kLL ? "ll" : "hb"; }

namespace {
// In ExchangeKind order.
constexpr const char* kExchangeNames[] = {"all_gather", "all_to_all", "broadcast", "reduce_scatter"};
}  // namespace

const char* exchangeKindName(ExchangeKind kind) { return kExchangeNames[static_cast<uint32_t>(kind)]; }

CallOp callOpOf(ExchangeKind kind) {
  switch (kind) {
    case ExchangeKind::kAllGather: return CallOp::kAllGather;
    case ExchangeKind::kAllToAll: return CallOp::kAllToAll;
    case ExchangeKind::kBroadcast: return CallOp::kBroadcast;
    case ExchangeKind::kReduceScatter: return CallOp::kReduceScatter;
  }
  return CallOp::kNone;
}

ExchangeKind parseExchangeKind(const std::string& name, const char* what) {
  for (uint32_t k = 0; k < 4; ++k) {
    if (name == kExchangeNames[k]) return static_cast<ExchangeKind>(k);
  }
  throw InvalidArgument(strCat("invalid argument '", what, "': '", name,
                               "' (expected all_gather, all_to_all, broadcast or reduce_scatter)"));
}

}  // namespace pyccl
