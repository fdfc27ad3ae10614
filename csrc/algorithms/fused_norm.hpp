// The fused all-reduce + residual add + RMSNorm of the collective engine, as
// the engine sees it: its algorithms by name, one call's arguments, how rows
// map onto the LL regions, and the launch on CPU threads (host mode) or on a
// stream. fused_norm.cu holds the algorithms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/collective_context.hpp"
#include "device/kernel_launch.hpp"

namespace pyccl {

/// The fused all-reduce + residual add + RMSNorm: one kernel, one-shot or
/// two-shot, or two kernels, the all-reduce and then the add + RMSNorm.
enum class FusedNormAlgorithm : uint32_t { kOneShot = 0, kTwoShot = 1, kTwoKernel = 2 };

/// Parses "one_shot" / "two_shot" / "two_kernel", as docs and `algorithm=` spell them; throws InvalidArgument
/// naming `what`.
FusedNormAlgorithm parseFusedNormAlgorithm(const std::string& name, const char* what);
const char* fusedNormAlgorithmName(FusedNormAlgorithm a);

/// Threads per block of the fused kernel at most: it keeps a few packets of
/// every row in registers, more than 64 registers a thread.
constexpr uint32_t kFusedMaxThreads = 512;
/// Blocks per row at most: a portable thread-block cluster.
constexpr uint32_t kFusedMaxSegments = 8;

/// One fused call over `rows` rows of `hidden` elements (every pointer any alignment).
struct FusedNormArgs {
  const void* input;     ///< [rows][hidden] this rank's partial sums
  const void* residual;  ///< [rows][hidden]
  const void* weight;    ///< [hidden]
  void* normed;          ///< [rows][hidden]; may be `input`
  void* residualOut;     ///< [rows][hidden]; may be `residual`
  uint64_t rows;
  uint64_t hidden;
  float eps;
  uint32_t segments;  ///< blocks per row
  uint32_t groups;    ///< row groups; the grid is groups * segments blocks
  uint32_t twoShot;   ///< 0: one-shot, 1: two-shot (rows >= world size)
};

/// Where one block's slice of a row lies, and how its rows map to LL slots.
struct FusedNormSlice {
  uint64_t begin;          ///< byte offset of the slice in a row
  uint64_t bytes;          ///< its length (0 for a slice past a short row's end)
  uint64_t packets;        ///< packets that carry it
  uint64_t slotsPerRow;    ///< LL slots each row takes in the block's region (same for every slice)

  PYCCL_HOST_DEVICE FusedNormSlice(uint64_t rowBytes, uint32_t segments, uint32_t segment) {
    const uint64_t per = ((rowBytes + segments - 1) / segments + LL16Packet::kDataBytes - 1) /
                         LL16Packet::kDataBytes * LL16Packet::kDataBytes;
    begin = segment * per < rowBytes ? segment * per : rowBytes;
    bytes = begin + per < rowBytes ? per : rowBytes - begin;
    packets = packetsFor<LL16Packet>(bytes);
    slotsPerRow = per / LL16Packet::kDataBytes;
  }
};

/// Rows of the two-shot that rank q owns, and the first of them: every rank
/// owns rows / world, the first rows % world one more.
PYCCL_HOST_DEVICE uint64_t fusedRowsOf(uint64_t rows, int world, int q) {
  return rows / world + (static_cast<uint64_t>(q) < rows % world ? 1 : 0);
}
PYCCL_HOST_DEVICE uint64_t fusedFirstRow(uint64_t rows, int world, int q) {
  const uint64_t extra = rows % world;
  return q * (rows / world) + (static_cast<uint64_t>(q) < extra ? q : extra);
}

/// Rows of one group's share per call that a block's LL region holds.
PYCCL_HOST_DEVICE uint64_t fusedRowsPerBlock(const CollectiveContext& c, uint64_t rowBytes, uint32_t segments) {
  return c.llBlockPackets / FusedNormSlice(rowBytes, segments, 0).slotsPerRow;
}

/// One add + RMSNorm call over `rows` rows of `hidden` elements.
struct AddRMSNormArgs {
  const void* sum;       ///< [rows][hidden] the all-reduced rows; may be `normed`
  const void* residual;  ///< [rows][hidden]
  const void* weight;    ///< [hidden]
  void* normed;          ///< [rows][hidden]
  void* residualOut;     ///< [rows][hidden]; may be `residual`
  uint64_t rows;
  uint64_t hidden;
  float eps;
};

struct FusedNormCall {
  FusedNormArgs args;  ///< rows within the layout's per-call limit
  DataType dtype;
};

/// The second kernel of the two-kernel algorithm: any number of rows.
struct AddRMSNormCall {
  AddRMSNormArgs args;
  DataType dtype;
};

/// Run one call on CPU threads and return when it is done.
void allReduceRMSNormHost(const CollectiveContext& context, const FusedNormCall& call);
void addRMSNormHost(const AddRMSNormCall& call);
#ifdef PYCCL_WITH_CUDA
/// Enqueues a fused call on args.groups * args.segments blocks, in clusters of
/// args.segments (launch.clusterBlocks is taken from it).
void allReduceRMSNormDevice(const CollectiveContext& context, const FusedNormCall& call, void* stream,
                            KernelLaunch launch);
/// Enqueues an add + RMSNorm call: one block per row, of addRMSNormThreads;
/// with programmatic dependent launch if `programmatic`.
void addRMSNormDevice(const AddRMSNormCall& call, void* stream, bool programmatic);
/// Whether `device` launches thread-block clusters (sm_90+): the fused kernel's segments need them.
bool clusterLaunchSupported(int device);
/// Appends the host stub of every kernel the two launches above may enqueue (core/kernel_loading.hpp).
void fusedNormKernels(std::vector<const void*>* out);
#endif

}  // namespace pyccl
