#include "core/gpu_runtime.hpp"
#include "diagnostics/pingpong.hpp"

namespace pyccl {
namespace {

// The handles arrive by value (kernel parameter space), so the loop touches
// global memory only for the semaphore words, packets and payloads.
__global__ void pingPongKernel(PingPongArgs args, PingPongResult* out) { runPingPong(args, out); }

}  // namespace

PingPongResult runPingPongDevice(int device, const PingPongArgs& args) {
  gpu::DeviceGuard guard(device);
  PingPongResult* result = nullptr;
  PYCCL_CHECK_CUDA(cudaMalloc(&result, sizeof(PingPongResult)));
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMemsetAsync(result, 0, sizeof(PingPongResult), stream);
  if (err == cudaSuccess) {
    pingPongKernel<<<1, 1, 0, stream>>>(args, result);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  PingPongResult out{};
  if (err == cudaSuccess) err = cudaMemcpy(&out, result, sizeof(out), cudaMemcpyDeviceToHost);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(result);
  PYCCL_CHECK_CUDA(err);
  return out;
}

}  // namespace pyccl
