// Compiles the SwitchChannel's multimem paths for the target architectures
// (so a broken lowering fails the build). The kernel is never launched unless
// PYCCL_ENABLE_NVLS=1 and a SwitchChannel was created.
#include "channels/switch_channel_device.hpp"

namespace pyccl {

__global__ void switchAllReduceFloatKernel(SwitchChannelDeviceHandle channel, uint64_t offset,
                                           uint64_t bytes) {
  const uint64_t per = (bytes / 16 + gridDim.x - 1) / gridDim.x * 16;
  const uint64_t begin = blockIdx.x * per;
  const uint64_t end = begin + per < bytes ? begin + per : bytes;
  if (begin < end) channel.allReduceFloatSlice(offset + begin, end - begin, threadIdx.x, blockDim.x);
}

__global__ void switchReduceBf16Kernel(SwitchChannelDeviceHandle channel, uint4* out, uint64_t count) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    out[i] = channel.reduce16<__nv_bfloat16>(i * 16);
    out[i] = channel.reduce16<__half>(i * 16);
  }
}

}  // namespace pyccl
