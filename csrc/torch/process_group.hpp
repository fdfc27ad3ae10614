// The torch.distributed backend "pyccl": a c10d::Backend over pyccl's
// collective engine, so that `init_process_group("cuda:pyccl,cpu:pyccl")`
// (or "cpu:gloo,cuda:pyccl") runs torch's collectives, functional
// collectives included, on pyccl's kernels.
//
//  - Every op runs on the current CUDA stream of its tensors' device (CPU
//    tensors: host mode, done on return), with that device current while it
//    enqueues, and can be captured in a CUDA graph.
//  - One GPU per rank, as ProcessGroupNCCL: the GPU communicator and its
//    scratch (the "GPU lane") are made when the backend is, where its creator
//    knows the device then (BackendOptions::cudaDevice); otherwise at the first
//    CUDA op, on the device init_process_group bound the group to (device_id)
//    or else on that op's tensors' device, and that op must not be captured.
//    A later op on another GPU is refused, naming both devices.
//  - pyccl.communicator_for(group) runs on the same lanes (lane()): a group
//    has one runtime, whichever API calls it.
//  - Messages from a per-collective size on go to the delegate backend when
//    one is given (ProcessGroupNCCL), like the Python API. So do the ops made
//    of sends and receives on GPUs (send/recv, gather, scatter, all-to-all and
//    all-gather of uneven sizes: process_group_p2p.cpp), which run on pyccl's send/recv
//    kernels without a delegate, and through the store on CPUs.
//  - Coalescing (batch_isend_irecv, _coalescing_manager): the sends and
//    receives of a block run together at its end (coalesced_p2p.hpp), in one
//    launch on GPUs; with a delegate, the block is also one NCCL group there.
//  - Work objects: wait() orders the caller's current stream after the op,
//    isCompleted() polls its event, getFuture() completes with the outputs.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/collective_engine.hpp"
#include "dispatch/selector.hpp"
#include "executor/plan_runners.hpp"
#include "torch/coalesced_p2p.hpp"

namespace pyccl {


/// Makes the delegate backend for a GPU (null: none).
using DelegateFactory = std::function<c10::intrusive_ptr<c10d::Backend>(int device)>;

/// Runs a collective on a communicator whose ranks span nodes (pyccl.across_nodes,
/// in Python): collective ("all_reduce", "all_gather", "reduce_scatter"), the
/// lane's communicator, input, output, op ("sum", "avg", "min", "max", "prod").
using AcrossNodesRunner = std::function<void(const std::string& collective, const std::shared_ptr<Communicator>& comm,
                                             const at::Tensor& input, const at::Tensor& output, const std::string& op)>;

/// Sets up and runs a call the lane's selector gave a DSL plan not yet set up on the lane (pyccl.registry, in
/// Python, keeping the runner in the lane's `plans` under `slot`): collective, the lane's communicator and plans,
/// the choice (its registered plan or table entry), its slot (planSlotOf), input, output, op.
using PlanRunner = std::function<void(const std::string& collective, const std::shared_ptr<Communicator>& comm,
                                      const std::shared_ptr<PlanRunners>& plans, const Choice& choice,
                                      const PlanSlot& slot, const at::Tensor& input, const at::Tensor& output,
                                      const std::string& op)>;

struct BackendOptions {
  std::string name;  ///< unique per group, the same on every rank
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  int cudaDevice = -1;  ///< the GPU of this rank, set up now; -1: bound at the first CUDA op
  /// What each lane's selector is made from (dispatch/selector.hpp): the GPU lane's (with the tuning tables
  /// of the GPU and world size) and the CPU lane's. Where the selector picks NCCL, a CUDA op goes to the
  /// delegate.
  SelectorConfig gpuSelector;
  SelectorConfig hostSelector;
  /// Where the group spans nodes: runs all_reduce, all_gather_into_tensor and
  /// reduce_scatter_tensor (the other ops go to the delegate). Null: such a
  /// group is refused, as the collective engine needs every peer in reach.
  AcrossNodesRunner acrossNodes;
  /// Runs the plans the selector chooses for all_reduce, all_gather_into_tensor and reduce_scatter_tensor.
  /// Null: those ops leave plans out of the choice.
  PlanRunner plans;
  /// The options of the GPU lane's collective engine (the tuning table's kernel choices, for the kernels it
  /// chooses itself: the fused all-reduce + RMSNorm's two-kernel path).
  CollectiveOptions gpuEngine;
};

class PycclBackend : public c10d::Backend {
 public:
  /// Collective over `store`: makes the GPU communicator and its collective
  /// scratch now (the CPU one on the first CPU op).
  PycclBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, BackendOptions options,
               DelegateFactory delegateFactory);
  ~PycclBackend() override;

