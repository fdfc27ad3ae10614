#include "executor/executor.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "device/kernel_launch.hpp"
#include "core/debug_options.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/kernel_loading.hpp"
#include "core/logging.hpp"
#include "core/proxy.hpp"
#include "core/transport_rdma.hpp"
#include "core/transport_socket.hpp"
#include "executor/interpreter.hpp"
#include "executor/plan_checks.hpp"
#include "executor/plan_threads.hpp"

namespace pyccl {
namespace {

uint64_t roundUp(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

/// The point-to-point tag of the executors' transport agreement across nodes.
constexpr int kPlanTransportTag = 0x5e1a;

}  // namespace

PlanExecutor::PlanExecutor(Communicator& comm, PlanProgram program, uint64_t maxChunkBytes, uint32_t threadsPerBlock)
    : comm_(comm), program_(std::move(program)), maxChunkBytes_(roundUp(maxChunkBytes, 16)), threads_(threadsPerBlock) {
  const int world = comm.worldSize();
  PYCCL_CHECK_ARG(world <= kPlanMaxRanks, "comm", "plans run on up to ", kPlanMaxRanks, " ranks, the "
                  "communicator has ", world);
  PYCCL_CHECK_ARG(maxChunkBytes_ >= 16, "max_chunk_bytes", "must be at least 16");
  PYCCL_CHECK_ARG(threads_ >= 32 && threads_ <= 1024 && threads_ % 32 == 0, "threads",
                  "must be a multiple of 32 in [32, 1024], got ", threads_);
  checkPlanProgram(program_, world);
  int local = 0;
  for (int q = 0; q < world; ++q) {
    if (q != comm.rank() && !comm.canAccessPeer(q)) {
      context_.remoteRanks |= 1ull << q;
      context_.slot[q] = kPlanFarSlot;
    } else {
      PYCCL_CHECK_ARG(local < kPlanMaxLocalRanks, "comm", "plans reach up to ", kPlanMaxLocalRanks,
                      " ranks on one node; rank ", comm.rank(), " reaches more by P2P");
      context_.slot[q] = static_cast<int8_t>(local++);
    }
  }
  if (context_.remoteRanks != 0) {
    // Ranks refuse together: a plan may break the rule on some ranks only
    // (a reduce_put to the next rank crosses a node on the node's last rank),
    // and a rank that passed would wait in the buffer exchange for the others.
    const std::string refusal = planAcrossNodesRefusal(program_, comm.rank(), context_.remoteRanks);
    const std::vector<Bytes> refusals = comm.allGather(Bytes(refusal.begin(), refusal.end()));
    PYCCL_CHECK_ARG(refusal.empty(), "plan", refusal);
    for (int q = 0; q < world; ++q) {
      PYCCL_CHECK_ARG(refusals[q].empty(), "plan", "rank ", q, " refuses it: ",
                      std::string(refusals[q].begin(), refusals[q].end()));
    }
    // The proxy moves data between registered regions only.
    program_.stageInput = program_.stageOutput = true;
  }
  // Each signal, wait and barrier carries what it needs from the channel
  // tables, so the interpreter reads no table in the op.
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    PlanOp& op = program_.ops[i];
    const auto kind = static_cast<PlanOpKind>(op.kind);
    if (kind == PlanOpKind::kSignal || kind == PlanOpKind::kWait) {
      for (int k = 0; k < op.numChannels; ++k) {
        const int ch = op.channels[k];
        op.peers[k] = kind == PlanOpKind::kSignal ? program_.channelDst[ch] : program_.channelSrc[ch];
        op.perCall[k] = program_.signalsPerCall[ch];
        PYCCL_CHECK_ARG(op.peers[k] >= 0 && op.peers[k] < world, "plan", "op ", i,
                        " signals or waits on a channel without that side");
        // Signals store and waits expect call x perCall + ordinal.
        PYCCL_CHECK_ARG(op.ordinals[k] >= 1 && op.ordinals[k] <= op.perCall[k], "plan", "op ", i, " has ordinal ",
                        op.ordinals[k], " on channel ", ch, ", which carries ", op.perCall[k], " signals a call");
      }
    }
    if (kind == PlanOpKind::kBarrier) {
      op.perCall[0] = program_.signalsPerCall[program_.channelDst.size() + op.ordinals[0]];
    }
  }
  const bool host = comm.hostMode();
  for (int t = 0; t < numThreadBlocks(); ++t) {
    maxOpsPerBlock_ = std::max(maxOpsPerBlock_, program_.tbOffsets[t + 1] - program_.tbOffsets[t]);
  }
  if (!host) {
    gpu::loadKernelsOnce(comm.device(), "plan", planKernels());
#ifdef PYCCL_WITH_CUDA
    // Before the buffers are exchanged: every rank fails here alike, none waits for the others.
    roomyKernel_ = choosePlanKernel(comm.device(), numThreadBlocks(), threads_, maxOpsPerBlock_);
#endif
  }
  const uint64_t c = maxChunkBytes_;
  const uint64_t scratch = std::max<int32_t>(program_.scratchChunks, 1);
  // Every staging region has two phases (by call parity). The input staging
  // exists even for plans that work on the user's input: a call whose output
  // overlaps its input (out of place) stages the input.
  const uint64_t phase[4] = {roundUp(program_.inputChunks * c, 256),
                             program_.inPlace || !program_.stageOutput ? 0 : roundUp(program_.outputChunks * c, 256),
                             roundUp(scratch * c, 256), 2 * scratch * c};
  const uint64_t counterCount = program_.signalsPerCall.size() + world + 2;
  const uint64_t sizes[5] = {2 * phase[0], std::max<uint64_t>(2 * phase[1], 16), 2 * phase[2], 2 * phase[3],
                             counterCount * 8};
  uint64_t offsets[5] = {};  // input, output, scratch, packets, counters within the region
  uint64_t total = 0;
  for (int k = 0; k < 5; ++k) {
    offsets[k] = total;
    total += roundUp(sizes[k], 256);
  }
  regionOwner_ = comm.allocateShareable(total);
  region_.local = comm.registerMemory(regionOwner_.get(), total, regionOwner_);
  region_.peers = comm.exchangeMemory(region_.local);

