// Communicator: one per (process group, device). Created collectively from a
// Store, rank and world size; owns the bootstrap, the fd server, the memory
// it registered or imported, the semaphores, and the abort flag every wait
// checks. device < 0 selects host mode (CPU memory, CPU "kernels").
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "channels/device_common.hpp"
#include "core/bootstrap.hpp"
#include "core/call_history.hpp"
#include "core/fd_passing.hpp"
#include "core/channels.hpp"
#include "core/health.hpp"
#include "core/registered_memory.hpp"
#include "core/semaphore.hpp"
#include "core/topology.hpp"
#include "core/verdicts.hpp"

namespace pyccl {

class FdServer;
class ProxyChannel;
class ProxyService;
struct RdmaInboxLayout;

struct CommunicatorOptions {
  std::string name;  ///< namespace of this communicator's store keys
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

class Communicator {
 public:
  /// Collective: every rank of the group calls it with the same name and
  /// world size. Throws InvalidArgument for a bad rank, world size or device,
  /// and TimeoutError when a rank does not arrive within the timeout.
  Communicator(std::shared_ptr<Store> store, int rank, int worldSize, int device,
               CommunicatorOptions options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }
  /// CUDA device ordinal, or -1 in host mode.
  int device() const { return device_; }
  bool hostMode() const { return device_ < 0; }
  const std::string& name() const { return options_.name; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  const Topology& topology() const { return topology_; }
  /// Whether this rank reaches `peer`'s registered memory by loads and stores.
  bool canAccessPeer(int peer) const;
  /// The lowest rank this one cannot reach by P2P (on another node, or no
  /// P2P path), or -1 when it reaches every rank.
  int firstUnreachablePeer() const;

  /// Host-side collectives over the store (set-up only, not the data path).
  std::vector<Bytes> allGather(const Bytes& mine);
  void barrier();
  void send(int peer, int tag, const Bytes& data);
  Bytes recv(int peer, int tag);

  /// Registers [ptr, ptr + size) for peers to map. On a GPU communicator the
  /// memory must be device memory of this communicator's device; in host mode,
  /// memory from allocateHostShared. The caller keeps the memory alive.
  /// `owner`, if given, is held until the registration is released.
  RegisteredMemory registerMemory(void* ptr, size_t size, std::shared_ptr<void> owner = nullptr);
  /// Zero-filled memory that peers can map once it is registered: shared host
  /// memory in host mode, device memory on GPUs. The pointer owns it.
  std::shared_ptr<void> allocateShareable(size_t size) const;
  /// Zero-filled memory for this rank's own kernels: heap memory in host
  /// mode, device memory on GPUs. The pointer owns it.
  std::shared_ptr<void> allocateLocal(size_t size) const;
  /// Zero-filled host memory that this rank's kernels reach too: page-locked
  /// and mapped on GPUs (use gpu::devicePointerOf in kernels), heap memory in
  /// host mode. The pointer owns it.
  std::shared_ptr<void> allocateHostMapped(size_t size) const;
  /// Maps memory a peer registered (from RegisteredMemory::serialize).
  RegisteredMemory importMemory(const Bytes& descriptor) { return importMemoryFrom(descriptor, true); }
  /// Collective: returns every rank's registration of `local`, mapped here,
  /// indexed by rank (this rank's own entry is `local`). Peers this rank cannot
  /// reach by P2P get std::nullopt. Returns once every rank has mapped.
  std::vector<std::optional<RegisteredMemory>> exchangeMemory(const RegisteredMemory& local);
  /// Collective: exchangeMemory for many registrations in one round trip:
  /// entry i holds every rank's i-th registration. Every rank must pass as
  /// many (else InvalidArgument on every rank, naming each rank's count, and
  /// nothing is mapped); `what` names the caller in that message.
  std::vector<std::vector<std::optional<RegisteredMemory>>> exchangeMemories(
      const std::vector<RegisteredMemory>& locals, const char* what = "exchange_memories");

  /// Pairwise: both this rank and `peer` call it (in matching order per peer);
  /// returns once both sides have mapped each other's slot.
  std::shared_ptr<Semaphore> createSemaphore(int peer);

  /// Pairwise: a MemoryChannel between `local` (registered here) and the
  /// buffer the peer passes; `localPackets` (optional, registered here) is the
  /// packet buffer the peer's putPackets write into.
  std::shared_ptr<MemoryChannel> createMemoryChannel(int peer, const RegisteredMemory& local,
                                                     const RegisteredMemory& localPackets);
  /// Pairwise: a PortChannel between `local` and the peer's buffer, moved by
  /// this rank's proxy through `transport`: "host", "cuda_ipc" (peers with
  /// P2P), "socket" (any peer), or "auto" (the first that fits).
  std::shared_ptr<PortChannel> createPortChannel(int peer, const RegisteredMemory& local,
                                                 const std::string& transport);
  /// Pairwise: a TCP connection to `peer` for the socket transport (the lower
  /// rank connects); tells the peer `localSize` and returns the peer's size
  /// in `peerSize`. Bounded by the communicator's timeout.
  UniqueFd connectSocket(int peer, uint64_t localSize, uint64_t* peerSize);
  /// Pairwise: the plan interpreter's RDMA connection to `peer` (another
  /// node) over `staging` (`bytes` of host memory, laid out as `layout` on
  /// every rank): a channel for this rank's proxy. Under PYCCL_RDMA_LOOPBACK=1
  /// (host mode, tests) `shared` is the staging registered here, the peer's
  /// is mapped and memcpy stands in for the NIC. Bounded by the timeout.
  std::unique_ptr<ProxyChannel> connectRdmaInbox(int peer, char* staging, uint64_t bytes,
                                                 const RegisteredMemory& shared, const RdmaInboxLayout& layout);
  /// Whether plans across nodes go over RDMA: PYCCL_PLAN_TRANSPORT=rdma, or
  /// (unset or "auto") under PYCCL_RDMA_LOOPBACK=1; otherwise sockets. Every
  /// rank must choose alike (the executors check).
  bool plansUseRdma() const;
  /// A semaphore slot signalled by something other than the peer's stores
  /// (e.g. a socket receiver); it maps nothing of the peer. Local, not pairwise.
  std::shared_ptr<Semaphore> createLocalSemaphore(int peer);
  /// This communicator's proxy (started on first use).
  std::shared_ptr<ProxyService> proxyService();

  /// The abort/timeout state kernels of this communicator embed.
  AbortState abortState() const;
  /// The first failure a device-side wait recorded, if any (status 0: none).
  DeviceErrorRecord deviceError() const;
  /// Sequence numbers, call tags and the broken state (core/health.hpp).
  CommunicatorHealth& health() const { return *health_; }
  /// Throws unless `op` may run: ClosedError once closed; otherwise, once
  /// broken (a wait gave up, abort(), the proxy died), the error of the first
  /// failure, naming its op, sequence number and peers.
  void checkUsable(const char* op) const;
  /// After a host-mode call of `op` ran: throws its failure, if a wait gave up.
  void checkCompleted(const char* op) const { health_->check(op, /*refusing=*/false); }
  /// Whether every call checks op, dtype, count and sequence number across
  /// ranks first (PYCCL_DEBUG=1 or TORCH_DISTRIBUTED_DEBUG=DETAIL, read at creation).
  bool callChecks() const { return callChecks_; }
  /// A call begun: the tag its kernels record on failure, and its labels while its host part runs.
  struct CallStart {
    uint64_t tag;
    CallLabel label;
  };
  /// Starts a call of `op` on `stream` (ignored in host mode): takes its
  /// sequence number, checks it across ranks when callChecks() (`signature`
  /// describes the call), records it in the flight recorder with `facts`,
  /// and opens its labels (call_history.hpp). Keep the result until the call is enqueued.
  CallStart beginCall(CallOp op, void* stream, const std::string& signature, const CallFacts& facts);
  /// Records call `seq` of `op`, numbered by its caller (send_recv), and returns its labels.
  CallLabel noteCall(CallOp op, uint64_t seq, bool captured, const CallFacts& facts);
  /// The flight recorder: the last calls, oldest first; how many were made; and the tag of the call whose wait
  /// gave up (0: none).
  std::vector<CallRecord> history() const { return history_->snapshot(); }
  uint64_t historyTotal() const { return history_->total(); }
  uint64_t failedCallTag() const;
  /// Marks a host-mode "kernel" (CPU threads using this communicator's
  /// channels) as running; close() waits for them after raising the abort flag.
  class HostKernelScope {
   public:
    explicit HostKernelScope(Communicator& c) : c_(c) { c_.hostKernels_.fetch_add(1); }
    ~HostKernelScope() { c_.hostKernels_.fetch_sub(1); }
    HostKernelScope(const HostKernelScope&) = delete;
    HostKernelScope& operator=(const HostKernelScope&) = delete;

   private:
    Communicator& c_;
  };

  /// Raises the abort flag: every wait (host or device) gives up, and the
  /// communicator is broken. Safe from any thread.
  void abort();
  bool aborted() const;
  /// Releases everything (idempotent). Memory and semaphores still held by the
  /// caller become invalid; later calls raise ClosedError.
  void close();
  bool closed() const { return closed_.load(); }

 private:
  void checkOpen(const char* op) const;
  /// importMemory; `sameNodeOnly` false only for the RDMA loopback stand-in.
  RegisteredMemory importMemoryFrom(const Bytes& descriptor, bool sameNodeOnly);
  std::shared_ptr<PortChannel> createSocketPortChannel(int peer, const RegisteredMemory& local);
  std::shared_ptr<PortChannel> createRdmaPortChannel(int peer, const RegisteredMemory& local);
  /// Throws InvalidArgument if two ranks of one node are on the same GPU,
  /// unless PYCCL_ALLOW_SHARED_GPU=1 (then warns). Same answer on every rank.
  void checkGpusDistinct();
  void probePeers();
  RegisteredMemory trackMemory(std::shared_ptr<RegisteredMemory::Impl> impl);
  SemaphoreSlot* allocateSemaphoreSlot(RegisteredMemory* page);
  /// Collective: gathers every rank's `signature` of call `seq` and throws
  /// RemoteError naming the ranks that differ (on every rank, before anything
  /// ran, so the communicator stays usable).
  void checkCallMatches(const char* op, uint64_t seq, const std::string& signature);
  /// Frees the abort flag and the error record (after close(); they outlive
  /// it for late readers such as a Work's wait()).
  void freeFailureState();
  /// Raises the abort flag: the host word, then its copy in GPU memory (a
  /// failure to reach the GPU is logged, never thrown).
  void raiseAbortFlag() noexcept;

  int rank_;
  int worldSize_;
  int device_;
  CommunicatorOptions options_;
  static constexpr uint32_t kProxyFifoSize = 1024;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::shared_ptr<FdServer> fdServer_;
  Topology topology_;
  std::string nodeKey_;

  // Abort flag and device error record: pinned + mapped on GPU, heap in host mode.
  uint32_t* abortFlagHost_ = nullptr;
  DeviceErrorRecord* errorRecordHost_ = nullptr;
  void* abortFlagDevice_ = nullptr;
  /// The abort flag's copy in GPU memory, which kernels poll (see AbortState).
  uint32_t* abortFlagGpu_ = nullptr;
  void* errorRecordDevice_ = nullptr;
  /// Before health_: its watchdog, which may dump the history, stops first.
  std::unique_ptr<CallHistory> history_;
  std::unique_ptr<CommunicatorHealth> health_;
  /// This rank's verdicts to its peers and theirs to it (worlds of 2 and more).
  std::unique_ptr<VerdictBoard> verdicts_;
  bool callChecks_ = false;

  mutable std::mutex mu_;
  std::vector<std::weak_ptr<RegisteredMemory::Impl>> tracked_;
  std::vector<std::shared_ptr<void>> ownedAllocations_;  // semaphore pages
  RegisteredMemory semaphorePage_;
  size_t semaphoreSlotsUsed_ = 0;
  // Peers' semaphore pages, by descriptor (its bytes as a string: GCC 12 warns, falsely, on the memcmp bound
  // that std::less<std::vector<uint8_t>> inlines).
  std::map<std::string, RegisteredMemory> importedPages_;
  std::shared_ptr<ProxyService> proxy_;
  std::atomic<int> hostKernels_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace pyccl
