// The host-side owner of the collective algorithms of one communicator: the
// scratch buffer every peer maps, the per-block call counters, and the choice
// of algorithm per message size. Create it collectively (every rank, same
// options); call it from one stream at a time, with the same calls in the
// same order on every rank (as with NCCL).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collective_launch.hpp"
#include "collectives/graph_buffers.hpp"
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
  /// zero-copy 2PA HB from here on; 0: default (see collective_engine.cpp).
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
  /// Launch the kernels with programmatic dependent launch (kernel_launch.cuh),
  /// so back-to-back collectives overlap their launch latency.
  bool programmaticLaunch = true;
};

class CollectiveEngine {
 public:
  /// Collective: allocates and registers the scratch, maps every peer's.
  /// Throws UnsupportedError if a peer is not reachable by P2P or there are more than kMaxCollectiveRanks.
  CollectiveEngine(Communicator& comm, CollectiveOptions options);
  ~CollectiveEngine();
  CollectiveEngine(const CollectiveEngine&) = delete;
  CollectiveEngine& operator=(const CollectiveEngine&) = delete;

  /// All-reduces `count` elements of `input` into `output` (may be the same
  /// buffer) with `algorithm` (or the size-based choice), enqueued on `stream`
  /// (a cudaStream_t; ignored in host mode, where it returns when done).
  /// `symmetricAlgorithm`, where given, takes the place of both when input
  /// and output lie in symmetric buffers or the call is captured on graph
  /// buffers: a caller's own choice for those calls, made without asking.
  void allReduce(const void* input, void* output, uint64_t count, DataType dtype, ReduceOp op,
                 std::optional<AllReduceAlgorithm> algorithm, void* stream,
                 std::optional<AllReduceAlgorithm> symmetricAlgorithm = std::nullopt);

  /// Moves chunks between all ranks (see exchange_device.hpp for `kind`):
  /// `chunkBytes` per (source, destination) pair, the chunk for/from rank q at
  /// input + q * inStride / output + q * outStride. For a reduce-scatter,
  /// `dtype` and `op` reduce; `root` is the broadcast's source. Enqueued on
  /// `stream` like allReduce.
  void exchange(ExchangeKind kind, const void* input, uint64_t inStride, void* output, uint64_t outStride,
                uint64_t chunkBytes, int root, DataType dtype, ReduceOp op, std::optional<Protocol> protocol,
                void* stream);

  /// One send to or receive from a peer (sendRecv).
  struct PeerTransfer {
    bool send;   ///< true: send `bytes` from `data` to `peer`; false: receive them from `peer` into `data`
    int peer;    ///< another rank
    void* data;  ///< any alignment
    uint64_t bytes;
  };
  /// Sends and receives, as ncclSend and ncclRecv between ncclGroupStart and
  /// ncclGroupEnd: enqueued on `stream` like allReduce, and run together (one
  /// launch, p2p_device.hpp), except that a transfer whose (peer, direction)
  /// an earlier one of the list has starts a further launch. Only the ranks
  /// involved take part; the n-th send to a peer meets the n-th receive from
  /// this rank there, and the sizes must agree (a receive that meets a send of
  /// another size breaks the communicator). A send may complete before its
  /// receive starts, up to p2pSlots * p2pBlocks * p2pSliceBytes; a larger one
  /// waits for it. Zero-byte transfers meet too (their sizes are checked).
  void sendRecv(const std::vector<PeerTransfer>& transfers, void* stream);

  /// All-reduces `rows` rows of `hidden` elements of `input` (sum), adds
  /// `residual` and applies RMSNorm with `weight` and `eps`: the rounded sums
  /// go to `residualOut` (may be `residual`), the normalized rows to `normed`
  /// (may be `input`). In one kernel, one-shot or two-shot
  /// (fused_norm_device.hpp), or in two, allReduce into `normed` and then
  /// add + RMSNorm (add_rmsnorm_device.hpp); by `algorithm` or by size.
  /// Enqueued on `stream` like allReduce. One-shot and two-shot take rows of
  /// at most fusedMaxRowBytes() (else InvalidArgument).
  void allReduceRMSNorm(const void* input, const void* residual, const void* weight, void* normed,
                        void* residualOut, uint64_t rows, uint64_t hidden, float eps, DataType dtype,
                        std::optional<FusedNormAlgorithm> algorithm, void* stream);
  /// The longest row (bytes) the fused kernel takes.
  uint64_t fusedMaxRowBytes() const;
  /// The algorithm the automatic choice takes for a fused call of `rows` rows of `rowBytes`.
  FusedNormAlgorithm selectFused(uint64_t rows, uint64_t rowBytes) const;
  /// Blocks per row (cluster size) and threads per block of a fused call of
  /// `rows` rows of `rowBytes`: as many blocks per row (up to 8) as the LL
  /// grid (llBlocks) has room for with one row group per row (one-shot) or
  /// per row of an owner (two-shot), and a thread per packet of a block's
  /// slice (128 to kFusedMaxThreads); the options override either.
  struct FusedLaunch {
    uint32_t segments;
    uint32_t threads;
  };
  FusedLaunch fusedLaunchFor(uint64_t rows, uint64_t rowBytes, FusedNormAlgorithm algorithm) const;

