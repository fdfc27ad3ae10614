// The CPU and CUDA kernels of torch.ops.pyccl.all_reduce, all_gather,
// reduce_scatter and fused_all_reduce_rmsnorm, in C++: a call whose route the
// Python path has learned (op_routes.hpp) goes straight into the engine; every
// other call goes to the Python path (pyccl/ops.py), which then teaches the
// route. Each kernel reads the route and makes its output as the Python path
// does; the GIL is held only for the look-up (and the Python path).
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
  const at::Tensor input = x.contiguous();
  const std::optional<ReduceOp> rop = reduceOpNamed(op);
  const auto call = rop ? learnedRoute(RoutedOp::kAllReduce, groupName, input) : std::nullopt;
  if (!call) return pythonPath<at::Tensor>(RoutedOp::kAllReduce, x, std::string(op), std::string(groupName));
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  runOnEngine(RoutedOp::kAllReduce, [&] {
    allReduceTensor(*call->engine, *call->comm, input, out, *rop, call->choice.algorithm,
                    call->choice.symmetricAlgorithm);
  });
  return out;
}

at::Tensor allGatherKernel(const at::Tensor& x, int64_t groupSize, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  auto call = learnedRoute(RoutedOp::kAllGather, groupName, input);
  if (call && call->comm->worldSize() != groupSize) call.reset();  // the Python path names the wrong size
  if (!call) return pythonPath<at::Tensor>(RoutedOp::kAllGather, x, groupSize, std::string(groupName));
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) {
    shape.push_back(groupSize);
  } else {
    shape[0] *= groupSize;
  }
  at::Tensor out = at::empty(shape, input.options());
  runOnEngine(RoutedOp::kAllGather,
              [&] { allGatherTensor(*call->engine, *call->comm, input, out, call->choice.protocol); });
  return out;
}

at::Tensor reduceScatterKernel(const at::Tensor& x, c10::string_view op, int64_t groupSize,
                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const std::optional<ReduceOp> rop = reduceOpNamed(op);
  const bool splits = input.dim() > 0 && groupSize > 0 && input.size(0) % groupSize == 0;
  auto call = rop && splits ? learnedRoute(RoutedOp::kReduceScatter, groupName, input) : std::nullopt;
  if (call && call->comm->worldSize() != groupSize) call.reset();
  if (!call) {
    return pythonPath<at::Tensor>(RoutedOp::kReduceScatter, x, std::string(op), groupSize, std::string(groupName));
  }
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] /= groupSize;
  at::Tensor out = at::empty(shape, input.options());
  runOnEngine(RoutedOp::kReduceScatter,
              [&] { reduceScatterTensor(*call->engine, *call->comm, input, out, *rop, call->choice.protocol); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fusedAllReduceRMSNormKernel(const at::Tensor& x, const at::Tensor& residual,
                                                               const at::Tensor& weight, double eps,
                                                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const auto call = learnedRoute(RoutedOp::kFusedNorm, groupName, input);
  if (!call) {
    return pythonPath<std::tuple<at::Tensor, at::Tensor>>(RoutedOp::kFusedNorm, x, residual, weight, eps,
                                                           std::string(groupName));
  }
  const at::Tensor res = residual.contiguous();
  at::Tensor normed = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor residualOut = at::empty_like(res, at::MemoryFormat::Contiguous);
  // Checks every argument as the Python path does (naming it), before anything runs.
  runOnEngine(RoutedOp::kFusedNorm, [&] {
    allReduceRMSNormTensor(*call->engine, *call->comm, input, res, weight.contiguous(), normed, residualOut, eps,
                           std::nullopt);
  });
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
