// CollectiveEngine: the fused all-reduce + residual add + RMSNorm: its choice
// of algorithm and launch shape by size, and its launches.
#include "engine/collective_engine.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {

CollectiveEngine::FusedLaunch CollectiveEngine::fusedLaunchFor(uint64_t rows, uint64_t rowBytes,
                                                               FusedNormAlgorithm algorithm) const {
  uint64_t segments = fusedMostSegments();
  if (clusters_ && options_.fusedSegments == 0) {
    const uint64_t blockBytes = context_.llBlockPackets * LL16Packet::kDataBytes;
    const uint64_t needed = (rowBytes + blockBytes - 1) / blockBytes;  // a slice fits one block's LL region
    const uint64_t world = static_cast<uint64_t>(comm_.worldSize());
    const uint64_t groups = algorithm == FusedNormAlgorithm::kTwoShot ? (rows + world - 1) / world : rows;
    while (segments > 1 && groups * segments > options_.llBlocks) segments /= 2;
    segments = std::max(segments, needed);
  }
  uint32_t threads = options_.fusedThreads;
  if (threads == 0) {
    const uint64_t packets = FusedNormSlice(rowBytes, static_cast<uint32_t>(segments), 0).slotsPerRow;
    threads = static_cast<uint32_t>(std::clamp<uint64_t>((packets + 31) / 32 * 32, 128, kFusedMaxThreads));
  }
  return {static_cast<uint32_t>(segments), threads};
}

uint32_t CollectiveEngine::fusedMostSegments() const {
  if (!clusters_) return 1;
  if (options_.fusedSegments != 0) return options_.fusedSegments;
  return std::min(kFusedMaxSegments, options_.llBlocks);
}

uint64_t CollectiveEngine::fusedMaxRowBytes() const {
  return fusedMostSegments() * context_.llBlockPackets * LL16Packet::kDataBytes;
}

FusedNormAlgorithm CollectiveEngine::selectFused(uint64_t rows, uint64_t rowBytes) const {
  const uint64_t bytes = rows * rowBytes;
  if (rowBytes > fusedMaxRowBytes() || bytes >= options_.fusedTwoKernelMinBytes) return FusedNormAlgorithm::kTwoKernel;
  if (rows < static_cast<uint64_t>(comm_.worldSize()) || bytes <= options_.fusedTwoShotBytes) {
    return FusedNormAlgorithm::kOneShot;
  }
  return FusedNormAlgorithm::kTwoShot;
}

void CollectiveEngine::allReduceRMSNorm(const void* input, const void* residual, const void* weight, void* normed,
                                        void* residualOut, uint64_t rows, uint64_t hidden, float eps,
                                        DataType dtype, std::optional<FusedNormAlgorithm> algorithm, void* stream) {
  static constexpr const char* kName = "fused_all_reduce_rmsnorm";
  checkUsable(kName);
  if (rows == 0 || hidden == 0) return;
  gpu::OptionalDeviceGuard onDevice(comm_.device());
  PYCCL_CHECK_ARG(input != nullptr && residual != nullptr && weight != nullptr && normed != nullptr &&
                      residualOut != nullptr, "tensor", "has no storage");
  const int world = comm_.worldSize();
  const uint64_t rowBytes = hidden * dataTypeSize(dtype);
  const FusedNormAlgorithm algo = algorithm ? *algorithm : selectFused(rows, rowBytes);
  if (algo == FusedNormAlgorithm::kTwoKernel) {
    // The all-reduce's sum lands in `normed`, which the second kernel overwrites unit by unit.
    allReduce(input, normed, rows * hidden, dtype, ReduceOp::kSum, std::nullopt, stream);
    launchAddRMSNorm({{normed, residual, weight, normed, residualOut, rows, hidden, eps}, dtype}, stream);
    return;
  }
  PYCCL_CHECK_ARG(rowBytes <= fusedMaxRowBytes(), "algorithm", fusedNormAlgorithmName(algo), " takes rows of at most ",
                  fusedMaxRowBytes(), " bytes in this communicator, the call's have ", rowBytes,
                  "; take two_kernel or the automatic choice");
  const FusedLaunch launch = fusedLaunchFor(rows, rowBytes, algo);
  const uint32_t segments = launch.segments;
  const uint64_t rowsPerBlock = fusedRowsPerBlock(context_, rowBytes, segments);
  // fusedSegments may be set below what a long row needs.
  PYCCL_CHECK_ARG(rowsPerBlock >= 1, "fused_segments", segments, " blocks per row cannot hold rows of ", rowBytes,
                  " bytes");
  PYCCL_CHECK_ARG(algo != FusedNormAlgorithm::kTwoShot || rows >= static_cast<uint64_t>(world), "algorithm",
                  "two_shot needs at least one row per rank (", world, "), the call has ", rows);
  const Communicator::CallStart started =
      comm_.beginCall(CallOp::kAllReduceRMSNorm, stream,
                      comm_.callChecks() ? strCat(kName, " ", dataTypeName(dtype), " ", rows, " x ", hidden)
                                         : std::string(),
                      CallFacts{rows * rowBytes, dataTypeName(dtype), fusedNormAlgorithmName(algo)});
  const uint64_t tag = started.tag;
  const uint64_t groupsMost = options_.llBlocks / segments;
  const uint64_t oneShotPerCall = groupsMost * rowsPerBlock;
  const uint64_t perCall = (algo == FusedNormAlgorithm::kOneShot ? 1 : world) * oneShotPerCall;
  CollectiveContext ctx = context_;
  ctx.abort.call = tag;
  for (uint64_t done = 0; done < rows;) {
    uint64_t n = rows - done < perCall ? rows - done : perCall;
    const uint64_t at = done * rowBytes;
    // A last two-shot piece of fewer rows than ranks runs one-shot, whose
    // blocks' LL regions hold world times fewer rows: it may take more pieces.
    const bool twoShot = algo == FusedNormAlgorithm::kTwoShot && n >= static_cast<uint64_t>(world);
    if (!twoShot && n > oneShotPerCall) n = oneShotPerCall;
    const uint64_t groupRows = twoShot ? fusedRowsOf(n, world, 0) : n;
    FusedNormCall call{{static_cast<const char*>(input) + at, static_cast<const char*>(residual) + at, weight,
                        static_cast<char*>(normed) + at, static_cast<char*>(residualOut) + at, n, hidden, eps,
                        segments, static_cast<uint32_t>(groupRows < groupsMost ? groupRows : groupsMost),
                        twoShot ? 1u : 0u},
                       dtype};
    launchFused(ctx, call, launch.threads, stream);
    done += n;
  }
}

void CollectiveEngine::launchFused(const CollectiveContext& ctx, const FusedNormCall& call, uint32_t threads,
                                   void* stream) {
#ifdef PYCCL_WITH_CUDA
  if (!comm_.hostMode()) {
    allReduceRMSNormDevice(ctx, call, stream, {threads, options_.programmaticLaunch});
    return;
  }
#endif
  (void)stream;
  (void)threads;
  Communicator::HostKernelScope active(comm_);
  allReduceRMSNormHost(ctx, call);
  comm_.checkCompleted("fused_all_reduce_rmsnorm");
}

void CollectiveEngine::launchAddRMSNorm(const AddRMSNormCall& call, void* stream) {
#ifdef PYCCL_WITH_CUDA
  if (!comm_.hostMode()) {
    addRMSNormDevice(call, stream, options_.programmaticLaunch);
    return;
  }
#endif
  (void)stream;
  addRMSNormHost(call);
}

}  // namespace pyccl
