// The options of a collective engine: what each one means, the defaults an
// engine fills in (host mode or GPUs), their checks, and the agreement of all
// ranks on them (every rank cuts the scratch and picks algorithms by them).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/allreduce.hpp"
#include "algorithms/exchange.hpp"
#include "algorithms/fused_norm.hpp"
#include "core/communicator.hpp"

namespace pyccl {

/// One entry of a size table: messages of at most maxBytes (UINT64_MAX: any) take `choice`.
template <typename Choice>
struct SizeChoice {
  uint64_t maxBytes;
  Choice choice;
};

/// Who sets an option: users (documented, steady), or experiments and tests
/// (they may go; benchmarks and the tuner try them). Every rank must agree on
/// all of them but the launch's own (kLaunch), which changes only how kernels
/// are launched.
enum class OptionUse { kUser, kExperiment, kLaunch };

constexpr uint64_t kOptionMaxBytes = 16ull << 20;  ///< the p2p options' upper limit

/// Every plain option of a collective engine, once. Each row drives the
/// CollectiveOptions member, its initial value, its check, the ranks'
/// agreement and the Python keyword:
///   X(type, member, Python name, initial, value that asks for the default (or std::nullopt: none),
///     lowest, highest, step (the value must be a multiple of it), use)
/// Defaults that depend on host mode, the world size or other options are
/// filled in by resolveCollectiveOptions; the checks run on the values
/// resolved. The defaults were measured on 4 x H200 NVLink (bf16, CUDA
/// graphs), and 2 x H200 where said; docs/performance.md has the figures.
#define PYCCL_COLLECTIVE_OPTIONS(X)                                                                                   \
  /* Blocks of the LL kernels; 0: default (64 on GPUs, 2 in host mode). */                                            \
  X(uint32_t, llBlocks, "ll_blocks", 0, 0, 0, 1024, 1, kUser)                                                         \
  /* Blocks of the HB kernels; 0: default (128 on GPUs, 2 in host mode). */                                           \
  X(uint32_t, hbBlocks, "hb_blocks", 0, 0, 0, 1024, 1, kUser)                                                         \
  /* Threads per block of the LL kernel. */                                                                           \
  X(uint32_t, llThreads, "ll_threads", 1024, std::nullopt, 32, 1024, 32, kUser)                                       \
  /* LL calls run on about (packets per rank pair) / this many blocks, up to llBlocks; 0: every LL call runs on all   \
     llBlocks. */                                                                                                     \
  X(uint32_t, llPacketsPerBlock, "ll_packets_per_block", 0, std::nullopt, 0, UINT32_MAX, 1, kExperiment)              \
  /* Threads per block of the HB kernels. */                                                                          \
  X(uint32_t, hbThreads, "hb_threads", 256, std::nullopt, 32, 1024, 32, kUser)                                        \
  /* Threads per block of 2PA HB all-reduces and HB exchanges of at least one whole round (hbPieceBytes): more        \
     stores in flight per block pay from there on. */                                                                 \
  X(uint32_t, hbLargeThreads, "hb_large_threads", 512, std::nullopt, 32, 1024, 32, kUser)                             \
  /* Largest LL message; 0: default (1 MiB GPUs, 64 KiB host). */                                                     \
  X(uint64_t, llMaxBytes, "ll_max_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                                              \
  /* HB rounds move this much; 0: default (16 MiB GPUs, 1 MiB host). */                                               \
  X(uint64_t, hbPieceBytes, "hb_piece_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                                          \
  /* HB rounds (2PA HB all-reduce, HB exchanges) per kernel launch; 0: the whole message in one launch. */            \
  X(uint32_t, hbRoundsPerLaunch, "hb_rounds_per_launch", 0, std::nullopt, 0, UINT32_MAX, 1, kExperiment)              \
  /* The 2PA HB all-reduce and the HB exchanges push (stores into the peers' scratch) instead of pulling (loads from  \
     it); algorithms/allreduce.cu, exchange.cu. */                                                                    \
  X(bool, hbPush, "hb_push", true, std::nullopt, 0, 1, 1, kExperiment)                                                \
  /* All-reduce, automatic choice: 1PA LL up to here; 0: default (128 KiB on GPUs, or llMaxBytes if smaller;          \
     llMaxBytes / 2 in host mode). */                                                                                 \
  X(uint64_t, llThresholdBytes, "ll_threshold_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                                  \
  /* All-reduce, automatic choice: 2PA LL up to here, 2PA HB above; 0: default (1 MiB on GPUs, llMaxBytes in host     \
     mode). */                                                                                                        \
  X(uint64_t, ll2ThresholdBytes, "ll2_threshold_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                                \
  /* All-reduce, automatic choice: 1PA HB above ll2ThresholdBytes up to here; 0: default (2 ranks on GPUs: 8 MiB,     \
     and 2PA LL's default range empty, as 1PA HB sends what 2PA sends there with one barrier fewer; else never). */   \
  X(uint64_t, onePhaseHBMaxBytes, "one_phase_hb_max_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                            \
  /* All-reduce, automatic choice, input and output in symmetric buffers: zero-copy 2PA HB from here on; 0: default   \
     (ll2ThresholdBytes). */                                                                                          \
  X(uint64_t, zeroCopyThresholdBytes, "zero_copy_threshold_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                     \
  /* Threads per block of the zero-copy all-reduce. */                                                                \
  X(uint32_t, zeroCopyThreads, "zero_copy_threads", 512, std::nullopt, 32, 1024, 32, kUser)                           \
  /* Symmetric buffers above this many bytes take the staged 2PA HB path (which pushes, and beats the zero-copy       \
     kernel's loads there); 0: default (8 MiB on GPUs, no limit in host mode), UINT64_MAX: never. */                  \
  X(uint64_t, zeroCopyMaxBytes, "zero_copy_max_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                                 \
  /* Zero-copy all-reduces run on about (bytes per rank's chunk) / this many blocks, up to hbBlocks; 0: always on     \
     hbBlocks. */                                                                                                     \
  X(uint64_t, zeroCopyBytesPerBlock, "zero_copy_bytes_per_block", 0, std::nullopt, 0, UINT64_MAX, 1, kExperiment)     \
  /* 1PA HB all-reduces run on about (bytes of the message) / this many blocks, up to hbBlocks; 0: always on          \
     hbBlocks. */                                                                                                     \
  X(uint64_t, onePhaseHBBytesPerBlock, "one_phase_hb_bytes_per_block", 0, std::nullopt, 0, UINT64_MAX, 1,             \
    kExperiment)                                                                                                      \
  /* Fused all-reduce + RMSNorm: blocks per row, one thread-block cluster (at most llBlocks too); 0: by the call      \
     (CollectiveEngine::fusedLaunchFor). */                                                                           \
  X(uint32_t, fusedSegments, "fused_segments", 0, 0, 0, kFusedMaxSegments, 1, kUser)                                  \
  /* Threads per block of the fused kernel; 0: by the call. */                                                        \
  X(uint32_t, fusedThreads, "fused_threads", 0, 0, 0, kFusedMaxThreads, 32, kUser)                                    \
  /* Fused all-reduce + RMSNorm, automatic choice: two kernels (the all-reduce, then add + RMSNorm) for messages of   \
     at least this many bytes and for rows longer than fusedMaxRowBytes(); 0: default (128 KiB + 1 on GPUs,           \
     llMaxBytes + 1 in host mode). */                                                                                 \
  X(uint64_t, fusedTwoKernelMinBytes, "fused_two_kernel_min_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                    \
  /* Fused all-reduce + RMSNorm, automatic choice below fusedTwoKernelMinBytes: one-shot up to this many bytes of the \
     whole message (and below world-size rows), two-shot above; 0: default (256 KiB on GPUs, llMaxBytes / 2 in host   \
     mode). */                                                                                                        \
  X(uint64_t, fusedTwoShotBytes, "fused_two_shot_bytes", 0, 0, 0, UINT64_MAX, 1, kUser)                               \
  /* Sends and receives (algorithms/p2p.cu): most lanes (blocks, each with a ring per peer) of a transfer; 0: default \
     (64 on GPUs, fewer where a launch with every peer would not stay resident; 2 in host mode). */                   \
  X(uint32_t, p2pBlocks, "p2p_blocks", 0, 0, 0, 64, 1, kUser)                                                         \
  /* Bytes a lane moves per step; 0: default (64 KiB on GPUs, 4 KiB in host mode). */                                 \
  X(uint64_t, p2pSliceBytes, "p2p_slice_bytes", 0, 0, 0, kOptionMaxBytes, 16, kUser)                                  \
  /* Slots per (peer, lane) ring: the steps a send may run ahead of its receive. */                                   \
  X(uint32_t, p2pSlots, "p2p_slots", 2, std::nullopt, 1, 64, 1, kUser)                                                \
  /* Threads per block of the send/receive kernel. */                                                                 \
  X(uint32_t, p2pThreads, "p2p_threads", 512, std::nullopt, 32, 1024, 32, kUser)                                      \
  /* Transfers of at most this many bytes go as LL packets (algorithms/p2p.cu); kP2PLLDefault: default (256 KiB on    \
     GPUs, 2 KiB in host mode); 0: only empty ones. */                                                                \
  X(uint64_t, p2pLLMaxBytes, "p2p_ll_max_bytes", kP2PLLDefault, kP2PLLDefault, 0, kOptionMaxBytes, 1, kUser)          \
  /* Bytes of an LL transfer per lane below which it takes no further lane; 0: default (8 bytes per thread of a block \
     but one, the header's, on GPUs: one packet per thread; 1 KiB in host mode). */                                   \
  X(uint64_t, p2pLLLaneBytes, "p2p_ll_lane_bytes", 0, 0, 0, kOptionMaxBytes, 8, kUser)                                \
  /* Launch the kernels with programmatic dependent launch (kernel_launch.cuh), so back-to-back collectives overlap   \
     their launch latency (PYCCL_PDL=0 turns it off for every engine). */                                             \
  X(bool, programmaticLaunch, "programmatic_launch", true, std::nullopt, 0, 1, 1, kLaunch)

/// p2pLLMaxBytes' value that asks for the default.
constexpr uint64_t kP2PLLDefault = ~0ull;

struct CollectiveOptions {
#define PYCCL_OPTION_MEMBER(type, member, name, initial, unset, lo, hi, step, use) type member = initial;
  PYCCL_COLLECTIVE_OPTIONS(PYCCL_OPTION_MEMBER)
#undef PYCCL_OPTION_MEMBER
  static constexpr uint64_t kP2PLLDefault = pyccl::kP2PLLDefault;

  /// All-reduce, automatic choice on plain buffers, where not empty (the
  /// kernel entries of a tuning table): the first entry whose maxBytes covers
  /// the message, the last entry beyond them all; in place of the thresholds.
  std::vector<SizeChoice<AllReduceAlgorithm>> allReduceBySize;
  /// The same for input and output in symmetric buffers (and plain tensors
  /// on graph buffers), in place of zeroCopyThresholdBytes: a table's
  /// `all_reduce_symmetric` entries, where 2PA HB means zero-copy.
  std::vector<SizeChoice<AllReduceAlgorithm>> allReduceSymmetricBySize;
  /// The same for the exchanges (ExchangeKind order), in place of exchangeLLThresholdBytes.
  std::vector<SizeChoice<Protocol>> exchangeBySize[4];
  /// All-gather, all-to-all, broadcast and reduce-scatter (ExchangeKind order),
  /// automatic choice: LL up to this many bytes of the whole buffer (nccl-tests'
  /// size); 0: default (GPUs: 512 KiB, broadcast 128 KiB; host: llMaxBytes / 2).
  uint64_t exchangeLLThresholdBytes[4] = {0, 0, 0, 0};
  /// The caller's own settings that every rank must share too, by name (e.g. "PYCCL_ALGO (environment)": the
  /// environment variables its choice of algorithm reads); checked with the options, the engine reads nothing else.
  std::map<std::string, std::string> agreedSettings;
};

/// One row of PYCCL_COLLECTIVE_OPTIONS, for code that walks them all (the
/// binding, the agreement): its Python name, use, and access to the member
/// as an unsigned number.
struct CollectiveOptionInfo {
  const char* name;
  OptionUse use;
  std::optional<uint64_t> unset;
  bool isBool;
  uint64_t (*get)(const CollectiveOptions&);
  /// Sets the member; InvalidArgument naming the option if `value` does not fit its type.
  void (*set)(CollectiveOptions&, uint64_t value);
};

/// Every row, in table order.
const std::vector<CollectiveOptionInfo>& collectiveOptionInfos();

/// `given` with every default filled in, for host mode or GPUs and `world` ranks, and every value checked
/// (InvalidArgument naming the option). p2pBlocks is not yet capped for residency: the engine does that.
CollectiveOptions resolveCollectiveOptions(CollectiveOptions given, bool host, int world);

/// Collective (one bootstrap all-gather): returns once every rank of `comm` passed the same options, as given
/// (the kLaunch options aside, which change only how kernels are launched), agreedSettings included; else throws
/// InvalidArgument on every rank alike, naming the first option or setting where a rank differs from rank 0, and
/// both values.
void agreeOnCollectiveOptions(Communicator& comm, const CollectiveOptions& given);

}  // namespace pyccl
