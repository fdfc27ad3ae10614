// The plan interpreter kernel: block t runs thread block t's ops from shared
// memory (all of them staged where they fit, else one at a time), with the
// call's context in shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <limits>

#include "device/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/interpreter.hpp"

namespace pyccl {
namespace {

/// Blocks of up to 512 threads get up to 128 registers each (one block per
/// SM): a reduction then keeps a batch of sources' loads in flight without
/// spilling. 1024-thread blocks, and grids wider than one such block per SM,
/// take the variant held to 64 registers.
constexpr uint32_t kRoomyThreads = 512;

/// Copies `count` ops to `to` (shared memory), every thread a word at a time.
__device__ __forceinline__ void stageOps(PlanOp* to, const PlanOp* from, int count) {
  const int words = count * static_cast<int>(sizeof(PlanOp) / 4);
  const auto* src = reinterpret_cast<const int32_t*>(from);
  auto* dst = reinterpret_cast<int32_t*>(to);
  for (int i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

/// `Lean`: a plan of packet ops, copies and synchronization on one node
/// (interpreter.hpp's runOp), without the code of the other ops.
template <typename T, bool Roomy, bool Lean>
__global__ void __launch_bounds__(Roomy ? kRoomyThreads : 1024, 1)
    planKernel(const __grid_constant__ PlanContext context, int callOp, bool staged, bool withAddresses) {
  extern __shared__ int4 stagedOps[];
  __shared__ PlanContext shared;
  static_assert(sizeof(PlanContext) % sizeof(uint64_t) == 0, "the context is copied in 8-byte words");
  const uint32_t tb = blockIdx.x;
  const PlanOp* ops = context.ops + context.tbOffsets[tb];
  const int32_t count = context.tbOffsets[tb + 1] - context.tbOffsets[tb];
  // Staged: the ops' resolved addresses where they fit (16-byte aligned, at
  // the start), then the ops. Ops are read from shared memory only: the
  // compiler then knows that no store to global memory changes them, and
  // keeps their fields in registers across the packet loops (through a
  // generic pointer, it reloaded them).
  auto* resolved = reinterpret_cast<plan_detail::ResolvedOp*>(stagedOps);
  auto* window = reinterpret_cast<PlanOp*>(withAddresses ? resolved + count : resolved);
  // The op tables never change and the context is this launch's own, so
  // these copies and the addresses (every thread a share) overlap the
  // previous kernel's tail under PDL.
  if (staged) stageOps(window, ops, count);
  {
    const auto* from = reinterpret_cast<const uint64_t*>(&context);
    auto* to = reinterpret_cast<uint64_t*>(&shared);
    for (int i = threadIdx.x; i < static_cast<int>(sizeof(PlanContext) / 8); i += blockDim.x) to[i] = from[i];
  }
  __syncthreads();
  if (withAddresses) {
    plan_detail::resolveOperands(shared, window, count, resolved, threadIdx.x, blockDim.x);
    __syncthreads();
  }
  collectiveKernelPrologue();  // the call counters and buffers are the previous kernel's after this
  // Every thread reads the count itself (one load per warp, as the
  // hand-written kernels read their flags): no step between the PDL wait and
  // the first op but this load.
  const uint64_t call = context.calls[tb];
  auto opAt = [&](int32_t i) -> const PlanOp& {
    if (staged) return window[i];
    __syncthreads();  // every thread is done with the op in the window
    stageOps(window, ops + i, 1);
    __syncthreads();
    return window[0];
  };
  runPlanCall<T, Roomy ? 4 : 1, Lean>(shared, opAt, withAddresses ? resolved : nullptr, count, callOp, tb, call,
                                      threadIdx.x, blockDim.x);
}

/// Shared memory for the ops: all of them (with their resolved addresses where those fit too), or one op's window.
uint64_t stagedOpBytes(int maxOpsPerBlock) {
  const uint64_t ops = static_cast<uint64_t>(maxOpsPerBlock);
  if (addressesFit(maxOpsPerBlock)) return ops * (sizeof(PlanOp) + sizeof(plan_detail::ResolvedOp));
  return (opsFit(maxOpsPerBlock) ? ops : 1) * sizeof(PlanOp);
}

/// The variant's full kernel for every dtype.
template <bool Roomy>
std::array<const void*, 3> planKernelsOf() {
  return {reinterpret_cast<const void*>(planKernel<float, Roomy, false>),
          reinterpret_cast<const void*>(planKernel<Half, Roomy, false>),
          reinterpret_cast<const void*>(planKernel<BFloat16, Roomy, false>)};
}

/// The lean kernels (roomy only: held to 64 registers, the lean body spills as the full one does).
std::array<const void*, 3> leanPlanKernels() {
  return {reinterpret_cast<const void*>(planKernel<float, true, true>),
          reinterpret_cast<const void*>(planKernel<Half, true, true>),
          reinterpret_cast<const void*>(planKernel<BFloat16, true, true>)};
}

/// Blocks of the variant (the fewest over the dtypes) that `device` holds at once.
template <bool Roomy>
int residentBlocks(int device, uint32_t threads, uint64_t sharedBytes) {
  int sms = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int fewestPerSm = std::numeric_limits<int>::max();
  for (const void* kernel : planKernelsOf<Roomy>()) {
    int perSm = 0;
    PYCCL_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, static_cast<int>(threads),
                                                                   sharedBytes));
    fewestPerSm = std::min(fewestPerSm, perSm);
  }
  return fewestPerSm * sms;
}

}  // namespace

bool choosePlanKernel(int device, int numThreadBlocks, uint32_t threads, int maxOpsPerBlock) {
  gpu::DeviceGuard onDevice(device);
  const uint64_t shared = stagedOpBytes(maxOpsPerBlock);
  if (threads <= kRoomyThreads && residentBlocks<true>(device, threads, shared) >= numThreadBlocks) return true;
  const int resident = residentBlocks<false>(device, threads, shared);
  // Thread blocks wait for each other (barriers, a peer's signals to another
  // block): a block that waits for a free SM behind them would wait forever.
  PYCCL_CHECK_ARG(resident >= numThreadBlocks, "plan", "runs ", numThreadBlocks, " thread blocks of ", threads,
                  " threads, which must all be resident at once; device ", device, " holds ", resident,
                  " (use fewer instances or threads)");
  return false;
}

void runPlanDevice(const PlanContext& context, int numThreadBlocks, uint32_t threads, int maxOpsPerBlock,
                   bool roomy, bool lean, bool programmatic, DataType dtype, ReduceOp op, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const uint64_t shared = stagedOpBytes(maxOpsPerBlock);
  const KernelLaunch launch{threads, programmatic, static_cast<uint32_t>(shared)};
  dispatchFloat(dtype, [&]<typename T>() {
    auto kernel = !roomy ? planKernel<T, false, false> : lean ? planKernel<T, true, true> : planKernel<T, true, false>;
    launchCollectiveKernel(kernel, static_cast<uint32_t>(numThreadBlocks), launch, s, context, static_cast<int>(op),
                           opsFit(maxOpsPerBlock), addressesFit(maxOpsPerBlock));
  });
}

std::vector<const void*> planKernels() {
  std::vector<const void*> kernels;
  for (const void* kernel : planKernelsOf<true>()) kernels.push_back(kernel);
  for (const void* kernel : planKernelsOf<false>()) kernels.push_back(kernel);
  for (const void* kernel : leanPlanKernels()) kernels.push_back(kernel);
  return kernels;
}

}  // namespace pyccl