  /// Collective: makes `memory` (registered on this communicator, the same
  /// size on every rank, 16-byte aligned) a symmetric buffer: every peer's is
  /// mapped here, and all-reduces whose input and output both lie in symmetric
  /// buffers, at the same offset on every rank, read and write the peers'
  /// buffers directly (2PA HB zero-copy). Held until close().
  void registerSymmetric(const RegisteredMemory& memory);
  /// Whether [ptr, ptr + bytes) lies within one symmetric buffer.
  bool isSymmetric(const void* ptr, uint64_t bytes) const;
  /// All-reduces that ran zero-copy on symmetric buffers (for tests and logs).
  uint64_t zeroCopyCalls() const { return zeroCopyCalls_; }

  /// Starts collecting graph buffers (graph_buffers.hpp): from here until
  /// finishGraphCapture(), an all-reduce captured in a CUDA graph on plain
  /// tensors is chosen as if they were symmetric buffers, and where that is
  /// zero-copy 2PA HB it runs zero-copy on them. Call it before the capture.
  void beginGraphCapture() { graphBuffers_.begin(); }
  /// Collective, after the capture: registers the captured calls' tensors;
  /// returns how many calls. The graph may replay from then on.
  size_t finishGraphCapture();
  /// Ends the collection without registering (a failed capture).
  void abandonGraphCapture() { graphBuffers_.abandon(); }
  bool graphCapturing() const { return graphBuffers_.active(); }
  /// Captured all-reduces registered on graph buffers so far.
  uint64_t graphBufferCalls() const { return graphBuffers_.registeredCalls(); }

  /// The algorithm the automatic choice takes for an all-reduce of `bytes`
  /// (`symmetric`: input and output in symmetric buffers).
  AllReduceAlgorithm select(uint64_t bytes, bool symmetric = false) const;
  /// The protocol the automatic choice takes for an exchange whose whole buffer has `bytes`.
  Protocol selectExchange(ExchangeKind kind, uint64_t bytes) const;
  const CollectiveOptions& options() const { return options_; }
  /// Releases the scratch mappings (idempotent); later calls raise ClosedError.
  void close();

 private:
  Communicator& comm_;
  /// Refuses calls on a closed or aborted communicator, and on one where a
  /// wait gave up (the communicator is then broken: every later call fails).
  void checkUsable(const char* op) const;
  /// Runs one all-reduce call: a kernel of `threads` per block on `stream`, or
  /// in host mode CPU threads (and then raises if a wait gave up).
  void launchAllReduce(const CollectiveContext& ctx, const AllReduceCall& call, uint32_t threads, void* stream);
  void launchFused(const CollectiveContext& ctx, const FusedNormCall& call, uint32_t threads, void* stream);
  void launchAddRMSNorm(const AddRMSNormCall& call, void* stream);
  /// Blocks per row of the fused kernel at most here (1 without clusters; fusedSegments where set).
  uint32_t fusedMostSegments() const;
  /// The context of an LL call moving `llPackets` per (source, destination) pair.
  CollectiveContext contextFor(uint64_t llPackets) const;
  /// Threads per block of an LL call moving `llPackets` per pair on `ctx`'s
  /// blocks: whole warps for a block's share of the packets where that share
  /// is under a quarter of llThreads, else llThreads.
  uint32_t llThreadsFor(const CollectiveContext& ctx, uint64_t llPackets) const;
  /// The grid of a 1PA HB all-reduce of `bytes` (onePhaseHBBytesPerBlock).
  uint32_t onePhaseHBBlocksFor(uint64_t bytes) const;

  CollectiveOptions options_;
  CollectiveContext context_{};
  std::shared_ptr<void> scratchOwner_;
  std::shared_ptr<void> countersOwner_;
  ExchangedMemory scratch_;
  using SymmetricBuffer = ExchangedMemory;
  /// The symmetric buffer holding [ptr, ptr + bytes), or null.
  const SymmetricBuffer* findSymmetric(const void* ptr, uint64_t bytes) const;
  /// Rank q's copy of `ptr` (within a symmetric buffer), mapped here.
  char* peerPointer(const SymmetricBuffer& buffer, const void* ptr, int q) const;
  std::map<uintptr_t, SymmetricBuffer> symmetric_;  ///< by local start address
  GraphBuffers graphBuffers_;
  bool closed_ = false;
  bool clusters_ = false;  ///< the device launches thread-block clusters (host mode emulates them)
  uint64_t zeroCopyCalls_ = 0;
  uint64_t sendRecvCalls_ = 0;  ///< launches of sendRecv: its calls' numbers (per rank)
};

/// The host stubs of every kernel a collective engine may launch (empty in
/// CPU-only builds). An engine loads them into its device when it is made
/// (core/kernel_loading.hpp says why).
std::vector<const void*> collectiveKernels();

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