  // Op and channel tables, then the per-thread-block call counters (zero),
  // where the interpreter reads them.
  const auto& p = program_;
  const uint64_t opBytes = p.ops.size() * sizeof(PlanOp);
  std::vector<char> tablesImage(
      opBytes + 4 * (p.tbOffsets.size() + p.channelSrc.size() + p.channelDst.size() + p.signalsPerCall.size()));
  std::memcpy(tablesImage.data(), p.ops.data(), opBytes);
  uint64_t filled = opBytes;
  auto append = [&](const std::vector<int32_t>& v) {
    const uint64_t start = filled;
    std::memcpy(tablesImage.data() + start, v.data(), v.size() * 4);
    filled += v.size() * 4;
    return start;
  };
  const uint64_t offTb = append(p.tbOffsets), offSrc = append(p.channelSrc), offDst = append(p.channelDst),
                 offSig = append(p.signalsPerCall);
  const uint64_t offCalls = roundUp(tablesImage.size(), 8);
  const uint64_t offBarriers = offCalls + static_cast<uint64_t>(numThreadBlocks()) * 8;
  const uint64_t offFailed = offBarriers + static_cast<uint64_t>(numThreadBlocks()) * 8;
  tablesOwner_ = comm.allocateLocal(offFailed + 8);
  char* tables = static_cast<char*>(tablesOwner_.get());
  if (host) {
    std::memcpy(tables, tablesImage.data(), tablesImage.size());
  } else {
    gpu::copyToDevice(comm.device(), tables, tablesImage.data(), tablesImage.size());
  }
  context_.rank = comm.rank();
  context_.worldSize = world;
  if (context_.remoteRanks != 0) connectRemoteRanks(total, counterCount);
  for (int q = 0; q <= world; ++q) {  // every slot once; q == world: the slot of the other nodes' ranks
    if (q < world && plan_detail::isRemote(context_, q)) continue;
    // Other nodes' ranks: offsets into their regions (laid out as here).
    char* base = q == world ? nullptr : static_cast<char*>(region_.peers[q]->data());
    const int slot = q == world ? kPlanFarSlot : context_.slot[q];
    const uint64_t firstPhase[3] = {offsets[0], program_.inPlace ? offsets[0] : offsets[1], offsets[2]};
    const uint64_t phaseBytes[3] = {phase[0], program_.inPlace ? phase[0] : phase[1], phase[2]};
    for (int parity = 0; parity < 2; ++parity) {
      for (int k = 0; k < 3; ++k) context_.buffers[parity][slot][k] = base + firstPhase[k] + parity * phaseBytes[k];
    }
    context_.packets[slot] = base + offsets[3];
    context_.counters[slot] = reinterpret_cast<uint64_t*>(base + offsets[4]);
  }
  context_.packetPhaseBytes = phase[3];
  context_.ops = reinterpret_cast<const PlanOp*>(tables);
  context_.tbOffsets = reinterpret_cast<const int32_t*>(tables + offTb);
  context_.channelSrc = reinterpret_cast<const int32_t*>(tables + offSrc);
  context_.channelDst = reinterpret_cast<const int32_t*>(tables + offDst);
  context_.signalsPerCall = reinterpret_cast<const int32_t*>(tables + offSig);
  context_.numChannels = static_cast<int32_t>(p.channelDst.size());
  context_.numThreadBlocks = numThreadBlocks();
  context_.entryBase = static_cast<int32_t>(p.signalsPerCall.size());
  context_.inPlace = p.inPlace;
  context_.entryBarrier = p.entryBarrier;
  lean_ = context_.remoteRanks == 0 && std::all_of(program_.ops.begin(), program_.ops.end(), [](const PlanOp& op) {
    return plan_detail::isLeanOp(op.kind);
  });
  context_.genericPacketOps = debugOptions().planGenericPackets;
  context_.calls = reinterpret_cast<uint64_t*>(tables + offCalls);
  context_.rankBarriers = reinterpret_cast<uint64_t*>(tables + offBarriers);
  context_.failed = reinterpret_cast<uint64_t*>(tables + offFailed);
  programmatic_ = programmaticLaunchAllowed(comm.device());
  context_.abort = comm.abortState();
  context_.regionBase = static_cast<const char*>(region_.local.data());
  PYCCL_LOG(Info, "plan executor: " << p.ops.size() << " ops on " << numThreadBlocks() << " thread blocks, "
                                    << (total >> 10) << " KiB of buffers for chunks up to " << c << " B; input "
                                    << (p.stageInput ? "staged" : "in place") << ", output "
                                    << (p.stageOutput ? "staged" : "in place") << ", entry barrier "
                                    << (p.entryBarrier ? "on" : "off") << (lean_ ? ", lean interpreter" : "")
                                    << (context_.remoteRanks != 0 ? strCat(
                                        "; ", proxyChannels_.size(), " ranks on other nodes, over ", transport_)
                                                                        : std::string()));
}

void PlanExecutor::connectRemoteRanks(uint64_t regionBytes, uint64_t counterCount) {
  auto proxy = comm_.proxyService();
  const int world = comm_.worldSize();
  const bool rdma = comm_.plansUseRdma();
  char* region = static_cast<char*>(region_.local.data());
  // Host staging (channels/inbox_device.hpp), one block laid out alike on
  // every rank (RDMA writes name offsets into the peer's): the mirrors, far
  // counters, inbox counts and rings, and for RDMA the outbox.
  RdmaInboxLayout l{};
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t start = at;
    at += roundUp(bytes, 64);
    return start;
  };
  l.mirrorBytes = regionBytes;
  l.sendMirror = take(regionBytes);
  l.receiveMirror = take(regionBytes);
  l.farCounters = take(counterCount * 8);
  l.numCounters = counterCount;
  l.published = take(world * 8ull);
  const uint64_t consumedAt = take(world * 8ull);
  l.records = take(world * kInboxRecords * sizeof(ReceivedPut));
  l.outboxRecords = rdma ? take(world * kInboxRecords * sizeof(ReceivedPut)) : at;
  l.outboxValues = rdma ? take(world * kRdmaInboxValueSlots * 8) : at;
  l.self = comm_.rank();
  stagingBytes_ = at;
  if (comm_.hostMode()) {  // shareable, for the RDMA stand-in to map (registered while the peers may import it)
    staging_ = comm_.allocateShareable(stagingBytes_);
    if (rdma) sharedStaging_ = comm_.registerMemory(staging_.get(), stagingBytes_, staging_);
  } else {
    staging_ = comm_.allocateHostMapped(stagingBytes_);
  }
  inboxProgress_ = comm_.allocateLocal(static_cast<uint64_t>(world) * 2 * 8);
  char* host = static_cast<char*>(staging_.get());
  auto forKernels = [&](char* p) { return comm_.hostMode() ? p : static_cast<char*>(gpu::devicePointerOf(p)); };
  char* dev = forKernels(host);  // the block as kernels address it
  context_.sendMirror = dev + l.sendMirror;
  context_.farCounters = reinterpret_cast<uint64_t*>(dev + l.farCounters);
  context_.inbox = InboxDeviceHandle{reinterpret_cast<const ReceivedPut*>(dev + l.records),
                                     reinterpret_cast<const uint64_t*>(dev + l.published),
                                     reinterpret_cast<uint64_t*>(dev + consumedAt),
                                     static_cast<uint64_t*>(inboxProgress_.get()), dev + l.receiveMirror, region};
  if (rdma) {
    // The sender writes records without seeing the ring's room: a call may
    // leave at most half of it in flight (the peer may be a call behind).
    const uint64_t piecesPerCall = regionBytes / plan_detail::kAcrossNodesPiece + program_.ops.size();
    PYCCL_CHECK_ARG(2 * piecesPerCall <= kInboxRecords, "plan", "its buffers (", regionBytes, " bytes) may put up ",
                    "to ", piecesPerCall, " pieces to a peer per call, more than half the RDMA inbox ring (",
                    kInboxRecords, "); use smaller messages or PYCCL_PLAN_TRANSPORT=socket");
  }
  // Ascending peer order on every rank: each waits only on a peer that is
  // connecting to it or to a lower rank, so the pairs cannot deadlock.
  for (int q = 0; q < world; ++q) {
    if (!plan_detail::isRemote(context_, q)) continue;
    // Both sides must take the same transport (PYCCL_PLAN_TRANSPORT, RDMA devices).
    comm_.send(q, kPlanTransportTag, Bytes{static_cast<uint8_t>(rdma ? 1 : 0)});
    const Bytes theirs = comm_.recv(q, kPlanTransportTag);
    PYCCL_CHECK_ARG(theirs.size() == 1 && (theirs[0] != 0) == rdma, "plan", "this rank reaches rank ", q, " over ",
                    rdma ? "RDMA" : "sockets", " and rank ", q, " over ", rdma ? "sockets" : "RDMA",
                    " (set PYCCL_PLAN_TRANSPORT alike on every rank)");
    std::unique_ptr<ProxyChannel> channel;
    if (rdma) {
      channel = comm_.connectRdmaInbox(q, host, stagingBytes_, sharedStaging_, l);
    } else {
      uint64_t peerBytes = 0;
      UniqueFd connection = comm_.connectSocket(q, regionBytes, &peerBytes);
      PYCCL_CHECK_ARG(peerBytes == regionBytes, "plan", "rank ", q, " laid out ", peerBytes,
                      " bytes of plan buffers where this rank has ", regionBytes,
                      " (every rank must create the executor with the same plan, chunk size and threads)");
      SocketChannelConfig cfg{comm_.device(), region, regionBytes, peerBytes, nullptr, comm_.abortState(), q};
      cfg.counters = reinterpret_cast<uint64_t*>(host + l.farCounters);
      cfg.numCounters = counterCount;
      cfg.sendFrom = host + l.sendMirror;
      cfg.receiveInto = host + l.receiveMirror;
      cfg.records = reinterpret_cast<ReceivedPut*>(host + l.records) + static_cast<uint64_t>(q) * kInboxRecords;
      cfg.published = reinterpret_cast<uint64_t*>(host + l.published) + q;
      cfg.consumed = reinterpret_cast<uint64_t*>(host + consumedAt) + q;
      channel = makeSocketChannel(std::move(connection), cfg);
    }
    const uint32_t id = proxy->addChannel(std::move(channel));
    proxyChannels_.push_back(id);
    context_.proxyChannel[q] = static_cast<int16_t>(id);  // ids stay below kTriggerMaxChannels
  }
  transport_ = rdma ? "RDMA" : "the socket transport";
  proxy_ = proxy;
  context_.fifo = proxy->fifoHandle();
}

