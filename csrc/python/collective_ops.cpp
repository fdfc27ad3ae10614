// The CPU and CUDA kernels of torch.ops.pyccl.all_reduce, all_gather,
// reduce_scatter and fused_all_reduce_rmsnorm, in C++ (no Python on the
// path of a kernel choice): each finds its group's runtime (op_runtimes.hpp),
// asks the group's selector, and runs a kernel choice straight on the engine.
// Every other choice (a plan, NCCL, the collectives across nodes), a group
// with no runtime yet, and a call with an argument to refuse go to the op's
// Python kernel (pyccl/ops.py), which asks the same selector and raises the
// error naming the argument. Each kernel makes its output as the Python path
// does.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "python/op_runtimes.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

/// The group's selector's choice for `input` where it is a kernel of `runtime`'s engine (counted then);
/// nullopt for the Python path to run (and count) the call.
std::optional<Choice> kernelChoice(const GroupRuntime& runtime, Collective c, const at::Tensor& input,
                                   uint64_t bytes) {
  Choice choice;
  try {
    choice = runtime.selector->select(c, tableDtypeOf(input), bytes, static_cast<uint64_t>(input.numel()), "",
                                      runtime.nccl && input.is_cuda(), true, /*counted=*/false);
  } catch (const Error&) {
    return std::nullopt;  // the Python path asks again and raises the error
  }
  // An all-reduce whose symmetric-buffer choice is NCCL: the Python path tells those buffers apart.
  if (choice.route != Route::kKernel || choice.symmetricAlgorithm == "nccl") return std::nullopt;
  runtime.selector->count(c, choice);
  return choice;
}

at::Tensor allReduceKernel(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const std::optional<ReduceOp> rop = reduceOpNamed(op);
  const bool ours = rop && reducesDtype(input.scalar_type());
  const auto runtime = ours ? groupRuntime(groupName, input.device()) : std::nullopt;
  const auto choice = runtime ? kernelChoice(*runtime, Collective::kAllReduce, input, input.nbytes()) : std::nullopt;
  if (!choice) return pythonPath<at::Tensor>(CustomOp::kAllReduce, x, std::string(op), std::string(groupName));
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  runOnEngine(CustomOp::kAllReduce, [&] {
    allReduceTensor(*runtime->engine, *runtime->comm, input, out, *rop, kernelOf(*choice), symmetricOf(*choice));
  });
  return out;
}

at::Tensor allGatherKernel(const at::Tensor& x, int64_t groupSize, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  auto runtime = groupRuntime(groupName, input.device());
  if (runtime && runtime->comm->worldSize() != groupSize) runtime.reset();  // the Python path names the wrong size
  const auto choice =
      runtime ? kernelChoice(*runtime, Collective::kAllGather, input, input.nbytes() * groupSize) : std::nullopt;
  if (!choice) return pythonPath<at::Tensor>(CustomOp::kAllGather, x, groupSize, std::string(groupName));
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) {
    shape.push_back(groupSize);
  } else {
    shape[0] *= groupSize;
  }
  at::Tensor out = at::empty(shape, input.options());
  runOnEngine(CustomOp::kAllGather,
              [&] { allGatherTensor(*runtime->engine, *runtime->comm, input, out, protocolOf(*choice)); });
  return out;
}

at::Tensor reduceScatterKernel(const at::Tensor& x, c10::string_view op, int64_t groupSize,
                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const std::optional<ReduceOp> rop = reduceOpNamed(op);
  const bool splits = input.dim() > 0 && groupSize > 0 && input.size(0) % groupSize == 0;
  const bool ours = rop && splits && reducesDtype(input.scalar_type());
  auto runtime = ours ? groupRuntime(groupName, input.device()) : std::nullopt;
  if (runtime && runtime->comm->worldSize() != groupSize) runtime.reset();
  const auto choice =
      runtime ? kernelChoice(*runtime, Collective::kReduceScatter, input, input.nbytes()) : std::nullopt;
  if (!choice) {
    return pythonPath<at::Tensor>(CustomOp::kReduceScatter, x, std::string(op), groupSize, std::string(groupName));
  }
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] /= groupSize;
  at::Tensor out = at::empty(shape, input.options());
  runOnEngine(CustomOp::kReduceScatter, [&] {
    reduceScatterTensor(*runtime->engine, *runtime->comm, input, out, *rop, protocolOf(*choice));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fusedAllReduceRMSNormKernel(const at::Tensor& x, const at::Tensor& residual,
                                                               const at::Tensor& weight, double eps,
                                                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  // Above kFusedMaxBytes the call runs unfused, on pyccl.all_reduce: the Python path.
  const bool fused = input.nbytes() <= kFusedMaxBytes && reducesDtype(input.scalar_type());
  const auto runtime = fused ? groupRuntime(groupName, input.device()) : std::nullopt;
  if (!runtime) {
    return pythonPath<std::tuple<at::Tensor, at::Tensor>>(CustomOp::kFusedNorm, x, residual, weight, eps,
                                                           std::string(groupName));
  }
  const at::Tensor res = residual.contiguous();
  at::Tensor normed = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor residualOut = at::empty_like(res, at::MemoryFormat::Contiguous);
  // Checks every argument as the Python path does (naming it), before anything runs; the engine's own choice of
  // fused kernel, as pyccl.fused_all_reduce_rmsnorm's.
  runOnEngine(CustomOp::kFusedNorm, [&] {
    allReduceRMSNormTensor(*runtime->engine, *runtime->comm, input, res, weight.contiguous(), normed, residualOut,
                           eps, std::nullopt);
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
