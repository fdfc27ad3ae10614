// Launching the collective bodies: as CUDA kernels on a stream, or in host
// mode on CPU threads (one per block). Dispatch over dtype x op x algorithm.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/add_rmsnorm_device.hpp"
#include "collectives/allreduce_device.hpp"
#include "collectives/allreduce_zero_copy_device.hpp"
#include "collectives/exchange_device.hpp"
#include "collectives/fused_norm_device.hpp"
#include "collectives/p2p_device.hpp"
#include "core/debug_options.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {

enum class AllReduceAlgorithm : uint32_t { kOnePhaseLL = 0, kTwoPhaseHB = 1, kTwoPhaseLL = 2, kOnePhaseHB = 3 };

/// The protocol of an exchange (all-gather, all-to-all, broadcast, reduce-scatter).
enum class Protocol : uint32_t { kLL = 0, kHB = 1 };

struct AllReduceCall {
  const void* input;
  void* output;
  uint64_t count;  ///< elements; within the algorithm's per-call limit
  DataType dtype;
  ReduceOp op;
  AllReduceAlgorithm algorithm;
  /// 2PA HB on symmetric buffers: every rank's input and output, mapped here
  /// (allreduce_zero_copy_device.hpp); null otherwise.
  const SymmetricPointers* symmetric = nullptr;
  /// 2PA HB on graph buffers: the device address of the call's pointers,
  /// filled in when the capture's buffers are registered (graph_buffers.hpp); null otherwise.
  const SymmetricPointers* graphSlot = nullptr;
};

/// The fused all-reduce + residual add + RMSNorm: one kernel, one-shot or
/// two-shot (fused_norm_device.hpp), or two kernels, the all-reduce and then
/// the add + RMSNorm (add_rmsnorm_device.hpp).
enum class FusedNormAlgorithm : uint32_t { kOneShot = 0, kTwoShot = 1, kTwoKernel = 2 };

struct FusedNormCall {
  FusedNormArgs args;  ///< rows within the layout's per-call limit
  DataType dtype;
};

/// The second kernel of the two-kernel algorithm: any number of rows.
struct AddRMSNormCall {
  AddRMSNormArgs args;
  DataType dtype;
};

struct ExchangeCall {
  ExchangeKind kind;
  Protocol protocol;
  ExchangeArgs args;  ///< chunkBytes within the protocol's per-call limit
  DataType dtype;     ///< reduce-scatter only
  ReduceOp op;        ///< reduce-scatter only
};

/// Threads per block for `items` work items, one per thread: whole warps,
/// at least one, at most `maxThreads` (a multiple of 32).
inline uint32_t wholeWarpsFor(uint64_t items, uint32_t maxThreads) {
  const uint64_t threads = items <= 32 ? 32 : (items + 31) / 32 * 32;
  return threads < maxThreads ? static_cast<uint32_t>(threads) : maxThreads;
}

/// How a collective kernel is launched (kernel_launch.cuh).
struct KernelLaunch {
  uint32_t threadsPerBlock;
  /// Programmatic dependent launch (sm_90+): the kernel may be scheduled
  /// before the previous one on the stream completes, and waits for it on the GPU.
  bool programmatic;
  /// Dynamic shared memory per block.
  uint32_t sharedBytes = 0;
  /// Blocks per thread-block cluster (sm_90+); 1: no clusters.
  uint32_t clusterBlocks = 1;
};

/// Whether kernels on `device` launch with programmatic dependent launch: on
/// sm_90 and newer (the kernels' griddepcontrol instructions are compiled for
/// those only), unless PYCCL_PDL=0 turns it off; for the collective engines
/// and the plan executors alike. Host mode (device < 0): as PYCCL_PDL says.
inline bool programmaticLaunchAllowed(int device) {
  return debugOptions().programmaticLaunch && (device < 0 || gpu::computeCapability(device) >= 90);
}

