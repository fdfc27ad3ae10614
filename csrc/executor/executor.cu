// The plan interpreter kernel: block t runs thread block t's ops.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"  // dispatchReduction
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/interpreter.hpp"

namespace pyccl {
namespace {

template <typename T>
__global__ void __launch_bounds__(1024) planKernel(PlanContext context, int callOp) {
  runPlanThreadBlock<T>(context, callOp, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void runPlanDevice(const PlanContext& context, int numThreadBlocks, uint32_t threads, DataType dtype, ReduceOp op,
                   void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatchReduction(dtype, op, [&]<typename T, ReduceOp>() {
    planKernel<T><<<numThreadBlocks, threads, 0, s>>>(context, static_cast<int>(op));
  });
  PYCCL_CHECK_CUDA(cudaGetLastError());
}

}  // namespace pyccl
