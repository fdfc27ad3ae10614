// The plan interpreter kernel: block t runs thread block t's ops, staged in
// shared memory where they fit, with the call's context in shared memory.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"  // dispatchReduction
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/interpreter.hpp"

namespace pyccl {
namespace {

/// Shared memory for ops beyond which blocks read them from global memory
/// (within the default per-block limit with the context, so no opt-in is needed).
constexpr int kStagedOpsBytes = 44 << 10;

template <typename T>
__global__ void __launch_bounds__(1024) planKernel(const __grid_constant__ PlanContext context, int callOp,
                                                   bool staged) {
  extern __shared__ int4 stagedOps[];
  __shared__ PlanContext call;
  static_assert(sizeof(PlanContext) % sizeof(uint64_t) == 0, "the context is copied in 8-byte words");
  const uint32_t tb = blockIdx.x;
  const PlanOp* ops = context.ops + context.tbOffsets[tb];
  const int32_t count = context.tbOffsets[tb + 1] - context.tbOffsets[tb];
  // The op tables never change and the context is this launch's own, so
  // these copies (every thread a word at a time, not one thread the whole
  // context) overlap the previous kernel's tail under PDL.
  if (staged) {
    const int words = count * static_cast<int>(sizeof(PlanOp) / 4);
    const auto* from = reinterpret_cast<const int32_t*>(ops);
    auto* to = reinterpret_cast<int32_t*>(stagedOps);
    for (int i = threadIdx.x; i < words; i += blockDim.x) to[i] = from[i];
    ops = reinterpret_cast<const PlanOp*>(stagedOps);
  }
  {
    const auto* from = reinterpret_cast<const uint64_t*>(&context);
    auto* to = reinterpret_cast<uint64_t*>(&call);
    for (int i = threadIdx.x; i < static_cast<int>(sizeof(PlanContext) / 8); i += blockDim.x) to[i] = from[i];
  }
  __syncthreads();
  collectiveKernelPrologue();  // the call counters and buffers are the previous kernel's after this
  if (threadIdx.x == 0) preparePlanCall(call, tb);
  __syncthreads();
  runPlanCall<T>(call, ops, count, callOp, tb, threadIdx.x, blockDim.x);
}

}  // namespace

void runPlanDevice(const PlanContext& context, int numThreadBlocks, uint32_t threads, int maxOpsPerBlock,
                   bool programmatic, DataType dtype, ReduceOp op, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const uint64_t opBytes = static_cast<uint64_t>(maxOpsPerBlock) * sizeof(PlanOp);
  const bool staged = opBytes <= kStagedOpsBytes;
  const KernelLaunch launch{threads, programmatic, staged ? static_cast<uint32_t>(opBytes) : 0u};
  dispatchReduction(dtype, op, [&]<typename T, ReduceOp>() {
    launchCollectiveKernel(planKernel<T>, static_cast<uint32_t>(numThreadBlocks), launch, s, context,
                           static_cast<int>(op), staged);
  });
}

std::vector<const void*> planKernels() {
  return {reinterpret_cast<const void*>(planKernel<float>), reinterpret_cast<const void*>(planKernel<Half>),
          reinterpret_cast<const void*>(planKernel<BFloat16>)};
}

}  // namespace pyccl
