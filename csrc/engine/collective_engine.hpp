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

#include "algorithms/allreduce.hpp"
#include "algorithms/exchange.hpp"
#include "algorithms/fused_norm.hpp"
#include "algorithms/p2p.hpp"
#include "engine/collective_options.hpp"
#include "engine/graph_buffers.hpp"
#include "core/communicator.hpp"

namespace pyccl {

/// Fused all-reduce + RMSNorm calls of more input bytes than this run
/// unfused (pyccl.all_reduce, then torch's add and rms_norm): the fused
/// kernel is measured to win up to 1 MiB (64 tokens of hidden 8192 bf16,
/// docs/performance.md); above it the all-reduce's bandwidth sets the time,
/// and the one-shot LL kernel is not the fastest all-reduce there.
constexpr uint64_t kFusedMaxBytes = uint64_t{1} << 20;

class CollectiveEngine {
 public:
  /// Collective: allocates and registers the scratch, maps every peer's.
  /// Throws UnsupportedError if a peer is not reachable by P2P or there are more than kMaxCollectiveRanks,
  /// InvalidArgument on every rank if the ranks' options differ (agreeOnCollectiveOptions).
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

  /// Moves chunks between all ranks (see algorithms/exchange.cu for `kind`):
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
  /// launch, algorithms/p2p.cu), except that a transfer whose (peer, direction)
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
  /// (algorithms/fused_norm.cu), or in two, allReduce into `normed` and then
  /// add + RMSNorm (the same file); by `algorithm` or by size.
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
  /// Releases the scratch, its mappings and the call counters (idempotent); later calls raise ClosedError.
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

}  // namespace pyccl
