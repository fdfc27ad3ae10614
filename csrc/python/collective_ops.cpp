// The CPU and CUDA kernels of torch.ops.pyccl.all_reduce, all_gather,
// reduce_scatter and fused_all_reduce_rmsnorm, in C++: a call whose route the
// Python path has learned (op_routes.hpp) goes straight into the engine; every
// other call goes to the Python path (pyccl/ops.py), which then teaches the
// route. Each kernel reads the route and makes its output as the Python path
// does, with the GIL held only for the look-up.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "python/op_routes.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

at::Tensor allReduceKernel(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  std::optional<RoutedCall> call;
  std::optional<ReduceOp> rop;
  at::Tensor input;
  {
    py::gil_scoped_acquire gil;
    input = x.contiguous();
    rop = reduceOpNamed(op);
    if (rop) call = learnedRoute(RoutedOp::kAllReduce, groupName, input);
    if (!call) return callPythonPath(RoutedOp::kAllReduce, py::make_tuple(x, std::string(op), std::string(groupName))).cast<at::Tensor>();
  }
  countEngineCall(RoutedOp::kAllReduce);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  try {
    allReduceTensor(*call->engine, *call->comm, input, out, *rop, call->choice.algorithm,
                    call->choice.symmetricAlgorithm);
  } catch (const Error& e) {
    raiseAsPython(e);
  }
  return out;
}

at::Tensor allGatherKernel(const at::Tensor& x, int64_t groupSize, c10::string_view groupName) {
  std::optional<RoutedCall> call;
  at::Tensor input;
  {
    py::gil_scoped_acquire gil;
    input = x.contiguous();
    call = learnedRoute(RoutedOp::kAllGather, groupName, input);
    if (call && call->comm->worldSize() != groupSize) call.reset();  // the Python path names the wrong size
    if (!call) {
      return callPythonPath(RoutedOp::kAllGather, py::make_tuple(x, groupSize, std::string(groupName))).cast<at::Tensor>();
    }
  }
  countEngineCall(RoutedOp::kAllGather);
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) {
    shape.push_back(groupSize);
  } else {
    shape[0] *= groupSize;
  }
  at::Tensor out = at::empty(shape, input.options());
  try {
    allGatherTensor(*call->engine, *call->comm, input, out, call->choice.protocol);
  } catch (const Error& e) {
    raiseAsPython(e);
  }
  return out;
}

at::Tensor reduceScatterKernel(const at::Tensor& x, c10::string_view op, int64_t groupSize,
                               c10::string_view groupName) {
  std::optional<RoutedCall> call;
  std::optional<ReduceOp> rop;
  at::Tensor input;
  {
    py::gil_scoped_acquire gil;
    input = x.contiguous();
    rop = reduceOpNamed(op);
    const bool splits = input.dim() > 0 && groupSize > 0 && input.size(0) % groupSize == 0;
    if (rop && splits) call = learnedRoute(RoutedOp::kReduceScatter, groupName, input);
    if (call && call->comm->worldSize() != groupSize) call.reset();
    if (!call) {
      return callPythonPath(RoutedOp::kReduceScatter, py::make_tuple(x, std::string(op), groupSize, std::string(groupName)))
          .cast<at::Tensor>();
    }
  }
  countEngineCall(RoutedOp::kReduceScatter);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] /= groupSize;
  at::Tensor out = at::empty(shape, input.options());
  try {
    reduceScatterTensor(*call->engine, *call->comm, input, out, *rop, call->choice.protocol);
  } catch (const Error& e) {
    raiseAsPython(e);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> fusedAllReduceRMSNormKernel(const at::Tensor& x, const at::Tensor& residual,
                                                               const at::Tensor& weight, double eps,
                                                               c10::string_view groupName) {
  std::optional<RoutedCall> call;
  at::Tensor input;
  {
    py::gil_scoped_acquire gil;
    input = x.contiguous();
    call = learnedRoute(RoutedOp::kFusedNorm, groupName, input);
    if (!call) {
      return callPythonPath(RoutedOp::kFusedNorm, py::make_tuple(x, residual, weight, eps, std::string(groupName)))
          .cast<std::tuple<at::Tensor, at::Tensor>>();
    }
  }
  countEngineCall(RoutedOp::kFusedNorm);
  const at::Tensor res = residual.contiguous();
  at::Tensor normed = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor residualOut = at::empty_like(res, at::MemoryFormat::Contiguous);
  try {
    // Checks every argument as the Python path does (naming it), before anything runs.
    allReduceRMSNormTensor(*call->engine, *call->comm, input, res, weight.contiguous(), normed, residualOut, eps,
                           std::nullopt);
  } catch (const Error& e) {
    raiseAsPython(e);
  }
  return {normed, residualOut};
}

}  // namespace
}  // namespace pyccl

TORCH_LIBRARY_IMPL(pyccl, CPU, m) {
  m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel));
  m.impl("all_gather", TORCH_FN(pyccl::allGatherKernel));
  m.impl("reduce_scatter", TORCH_FN(pyccl::reduceScatterKernel));
  m.impl("fused_all_reduce_rmsnorm", TORCH_FN(pyccl::fusedAllReduceRMSNormKernel));
}
TORCH_LIBRARY_IMPL(pyccl, CUDA, m) {
  m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel));
  m.impl("all_gather", TORCH_FN(pyccl::allGatherKernel));
  m.impl("reduce_scatter", TORCH_FN(pyccl::reduceScatterKernel));
  m.impl("fused_all_reduce_rmsnorm", TORCH_FN(pyccl::fusedAllReduceRMSNormKernel));
}
