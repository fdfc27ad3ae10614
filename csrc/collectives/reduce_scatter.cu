// The reduce-scatter kernels: dtype x op x {LL, HB}.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterLLKernel(CollectiveContext context, ExchangeArgs args) {
  collectiveKernelPrologue();
  reduceLL<T, Op>(context, args.input, args.inStride, args.output, args.chunkBytes / sizeof(T), blockIdx.x,
                  threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) reduceScatterHBKernel(CollectiveContext context, ExchangeArgs args) {
  collectiveKernelPrologue();
  reduceScatterHB<T, Op>(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void reduceScatterDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                         const KernelLaunch& launch) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (call.protocol == Protocol::kLL) {
      launchCollectiveKernel(reduceScatterLLKernel<T, Op>, context.llActiveBlocks, launch, s, context, call.args);
    } else {
      launchCollectiveKernel(reduceScatterHBKernel<T, Op>, context.hbBlocks, launch, s, context, call.args);
    }
  });
}

void reduceScatterKernels(std::vector<const void*>* out) {
  forEachReduction([&]<typename T, ReduceOp Op>() {
    out->push_back(reinterpret_cast<const void*>(reduceScatterLLKernel<T, Op>));
    out->push_back(reinterpret_cast<const void*>(reduceScatterHBKernel<T, Op>));
  });
}

}  // namespace pyccl
