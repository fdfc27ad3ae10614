// The all-reduce kernels: dtype x op x {1PA LL, 2PA LL, 2PA HB}.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceLLKernel(CollectiveContext context, const void* input, void* output,
                                                          uint64_t count) {
  allReduceLL<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceLL2Kernel(CollectiveContext context, const void* input,
                                                           void* output, uint64_t count) {
  allReduceLL2<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceHBKernel(CollectiveContext context, const void* input, void* output,
                                                          uint64_t count) {
  allReduceHB<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void allReduceDevice(const CollectiveContext& context, const AllReduceCall& call, void* stream,
                     uint32_t threadsPerBlock) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (call.algorithm == AllReduceAlgorithm::kOnePhaseLL) {
      allReduceLLKernel<T, Op><<<context.llActiveBlocks, threadsPerBlock, 0, s>>>(context, call.input, call.output,
                                                                            call.count);
    } else if (call.algorithm == AllReduceAlgorithm::kTwoPhaseLL) {
      allReduceLL2Kernel<T, Op><<<context.llActiveBlocks, threadsPerBlock, 0, s>>>(context, call.input, call.output,
                                                                             call.count);
    } else {
      allReduceHBKernel<T, Op><<<context.hbBlocks, threadsPerBlock, 0, s>>>(context, call.input, call.output,
                                                                            call.count);
    }
  });
  PYCCL_CHECK_CUDA(cudaGetLastError());
}

}  // namespace pyccl
