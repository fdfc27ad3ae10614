#include "engine/collective_engine.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/kernel_loading.hpp"
#include "core/logging.hpp"

namespace pyccl {
namespace {

uint64_t roundDown(uint64_t x, uint64_t m) { return x / m * m; }

/// p2p_blocks as the engine uses it: on GPUs, at most what keeps a launch of
/// a send to and a receive from every peer resident at once (a send's
/// progress needs its receive running, and the receive may be in the same
/// launch on the other side), and the same on every rank (the minimum, for
/// GPUs that differ), as both sides of a transfer cut it into lanes alike.
/// Host mode runs every block on a thread of its own: nothing is capped there.
uint32_t agreedP2PLanes(Communicator& comm, uint32_t wanted, uint32_t threads) {
#ifdef PYCCL_WITH_CUDA
  if (comm.hostMode() || comm.worldSize() < 2) return wanted;
  const uint32_t resident = sendRecvResidentBlocks(comm.device(), threads);
  const uint32_t perLaunch = 2u * static_cast<uint32_t>(comm.worldSize() - 1);
  uint32_t lanes = std::max(1u, std::min(wanted, resident / perLaunch));
  Bytes mine(sizeof(lanes));
  std::memcpy(mine.data(), &lanes, sizeof(lanes));
  for (const Bytes& theirs : comm.allGather(mine)) {
    uint32_t other = 0;
    if (theirs.size() == sizeof(other)) std::memcpy(&other, theirs.data(), sizeof(other));
    if (other >= 1) lanes = std::min(lanes, other);
  }
  if (lanes < wanted) {
    PYCCL_LOG(Info, "collective engine: send/receive lanes " << lanes << " (of p2p_blocks " << wanted
                                                              << "), so that a launch stays resident on every rank");
  }
  return lanes;
#else
  (void)comm;
  (void)threads;
  return wanted;
#endif
}

}  // namespace

std::vector<const void*> collectiveKernels() {
  std::vector<const void*> kernels;
#ifdef PYCCL_WITH_CUDA
  allReduceKernels(&kernels);
  exchangeKernels(&kernels);
  fusedNormKernels(&kernels);
  sendRecvKernels(&kernels);
#endif
  return kernels;
}

CollectiveEngine::CollectiveEngine(Communicator& comm, CollectiveOptions options)
    : comm_(comm), options_(options), graphBuffers_(comm) {
  const bool host = comm.hostMode();
  const int world = comm.worldSize();
  if (world > kMaxCollectiveRanks) {
    throw UnsupportedError(strCat("collectives in communicator '", comm.name(), "' support up to ",
                                  kMaxCollectiveRanks, " ranks in one node, it has ", world));
  }
  if (const int p = comm.firstUnreachablePeer(); p >= 0) {
    throw UnsupportedError(strCat("collectives in communicator '", comm.name(), "' need P2P between all ranks; rank ",
                                  comm.rank(), " cannot reach rank ", p, " (another node, or no P2P path)"));
  }
  if (!host) gpu::loadKernelsOnce(comm.device(), "collective", collectiveKernels());
  // Before any check: with the same options on every rank, every rank fails the same check, or none does.
  agreeOnCollectiveOptions(comm, options_);
  options_ = resolveCollectiveOptions(std::move(options_), host, world);
  // PYCCL_PDL=0, or a GPU before sm_90, turns programmatic dependent launch off for every engine (the backend's too).
  if (!programmaticLaunchAllowed(comm.device())) options_.programmaticLaunch = false;
#ifdef PYCCL_WITH_CUDA
  clusters_ = host || clusterLaunchSupported(comm.device());
#else
  clusters_ = host;
#endif
  options_.p2pBlocks = agreedP2PLanes(comm, options_.p2pBlocks, options_.p2pThreads);

  // Scratch layout (16-byte aligned regions).
  const uint64_t llBlockPackets =
      (options_.llMaxBytes / LL16Packet::kDataBytes + options_.llBlocks - 1) / options_.llBlocks;
  const uint64_t llBytes = 2ull * world * options_.llBlocks * llBlockPackets * sizeof(LL16Packet);
  const uint64_t subBytes = roundDown(options_.hbPieceBytes / (static_cast<uint64_t>(world) * options_.hbBlocks), 16);
  PYCCL_CHECK_ARG(subBytes >= 16, "hb_piece_bytes", "too small for ", world, " ranks x ", options_.hbBlocks,
                  " blocks");
  const uint64_t stagingBytes = 2ull * options_.hbBlocks * world * subBytes;
  const uint64_t resultSlots = options_.hbPush ? world : 1;
  const uint64_t resultBytes = 2ull * options_.hbBlocks * resultSlots * subBytes;
  const uint64_t barrierBytes = (static_cast<uint64_t>(options_.hbBlocks) * world * 8 + 15) / 16 * 16;
  const uint64_t p2pRings = static_cast<uint64_t>(world) * options_.p2pBlocks;
  const uint64_t p2pDataBytes = p2pRings * options_.p2pSlots * (kP2PHeaderBytes + options_.p2pSliceBytes);
  const uint64_t p2pCountBytes = (p2pRings * 8 + 15) / 16 * 16;
  const uint64_t p2pLLSlots = p2pLLSlotPackets(options_.p2pLLMaxBytes, options_.p2pLLLaneBytes, options_.p2pBlocks);
  const uint64_t p2pLLBytes = p2pRings * options_.p2pSlots * p2pLLSlots * sizeof(LL16Packet);
  const uint64_t collectiveBytes = 2 * llBytes + stagingBytes + resultBytes + barrierBytes;
  const uint64_t total = collectiveBytes + p2pDataBytes + 2 * p2pCountBytes + p2pLLBytes;

  scratchOwner_ = comm.allocateShareable(total);
  void* scratch = scratchOwner_.get();
  const uint64_t counterBytes =
      (options_.hbBlocks + 2 * p2pRings) * sizeof(uint64_t) + options_.llBlocks * sizeof(uint32_t) + 8;
  countersOwner_ = comm.allocateLocal(counterBytes);
  void* counters = countersOwner_.get();
  scratch_.local = comm.registerMemory(scratch, total, scratchOwner_);
  scratch_.peers = comm.exchangeMemory(scratch_.local);

  context_.rank = comm.rank();
  context_.worldSize = world;
  for (int p = 0; p < world; ++p) context_.scratch[p] = static_cast<char*>(scratch_.peers[p]->data());
  context_.llOffset = 0;
  context_.llBlockPackets = llBlockPackets;
  context_.llBlocks = options_.llBlocks;
  context_.llActiveBlocks = options_.llBlocks;
  context_.hbBlocks = options_.hbBlocks;
  context_.hbActiveBlocks = options_.hbBlocks;
  context_.hbPush = options_.hbPush ? 1 : 0;
  context_.ll2Offset = llBytes;
  context_.hbStagingOffset = 2 * llBytes;
  context_.hbResultOffset = 2 * llBytes + stagingBytes;
  context_.hbBarrierOffset = 2 * llBytes + stagingBytes + resultBytes;
  context_.hbSubBytes = subBytes;
  context_.p2pDataOffset = collectiveBytes;
  context_.p2pReadyOffset = collectiveBytes + p2pDataBytes;
  context_.p2pAckOffset = collectiveBytes + p2pDataBytes + p2pCountBytes;
  context_.p2pSliceBytes = options_.p2pSliceBytes;
  context_.p2pBlocks = options_.p2pBlocks;
  context_.p2pSlots = options_.p2pSlots;
  context_.p2pLLOffset = collectiveBytes + p2pDataBytes + 2 * p2pCountBytes;
  context_.p2pLLSlotPackets = p2pLLSlots;
  context_.p2pLLMaxBytes = options_.p2pLLMaxBytes;
  context_.p2pLLLaneBytes = options_.p2pLLLaneBytes;
  // The 64-bit counters come first: 8-byte aligned.
  context_.hbCalls = static_cast<uint64_t*>(counters);
  context_.p2pSent = context_.hbCalls + options_.hbBlocks;
  context_.p2pReceived = context_.p2pSent + p2pRings;
  context_.llCalls = reinterpret_cast<uint32_t*>(context_.p2pReceived + p2pRings);
  context_.abort = comm.abortState();
  PYCCL_LOG(Info, "collective engine: " << world << " ranks, scratch " << (total >> 10) << " KiB, LL up to "
                                        << options_.llMaxBytes << " B on " << options_.llBlocks
                                        << " blocks, HB pieces of " << options_.hbPieceBytes << " B on "
                                        << options_.hbBlocks << " blocks ("
                                        << (options_.hbPush ? "push" : "pull") << ")");
}

CollectiveEngine::~CollectiveEngine() { close(); }

void CollectiveEngine::close() {
  if (closed_) return;
  closed_ = true;
  scratch_.release();
  for (auto& [start, buffer] : symmetric_) buffer.release();
  symmetric_.clear();
  graphBuffers_.release();
  // The memory itself goes now too, not when the last reference to the engine does (a Python traceback of a
  // failed call may keep one long after its communicator closed): its shared memory, fd and counters.
  scratchOwner_.reset();
  countersOwner_.reset();
}

size_t CollectiveEngine::finishGraphCapture() {
  checkUsable("graph_capture");
  gpu::OptionalDeviceGuard onDevice(comm_.device());
  return graphBuffers_.finish();
}

void CollectiveEngine::registerSymmetric(const RegisteredMemory& memory) {
  checkUsable("register_symmetric");
  PYCCL_CHECK_ARG(memory.valid() && memory.isLocal(), "memory", "must be a registration of this rank's memory");
  SymmetricBuffer buffer{memory, comm_.exchangeMemory(memory)};
  // Every rank sees every rank's size and alignment: all raise together or none does.
  for (int q = 0; q < comm_.worldSize(); ++q) {
    const auto& peer = buffer.peers[q];
    if (!peer) {
      throw UnsupportedError(strCat("register_symmetric: rank ", q, " of communicator '", comm_.name(),
                                    "' cannot be reached by P2P"));
    }
    PYCCL_CHECK_ARG(peer->size() == memory.size(), "tensor", "must have the same size on every rank: rank ",
                    comm_.rank(), " has ", memory.size(), " bytes, rank ", q, " ", peer->size());
    PYCCL_CHECK_ARG(reinterpret_cast<uintptr_t>(peer->data()) % 16 == 0, "tensor",
                    "must start 16-byte aligned on every rank (rank ", q, "'s does not)");
  }
  const auto start = reinterpret_cast<uintptr_t>(memory.data());
  auto next = symmetric_.lower_bound(start);
  const bool overlapsNext = next != symmetric_.end() && next->first < start + memory.size();
  const bool overlapsPrev = next != symmetric_.begin() &&
                            std::prev(next)->first + std::prev(next)->second.local.size() > start;
  PYCCL_CHECK_ARG(!overlapsNext && !overlapsPrev, "tensor", "overlaps a buffer already registered as symmetric");
  symmetric_.emplace(start, std::move(buffer));
  PYCCL_LOG(Info, "collective engine: symmetric buffer of " << memory.size() << " B registered");
}

const CollectiveEngine::SymmetricBuffer* CollectiveEngine::findSymmetric(const void* ptr, uint64_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  auto it = symmetric_.upper_bound(at);
  if (it == symmetric_.begin()) return nullptr;
  --it;
  return at + bytes <= it->first + it->second.local.size() ? &it->second : nullptr;
}

bool CollectiveEngine::isSymmetric(const void* ptr, uint64_t bytes) const {
  return findSymmetric(ptr, bytes) != nullptr;
}

char* CollectiveEngine::peerPointer(const SymmetricBuffer& buffer, const void* ptr, int q) const {
  const uint64_t offset = static_cast<const char*>(ptr) - static_cast<const char*>(buffer.local.data());
  return static_cast<char*>(buffer.peers[q]->data()) + offset;
}

namespace {

template <typename Choice>
Choice bySize(const std::vector<SizeChoice<Choice>>& table, uint64_t bytes) {
  for (const auto& entry : table) {
    if (bytes <= entry.maxBytes) return entry.choice;
  }
  return table.back().choice;
}

}  // namespace

AllReduceAlgorithm CollectiveEngine::select(uint64_t bytes, bool symmetric) const {
  const auto& table = symmetric && !options_.allReduceSymmetricBySize.empty() ? options_.allReduceSymmetricBySize
                                                                              : options_.allReduceBySize;
  if (symmetric && options_.allReduceSymmetricBySize.empty() && bytes >= options_.zeroCopyThresholdBytes) {
    return AllReduceAlgorithm::kTwoPhaseHB;
  }
  if (!table.empty()) {
    const AllReduceAlgorithm a = bySize(table, bytes);
    // A last 1PA LL entry goes on only as far as 1PA LL can (a table that hands larger messages to NCCL).
    return a == AllReduceAlgorithm::kOnePhaseLL && bytes > options_.llMaxBytes ? AllReduceAlgorithm::kTwoPhaseHB : a;
  }
  if (bytes <= options_.llThresholdBytes) return AllReduceAlgorithm::kOnePhaseLL;
  if (bytes <= options_.ll2ThresholdBytes) return AllReduceAlgorithm::kTwoPhaseLL;
  if (bytes <= options_.onePhaseHBMaxBytes) return AllReduceAlgorithm::kOnePhaseHB;
  return AllReduceAlgorithm::kTwoPhaseHB;
}

Protocol CollectiveEngine::selectExchange(ExchangeKind kind, uint64_t bytes) const {
  const auto& table = options_.exchangeBySize[static_cast<int>(kind)];
  if (!table.empty()) return bySize(table, bytes);
  return bytes <= options_.exchangeLLThresholdBytes[static_cast<int>(kind)] ? Protocol::kLL : Protocol::kHB;
}

CollectiveContext CollectiveEngine::contextFor(uint64_t llPackets) const {
  CollectiveContext ctx = context_;
  const uint64_t perBlock = options_.llPacketsPerBlock;
  if (perBlock == 0) return ctx;  // every LL call on every block
  // Enough blocks for `perBlock` packets each, and for the layout's per-block room.
  uint64_t blocks = (llPackets + perBlock - 1) / perBlock;
  const uint64_t forRoom = (llPackets + context_.llBlockPackets - 1) / context_.llBlockPackets;
  if (blocks < forRoom) blocks = forRoom;
  if (blocks < 1) blocks = 1;
  if (blocks > options_.llBlocks) blocks = options_.llBlocks;
  ctx.llActiveBlocks = static_cast<uint32_t>(blocks);
  return ctx;
}

uint32_t CollectiveEngine::onePhaseHBBlocksFor(uint64_t bytes) const {
  const uint64_t perBlock = options_.onePhaseHBBytesPerBlock;
  if (perBlock == 0) return context_.hbBlocks;
  const uint64_t blocks = (bytes + perBlock - 1) / perBlock;
  return static_cast<uint32_t>(std::clamp<uint64_t>(blocks, 1, context_.hbBlocks));
}

uint32_t CollectiveEngine::llThreadsFor(const CollectiveContext& ctx, uint64_t llPackets) const {
  // The LL kernels give packet i of a block's share to thread i mod threads.
  // Threads without a packet still pass the call's set-up and block syncs,
  // and small calls paid for them (2 x H200, 2PA LL at 64 KiB: 5.22 us on
  // 1024 threads, 4.90 on 64), so a call whose shares are under a quarter of
  // llThreads runs on whole warps for them. Larger shares keep llThreads:
  // 1PA LL at 256 KiB (512 packets a block) took 5.08 us on 1024 threads and
  // 5.22 on 512.
  const uint64_t blocks = std::max<uint64_t>(ctx.llActiveBlocks, 1);
  const uint64_t perBlock = (llPackets + blocks - 1) / blocks;
  return 4 * perBlock >= options_.llThreads ? options_.llThreads : wholeWarpsFor(perBlock, options_.llThreads);
}

void CollectiveEngine::checkUsable(const char* op) const {
  if (closed_) throw ClosedError(strCat(op, ": communicator '", comm_.name(), "' is closed"));
  comm_.checkUsable(op);
}

void CollectiveEngine::allReduce(const void* input, void* output, uint64_t count, DataType dtype, ReduceOp op,
                                 std::optional<AllReduceAlgorithm> algorithm, void* stream,
                                 std::optional<AllReduceAlgorithm> symmetricAlgorithm) {
  checkUsable("all_reduce");
  if (count == 0) return;
  gpu::OptionalDeviceGuard onDevice(comm_.device());
  PYCCL_CHECK_ARG(input != nullptr && output != nullptr, "tensor", "has no storage");
  const uint64_t elemSize = dataTypeSize(dtype);
  const uint64_t bytes = count * elemSize;
  const SymmetricBuffer* symIn = findSymmetric(input, bytes);
  const SymmetricBuffer* symOut = symIn != nullptr ? findSymmetric(output, bytes) : nullptr;
  // Plain tensors captured under graph buffers: chosen as symmetric buffers are, and zero-copy where they would be.
  const bool graphCall = symOut == nullptr && graphBuffers_.active() && !comm_.hostMode() && gpu::isCapturing(stream);
  const bool symmetricCall = symOut != nullptr || graphCall;
  const AllReduceAlgorithm algo = symmetricCall && symmetricAlgorithm ? *symmetricAlgorithm
                                  : algorithm                         ? *algorithm
                                                                      : select(bytes, symmetricCall);
  if (algo == AllReduceAlgorithm::kOnePhaseLL) {
    PYCCL_CHECK_ARG(bytes <= options_.llMaxBytes, "algorithm", "1pa_ll takes at most ", options_.llMaxBytes,
                    " bytes per call in this communicator, the message has ", bytes);
  }
  const Communicator::CallStart started =
      comm_.beginCall(CallOp::kAllReduce, stream,
                      comm_.callChecks() ? strCat("all_reduce ", dataTypeName(dtype), " x ", count, " ", reduceOpName(op))
                                         : std::string(),
                      CallFacts{bytes, dataTypeName(dtype), allReduceAlgorithmName(algo)});
  const uint64_t tag = started.tag;
  const bool zeroCopy = algo == AllReduceAlgorithm::kTwoPhaseHB && (symOut != nullptr || graphCall) &&
                        bytes <= options_.zeroCopyMaxBytes;
  // The same on every rank: as many slots are taken everywhere, so either all get one or none does.
  const SymmetricPointers* graphSlot = zeroCopy && symOut == nullptr ? graphBuffers_.take(input, output, bytes) : nullptr;
  if (zeroCopy && (symOut != nullptr || graphSlot != nullptr)) {
    // Zero-copy: the whole message in one call, no scratch.
    ++zeroCopyCalls_;
    SymmetricPointers pointers{};
    for (int q = 0; symOut != nullptr && q < comm_.worldSize(); ++q) {
      pointers.inputs[q] = peerPointer(*symIn, input, q);
      pointers.outputs[q] = peerPointer(*symOut, output, q);
    }
    AllReduceCall call{input, output, count, dtype, op, algo, symOut != nullptr ? &pointers : nullptr, graphSlot};
    // The body uses no HB scratch: its grid may be smaller than the layout's.
    CollectiveContext ctx = context_;
    ctx.abort.call = tag;
    if (options_.zeroCopyBytesPerBlock != 0) {
      const uint64_t chunkBytes = (bytes + comm_.worldSize() - 1) / comm_.worldSize();
      const uint64_t blocks = (chunkBytes + options_.zeroCopyBytesPerBlock - 1) / options_.zeroCopyBytesPerBlock;
      ctx.hbBlocks = static_cast<uint32_t>(blocks < 1 ? 1 : (blocks > context_.hbBlocks ? context_.hbBlocks : blocks));
    }
    launchAllReduce(ctx, call, options_.zeroCopyThreads, stream);
    return;
  }
  uint64_t piece = count;
  if (algo == AllReduceAlgorithm::kTwoPhaseLL) {
    piece = allReduceTwoPhaseLLMaxCount(context_, options_.llMaxBytes, elemSize);
  }
  if (algo == AllReduceAlgorithm::kTwoPhaseHB && options_.hbRoundsPerLaunch != 0) {
    piece = allReduceTwoPhaseHBMaxCount(context_, elemSize) * options_.hbRoundsPerLaunch;
  }
  // 1PA HB: the grid by the message's size; every piece of it runs on the same blocks.
  const uint32_t hbActiveBlocks = algo == AllReduceAlgorithm::kOnePhaseHB ? onePhaseHBBlocksFor(bytes)
                                                                         : context_.hbBlocks;
  if (algo == AllReduceAlgorithm::kOnePhaseHB && options_.hbRoundsPerLaunch != 0) {
    CollectiveContext sized = context_;
    sized.hbActiveBlocks = hbActiveBlocks;
    piece = allReduceOnePhaseHBMaxCount(sized, elemSize) * options_.hbRoundsPerLaunch;
  }
  for (uint64_t done = 0; done < count; done += piece) {
    AllReduceCall call{static_cast<const char*>(input) + done * elemSize, static_cast<char*>(output) + done * elemSize,
                       count - done < piece ? count - done : piece, dtype, op, algo};
    // Packets per (source, destination) pair: the whole piece for 1PA, one rank's chunk for 2PA.
    const uint64_t world = static_cast<uint64_t>(comm_.worldSize());
    const uint64_t pairBytes = algo == AllReduceAlgorithm::kTwoPhaseLL ? (call.count + world - 1) / world * elemSize
                                                                        : call.count * elemSize;
    const uint64_t pairPackets = packetsFor<LL16Packet>(pairBytes);
    CollectiveContext ctx = contextFor(pairPackets);
    ctx.abort.call = tag;
    ctx.hbActiveBlocks = hbActiveBlocks;
    uint32_t threads = 0;
    if (algo == AllReduceAlgorithm::kTwoPhaseHB) {
      threads = bytes >= options_.hbPieceBytes ? options_.hbLargeThreads : options_.hbThreads;
    } else if (algo == AllReduceAlgorithm::kOnePhaseHB) {
      // From one whole round of all blocks, as for 2PA HB (8 MiB on 2 x H200: 31.7 us on 512 threads, 33.3 on 256).
      const uint64_t round = static_cast<uint64_t>(context_.hbBlocks) * context_.hbSubBytes;
      threads = bytes >= round ? options_.hbLargeThreads : options_.hbThreads;
    } else {
      threads = llThreadsFor(ctx, pairPackets);
    }
    launchAllReduce(ctx, call, threads, stream);
  }
}

void CollectiveEngine::launchAllReduce(const CollectiveContext& ctx, const AllReduceCall& call, uint32_t threads,
                                       void* stream) {
#ifdef PYCCL_WITH_CUDA
  if (!comm_.hostMode()) {
    allReduceDevice(ctx, call, stream, {threads, options_.programmaticLaunch});
    return;
  }
#endif
  (void)stream;
  (void)threads;
  Communicator::HostKernelScope active(comm_);
  allReduceHost(ctx, call);
  comm_.checkCompleted("all_reduce");
}

void CollectiveEngine::exchange(ExchangeKind kind, const void* input, uint64_t inStride, void* output,
                                uint64_t outStride, uint64_t chunkBytes, int root, DataType dtype, ReduceOp op,
                                std::optional<Protocol> protocol, void* stream) {
  const char* name = exchangeKindName(kind);
  checkUsable(name);
  if (chunkBytes == 0) return;
  gpu::OptionalDeviceGuard onDevice(comm_.device());
  PYCCL_CHECK_ARG(input != nullptr && output != nullptr, "tensor", "has no storage");
  if (kind == ExchangeKind::kBroadcast) {
    PYCCL_CHECK_ARG(root >= 0 && root < comm_.worldSize(), "src", "must be a rank of the group (0 to ",
                    comm_.worldSize() - 1, "), got ", root);
  }
  std::string signature;
  if (comm_.callChecks()) {
    signature = strCat(name, " ", chunkBytes, " bytes per rank");
    if (kind == ExchangeKind::kReduceScatter) signature += strCat(" of ", dataTypeName(dtype), " ", reduceOpName(op));
    if (kind == ExchangeKind::kBroadcast) signature += strCat(" from rank ", root);
  }
  const uint64_t wholeBytes = kind == ExchangeKind::kBroadcast ? chunkBytes : chunkBytes * comm_.worldSize();
  const Protocol proto = protocol ? *protocol : selectExchange(kind, wholeBytes);
  // Data movement sees bytes, not elements: its record names no dtype.
  const Communicator::CallStart started =
      comm_.beginCall(callOpOf(kind), stream, signature,
                      CallFacts{wholeBytes, kind == ExchangeKind::kReduceScatter ? dataTypeName(dtype) : "",
                                protocolName(proto)});
  const uint64_t tag = started.tag;
  // Pieces of whole 16-byte units, so that every piece but the last keeps the
  // LL/HB layout full. An HB kernel runs all the rounds of its piece.
  uint64_t piece = options_.llMaxBytes / 16 * 16;
  uint32_t hbCallThreads = 0;  // LL calls run on llThreadsFor
  if (proto == Protocol::kHB) {
    piece = options_.hbRoundsPerLaunch == 0 ? chunkBytes
                                            : exchangeHBMaxChunk(context_) / 16 * 16 * options_.hbRoundsPerLaunch;
    hbCallThreads = wholeBytes >= options_.hbPieceBytes ? options_.hbLargeThreads : options_.hbThreads;
  }
  for (uint64_t done = 0; done < chunkBytes; done += piece) {
    ExchangeCall call{kind, proto,
                      ExchangeArgs{static_cast<const char*>(input) + done, inStride, static_cast<char*>(output) + done,
                                   outStride, chunkBytes - done < piece ? chunkBytes - done : piece, root},
                      dtype, op};
    const uint64_t pairPackets = packetsFor<LL16Packet>(call.args.chunkBytes);
    CollectiveContext ctx = contextFor(pairPackets);
    ctx.abort.call = tag;
#ifdef PYCCL_WITH_CUDA
    if (!comm_.hostMode()) {
      const uint32_t threads = proto == Protocol::kLL ? llThreadsFor(ctx, pairPackets) : hbCallThreads;
      exchangeDevice(ctx, call, stream, {threads, options_.programmaticLaunch});
      continue;
    }
#endif
    (void)stream;
    (void)hbCallThreads;
    Communicator::HostKernelScope active(comm_);
    exchangeHost(ctx, call);
    comm_.checkCompleted(name);
  }
}

void CollectiveEngine::sendRecv(const std::vector<PeerTransfer>& transfers, void* stream) {
  checkUsable("send_recv");
  gpu::OptionalDeviceGuard onDevice(comm_.device());
  const int world = comm_.worldSize();
  for (const PeerTransfer& t : transfers) {
    const char* arg = t.send ? "dst" : "src";
    PYCCL_CHECK_ARG(t.peer >= 0 && t.peer < world && t.peer != comm_.rank(), arg,
                    "must be another rank of the communicator (0 to ", world - 1, ", not ", comm_.rank(), "), got ",
                    t.peer);
    PYCCL_CHECK_ARG(t.bytes == 0 || t.data != nullptr, "tensor", "has no storage");
  }
  // Launches of transfers with distinct (peer, direction), in the order given.
  size_t next = 0;
  while (next < transfers.size()) {
    P2PArgs args{};
    uint32_t taken[2] = {0, 0};  // bit q: a receive (0) or send (1) with rank q is in this launch
    for (; next < transfers.size(); ++next) {
      const PeerTransfer& t = transfers[next];
      const uint32_t bit = 1u << t.peer;
      if (taken[t.send ? 1 : 0] & bit) break;
      taken[t.send ? 1 : 0] |= bit;
      args.transfers[args.count++] =
          P2PTransfer{static_cast<char*>(t.data), t.bytes, t.peer, t.send ? 1u : 0u, args.blocks};
      args.blocks += p2pShape(context_, t.bytes).lanes;
    }
    CollectiveContext ctx = context_;
    const bool captured = !comm_.hostMode() && gpu::isCapturing(stream);
    ctx.abort.call = makeCallTag(CallOp::kSendRecv, ++sendRecvCalls_, captured);
    uint64_t launchBytes = 0;
    for (uint32_t i = 0; i < args.count; ++i) launchBytes += args.transfers[i].bytes;
    const CallLabel label = comm_.noteCall(CallOp::kSendRecv, sendRecvCalls_, captured,
                                           CallFacts{launchBytes, "", "p2p"});
#ifdef PYCCL_WITH_CUDA
    if (!comm_.hostMode()) {
      sendRecvDevice(ctx, args, stream, {options_.p2pThreads, options_.programmaticLaunch});
      continue;
    }
#endif
    (void)stream;
    Communicator::HostKernelScope active(comm_);
    sendRecvHost(ctx, args);
    comm_.checkCompleted("send_recv");
  }
}

}  // namespace pyccl
