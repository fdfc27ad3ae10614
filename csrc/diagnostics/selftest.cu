#include "core/gpu_runtime.hpp"
#include "diagnostics/selftest.hpp"

namespace pyccl {
namespace {

__global__ void selftestKernel(SelftestArgs args) {
  const int b = blockIdx.x;
  const int peer = args.peers[b];
  int32_t* dst = args.peerBuffers[b] + static_cast<uint64_t>(args.rank) * args.wordsPerRank;
  for (uint64_t i = threadIdx.x; i < args.wordsPerRank; i += blockDim.x) {
    dst[i] = selftestValue(args.rank, i, args.seed);
  }
  // Order every thread's stores before thread 0's release-signal.
  __syncthreads();
  __shared__ int ok;
  if (threadIdx.x == 0) {
    args.semaphores[b].signal();
    ok = args.semaphores[b].wait() == WaitStatus::kOk;
    if (!ok) atomicAdd(args.waitFailures, 1u);
  }
  // The acquire by thread 0 is made visible to the block by the barrier.
  __syncthreads();
  if (!ok) return;
  const int32_t* src = args.localBuffer + static_cast<uint64_t>(peer) * args.wordsPerRank;
  unsigned long long bad = 0;
  for (uint64_t i = threadIdx.x; i < args.wordsPerRank; i += blockDim.x) {
    bad += src[i] != selftestValue(peer, i, args.seed) ? 1 : 0;
  }
  if (bad) atomicAdd(args.mismatches, bad);
  // Closing handshake: the peer may reuse its slot in this buffer (the next
  // exchange) only once every thread here has finished reading it.
  __syncthreads();
  if (threadIdx.x == 0) {
    args.semaphores[b].signal();
    if (args.semaphores[b].wait() != WaitStatus::kOk) atomicAdd(args.waitFailures, 1u);
  }
}

}  // namespace

SelftestResult runSelftestDevice(int device, SelftestArgs args) {
  if (args.numPeers == 0) return {0, 0};
  gpu::DeviceGuard guard(device);
  struct Counters {
    unsigned long long mismatches;
    unsigned int waitFailures;
  };
  Counters* counters = nullptr;
  PYCCL_CHECK_CUDA(cudaMalloc(&counters, sizeof(Counters)));
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMemsetAsync(counters, 0, sizeof(Counters), stream);
  if (err == cudaSuccess) {
    args.mismatches = &counters->mismatches;
    args.waitFailures = &counters->waitFailures;
    selftestKernel<<<args.numPeers, 512, 0, stream>>>(args);
    err = cudaGetLastError();
  }
  Counters host{};
  if (err == cudaSuccess) err = cudaMemcpyAsync(&host, counters, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(counters);
  PYCCL_CHECK_CUDA(err);
  return {host.mismatches, host.waitFailures};
}

}  // namespace pyccl
