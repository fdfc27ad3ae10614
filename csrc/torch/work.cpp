#include "torch/work.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>
#include <thread>
#include <utility>

#include "core/env_settings.hpp"
#include "core/errors.hpp"

namespace pyccl {
namespace {

/// Whether Work.wait() blocks the host until the op completes or the group's
/// timeout passes (PYCCL_BLOCKING_WAIT=1, like TORCH_NCCL_BLOCKING_WAIT), instead
/// of ordering the caller's stream after it.
bool blockingWait() {
  static const bool on = envFlag("PYCCL_BLOCKING_WAIT", false);
  return on;
}

}  // namespace

void* currentStreamOf(const at::Tensor& t) {
#ifdef PYCCL_WITH_CUDA
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif
  (void)t;
  return nullptr;
}

PycclWork::PycclWork(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
                     std::shared_ptr<Communicator> comm)
    : c10d::Work(rank, type), seq_(seq), outputs_(std::move(outputs)), comm_(std::move(comm)) {
  if (!outputs_.empty() && outputs_[0].is_cuda()) {
    device_ = outputs_[0].device().index();
    stream_ = currentStreamOf(outputs_[0]);
    gpu::DeviceGuard onDevice(device_);  // the default stream's handle names the current device's
    // A captured op completes when the graph is replayed; nothing to track here.
    if (!gpu::isCapturing(stream_)) event_ = std::make_unique<gpu::StreamEvent>(device_, stream_);
  }
}

bool PycclWork::wait(std::chrono::milliseconds timeout) {
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

void PycclWork::synchronize() {
  if (event_ != nullptr) waitOnHost(kNoTimeout);
  raiseIfBroken();
}

c10::intrusive_ptr<c10::ivalue::Future> PycclWork::getFuture() {
  if (!future_) {
    std::vector<c10::Device> devices;
    if (device_ >= 0) devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_));
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    // A CUDA future records its own event on the current stream, after the op.
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

/// Polls the event until it passes; past the bound (`timeout`, or the
/// group's and a margin), breaks the communicator (its kernels give up) and raises.
void PycclWork::waitOnHost(std::chrono::milliseconds timeout) {
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
void PycclWork::raiseIfBroken() const {
  if (comm_ == nullptr) return;
  try {
    comm_->checkCompleted(c10d::opTypeToString(opType_).c_str());
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, strCat("pyccl work ", seq_, ": ", e.what()));
  }
}

}  // namespace pyccl
