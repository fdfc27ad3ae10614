// The fused all-reduce + residual add + RMSNorm kernels (one-shot and
// two-shot, per dtype), the row sums of a thread-block cluster that they
// normalize with, and the add + RMSNorm kernel that follows an all-reduce in
// the two-kernel algorithm (its block sums are a one-block cluster's).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "collectives/collective_launch.hpp"
#include "collectives/kernel_launch.cuh"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {
namespace {

namespace cg = cooperative_groups;

/// The row sums of fused_norm_device.hpp for the blocks of one cluster (one
/// block when segments is 1): warp shuffles, then the block's warps in order;
/// each block stores its sums into every block's shared memory (distributed
/// shared memory stores, which need no reply), and after the cluster barrier
/// each adds the blocks' sums in block order. Every block adds the same values
/// in the same order, so each gets the same bits.
struct ClusterRowGroup {
  float* warpSums;  ///< shared [32 warps][kMaxCollectiveRanks]
  float* gathered;  ///< shared [2 parities][kFusedMaxSegments][kMaxCollectiveRanks], written by the cluster's blocks
  float* totals;    ///< shared [kMaxCollectiveRanks]
  uint32_t segment;
  uint32_t segments;
  uint32_t parity = 0;

  /// Block-wide then cluster-wide sums of values[0..used) (used <= N; the rest are left), on every
  /// thread of every block of the cluster. Synchronizes the block, and the cluster (release/acquire)
  /// when it has more than one block.
  template <int N>
  __device__ __forceinline__ void sums(float (&values)[N], int used) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    PYCCL_UNROLL
    for (int n = 0; n < N; ++n) {
      if (n >= used) break;
      PYCCL_UNROLL
      for (int offset = 16; offset > 0; offset >>= 1) values[n] += __shfl_xor_sync(0xffffffffu, values[n], offset);
      if (lane == 0) warpSums[warp * kMaxCollectiveRanks + n] = values[n];
    }
    __syncthreads();
    float* slots = gathered + parity * kFusedMaxSegments * kMaxCollectiveRanks;
    if (segments == 1) {
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t w = 0; w < warps; ++w) total += warpSums[w * kMaxCollectiveRanks + threadIdx.x];
        totals[threadIdx.x] = total;
      }
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t w = 0; w < warps; ++w) total += warpSums[w * kMaxCollectiveRanks + threadIdx.x];
        for (uint32_t s = 0; s < segments; ++s) {
          *cluster.map_shared_rank(slots + segment * kMaxCollectiveRanks + threadIdx.x, s) = total;
        }
      }
      // Releases the stores into the other blocks' slots; acquires theirs into ours. A parity's
      // slots are written again only after the next barrier, by which every block has read them.
      cluster.sync();
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t s = 0; s < segments; ++s) total += slots[s * kMaxCollectiveRanks + threadIdx.x];
        totals[threadIdx.x] = total;
      }
#endif
    }
    __syncthreads();  // totals are read after it, and written again only after the next call's barrier
    PYCCL_UNROLL
    for (int n = 0; n < N; ++n) {
      if (n >= used) break;
      values[n] = totals[n];
    }
    parity ^= 1;
  }

  /// Nothing to wait for: every store into a block's shared memory lands
  /// before the cluster barrier of the same call, which the block passes
  /// before it can exit.
  __device__ __forceinline__ void finish() {}
};

template <typename T, bool kTwoShot>
__global__ void __launch_bounds__(kFusedMaxThreads) allReduceRMSNormKernel(CollectiveContext context,
                                                                           FusedNormArgs args) {
  __shared__ float warpSums[32 * kMaxCollectiveRanks];
  __shared__ float gathered[2 * kFusedMaxSegments * kMaxCollectiveRanks];
  __shared__ float totals[kMaxCollectiveRanks];
  collectiveKernelPrologue();
  ClusterRowGroup group{warpSums, gathered, totals, blockIdx.x % args.segments, args.segments};
  allReduceRMSNorm<T, kTwoShot>(context, args, blockIdx.x / args.segments, blockIdx.x % args.segments, threadIdx.x,
                      blockDim.x, group);
}

template <typename T, typename Unit>
__global__ void __launch_bounds__(kAddNormMaxThreads) addRMSNormKernel(AddRMSNormArgs args) {
  __shared__ float warpSums[32 * kMaxCollectiveRanks];
  __shared__ float gathered[2 * kFusedMaxSegments * kMaxCollectiveRanks];
  __shared__ float totals[kMaxCollectiveRanks];
  ClusterRowGroup block{warpSums, gathered, totals, 0, 1};
  auto blockSum = [&](float x) {
    float values[1] = {x};
    block.sums(values, 1);
    return values[0];
  };
  bool waited = false;
  auto waitForSum = [&] {
    if (waited) return;
    waited = true;
    waitForPriorGrid();
    allowDependentLaunch();
  };
  for (uint64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    addRMSNormRow<T, Unit>(args, row, threadIdx.x, blockDim.x, waitForSum, blockSum);
  }
  waitForSum();  // every kernel waits before it exits (a block without rows too)
}

/// Blocks of the add + RMSNorm kernel at most (rows beyond it loop).
constexpr uint64_t kAddNormMaxBlocks = 1u << 16;

}  // namespace

void addRMSNormDevice(const AddRMSNormCall& call, void* stream, bool programmatic) {
  const AddRMSNormArgs& a = call.args;
  if (a.rows == 0 || a.hidden == 0) return;
  dispatchFloat(call.dtype, [&]<typename T>() {
    const bool vectorized = addRMSNormVectorized(a, sizeof(T));
    const uint64_t units = vectorized ? a.hidden * sizeof(T) / 16 : a.hidden;
    const KernelLaunch shape{addRMSNormThreads(units), programmatic};
    const auto blocks = static_cast<uint32_t>(a.rows < kAddNormMaxBlocks ? a.rows : kAddNormMaxBlocks);
    auto* kernel = vectorized ? addRMSNormKernel<T, detail::Vec16> : addRMSNormKernel<T, T>;
    launchCollectiveKernel(kernel, blocks, shape, static_cast<cudaStream_t>(stream), a);
  });
}

bool clusterLaunchSupported(int device) {
  int supported = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device));
  return supported != 0;
}

void allReduceRMSNormDevice(const CollectiveContext& context, const FusedNormCall& call, void* stream,
                            KernelLaunch launch) {
  launch.clusterBlocks = call.args.segments;
  dispatchFloat(call.dtype, [&]<typename T>() {
    auto* kernel = call.args.twoShot != 0 ? allReduceRMSNormKernel<T, true> : allReduceRMSNormKernel<T, false>;
    launchCollectiveKernel(kernel, call.args.groups * call.args.segments, launch, static_cast<cudaStream_t>(stream),
                           context, call.args);
  });
}

void fusedNormKernels(std::vector<const void*>* out) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    dispatchFloat(dtype, [&]<typename T>() {
      out->push_back(reinterpret_cast<const void*>(allReduceRMSNormKernel<T, false>));
      out->push_back(reinterpret_cast<const void*>(allReduceRMSNormKernel<T, true>));
      out->push_back(reinterpret_cast<const void*>(addRMSNormKernel<T, detail::Vec16>));
      out->push_back(reinterpret_cast<const void*>(addRMSNormKernel<T, T>));
    });
  }
}

}  // namespace pyccl