/// Runs one call on CPU threads and returns when it is done.
void allReduceHost(const CollectiveContext& context, const AllReduceCall& call);
void exchangeHost(const CollectiveContext& context, const ExchangeCall& call);
void allReduceRMSNormHost(const CollectiveContext& context, const FusedNormCall& call);
void addRMSNormHost(const AddRMSNormCall& call);
void sendRecvHost(const CollectiveContext& context, const P2PArgs& args);
#ifdef PYCCL_WITH_CUDA
/// Enqueues sends and receives on args.blocks blocks.
void sendRecvDevice(const CollectiveContext& context, const P2PArgs& args, void* stream, const KernelLaunch& launch);
/// Blocks of the send/receive kernel of `threads` threads that `device` holds at once.
uint32_t sendRecvResidentBlocks(int device, uint32_t threads);
void sendRecvKernels(std::vector<const void*>* out);
/// Enqueues one call on `stream` (a cudaStream_t); capturable in CUDA graphs.
void allReduceDevice(const CollectiveContext& context, const AllReduceCall& call, void* stream,
                     const KernelLaunch& launch);
void exchangeDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                    const KernelLaunch& launch);
/// Enqueues a fused call on args.groups * args.segments blocks, in clusters of
/// args.segments (launch.clusterBlocks is taken from it).
void allReduceRMSNormDevice(const CollectiveContext& context, const FusedNormCall& call, void* stream,
                            KernelLaunch launch);
/// Enqueues an add + RMSNorm call: one block per row, of addRMSNormThreads;
/// with programmatic dependent launch if `programmatic`.
void addRMSNormDevice(const AddRMSNormCall& call, void* stream, bool programmatic);
/// Whether `device` launches thread-block clusters (sm_90+): the fused kernel's segments need them.
bool clusterLaunchSupported(int device);
/// The reduce-scatter kernels (reduce_scatter.cu), called by exchangeDevice.
void reduceScatterDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                         const KernelLaunch& launch);
/// Append the host stubs of every kernel that allReduceDevice, exchangeDevice and
/// reduceScatterDevice may launch (for loading them up front: core/kernel_loading.hpp).
void allReduceKernels(std::vector<const void*>* out);
void exchangeKernels(std::vector<const void*>* out);
void reduceScatterKernels(std::vector<const void*>* out);
void fusedNormKernels(std::vector<const void*>* out);
#endif

/// Calls fn.template operator()<T, Op>() for the runtime dtype and op.
template <typename Fn>
void dispatchReduction(DataType dtype, ReduceOp op, Fn&& fn) {
  auto withOp = [&](auto typeTag) {
    using T = decltype(typeTag);
    switch (op) {
      case ReduceOp::kSum: fn.template operator()<T, ReduceOp::kSum>(); break;
      case ReduceOp::kAvg: fn.template operator()<T, ReduceOp::kAvg>(); break;
      case ReduceOp::kMin: fn.template operator()<T, ReduceOp::kMin>(); break;
      case ReduceOp::kMax: fn.template operator()<T, ReduceOp::kMax>(); break;
      case ReduceOp::kProd: fn.template operator()<T, ReduceOp::kProd>(); break;
    }
  };
  switch (dtype) {
    case DataType::kFloat32: withOp(float{}); break;
    case DataType::kFloat16: withOp(Half{}); break;
    case DataType::kBFloat16: withOp(BFloat16{}); break;
  }
}

/// Calls fn.template operator()<T>() for the runtime dtype (a reduction dtype).
template <typename Fn>
void dispatchFloat(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32: fn.template operator()<float>(); break;
    case DataType::kFloat16: fn.template operator()<Half>(); break;
    case DataType::kBFloat16: fn.template operator()<BFloat16>(); break;
  }
}

/// Calls fn.template operator()<T, Op>() for every dtype and op that reduces.
template <typename Fn>
void forEachReduction(Fn&& fn) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      dispatchReduction(dtype, op, fn);
    }
  }
}

}  // namespace pyccl
