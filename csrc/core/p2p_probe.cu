#include "core/gpu_runtime.hpp"
#include "core/p2p_probe.hpp"

namespace pyccl {
namespace {

constexpr int kMaxProbeTargets = 64;

struct ProbeArgs {
  uint64_t* targets[kMaxProbeTargets];
  uint64_t values[kMaxProbeTargets];
  int count;
};

__global__ void probeKernel(ProbeArgs args) {
  const int i = threadIdx.x;
  if (i < args.count) {
    // A volatile store goes out as one 8-byte write across the link.
    *reinterpret_cast<volatile uint64_t*>(args.targets[i]) = args.values[i];
  }
  __threadfence_system();
}

}  // namespace

void probeWritePeers(int device, const std::vector<uint64_t*>& targets,
                     const std::vector<uint64_t>& values) {
  PYCCL_CHECK_ARG(targets.size() == values.size() && targets.size() <= kMaxProbeTargets,
                  "targets", "at most ", kMaxProbeTargets, " probe targets");
  if (targets.empty()) return;
  gpu::DeviceGuard guard(device);
  ProbeArgs args{};
  args.count = static_cast<int>(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    args.targets[i] = targets[i];
    args.values[i] = values[i];
  }
  cudaStream_t stream;
  PYCCL_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  probeKernel<<<1, kMaxProbeTargets, 0, stream>>>(args);
  cudaError_t launch = cudaGetLastError();
  cudaError_t sync = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  PYCCL_CHECK_CUDA(launch);
  PYCCL_CHECK_CUDA(sync);
}

}  // namespace pyccl
