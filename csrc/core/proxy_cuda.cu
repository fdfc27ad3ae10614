// The copy-engine channel of the proxy: puts are cudaMemcpyAsync on the
// channel's own stream; a signal is a one-thread kernel on the same stream,
// so it runs after the copies before it have completed.
#include "channels/device_common.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "core/proxy.hpp"

namespace pyccl {
namespace {

__global__ void storeSemaphoreKernel(uint64_t* target, uint64_t value) {
  // The copies before this kernel on the stream have completed; make the
  // value visible to the peer (system scope) as a release.
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*target).store(value, cuda::memory_order_release);
}

class CudaIpcChannel : public ProxyChannel {
 public:
  CudaIpcChannel(int device, char* src, char* dst, uint64_t* remoteInbound)
      : device_(device), src_(src), dst_(dst), remoteInbound_(remoteInbound) {
    gpu::DeviceGuard guard(device);
    PYCCL_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Load the signal kernel now. With lazy module loading, its first launch
    // would otherwise load the module, which waits for running kernels; a
    // kernel spinning on this very signal would then never finish.
    cudaFuncAttributes attr{};
    PYCCL_CHECK_CUDA(cudaFuncGetAttributes(&attr, storeSemaphoreKernel));
  }
  ~CudaIpcChannel() override {
    gpu::DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    PYCCL_CHECK_CUDA(cudaMemcpyAsync(dst_ + dstOffset, src_ + srcOffset, bytes,
                                     cudaMemcpyDeviceToDevice, stream_));
  }
  void signal() override {
    storeSemaphoreKernel<<<1, 1, 0, stream_>>>(remoteInbound_, ++outbound_);
    PYCCL_CHECK_CUDA(cudaGetLastError());
  }
  void flush() override { PYCCL_CHECK_CUDA(cudaStreamSynchronize(stream_)); }
  const char* transport() const override { return "cuda_ipc"; }

 private:
  int device_;
  char* src_;
  char* dst_;
  uint64_t* remoteInbound_;
  uint64_t outbound_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<ProxyChannel> makeCudaIpcChannel(int device, char* src, char* dst,
                                                 uint64_t* remoteInbound) {
  return std::make_unique<CudaIpcChannel>(device, src, dst, remoteInbound);
}

}  // namespace pyccl
