// The send/receive kernel (p2p_device.hpp): byte-based, one for every dtype.
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"

namespace pyccl {
namespace {

__global__ void __launch_bounds__(1024) sendRecvKernel(CollectiveContext context, P2PArgs args) {
  collectiveKernelPrologue();
  sendRecvBlock(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void sendRecvDevice(const CollectiveContext& context, const P2PArgs& args, void* stream, const KernelLaunch& launch) {
  launchCollectiveKernel(sendRecvKernel, args.count * context.p2pBlocks, launch, static_cast<cudaStream_t>(stream),
                         context, args);
}

void sendRecvKernels(std::vector<const void*>* out) { out->push_back(reinterpret_cast<const void*>(sendRecvKernel)); }

}  // namespace pyccl
