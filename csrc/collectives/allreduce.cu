// The all-reduce kernels: dtype x op x {1PA LL, 2PA LL, 1PA HB, 2PA HB, 2PA HB zero-copy}.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceOnePhaseLLKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceOnePhaseLL<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceTwoPhaseLLKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceTwoPhaseLL<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceOnePhaseHBKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceOnePhaseHB<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceTwoPhaseHBKernel(CollectiveContext context, const void* input,
                                                                  void* output, uint64_t count) {
  collectiveKernelPrologue();
  allReduceTwoPhaseHB<T, Op>(context, input, output, count, blockIdx.x, threadIdx.x, blockDim.x);
}

// `buffers` on symmetric buffers; on graph buffers `graphSlot`, in device
// memory, which the registration after the capture fills in.
template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(1024) allReduceZeroCopyKernel(CollectiveContext context, SymmetricPointers buffers,
                                                                const SymmetricPointers* graphSlot, uint64_t count) {
  if (graphSlot == nullptr) {
    collectiveKernelPrologue();
    allReduceZeroCopy<T, Op>(context, buffers, count, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
    return;
  }
  // Written once, before the first replay, so it may be read before the wait for the prior grid.
  __shared__ SymmetricPointers fromSlot;
  constexpr uint32_t kWords = sizeof(SymmetricPointers) / sizeof(uint64_t);
  if (threadIdx.x < kWords) {
    reinterpret_cast<uint64_t*>(&fromSlot)[threadIdx.x] = reinterpret_cast<const uint64_t*>(graphSlot)[threadIdx.x];
  }
  __syncthreads();
  collectiveKernelPrologue();
  allReduceZeroCopy<T, Op>(context, fromSlot, count, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace

void allReduceDevice(const CollectiveContext& context, const AllReduceCall& call, void* stream,
                     const KernelLaunch& launch) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    if (call.algorithm == AllReduceAlgorithm::kOnePhaseLL) {
      launchCollectiveKernel(allReduceOnePhaseLLKernel<T, Op>, context.llActiveBlocks, launch, s, context, call.input,
                             call.output, call.count);
    } else if (call.algorithm == AllReduceAlgorithm::kTwoPhaseLL) {
      launchCollectiveKernel(allReduceTwoPhaseLLKernel<T, Op>, context.llActiveBlocks, launch, s, context, call.input,
                             call.output, call.count);
    } else if (call.algorithm == AllReduceAlgorithm::kOnePhaseHB) {
      launchCollectiveKernel(allReduceOnePhaseHBKernel<T, Op>, context.hbActiveBlocks, launch, s, context, call.input,
                             call.output, call.count);
    } else if (call.symmetric != nullptr || call.graphSlot != nullptr) {
      launchCollectiveKernel(allReduceZeroCopyKernel<T, Op>, context.hbBlocks, launch, s, context,
                             call.symmetric != nullptr ? *call.symmetric : SymmetricPointers{}, call.graphSlot,
                             call.count);
    } else {
      launchCollectiveKernel(allReduceTwoPhaseHBKernel<T, Op>, context.hbBlocks, launch, s, context, call.input,
                             call.output, call.count);
    }
  });
}

void allReduceKernels(std::vector<const void*>* out) {
  forEachReduction([&]<typename T, ReduceOp Op>() {
    for (const void* k : {reinterpret_cast<const void*>(allReduceOnePhaseLLKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceTwoPhaseLLKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceOnePhaseHBKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceTwoPhaseHBKernel<T, Op>),
                          reinterpret_cast<const void*>(allReduceZeroCopyKernel<T, Op>)}) {
      out->push_back(k);
    }
  });
}

}  // namespace pyccl