  const std::string getBackendName() const override { return "pyccl"; }

  /// torch's sequence numbers (TORCH_DISTRIBUTED_DEBUG=DETAIL checks them): every rank's backend starts at 0
  /// and counts the ops it is given, so ranks that make the same calls agree without a store round trip.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  /// outputs[r][i]: rank r's inputs[i] (torch's all_gather_coalesced): one all-gather per input.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  bool supportsCoalescing() const override { return true; }
  /// Opens a coalescing block: sends and receives until endCoalescing are held
  /// (their works refuse wait() until then); collectives still run at once, or in
  /// the delegate's group where the delegate takes them. A block left open (an
  /// error inside it) is dropped, its works failed, with a warning.
  void startCoalescing() override;
  /// Runs the block's sends and receives together on the current stream (CPU
  /// tensors: done on return) and returns their work; null if it held none.
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void abort() override;
  void shutdown() override;

  /// pyccl.graph_capture on this group (engine/graph_buffers.hpp): the
  /// engine of the lane on `device` collects the all-reduces captured from
  /// here on. Collective; sets the lane up if needed.
  void beginGraphCapture(int device);
  /// Collective, after the capture: registers them; returns how many calls.
  size_t finishGraphCapture();
  /// Ends the collection without registering.
  void abandonGraphCapture();

  /// A communicator and its collective engine: the runtime of one device kind of the group.
  struct Lane {
    std::shared_ptr<Communicator> comm;
    std::shared_ptr<CollectiveEngine> engine;  ///< null where the ranks span nodes
    std::shared_ptr<Selector> selector;        ///< what runs each call, for every entry point on this lane
    /// The plans set up on the lane (by the Python path, at a plan's first call), for every entry point.
    std::shared_ptr<PlanRunners> plans = std::make_shared<PlanRunners>();
    bool acrossNodes = false;
  };
  /// The lane of `device` (a CUDA ordinal, or -1 for the CPU one), set up
  /// first where it is not yet (collective then, like the first op on it):
  /// what pyccl.communicator_for(group) runs on. A CUDA device other than the
  /// GPU lane's is refused, naming both; a shut-down group with ClosedError.
  Lane lane(int device);

 private:

