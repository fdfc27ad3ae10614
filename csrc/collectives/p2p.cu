// The send/receive kernel (p2p_device.hpp): byte-based, one for every dtype.
#include <cuda_runtime.h>

#include <algorithm>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

__global__ void __launch_bounds__(1024) sendRecvKernel(CollectiveContext context, P2PArgs args) {
  collectiveKernelPrologue();
  sendRecvBlock(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void sendRecvDevice(const CollectiveContext& context, const P2PArgs& args, void* stream, const KernelLaunch& launch) {
  launchCollectiveKernel(sendRecvKernel, args.blocks, launch, static_cast<cudaStream_t>(stream),
                         context, args);
}

uint32_t sendRecvResidentBlocks(int device, uint32_t threads) {
  gpu::DeviceGuard onDevice(device);
  int sms = 0, perSm = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PYCCL_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, sendRecvKernel, static_cast<int>(threads), 0));
  return static_cast<uint32_t>(std::max(0, perSm * sms));
}

void sendRecvKernels(std::vector<const void*>* out) { out->push_back(reinterpret_cast<const void*>(sendRecvKernel)); }

}  // namespace pyccl
