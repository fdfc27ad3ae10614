// Launching the collective kernels, with programmatic dependent launch (PDL)
// where asked for: a kernel launched so may be scheduled while the kernel
// before it on the stream is still running, which hides the launch latency of
// back-to-back collectives (and of any kernel before them that lets its
// dependents launch early). Every collective kernel starts with
// waitForPriorGrid(), which returns once the previous kernel has completed and
// its memory operations are visible, so the stream's order is kept for every
// byte the collective reads or writes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "device/kernel_launch.hpp"

namespace pyccl {

/// Blocks until the grid this one depends on programmatically has completed
/// and flushed its memory (acquire); a no-op for a kernel launched without PDL.
__device__ __forceinline__ void waitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next PDL kernel on the stream be scheduled now. It still waits for
/// this grid's completion in its own waitForPriorGrid(), so this orders nothing.
__device__ __forceinline__ void allowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The prologue of every collective kernel: the previous kernel's results are
/// visible after it, and the next collective may be scheduled.
__device__ __forceinline__ void collectiveKernelPrologue() {
  waitForPriorGrid();
  allowDependentLaunch();
}

/// Enqueues kernel<<<blocks, launch.threadsPerBlock, 0, stream>>>(args...),
/// with the programmatic-serialization attribute when launch.programmatic, in
/// clusters of launch.clusterBlocks (which must divide `blocks`).
/// Capturable: stream capture turns the attribute into a programmatic edge.
template <typename... Params, typename... Args>
void launchCollectiveKernel(void (*kernel)(Params...), uint32_t blocks, const KernelLaunch& launch,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  uint32_t numAttributes = 0;
  if (launch.programmatic) {
    attributes[numAttributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[numAttributes++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (launch.clusterBlocks > 1) {
    attributes[numAttributes].id = cudaLaunchAttributeClusterDimension;
    attributes[numAttributes++].val.clusterDim = {launch.clusterBlocks, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(launch.threadsPerBlock);
  config.dynamicSmemBytes = launch.sharedBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = numAttributes;
  PYCCL_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace pyccl