PlanExecutor::~PlanExecutor() { close(); }

void PlanExecutor::close() {
  if (closed_) return;
  closed_ = true;
  // Sockets and their receiver threads go before the memory they write.
  for (uint32_t id : proxyChannels_) {
    try {
      proxy_->removeChannel(id);
    } catch (const std::exception& e) {
      PYCCL_LOG(Warn, "plan executor: closing proxy channel " << id << ": " << e.what());
    }
  }
  proxyChannels_.clear();
  sharedStaging_ = RegisteredMemory();
  staging_.reset();
  inboxProgress_.reset();
  region_.release();
}

void PlanExecutor::run(const void* input, uint64_t inputBytes, void* output, uint64_t outputBytes, DataType dtype,
                       uint64_t elementSize, ReduceOp op, void* stream, bool reduces) {
  if (closed_) throw ClosedError(strCat("plan: communicator '", comm_.name(), "' is closed"));
  comm_.checkUsable("plan");
  PYCCL_CHECK_ARG(op != ReduceOp::kAvg, "op", "avg is not supported by plans (use sum and divide)");
  PYCCL_CHECK_ARG(!reduces || isFloatType(dtype), "tensor", "plans reduce float32, float16 and bfloat16, got ",
                  dataTypeName(dtype), " (the built-in kernels reduce it: pass no plan)");
  const uint64_t unit = static_cast<uint64_t>(program_.inputChunks) * elementSize;
  PYCCL_CHECK_ARG(inputBytes > 0 && inputBytes % unit == 0, "tensor", "has ", inputBytes,
                  " bytes; this plan splits its input into ", program_.inputChunks,
                  " chunks of whole elements, so the size must be a multiple of ", unit);
  const uint64_t chunk = inputBytes / program_.inputChunks;
  PYCCL_CHECK_ARG(chunk <= maxChunkBytes_, "tensor", "needs chunks of ", chunk, " bytes, this executor holds up to ",
                  maxChunkBytes_);
  const uint64_t outChunks = program_.inPlace ? program_.inputChunks : program_.outputChunks;
  PYCCL_CHECK_ARG(outputBytes == outChunks * chunk, "out", "has ", outputBytes, " bytes, the plan writes ",
                  outChunks * chunk);
  // An out-of-place plan reads its input after writing output chunks, so an
  // output that overlaps the input makes the call stage its input; an
  // in-place plan works on the output after copying the input there, which
  // is only meaningful for the same tensor or disjoint ones.
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  const bool overlap = in < out + outputBytes && out < in + inputBytes;
  if (program_.inPlace && !program_.stageInput) {
    PYCCL_CHECK_ARG(!overlap || in == out, "out", "partly overlaps the input tensor; pass the same tensor or a "
                    "separate one");
  }
  const Communicator::CallStart started = comm_.beginCall(
      CallOp::kPlan, stream,
      comm_.callChecks() ? strCat("plan of ", program_.ops.size(), " ops, ", inputBytes, " bytes in, ", outputBytes,
                                  " bytes out, ", dataTypeName(dtype), " ", reduceOpName(op))
                         : std::string(),
      CallFacts{inputBytes, reduces ? dataTypeName(dtype) : "", program_.name.c_str()});
  const uint64_t tag = started.tag;
  calls_.fetch_add(1, std::memory_order_relaxed);
  PlanContext ctx = context_;
  ctx.abort.call = tag;
  ctx.inputStaged = program_.stageInput || (!program_.inPlace && overlap);
  ctx.outputStaged = program_.inPlace ? ctx.inputStaged : program_.stageOutput;
  ctx.chunkBytes = chunk;
  ctx.userInput = static_cast<const char*>(input);
  ctx.userOutput = static_cast<char*>(output);
  ctx.inputBytes = inputBytes;
  ctx.outputBytes = outputBytes;
  // This rank's unstaged buffers are the call's tensors, in both phases; an
  // in-place plan works on the output, which first receives the input.
  const int self = ctx.slot[comm_.rank()];
  for (auto& phase : ctx.buffers) {
    char*& input = phase[self][0];
    if (!ctx.inputStaged) input = program_.inPlace ? out : const_cast<char*>(in);
    if (program_.inPlace) {
      phase[self][1] = input;
    } else if (!ctx.outputStaged) {
      phase[self][1] = out;
    }
  }
  ctx.copiesInput = ctx.buffers[0][self][0] != ctx.userInput;
  ctx.phasedBuffers = 0;
  for (int slot = 0; slot <= kPlanFarSlot; ++slot) {
    for (int k = 0; k < 3; ++k) {
      if (ctx.buffers[0][slot][k] != ctx.buffers[1][slot][k]) ctx.phasedBuffers |= 1u << (slot * 3 + k);
    }
  }
  const int tbs = numThreadBlocks();
#ifdef PYCCL_WITH_CUDA
  if (!comm_.hostMode()) {
    const uint32_t threads = callThreads(chunk, ctx.copiesInput ? inputBytes : 0, ctx.outputStaged ? outputBytes : 0);
    runPlanDevice(ctx, tbs, threads, maxOpsPerBlock_, roomyKernel_, lean_, programmatic_, dtype, op, stream);
    return;
  }
#endif
  (void)stream;
  Communicator::HostKernelScope active(comm_);
  dispatchFloat(dtype, [&]<typename T>() {
    std::vector<std::thread> threads;
    for (int t = 0; t < tbs; ++t) {
      threads.emplace_back([&ctx, op, t, lean = lean_, maxOps = maxOpsPerBlock_] {
        const PlanOp* ops = ctx.ops + ctx.tbOffsets[t];
        auto opAt = [ops](int32_t i) -> const PlanOp& { return ops[i]; };
        const int32_t count = ctx.tbOffsets[t + 1] - ctx.tbOffsets[t];
        // Addresses resolved before the ops where the kernel resolves them so too (addressesFit).
        std::vector<plan_detail::ResolvedOp> resolved;
        if (addressesFit(maxOps)) {
          resolved.resize(static_cast<size_t>(count));
          plan_detail::resolveOperands(ctx, ops, count, resolved.data(), 0, 1);
        }
        const plan_detail::ResolvedOp* ready = resolved.empty() ? nullptr : resolved.data();
        if (lean) {
          runPlanCall<T, 4, true>(ctx, opAt, ready, count, static_cast<int>(op), t, ctx.calls[t], 0, 1);
        } else {
          runPlanCall<T, 4, false>(ctx, opAt, ready, count, static_cast<int>(op), t, ctx.calls[t], 0, 1);
        }
      });
    }
    for (auto& th : threads) th.join();
  });
  comm_.checkCompleted("plan");
}

uint32_t PlanExecutor::callThreads(uint64_t chunkBytes, uint64_t copiedIn, uint64_t copiedOut) const {
  const uint64_t tbs = static_cast<uint64_t>(numThreadBlocks());
  const uint64_t stagingPerBlock = (std::max(copiedIn, copiedOut) + tbs - 1) / tbs;
  return planCallThreads(program_.ops, chunkBytes, stagingPerBlock, threads_);
}

uint32_t PlanExecutor::threadsFor(uint64_t inputBytes) const {
  const uint64_t chunk = inputBytes / std::max(program_.inputChunks, 1);
  const uint64_t outputBytes = (program_.inPlace ? program_.inputChunks : program_.outputChunks) * chunk;
  const bool copiesIn = program_.stageInput || program_.inPlace;
  const bool copiesOut = program_.inPlace ? program_.stageInput : program_.stageOutput;
  return callThreads(chunk, copiesIn ? inputBytes : 0, copiesOut ? outputBytes : 0);
}

#ifndef PYCCL_WITH_CUDA
std::vector<const void*> planKernels() { return {}; }
#endif

}  // namespace pyccl
