// The all-reduce algorithms of the collective engine, as the engine sees
// them: their names, one call's arguments, how much one launch takes, and
// the launch on CPU threads (host mode) or on a stream. allreduce.cu holds
// the algorithms themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/collective_context.hpp"
#include "device/kernel_launch.hpp"

namespace pyccl {

enum class AllReduceAlgorithm : uint32_t { kOnePhaseLL = 0, kTwoPhaseHB = 1, kTwoPhaseLL = 2, kOnePhaseHB = 3 };

/// Every all-reduce algorithm's one name ("1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb"), as docs, `algorithm=`,
/// PYCCL_ALGO and the tuning tables spell it; in that order.
const std::vector<std::string>& allReduceAlgorithmNames();
/// Parses one of allReduceAlgorithmNames(); throws InvalidArgument naming `what`.
AllReduceAlgorithm parseAllReduceAlgorithm(const std::string& name, const char* what);
const char* allReduceAlgorithmName(AllReduceAlgorithm a);

/// Where each rank's input and output of a zero-copy call are, mapped here
/// (this rank's own at index rank). Plain data, passed to the kernel by value.
struct SymmetricPointers {
  const char* inputs[kMaxCollectiveRanks];
  char* outputs[kMaxCollectiveRanks];
};

struct AllReduceCall {
  const void* input;
  void* output;
  uint64_t count;  ///< elements; within the algorithm's per-call limit
  DataType dtype;
  ReduceOp op;
  AllReduceAlgorithm algorithm;
  /// 2PA HB on symmetric buffers: every rank's input and output, mapped here
  /// (the zero-copy algorithm); null otherwise.
  const SymmetricPointers* symmetric = nullptr;
  /// 2PA HB on graph buffers: the device address of the call's pointers,
  /// filled in when the capture's buffers are registered (engine/graph_buffers.hpp); null otherwise.
  const SymmetricPointers* graphSlot = nullptr;
};

/// Elements of `elementSize` bytes per 2PA LL call (the host splits larger messages).
PYCCL_HOST_DEVICE uint64_t allReduceTwoPhaseLLMaxCount(const CollectiveContext& c, uint64_t llMaxBytes,
                                                       uint64_t elementSize) {
  return static_cast<uint64_t>(c.worldSize) * (llMaxBytes / elementSize);
}

/// Elements of `elementSize` bytes per 2PA HB round (a kernel runs as many rounds as its message needs).
PYCCL_HOST_DEVICE uint64_t allReduceTwoPhaseHBMaxCount(const CollectiveContext& c, uint64_t elementSize) {
  return static_cast<uint64_t>(c.worldSize) * c.hbBlocks * (c.hbSubBytes / elementSize);
}

/// Elements of `elementSize` bytes per 1PA HB round: one staging slot per block and rank.
PYCCL_HOST_DEVICE uint64_t allReduceOnePhaseHBMaxCount(const CollectiveContext& c, uint64_t elementSize) {
  return static_cast<uint64_t>(c.hbActiveBlocks) * (c.hbSubBytes / elementSize);
}

/// Runs one call on CPU threads and returns when it is done.
void allReduceHost(const CollectiveContext& context, const AllReduceCall& call);
#ifdef PYCCL_WITH_CUDA
/// Enqueues one call on `stream` (a cudaStream_t); capturable in CUDA graphs.
void allReduceDevice(const CollectiveContext& context, const AllReduceCall& call, void* stream,
                     const KernelLaunch& launch);
/// Appends the host stub of every kernel allReduceDevice may launch (for loading them up front:
/// core/kernel_loading.hpp).
void allReduceKernels(std::vector<const void*>* out);
#endif

}  // namespace pyccl
