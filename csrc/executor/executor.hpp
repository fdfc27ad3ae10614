// The plan executor: owns one plan's buffers on this rank (input, output and
// scratch staging, LL packet region, semaphore counters), maps every peer's
// of this node and connects to those of other nodes through the proxy
// (socket transport),
// and runs the plan on a stream (or, in host mode, on CPU threads). Create it
// collectively (every rank, the same plan); call run() from one stream at a
// time with the same calls in the same order on every rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "device/reduce_types.hpp"
#include "core/communicator.hpp"
#include "executor/plan_format.hpp"

namespace pyccl {

/// A plan in binary form (pyccl/plans.py builds it from the JSON plan).
struct PlanProgram {
  std::vector<PlanOp> ops;
  std::vector<int32_t> tbOffsets;       ///< numThreadBlocks + 1 entries
  std::vector<int32_t> channelSrc;      ///< per channel (-1 for switch channels)
  std::vector<int32_t> channelDst;
  std::vector<int32_t> signalsPerCall;  ///< per channel, then arrivals per call per barrier group
  int32_t inputChunks = 0;
  int32_t outputChunks = 0;
  int32_t scratchChunks = 0;
  bool inPlace = false;  ///< the output buffer is the input buffer
  /// Where the plan's buffers live (pyccl/plans.py reads it off the plan):
  /// a peer reaches this rank's input (or the plan writes the input of an
  /// out-of-place collective), so calls copy it into registered staging; a
  /// peer reaches the output, so the plan writes staging that is copied out.
  /// Otherwise the plan works on the user's tensors.
  bool stageInput = true;
  bool stageOutput = true;
  /// The ranks meet at the start of every call; false where every rank waits
  /// on every peer it reaches within a call, which orders buffer reuse.
  bool entryBarrier = true;
  /// What the flight recorder and the labels call it: "plan <name>".
  std::string name = "plan";
};

class PlanExecutor {
 public:
  /// Collective. `maxChunkBytes` bounds the chunk size of any call.
  PlanExecutor(Communicator& comm, PlanProgram program, uint64_t maxChunkBytes, uint32_t threadsPerBlock);
  ~PlanExecutor();
  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;

  /// Runs the plan on `inputBytes` of `input` (a whole number of chunks per
  /// input chunk count) into `output` (outputChunks chunks of the same size);
  /// elements of `elementSize` bytes; `dtype` and `op` reduce where the plan
  /// reduces (`op` where the plan names no reduction); `reduces` false: the
  /// plan moves data and `dtype` means nothing. Enqueued on `stream`
  /// (host mode: returns when done, raising if a wait gave up).
  void run(const void* input, uint64_t inputBytes, void* output, uint64_t outputBytes, DataType dtype,
           uint64_t elementSize, ReduceOp op, void* stream, bool reduces = true);
  uint64_t maxChunkBytes() const { return maxChunkBytes_; }
  /// Threads per block that a GPU call with `inputBytes` of input runs on
  /// (plan_threads.hpp: whole warps for its largest op, at most the
  /// executor's threads), for tensors that do not overlap.
  uint32_t threadsFor(uint64_t inputBytes) const;
  int numThreadBlocks() const { return static_cast<int>(program_.tbOffsets.size()) - 1; }
  /// Calls run so far (begun: past the argument checks), from every entry point.
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  void close();

 private:
  /// A socket connection per rank on another node, served by the proxy, and
  /// the host staging its puts and signals pass through.
  void connectRemoteRanks(uint64_t regionBytes, uint64_t counterCount);
  /// planCallThreads for a call with chunks of `chunkBytes` that copies
  /// `copiedIn` bytes into staging and `copiedOut` bytes out of it.
  uint32_t callThreads(uint64_t chunkBytes, uint64_t copiedIn, uint64_t copiedOut) const;

  Communicator& comm_;
  std::atomic<uint64_t> calls_{0};
  PlanProgram program_;
  uint64_t maxChunkBytes_;
  uint32_t threads_;
  PlanContext context_{};
  std::shared_ptr<void> regionOwner_;
  std::shared_ptr<void> tablesOwner_;
  /// Across nodes (channels/inbox_device.hpp): the host staging block (the
  /// mirrors, far counters, inbox rings, the RDMA outbox), the inbox locks (device).
  std::shared_ptr<void> staging_, inboxProgress_;
  uint64_t stagingBytes_ = 0;
  RegisteredMemory sharedStaging_;  ///< host mode over the RDMA stand-in: the staging, registered
  const char* transport_ = "";  ///< how other nodes' ranks are reached, for the log
  ExchangedMemory region_;
  bool closed_ = false;
  bool programmatic_ = true;
  bool roomyKernel_ = false;  ///< choosePlanKernel's choice
  /// Only packet ops, copies and synchronization, every rank on this node:
  /// the interpreter without the other ops' code runs it (interpreter.hpp).
  bool lean_ = false;
  int maxOpsPerBlock_ = 0;
  std::shared_ptr<ProxyService> proxy_;  ///< set where ranks on other nodes are reached through it
  std::vector<uint32_t> proxyChannels_;
};

#ifdef PYCCL_WITH_CUDA
/// Which interpreter kernel runs a plan of `numThreadBlocks` blocks of
/// `threads` threads on `device`: true for the one with more registers per
/// thread, where all blocks still fit on the device at once. Throws if even
/// the other one cannot hold them all at once (the blocks wait on each other).
bool choosePlanKernel(int device, int numThreadBlocks, uint32_t threads, int maxOpsPerBlock);
/// Enqueues the interpreter kernel (one block per thread block of the plan;
/// it copies the input in and the output out itself) on `stream`.
/// `maxOpsPerBlock` ops are staged in shared memory where they fit (else one
/// at a time); `roomy`: choosePlanKernel's choice; `lean`: the plan has only
/// the ops of interpreter.hpp's isLeanOp and no rank on another node (the
/// lean kernel runs it where `roomy`);
/// `programmatic`: programmatic dependent launch (kernel_launch.cuh).
void runPlanDevice(const PlanContext& context, int numThreadBlocks, uint32_t threads, int maxOpsPerBlock, bool roomy,
                   bool lean, bool programmatic, DataType dtype, ReduceOp op, void* stream);
#endif
/// The host stubs of the plan kernels (empty in CPU-only builds); an executor
/// loads them into its device when it is made (core/kernel_loading.hpp).
std::vector<const void*> planKernels();

}  // namespace pyccl
