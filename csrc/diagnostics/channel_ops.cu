#include <chrono>

#include "core/gpu_runtime.hpp"
#include "diagnostics/channel_ops.hpp"

namespace pyccl {
namespace {

__global__ void channelOpsKernel(ChannelOpsArgs* args) {
  runChannelOps(*args, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace

ChannelOpsResult runChannelOpsDevice(int device, const ChannelOpsArgs& hostArgs, uint32_t numBlocks,
                                     uint32_t numThreads) {
  gpu::DeviceGuard guard(device);
  struct Scratch {
    ChannelOpsArgs args;
    unsigned int failures;
    uint64_t elapsed;
    uint64_t barrier[2];
  };
  Scratch* scratch = nullptr;
  PYCCL_CHECK_CUDA(cudaMalloc(&scratch, sizeof(Scratch)));
  ChannelOpsArgs args = hostArgs;
  args.failures = &scratch->failures;
  args.elapsedNs = &scratch->elapsed;
  args.barrier = scratch->barrier;
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMemsetAsync(scratch, 0, sizeof(Scratch), stream);
  if (err == cudaSuccess) err = cudaMemcpyAsync(&scratch->args, &args, sizeof(args), cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  const auto t0 = std::chrono::steady_clock::now();
  if (err == cudaSuccess) {
    channelOpsKernel<<<numBlocks, numThreads, 0, stream>>>(&scratch->args);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  const auto t1 = std::chrono::steady_clock::now();
  Scratch out{};
  if (err == cudaSuccess) err = cudaMemcpy(&out, scratch, sizeof(out), cudaMemcpyDeviceToHost);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(scratch);
  PYCCL_CHECK_CUDA(err);
  return {out.failures, out.elapsed, std::chrono::duration<double, std::micro>(t1 - t0).count()};
}

}  // namespace pyccl
