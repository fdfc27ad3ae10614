#include "torch/process_group.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "torch/backend_calls.hpp"
#include "torch/store_adapter.hpp"
#include "torch/tensor_collectives.hpp"

namespace pyccl {
namespace {

void* currentStreamOf(const at::Tensor& t) {
#ifdef PYCCL_WITH_CUDA
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif
  return nullptr;
}

/// Whether Work.wait() blocks the host until the op completes or the group's
/// timeout passes (PYCCL_BLOCKING_WAIT=1, like TORCH_NCCL_BLOCKING_WAIT), instead
/// of ordering the caller's stream after it.
bool blockingWait() {
  static const bool on = [] {
    const char* v = std::getenv("PYCCL_BLOCKING_WAIT");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

/// The op's outputs, ready when the event recorded after the op has passed.
/// Reports a failure of its communicator (a wait that gave up, an abort) as a
/// DistBackendError from wait() and synchronize().
class PycclWork : public c10d::Work {
 public:
  PycclWork(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
            std::shared_ptr<Communicator> comm)
      : c10d::Work(rank, type), seq_(seq), outputs_(std::move(outputs)), comm_(std::move(comm)) {
    if (!outputs_.empty() && outputs_[0].is_cuda()) {
      device_ = outputs_[0].device().index();
      stream_ = currentStreamOf(outputs_[0]);
      // A captured op completes when the graph is replayed; nothing to track here.
      if (!gpu::isCapturing(stream_)) event_ = std::make_unique<gpu::StreamEvent>(device_, stream_);
    }
  }

  bool isCompleted() override { return event_ == nullptr || event_->query(); }
  bool isSuccess() const override { return comm_ == nullptr || !comm_->health().broken(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

  /// Orders the caller's current stream after the op (as ProcessGroupNCCL
  /// does), or with PYCCL_BLOCKING_WAIT=1 waits on the host, bounded by
  /// `timeout` or the group's. Raises if the communicator is broken.
  bool wait(std::chrono::milliseconds timeout) override {
    if (event_ != nullptr) {
      if (blockingWait()) {
        waitOnHost(timeout);
      } else if (void* caller = currentStreamOf(outputs_[0]); caller != stream_) {
        // The op ran on the caller's stream when it is still current (the usual
        // synchronous call): the stream is ordered after it already, and a wait
        // on its own event would cost the host a CUDA call for nothing.
        event_->block(caller);
      }
    }
    raiseIfBroken();
    return true;
  }
  void synchronize() override {
    if (event_ != nullptr) waitOnHost(kNoTimeout);
    raiseIfBroken();
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!future_) {
      std::vector<c10::Device> devices;
      if (device_ >= 0) devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_));
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
      // A CUDA future records its own event on the current stream, after the op.
      future_->markCompleted(c10::IValue(outputs_));
    }
    return future_;
  }

 private:
  /// Polls the event until it passes; past the bound (`timeout`, or the
  /// group's and a margin), breaks the communicator (its kernels give up) and raises.
  void waitOnHost(std::chrono::milliseconds timeout) {
    // The kernels' own bound comes first and names the peer; this one only
    // catches what they cannot (a kernel that never started).
    const auto bound = timeout == kNoTimeout && comm_ != nullptr ? comm_->timeout() + std::chrono::seconds(2)
                                                                  : timeout;
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (!event_->query()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string what = strCat("work ", seq_, " (", c10d::opTypeToString(opType_),
                                        ") did not complete within ", bound.count(), " ms");
        if (comm_ != nullptr) comm_->health().fail(ErrorCode::kTimeout, what);
        C10_THROW_ERROR(DistBackendError, strCat("pyccl: ", what, "; the process group is broken"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  /// Reads the error record too: the op's kernel may have given up a moment
  /// before the watchdog's next look.
  void raiseIfBroken() const {
    if (comm_ == nullptr) return;
    try {
      comm_->checkCompleted(c10d::opTypeToString(opType_).c_str());
    } catch (const Error& e) {
      C10_THROW_ERROR(DistBackendError, strCat("pyccl work ", seq_, ": ", e.what()));
    }
  }

  uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<Communicator> comm_;
  int device_ = -1;
  void* stream_ = nullptr;  // the stream the op was enqueued on
  std::unique_ptr<gpu::StreamEvent> event_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

ReduceOp reduceOpOfC10d(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    default:
      throw TypeError("invalid argument 'op': pyccl reduces with SUM, AVG, PRODUCT, MIN and MAX, not "
                      "BAND/BOR/BXOR/PREMUL_SUM");
  }
}

/// Whether pyccl reduces tensors of `st` (its kernels and plans: float32, float16, bfloat16).
bool pycclReducesDtype(at::ScalarType st) { return st == at::kFloat || st == at::kHalf || st == at::kBFloat16; }

bool pycclReduces(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      return true;
    default:
      return false;
  }
}

/// `lane`, unless its ranks span nodes: then only the collectives run across
/// nodes and what the delegate takes are there, and `op` is neither.
template <typename Lane>
Lane& refuseAcrossNodes(Lane& lane, const std::string& group, const char* op) {
  if (lane.acrossNodes) {
    throw UnsupportedError(strCat("process group '", group, "' spans nodes, where pyccl runs all_reduce, ",
                                  "all_gather_into_tensor and reduce_scatter_tensor; ", op, " needs the NCCL ",
                                  "delegate (CUDA tensors, PYCCL_NCCL_DELEGATE=1)"));
  }
  return lane;
}

}  // namespace

PycclBackend::PycclBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, BackendOptions options,
                           DelegateFactory delegateFactory)
    : c10d::Backend(rank, size), store_(std::move(store)), options_(std::move(options)),
      delegateFactory_(std::move(delegateFactory)) {
  translated("init", [&] {
    PYCCL_CHECK_ARG(!options_.name.empty(), "name", "must not be empty");
    if (options_.cudaDevice >= 0) ensureGpuLane(options_.cudaDevice);
  });
}

void PycclBackend::ensureGpuLane(int device) {
  std::lock_guard<std::mutex> lock(laneMutex_);
  if (gpu_ != nullptr) return;
#ifdef PYCCL_WITH_CUDA
  if (gpu::isCapturing(c10::cuda::getCurrentCUDAStream(device).stream())) {
    throw InvalidArgument(strCat(
        "invalid argument 'tensor': the first CUDA op of process group '", options_.name,
        "' is being captured in a CUDA graph, and the group cannot set up its GPU buffers during a capture; run "
        "one op eagerly first, or make the group with a backend string that names cuda first (\"pyccl\", "
        "\"cuda:pyccl,cpu:pyccl\") after torch.cuda.set_device"));
  }
#endif
  options_.cudaDevice = device;
  gpu_ = std::make_unique<Lane>(makeLane(device));  // every rank makes the same first CUDA call
  if (delegateFactory_) delegate_ = delegateFactory_(device);
  startDelegateCoalescing();  // a block opened before the first CUDA op
}

PycclBackend::~PycclBackend() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    PYCCL_LOG(Error, "pyccl backend '" << options_.name << "' shutdown: " << e.what());
  }
}

PycclBackend::Lane PycclBackend::makeLane(int device) {
  CommunicatorOptions opts;
  opts.name = strCat(options_.name, device >= 0 ? "_cuda" : "_cpu");
  opts.timeout = options_.timeout;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(device >= 0 ? "cuda" : "cpu", store_);
  Lane lane;
  lane.comm = std::make_shared<Communicator>(std::make_shared<C10dStore>(prefixed), getRank(), getSize(), device,
                                             opts);
  if (lane.comm->firstUnreachablePeer() >= 0 && options_.acrossNodes) {
    // The engine's kernels need every peer in reach; pyccl.across_nodes runs
    // the collectives on plans instead (every rank sees the same topology).
    lane.acrossNodes = true;
    PYCCL_LOG(Info, "pyccl backend '" << options_.name << "': the group spans nodes; all_reduce, all_gather and "
                                      << "reduce_scatter run across nodes, the other ops on the delegate");
    return lane;
  }
  lane.engine = std::make_unique<CollectiveEngine>(*lane.comm, device >= 0 ? options_.gpuEngine : CollectiveOptions{});
  return lane;
}

void PycclBackend::beginGraphCapture(int device) {
  checkUsable("graph_capture");
  ensureGpuLane(device);
  PYCCL_CHECK_ARG(gpu_->engine != nullptr, "group", "spans nodes, where captured all-reduces cannot take graph "
                  "buffers (they need every peer within P2P reach)");
  gpu_->engine->beginGraphCapture();
}

size_t PycclBackend::finishGraphCapture() {
  checkUsable("graph_capture");
  if (gpu_ == nullptr || gpu_->engine == nullptr) {
    throw InvalidArgument(strCat("graph_capture: process group '", options_.name, "' is not in a graph_capture block"));
  }
  return gpu_->engine->finishGraphCapture();
}

void PycclBackend::abandonGraphCapture() {
  if (gpu_ != nullptr && gpu_->engine != nullptr) gpu_->engine->abandonGraphCapture();
}

void PycclBackend::checkUsable(const char* op) const {
  if (shutDown_) throw ClosedError(strCat("process group '", options_.name, "' was shut down (", op, ")"));
}

PycclBackend::Lane& PycclBackend::laneFor(const at::Tensor& t, const char* op) {
  checkUsable(op);
  if (t.is_cuda()) {
    ensureGpuLane(t.device().index());
    PYCCL_CHECK_ARG(t.device().index() == options_.cudaDevice, "tensor", "is on ", t.device().str(),
                    ", but this rank's pyccl process group runs on cuda:", options_.cudaDevice,
                    " (the device of its first CUDA op, or the current one when the group was made)");
    return refuseAcrossNodes(*gpu_, options_.name, op);
  }
  PYCCL_CHECK_ARG(t.device().is_cpu(), "tensor", "must be a CUDA or CPU tensor, got ", t.device().str());
  std::lock_guard<std::mutex> lock(laneMutex_);
  if (host_ == nullptr) host_ = std::make_unique<Lane>(makeLane(-1));  // every rank makes the same first CPU call
  return refuseAcrossNodes(*host_, options_.name, op);
}

PycclBackend::Lane* PycclBackend::acrossNodesLane(const at::Tensor& t, const char* op) {
  checkUsable(op);
  if (t.is_cuda()) {
    ensureGpuLane(t.device().index());
    return gpu_->acrossNodes && t.device().index() == options_.cudaDevice ? gpu_.get() : nullptr;
  }
  if (!t.device().is_cpu()) return nullptr;  // laneFor names the device
  std::lock_guard<std::mutex> lock(laneMutex_);
  if (host_ == nullptr) host_ = std::make_unique<Lane>(makeLane(-1));
  return host_->acrossNodes ? host_.get() : nullptr;
}

c10::intrusive_ptr<c10d::Work> PycclBackend::runAcrossNodes(
    Lane& lane, const char* op, const char* collective, const at::Tensor& input, const at::Tensor& output,
    const c10d::ReduceOp* reduceOp, c10d::OpType type,
    const std::function<c10::intrusive_ptr<c10d::Work>()>& delegateCall) {
  if (reduceOp == nullptr || (pycclReducesDtype(input.scalar_type()) && pycclReduces(*reduceOp))) {
    const char* name = "sum";
    if (reduceOp != nullptr) name = reduceOpName(reduceOpOfC10d(*reduceOp));
    options_.acrossNodes(collective, lane.comm, input, output, name);
    return done(type, {output});
  }
  if (delegate_ && input.is_cuda()) return delegateCall();
  throw UnsupportedError(strCat("process group '", options_.name, "' spans nodes, where pyccl runs ", op,
                                " on float32, float16 and bfloat16 with SUM, AVG, PRODUCT, MIN and MAX only, and ",
                                "it has no NCCL delegate for ", input.scalar_type(), " (PYCCL_NCCL_DELEGATE=1 ",
                                "on GPUs)"));
}

bool PycclBackend::delegated(BackendCollective c, const at::Tensor& t, uint64_t wholeBytes) {
  if (!t.is_cuda()) return false;
  ensureGpuLane(t.device().index());
  if (!delegate_) return false;
  if (gpu_->acrossNodes) return true;  // what reaches here is not among the collectives run across nodes
  if (wholeBytes >= options_.delegateMinBytes[static_cast<int>(c)]) return true;
  // Reductions pyccl does not do (integers, float64) go to NCCL too.
  const bool reduction = c == BackendCollective::kAllReduce || c == BackendCollective::kReduceScatter;
  return reduction && !pycclReducesDtype(t.scalar_type());
}

bool PycclBackend::reducesHere(const at::Tensor& t, const c10d::ReduceOp& op) const {
  return !(delegate_ && t.is_cuda()) || pycclReduces(op);
}

c10::intrusive_ptr<c10d::Work> PycclBackend::done(c10d::OpType type, std::vector<at::Tensor> outputs) {
  std::shared_ptr<Communicator> comm;
  const bool onGpu = !outputs.empty() && outputs[0].is_cuda();
  if (onGpu && gpu_ != nullptr) comm = gpu_->comm;
  if (!onGpu && host_ != nullptr) comm = host_->comm;
  return c10::make_intrusive<PycclWork>(getRank(), type, ++seq_, std::move(outputs), std::move(comm));
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  return translated("allreduce", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    if (Lane* far = acrossNodesLane(t, "allreduce")) {
      return runAcrossNodes(*far, "allreduce", "all_reduce", t, t, &opts.reduceOp, c10d::OpType::ALLREDUCE,
                            [&] { return delegate_->allreduce(tensors, opts); });
    }
    if (delegated(BackendCollective::kAllReduce, t, t.nbytes()) || !reducesHere(t, opts.reduceOp)) {
      return delegate_->allreduce(tensors, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(t, "allreduce");
    allReduceTensor(*lane.engine, *lane.comm, t, t, op, std::nullopt);
    return done(c10d::OpType::ALLREDUCE, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return translated("allreduce_coalesced", [&] {
    PYCCL_CHECK_ARG(!tensors.empty(), "tensors", "must not be empty");
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.nbytes();
    if (delegated(BackendCollective::kAllReduce, tensors[0], total) || !reducesHere(tensors[0], opts.reduceOp)) {
      return delegate_->allreduce_coalesced(tensors, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(tensors[0], "allreduce_coalesced");
    for (auto& t : tensors) allReduceTensor(*lane.engine, *lane.comm, t, t, op, std::nullopt);
    return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return translated("broadcast", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    if (delegated(BackendCollective::kBroadcast, t, t.nbytes())) return delegate_->broadcast(tensors, opts);
    Lane& lane = laneFor(t, "broadcast");
    broadcastTensor(*lane.engine, *lane.comm, t, t, static_cast<int>(opts.rootRank), std::nullopt);
    return done(c10d::OpType::BROADCAST, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return translated("reduce", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    if (delegated(BackendCollective::kAllReduce, t, t.nbytes()) || !reducesHere(t, opts.reduceOp)) {
      return delegate_->reduce(tensors, opts);
    }
    PYCCL_CHECK_ARG(opts.rootRank >= 0 && opts.rootRank < getSize(), "dst", "must be a rank of the group, got ",
                    opts.rootRank);
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(t, "reduce");
    // An all-reduce into scratch; only the root's tensor changes (as with NCCL).
    at::Tensor result = at::empty_like(t, at::MemoryFormat::Contiguous);
    allReduceTensor(*lane.engine, *lane.comm, t, result, op, std::nullopt);
    if (getRank() == opts.rootRank) t.copy_(result);
    return done(c10d::OpType::REDUCE, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  return translated("all_gather_into_tensor", [&] {
    if (Lane* far = acrossNodesLane(input, "all_gather_into_tensor")) {
      return runAcrossNodes(*far, "all_gather_into_tensor", "all_gather", input, output, nullptr,
                            c10d::OpType::_ALLGATHER_BASE,
                            [&] { return delegate_->_allgather_base(output, input, opts); });
    }
    if (delegated(BackendCollective::kAllGather, input, output.nbytes())) {
      return delegate_->_allgather_base(output, input, opts);
    }
    Lane& lane = laneFor(input, "all_gather_into_tensor");
    allGatherTensor(*lane.engine, *lane.comm, input, output, std::nullopt);
    return done(c10d::OpType::_ALLGATHER_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  return translated("all_gather", [&] {
    checkOne(inputs, "tensor");
    PYCCL_CHECK_ARG(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "tensor_list",
                    "must hold world_size (", getSize(), ") tensors");
    const at::Tensor& input = inputs[0];
    bool even = true;
    for (const auto& o : outputs[0]) {
      PYCCL_CHECK_ARG(o.scalar_type() == input.scalar_type(), "tensor_list", "every tensor must have the input's "
                      "dtype (", input.scalar_type(), "), got ", o.scalar_type());
      even = even && o.numel() == input.numel();
    }
    if (!even) {
      // Ranks of different sizes (as ProcessGroupNCCL takes them): the delegate, else a send to and a
      // receive from every peer.
      PYCCL_CHECK_ARG(outputs[0][getRank()].numel() == input.numel(), "tensor_list", "tensor ", getRank(),
                      " (this rank's) must have the input's ", input.numel(), " elements, got ",
                      outputs[0][getRank()].numel());
      if (delegateTakes(input, "all_gather")) return delegate_->allgather(outputs, inputs, opts);
      return allToAllByTransfers(outputs[0], std::vector<at::Tensor>(getSize(), input), c10d::OpType::ALLGATHER,
                                 "all_gather");
    }
    if (delegated(BackendCollective::kAllGather, input, input.nbytes() * getSize())) {
      return delegate_->allgather(outputs, inputs, opts);
    }
    Lane& lane = laneFor(input, "all_gather");
    at::Tensor flat = at::empty({input.numel() * getSize()}, input.options());
    allGatherTensor(*lane.engine, *lane.comm, input, flat, std::nullopt);
    for (int q = 0; q < getSize(); ++q) {
      outputs[0][q].copy_(flat.narrow(0, q * input.numel(), input.numel()).view(outputs[0][q].sizes()));
    }
    return done(c10d::OpType::ALLGATHER, outputs[0]);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  return translated("all_gather_into_tensor_coalesced", [&] {
    PYCCL_CHECK_ARG(!inputs.empty() && outputs.size() == inputs.size(), "output_tensors",
                    "must pair with the inputs, one output per input");
    uint64_t total = 0;
    for (const auto& o : outputs) total += o.nbytes();
    if (delegated(BackendCollective::kAllGather, inputs[0], total)) {
      return delegate_->allgather_into_tensor_coalesced(outputs, inputs, opts);
    }
    Lane& lane = laneFor(inputs[0], "all_gather_into_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      allGatherTensor(*lane.engine, *lane.comm, inputs[i], outputs[i], std::nullopt);
    }
    return done(c10d::OpType::COALESCED, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter_tensor", [&] {
    if (Lane* far = acrossNodesLane(input, "reduce_scatter_tensor")) {
      return runAcrossNodes(*far, "reduce_scatter_tensor", "reduce_scatter", input, output, &opts.reduceOp,
                            c10d::OpType::_REDUCE_SCATTER_BASE,
                            [&] { return delegate_->_reduce_scatter_base(output, input, opts); });
    }
    if (delegated(BackendCollective::kReduceScatter, input, input.nbytes()) || !reducesHere(input, opts.reduceOp)) {
      return delegate_->_reduce_scatter_base(output, input, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(input, "reduce_scatter_tensor");
    reduceScatterTensor(*lane.engine, *lane.comm, input, output, op, std::nullopt);
    return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter", [&] {
    checkOne(outputs, "output");
    PYCCL_CHECK_ARG(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "input_list",
                    "must hold world_size (", getSize(), ") tensors");
    at::Tensor& output = outputs[0];
    for (const auto& i : inputs[0]) {
      PYCCL_CHECK_ARG(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(), "input_list",
                      "every tensor must match the output's size and dtype");
    }
    if (delegated(BackendCollective::kReduceScatter, output, output.nbytes() * getSize()) ||
        !reducesHere(output, opts.reduceOp)) {
      return delegate_->reduce_scatter(outputs, inputs, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(output, "reduce_scatter");
    std::vector<at::Tensor> flats;
    for (const auto& i : inputs[0]) flats.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(flats);
    reduceScatterTensor(*lane.engine, *lane.comm, flat, output, op, std::nullopt);
    return done(c10d::OpType::REDUCE_SCATTER, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter_tensor_coalesced", [&] {
    PYCCL_CHECK_ARG(!inputs.empty() && outputs.size() == inputs.size(), "output_tensors",
                    "must pair with the inputs, one output per input");
    uint64_t total = 0;
    for (const auto& i : inputs) total += i.nbytes();
    if (delegated(BackendCollective::kReduceScatter, inputs[0], total) || !reducesHere(inputs[0], opts.reduceOp)) {
      return delegate_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(inputs[0], "reduce_scatter_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      reduceScatterTensor(*lane.engine, *lane.comm, inputs[i], outputs[i], op, std::nullopt);
    }
    return done(c10d::OpType::COALESCED, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  return translated("all_to_all_single", [&] {
    auto even = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
      if (splits.empty()) return true;
      for (int64_t s : splits) {
        if (t.dim() == 0 || s * getSize() != t.size(0)) return false;
      }
      return true;
    };
    const bool equal = even(outputSplitSizes, output) && even(inputSplitSizes, input);
    if (!equal || delegated(BackendCollective::kAllToAll, input, input.nbytes())) {
      if (delegate_ && input.is_cuda()) {
        return delegate_->alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
      }
      // No delegate: each piece is a send and a receive, all in one launch.
      return unevenAllToAllSingle(output, input, outputSplitSizes, inputSplitSizes);
    }
    Lane& lane = laneFor(input, "all_to_all_single");
    allToAllTensor(*lane.engine, *lane.comm, input, output, std::nullopt);
    return done(c10d::OpType::ALLTOALL_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  return translated("all_to_all", [&] {
    PYCCL_CHECK_ARG(static_cast<int>(inputs.size()) == getSize() && outputs.size() == inputs.size(),
                    "input_tensor_list", "must hold world_size (", getSize(), ") tensors, as must the outputs");
    bool equal = true;
    for (size_t q = 0; q < inputs.size(); ++q) {
      equal = equal && inputs[q].numel() == inputs[0].numel() && outputs[q].numel() == inputs[0].numel() &&
              inputs[q].scalar_type() == inputs[0].scalar_type() &&
              outputs[q].scalar_type() == inputs[0].scalar_type();
    }
    if (!equal || delegated(BackendCollective::kAllToAll, inputs[0], inputs[0].nbytes() * getSize())) {
      if (delegate_ && inputs[0].is_cuda()) return delegate_->alltoall(outputs, inputs, opts);
      return allToAllByTransfers(outputs, inputs, c10d::OpType::ALLTOALL, "all_to_all");
    }
    Lane& lane = laneFor(inputs[0], "all_to_all");
    std::vector<at::Tensor> flats;
    for (const auto& i : inputs) flats.push_back(i.reshape({-1}));
    at::Tensor flatIn = at::cat(flats);
    at::Tensor flatOut = at::empty_like(flatIn);
    allToAllTensor(*lane.engine, *lane.comm, flatIn, flatOut, std::nullopt);
    const int64_t n = inputs[0].numel();
    for (size_t q = 0; q < outputs.size(); ++q) {
      outputs[q].copy_(flatOut.narrow(0, static_cast<int64_t>(q) * n, n).view(outputs[q].sizes()));
    }
    return done(c10d::OpType::ALLTOALL, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::barrier(const c10d::BarrierOptions& /*opts*/) {
  return translated("barrier", [&] {
    checkUsable("barrier");
    if (gpu_ != nullptr && gpu_->acrossNodes) {
      // The stream's work done here, then every rank meets through the store.
      gpu::synchronizeStream(options_.cudaDevice, currentStream(*gpu_->comm));
      gpu_->comm->barrier();
      return done(c10d::OpType::BARRIER, {});
    }
    if (gpu_ != nullptr) {
      // As ProcessGroupNCCL: a one-element all-reduce orders every rank's stream
      // work, and the host waits for it.
      at::Tensor one = at::ones({1}, at::TensorOptions().device(at::kCUDA, options_.cudaDevice));
      allReduceTensor(*gpu_->engine, *gpu_->comm, one, one, ReduceOp::kSum, std::nullopt);
      gpu::synchronizeStream(options_.cudaDevice, currentStream(*gpu_->comm));
      return done(c10d::OpType::BARRIER, {});
    }
    const at::Tensor none = at::empty({0});
    Lane* far = acrossNodesLane(none, "barrier");  // a barrier needs only the communicator
    Lane& lane = far != nullptr ? *far : laneFor(none, "barrier");
    lane.comm->barrier();
    return done(c10d::OpType::BARRIER, {});
  });
}

void PycclBackend::abort() {
  for (Lane* lane : {gpu_.get(), host_.get()}) {
    if (lane != nullptr) lane->comm->abort();
  }
  if (delegate_) delegate_->abort();
}

void PycclBackend::shutdown() {
  if (shutDown_) return;
  shutDown_ = true;
  for (auto* lane : {&gpu_, &host_}) {
    if (*lane == nullptr) continue;
    if ((*lane)->engine != nullptr) (*lane)->engine->close();
    (*lane)->comm->close();
  }
  if (delegate_) delegate_->shutdown();
}

}  // namespace pyccl
