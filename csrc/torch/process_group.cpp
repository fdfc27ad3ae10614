// The pyccl process group (PycclBackend): its lanes (a communicator and
// engine per device kind, made at the first op on it), the NCCL delegate,
// graph capture, barrier, abort and shutdown. The ops are in
// process_group_collectives.cpp and process_group_p2p.cpp.
#include "torch/process_group.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>
#include <string>
#include <utility>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "torch/backend_calls.hpp"
#include "torch/store_adapter.hpp"
#include "torch/tensor_collectives.hpp"
#include "torch/work.hpp"

namespace pyccl {
namespace {

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
  // As ProcessGroupNCCL: the device init_process_group(device_id=...) bound the group to, else the first op's.
  if (const auto bound = getBoundDeviceId(); bound && bound->is_cuda() && bound->has_index()) device = bound->index();
#ifdef PYCCL_WITH_CUDA
  gpu::DeviceGuard onDevice(device);  // the default stream's handle names the current device's
  if (gpu::isCapturing(c10::cuda::getCurrentCUDAStream(device).stream())) {
    throw InvalidArgument(strCat(
        "invalid argument 'tensor': the first CUDA op of process group '", options_.name,
        "' is being captured in a CUDA graph, and the group cannot set up its GPU buffers during a capture; run "
        "one op eagerly first, or make the group with a backend string that names cuda first (\"pyccl\", "
        "\"cuda:pyccl,cpu:pyccl\") after torch.cuda.set_device(local_rank) on every rank"));
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
  // The lane's selector first: it reads the environment (a bad value fails here), and the engine checks that
  // every rank's selector read the same.
  SelectorConfig config = device >= 0 ? options_.gpuSelector : options_.hostSelector;
  config.worldSize = getSize();
  // The engine's kernels need every peer in reach; where the ranks span nodes, pyccl.across_nodes runs the
  // collectives on plans instead (every rank sees the same topology).
  lane.acrossNodes = config.acrossNodes = lane.comm->firstUnreachablePeer() >= 0 && options_.acrossNodes;
  lane.selector = std::make_shared<Selector>(std::move(config), engineDefaults(nullptr));
  if (lane.acrossNodes) {
    PYCCL_LOG(Info, "pyccl backend '" << options_.name << "': the group spans nodes; all_reduce, all_gather and "
                                      << "reduce_scatter run across nodes, the other ops on the delegate");
    return lane;
  }
  lane.engine = std::make_shared<CollectiveEngine>(*lane.comm, engineOptions(device >= 0, *lane.selector));
  lane.selector->setDefaultKernel(engineDefaults(lane.engine));
  return lane;
}

CollectiveOptions PycclBackend::engineOptions(bool gpu, const Selector& selector) const {
  CollectiveOptions o = gpu ? options_.gpuEngine : CollectiveOptions{};
  for (const auto& [name, value] : selector.settings()) o.agreedSettings[name] = value;
  return o;
}

void PycclBackend::beginGraphCapture(int device) {
  checkUsable("graph_capture");
  gpuLaneFor(device, "device");
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

PycclBackend::Lane& PycclBackend::gpuLaneFor(int device, const char* arg) {
  ensureGpuLane(device);
  PYCCL_CHECK_ARG(device == options_.cudaDevice, arg, "is on cuda:", device, ", but on this rank process group '",
                  options_.name, "' runs on cuda:", options_.cudaDevice,
                  " (one GPU per rank: the device_id given to init_process_group, else the current device when "
                  "the group was made after torch.cuda.set_device, else the device of its first CUDA op)");
  return *gpu_;
}

PycclBackend::Lane& PycclBackend::hostLane() {
  std::lock_guard<std::mutex> lock(laneMutex_);
  if (host_ == nullptr) host_ = std::make_unique<Lane>(makeLane(-1));  // every rank makes the same first CPU call
  return *host_;
}

PycclBackend::Lane PycclBackend::lane(int device) {
  checkUsable("communicator_for");
  return device >= 0 ? gpuLaneFor(device, "device") : hostLane();
}

PycclBackend::Lane& PycclBackend::laneFor(const at::Tensor& t, const char* op) {
  checkUsable(op);
  if (t.is_cuda()) return refuseAcrossNodes(gpuLaneFor(t.device().index(), "tensor"), options_.name, op);
  PYCCL_CHECK_ARG(t.device().is_cpu(), "tensor", "must be a CUDA or CPU tensor, got ", t.device().str());
  return refuseAcrossNodes(hostLane(), options_.name, op);
}

PycclBackend::Lane* PycclBackend::acrossNodesLane(const at::Tensor& t, const char* op) {
  checkUsable(op);
  if (t.is_cuda()) {
    Lane& gpuLane = gpuLaneFor(t.device().index(), "tensor");
    return gpuLane.acrossNodes ? &gpuLane : nullptr;
  }
  if (!t.device().is_cpu()) return nullptr;  // laneFor names the device
  Lane& cpuLane = hostLane();
  return cpuLane.acrossNodes ? &cpuLane : nullptr;
}

c10::intrusive_ptr<c10d::Work> PycclBackend::done(c10d::OpType type, std::vector<at::Tensor> outputs) {
  std::shared_ptr<Communicator> comm;
  const bool onGpu = !outputs.empty() && outputs[0].is_cuda();
  if (onGpu && gpu_ != nullptr) comm = gpu_->comm;
  if (!onGpu && host_ != nullptr) comm = host_->comm;
  return c10::make_intrusive<PycclWork>(getRank(), type, ++seq_, std::move(outputs), std::move(comm));
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
