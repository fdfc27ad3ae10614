// The Work objects of the pyccl process group: an op's outputs and the
// event recorded after it on its stream; wait() orders the caller's stream
// after the op (or, with PYCCL_BLOCKING_WAIT=1, waits on the host), and a
// failure of the op's communicator surfaces as a DistBackendError.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <vector>

#include "core/communicator.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {

/// The current CUDA stream of `t`'s device; nullptr for a CPU tensor.
void* currentStreamOf(const at::Tensor& t);

/// The op's outputs, ready when the event recorded after the op has passed.
/// Reports a failure of its communicator (a wait that gave up, an abort) as a
/// DistBackendError from wait() and synchronize().
class PycclWork : public c10d::Work {
 public:
  /// Records the event on the current stream of the outputs' device (none for
  /// CPU outputs, or while the stream is captured: the graph's replay runs the op).
  PycclWork(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
            std::shared_ptr<Communicator> comm);

  /// Whether the op's event has passed (always, for host-mode ops, which return when done).
  bool isCompleted() override { return event_ == nullptr || event_->query(); }
  /// False once the op's communicator is broken.
  bool isSuccess() const override { return comm_ == nullptr || !comm_->health().broken(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

  /// Orders the caller's current stream after the op (as ProcessGroupNCCL
  /// does), or with PYCCL_BLOCKING_WAIT=1 waits on the host, bounded by
  /// `timeout` or the group's. Raises if the communicator is broken.
  bool wait(std::chrono::milliseconds timeout) override;
  /// Waits on the host, bounded by the group's timeout. Raises if the communicator is broken.
  void synchronize() override;
  /// A completed future holding the outputs (a CUDA future orders its users after the op).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  void waitOnHost(std::chrono::milliseconds timeout);
  void raiseIfBroken() const;

  uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<Communicator> comm_;
  int device_ = -1;
  void* stream_ = nullptr;  // the stream the op was enqueued on
  std::unique_ptr<gpu::StreamEvent> event_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace pyccl