  Lane makeLane(int device);
  /// A lane's engine options: the GPU lane's options_.gpuEngine, with what its selector read as settings every
  /// rank must share (Selector::settings).
  CollectiveOptions engineOptions(bool gpu, const Selector& selector) const;
  /// The lane of `t`'s device, whose engine runs `op`; refuses a lane that
  /// spans nodes (no engine) with a message naming `op`.
  Lane& laneFor(const at::Tensor& t, const char* op);
  /// The lane of `t` where its ranks span nodes (pyccl.across_nodes runs its
  /// collectives), else null.
  Lane* acrossNodesLane(const at::Tensor& t, const char* op);
  /// On a lane that spans nodes: runs `collective` through options_.acrossNodes
  /// where its dtype and op allow, else hands it to the delegate (`delegateCall`),
  /// else refuses naming `op`.
  c10::intrusive_ptr<c10d::Work> runAcrossNodes(Lane& lane, const char* op, const char* collective,
                                                const at::Tensor& input, const at::Tensor& output,
                                                const c10d::ReduceOp* reduceOp, c10d::OpType type,
                                                const std::function<c10::intrusive_ptr<c10d::Work>()>& delegateCall);
  /// Sets up the GPU lane (and the delegate) if not yet done: on the device
  /// init_process_group bound the group to, else on `device` (that of the
  /// first CUDA op's tensors).
  void ensureGpuLane(int device);
  /// The CPU lane, set up at its first use.
  Lane& hostLane();
  /// The lane of a CUDA tensor's `device`: the GPU lane, set up if need be;
  /// InvalidArgument naming `arg` where the GPU lane runs on another device.
  Lane& gpuLaneFor(int device, const char* arg);
  /// Whether an op on `t` of `wholeBytes` goes to the delegate: the lane's selector's choice
  /// (`choice`, for the engine where it stays), or a reduction dtype pyccl lacks. Sets up the lane first.
  bool delegated(Collective c, const at::Tensor& t, uint64_t wholeBytes, Choice& choice, bool plans = false);
  /// Runs `choice`'s plan (options_.plans) where the selector chose one; returns whether it did.
  bool ranPlan(const Choice& choice, const char* collective, const at::Tensor& input, const at::Tensor& output,
               const c10d::ReduceOp* op);
  /// False where the delegate must take a reduction op pyccl lacks (BAND, PREMUL_SUM, ...).
  bool reducesHere(const at::Tensor& t, const c10d::ReduceOp& op) const;
  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> outputs);
  /// Whether the delegate takes an op made of sends and receives on `t`: a CUDA
  /// tensor, on a group with a delegate. Sets up the GPU lane first (refusing a
  /// closed group, naming `op`).
  bool delegateTakes(const at::Tensor& t, const char* op);
  /// send (`send`) or recv of `t` with `peer`: to the delegate (CUDA, if any),
  /// held (a coalescing block is open), or run now.
  c10::intrusive_ptr<c10d::Work> pointToPoint(bool send, at::Tensor& t, int peer, int tag);
  /// Opens the delegate's group if a block is open and it has none yet. Under laneMutex_.
  void startDelegateCoalescing();
  /// Runs `transfers` now: CPU ones through the store (sends first), CUDA ones
  /// in one sendRecv on the current stream. `op` names the call in errors.
  void runTransfers(const std::vector<HeldTransfer>& transfers, const char* op);
  /// All-to-all as sends and receives (any sizes; a pair's sizes must agree):
  /// outputs[q] from rank q, inputs[q] to it, this rank's own part copied.
  c10::intrusive_ptr<c10d::Work> allToAllByTransfers(const std::vector<at::Tensor>& outputs,
                                                     const std::vector<at::Tensor>& inputs, c10d::OpType type,
                                                     const char* op);
  /// gather (`gathering`: every rank's `own` into the root's list) or scatter
  /// (the root's list into every rank's `own`) as sends and receives.
  c10::intrusive_ptr<c10d::Work> rootedByTransfers(bool gathering, at::Tensor& own,
                                                   std::vector<std::vector<at::Tensor>>& lists, int root);
  /// all_to_all_single with uneven splits (dim 0) through allToAllByTransfers.
  c10::intrusive_ptr<c10d::Work> unevenAllToAllSingle(at::Tensor& output, const at::Tensor& input,
                                                      const std::vector<int64_t>& outputSplits,
                                                      const std::vector<int64_t>& inputSplits);
  void checkUsable(const char* op) const;

  c10::intrusive_ptr<c10d::Store> store_;
  BackendOptions options_;
  DelegateFactory delegateFactory_;
  c10::intrusive_ptr<c10d::Backend> delegate_;
  std::mutex laneMutex_;
  std::unique_ptr<Lane> gpu_;
  std::unique_ptr<Lane> host_;
  uint64_t seq_ = 0;
  bool shutDown_ = false;
  P2PBatch batch_;
  bool delegateCoalescing_ = false;  ///< the delegate has an NCCL group open for the block
};

}  // namespace pyccl
