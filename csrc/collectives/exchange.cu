// The data-movement kernels (all-gather, all-to-all, broadcast; LL and HB):
// byte-based, so every dtype shares them.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

__global__ void __launch_bounds__(1024) exchangeLLKernel(ExchangeKind kind, CollectiveContext context,
                                                         ExchangeArgs args) {
  collectiveKernelPrologue();
  exchangeLL(kind, context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

__global__ void __launch_bounds__(1024) exchangeHBKernel(ExchangeKind kind, CollectiveContext context,
                                                         ExchangeArgs args) {
  collectiveKernelPrologue();
  exchangeHB(kind, context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void exchangeDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                    const KernelLaunch& launch) {
  if (call.kind == ExchangeKind::kReduceScatter) {
    reduceScatterDevice(context, call, stream, launch);
    return;
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (call.protocol == Protocol::kLL) {
    launchCollectiveKernel(exchangeLLKernel, context.llActiveBlocks, launch, s, call.kind, context, call.args);
  } else {
    launchCollectiveKernel(exchangeHBKernel, context.hbBlocks, launch, s, call.kind, context, call.args);
  }
}

void exchangeKernels(std::vector<const void*>* out) {
  out->push_back(reinterpret_cast<const void*>(exchangeLLKernel));
  out->push_back(reinterpret_cast<const void*>(exchangeHBKernel));
}

}  // namespace pyccl
