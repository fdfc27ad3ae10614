// The reduce-scatter kernels: dtype x op x {LL, HB}.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterLLKernel(CollectiveContext context, ExchangeArgs args) {
  reduceLL<T, Op>(context, args.input, args.inStride, args.output, args.chunkBytes / sizeof(T), blockIdx.x,
                  threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterHBKernel(CollectiveContext context, ExchangeArgs args) {
  reduceScatterHB<T, Op>(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void reduceScatterDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                         uint32_t threadsPerBlock) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (call.protocol == Protocol::kLL) {
      reduceScatterLLKernel<T, Op><<<context.llActiveBlocks, threadsPerBlock, 0, s>>>(context, call.args);
    } else {
      reduceScatterHBKernel<T, Op><<<context.hbBlocks, threadsPerBlock, 0, s>>>(context, call.args);
    }
  });
  PYCCL_CHECK_CUDA(cudaGetLastError());
}

}  // namespace pyccl
