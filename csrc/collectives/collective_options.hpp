// The options of a collective engine: what each one means, the defaults an
// engine fills in (host mode or GPUs), their checks, and the agreement of all
// ranks on them (every rank cuts the scratch and picks algorithms by them).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collectives/collective_launch.hpp"
#include "core/communicator.hpp"

namespace pyccl {

/// One entry of a size table: messages of at most maxBytes (UINT64_MAX: any) take `choice`.
template <typename Choice>
struct SizeChoice {
  uint64_t maxBytes;
  Choice choice;
};

/// Defaults measured on 4 x H200 NVLink (bf16, CUDA graphs; benchmarks/RESULTS.md).
struct CollectiveOptions {
  uint32_t llBlocks = 0;          ///< 0: default (64 on GPUs, 2 in host mode)
  uint32_t hbBlocks = 0;          ///< 0: default (128 on GPUs, 2 in host mode)
  uint32_t llThreads = 1024;      ///< threads per block of the LL kernel
  /// LL calls run on about (packets per rank pair) / this many blocks, up to
  /// llBlocks; 0: every LL call runs on all llBlocks.
  uint32_t llPacketsPerBlock = 0;
  uint32_t hbThreads = 256;       ///< threads per block of the HB kernels
  /// Threads per block of 2PA HB all-reduces and HB exchanges of at least
  /// one whole round (hbPieceBytes): more stores in flight per block pay from there on.
  uint32_t hbLargeThreads = 512;
  uint64_t llMaxBytes = 0;        ///< largest LL message; 0: default (1 MiB GPUs, 64 KiB host)
  uint64_t hbPieceBytes = 0;      ///< HB rounds move this much; 0: default (16 MiB GPUs, 1 MiB host)
  /// HB rounds (2PA HB all-reduce, HB exchanges) per kernel launch; 0: the whole message in one launch.
  uint32_t hbRoundsPerLaunch = 0;
  /// The 2PA HB all-reduce and the HB exchanges push (stores into the peers'
  /// scratch) instead of pulling (loads from it); allreduce_device.hpp,
  /// exchange_device.hpp.
  bool hbPush = true;
  /// All-reduce, automatic choice: 1PA LL up to here; 0: default (128 KiB on
  /// GPUs, or llMaxBytes if smaller; llMaxBytes / 2 in host mode).
  uint64_t llThresholdBytes = 0;
  /// All-reduce, automatic choice: 2PA LL up to here, 2PA HB above; 0: default
  /// (1 MiB on GPUs, llMaxBytes in host mode).
  uint64_t ll2ThresholdBytes = 0;
  /// All-reduce, automatic choice: 1PA HB above ll2ThresholdBytes up to here;
  /// 0: default (2 ranks on GPUs: 8 MiB, and 2PA LL's default range empty, as
  /// 1PA HB sends what 2PA sends there with one barrier fewer; else never).
  uint64_t onePhaseHBMaxBytes = 0;
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
  /// All-reduce, automatic choice, input and output in symmetric buffers:
  /// zero-copy 2PA HB from here on; 0: default (see collective_options.cpp).
  uint64_t zeroCopyThresholdBytes = 0;
  uint32_t zeroCopyThreads = 512;  ///< threads per block of the zero-copy all-reduce
  /// Symmetric buffers above this many bytes take the staged 2PA HB path
  /// (which pushes, and beats the zero-copy kernel's loads there); 0: default
  /// (8 MiB on GPUs, no limit in host mode), UINT64_MAX: never.
  uint64_t zeroCopyMaxBytes = 0;
  /// Zero-copy all-reduces run on about (bytes per rank's chunk) / this many
  /// blocks, up to hbBlocks; 0: always on hbBlocks.
  uint64_t zeroCopyBytesPerBlock = 0;
  /// 1PA HB all-reduces run on about (bytes of the message) / this many
  /// blocks, up to hbBlocks; 0: always on hbBlocks.
  uint64_t onePhaseHBBytesPerBlock = 0;
  /// Fused all-reduce + RMSNorm: blocks per row, one thread-block cluster (at
  /// most kFusedMaxSegments); 0: by the call (CollectiveEngine::fusedLaunchFor).
  uint32_t fusedSegments = 0;
  /// Threads per block of the fused kernel (at most kFusedMaxThreads); 0: by the call.
  uint32_t fusedThreads = 0;
  /// Fused all-reduce + RMSNorm, automatic choice: two kernels (the
  /// all-reduce, then add + RMSNorm) for messages of at least this many bytes
  /// and for rows longer than fusedMaxRowBytes(); 0: default (128 KiB + 1 on
  /// GPUs, llMaxBytes + 1 in host mode).
  uint64_t fusedTwoKernelMinBytes = 0;
  /// Fused all-reduce + RMSNorm, automatic choice below fusedTwoKernelMinBytes:
  /// one-shot up to this many bytes of the whole message (and below
  /// world-size rows), two-shot above; 0: default (256 KiB on GPUs,
  /// llMaxBytes / 2 in host mode).
  uint64_t fusedTwoShotBytes = 0;
  /// Sends and receives (p2p_device.hpp): most lanes (blocks, each with a ring per peer) of a transfer; 0:
  /// default (64 on GPUs, fewer where a launch with every peer would not stay resident; 2 in host mode).
  uint32_t p2pBlocks = 0;
  /// Bytes a lane moves per step (a multiple of 16); 0: default (64 KiB on GPUs, 4 KiB in host mode).
  uint64_t p2pSliceBytes = 0;
  /// Slots per (peer, lane) ring: the steps a send may run ahead of its receive.
  uint32_t p2pSlots = 2;
  uint32_t p2pThreads = 512;  ///< threads per block of the send/receive kernel
  /// Transfers of at most this many bytes go as LL packets (p2p_device.hpp); kP2PLLDefault: default (256 KiB on
  /// GPUs, 2 KiB in host mode); 0: only empty ones.
  uint64_t p2pLLMaxBytes = kP2PLLDefault;
  /// Bytes of an LL transfer per lane below which it takes no further lane (a multiple of 8); 0: default (8
  /// bytes per thread of a block but one, the header's, on GPUs: one packet per thread; 1 KiB in host mode).
  uint64_t p2pLLLaneBytes = 0;
  static constexpr uint64_t kP2PLLDefault = ~0ull;
  /// The caller's own settings that every rank must share too, by name (e.g. "PYCCL_ALGO (environment)": the
  /// environment variables its choice of algorithm reads); checked with the options, the engine reads nothing else.
  std::map<std::string, std::string> agreedSettings;
  /// Launch the kernels with programmatic dependent launch (kernel_launch.cuh),
  /// so back-to-back collectives overlap their launch latency.
  bool programmaticLaunch = true;
};

/// `given` with every default filled in, for host mode or GPUs and `world` ranks, and every value checked
/// (InvalidArgument naming the option). p2pBlocks is not yet capped for residency: the engine does that.
CollectiveOptions resolveCollectiveOptions(CollectiveOptions given, bool host, int world);

/// Collective (one bootstrap all-gather): returns once every rank of `comm` passed the same options, as given
/// (programmaticLaunch aside, which changes only how kernels are launched), agreedSettings included; else throws
/// InvalidArgument on every rank alike, naming the first option or setting where a rank differs from rank 0, and
/// both values.
void agreeOnCollectiveOptions(Communicator& comm, const CollectiveOptions& given);

/// Parses "1pa_ll" / "2pa_hb" (PYCCL_ALGO values); throws InvalidArgument naming `what`.
AllReduceAlgorithm parseAllReduceAlgorithm(const std::string& name, const char* what);
const char* allReduceAlgorithmName(AllReduceAlgorithm a);
/// Parses "one_shot" / "two_shot" / "two_kernel"; throws InvalidArgument naming `what`.
FusedNormAlgorithm parseFusedNormAlgorithm(const std::string& name, const char* what);
const char* fusedNormAlgorithmName(FusedNormAlgorithm a);
/// Parses "ll" / "hb" (exchange protocols); throws InvalidArgument naming `what`.
Protocol parseProtocol(const std::string& name, const char* what);
const char* protocolName(Protocol p);
/// "all_gather", "all_to_all", "broadcast", "reduce_scatter", and back (InvalidArgument naming `what`).
const char* exchangeKindName(ExchangeKind kind);
CallOp callOpOf(ExchangeKind kind);
ExchangeKind parseExchangeKind(const std::string& name, const char* what);

}  // namespace pyccl
