#include "core/communicator.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "core/env_settings.hpp"
#include "core/errors.hpp"
#include "core/fd_passing.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "core/proxy.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/gpu_memory.hpp"
#endif

namespace pyccl {
namespace {

constexpr int kSemaphoreTag = 0x5e0a;
constexpr size_t kSemaphorePageBytes = 64 * 1024;

}  // namespace

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int worldSize, int device,
                           CommunicatorOptions options)
    : rank_(rank), worldSize_(worldSize), device_(device), options_(std::move(options)) {
  PYCCL_CHECK_ARG(worldSize >= 1, "world_size", "must be >= 1, got ", worldSize);
  PYCCL_CHECK_ARG(rank >= 0 && rank < worldSize, "rank", "must be in [0, ", worldSize, "), got ",
                  rank);
  PYCCL_CHECK_ARG(options_.timeout.count() > 0, "timeout", "must be positive");
  if (device_ >= 0) gpu::checkDevice(device_, "device");
  if (options_.name.empty()) options_.name = "default";
  (void)asyncErrorHandlingFromEnv();  // a bad value fails here, before anything is allocated
  checkEnvironment();
  setLogRank(rank_);

  bootstrap_ = std::make_unique<Bootstrap>(std::move(store), options_.name, rank_, worldSize_,
                                           options_.timeout);
  fdServer_ = std::make_shared<FdServer>();
  nodeKey_ = localNodeKey();

  if (hostMode()) {
    abortFlagHost_ = new uint32_t(0);
    errorRecordHost_ = new DeviceErrorRecord{};
  } else {
    gpu::DeviceGuard guard(device_);
    abortFlagHost_ = static_cast<uint32_t*>(gpu::allocPinnedMapped(sizeof(uint32_t)));
    errorRecordHost_ =
        static_cast<DeviceErrorRecord*>(gpu::allocPinnedMapped(sizeof(DeviceErrorRecord)));
    abortFlagDevice_ = gpu::devicePointerOf(abortFlagHost_);
    errorRecordDevice_ = gpu::devicePointerOf(errorRecordHost_);
    abortFlagGpu_ = static_cast<uint32_t*>(gpu::deviceMalloc(device_, sizeof(uint32_t)));
  }
  health_ = std::make_unique<CommunicatorHealth>(options_.name, rank_, options_.timeout,
                                                 [this] { raiseAbortFlag(); }, errorRecordHost_,
                                                 /*watch=*/!hostMode());
  callChecks_ = callChecksFromEnv();
  history_ = std::make_unique<CallHistory>(historySizeFromEnv());
  health_->setOnBroken([this](ErrorCode code) {
    const std::string dump = strCat("communicator '", options_.name, "' (rank ", rank_, "): ",
                                    describeHistory(history_->snapshot(), failedCallTag(), history_->total()));
    if (code == ErrorCode::kAborted) {
      PYCCL_LOG(Warn, dump);
    } else {
      PYCCL_LOG(Error, dump);
    }
  });

  try {
    bootstrap_->claimNamespace();
    RankInfo mine;
    mine.rank = rank_;
    mine.worldSize = worldSize_;
    mine.device = device_;
    mine.pid = static_cast<int32_t>(getpid());
    mine.hostname = localHostname();
    mine.nodeKey = nodeKey_;
    mine.fdServer = fdServer_->address();
    if (!hostMode()) {
      mine.deviceUuid = gpu::deviceUuid(device_);
      mine.pciBusId = gpu::pciBusId(device_);
    }
    // Each rank's info is checked as it arrives, rank 0's first: a rank given
    // the wrong world size fails at once instead of waiting for ranks that do
    // not exist.
    bootstrap_->allGather(mine.serialize(), [&](int p, const Bytes& bytes) {
      RankInfo info = RankInfo::deserialize(bytes);
      if (info.worldSize != worldSize_) {
        throw InvalidArgument(strCat("invalid argument 'world_size': this rank (", rank_,
                                     ") was given world_size=", worldSize_, " but rank ", p,
                                     " was given world_size=", info.worldSize));
      }
      if (info.rank != p) {
        throw InvalidArgument(strCat("invalid argument 'rank': two processes claim rank ", p));
      }
      if ((info.device < 0) != hostMode()) {
        throw InvalidArgument(strCat("invalid argument 'device': rank ", p, " uses ",
                                     info.device < 0 ? "host mode (cpu)" : "a CUDA device",
                                     " but this rank uses ",
                                     hostMode() ? "host mode (cpu)" : "a CUDA device",
                                     "; all ranks of a communicator must agree"));
      }
      topology_.ranks.push_back(std::move(info));
    });
    topology_.sameNode.resize(worldSize_);
    for (int p = 0; p < worldSize_; ++p) {
      topology_.sameNode[p] = topology_.ranks[p].nodeKey == nodeKey_;
    }
    checkGpusDistinct();
    probePeers();
    bootstrap_->barrier();
    if (worldSize_ > 1) {
      CommunicatorHealth* health = health_.get();
      verdicts_ = std::make_unique<VerdictBoard>(
          bootstrap_->store(), [b = bootstrap_.get()](const std::string& suffix) { return b->key(suffix); }, rank_,
          worldSize_, [health](int peer, ErrorCode code, const std::string& message) {
            // A peer's timeout is this rank's too (the call did not complete in time); anything else is remote.
            health->fail(code == ErrorCode::kTimeout ? code : ErrorCode::kRemote,
                         strCat("rank ", peer, " gave up: ", message), /*fromPeer=*/true);
          });
      health_->setPublisher(
          [board = verdicts_.get()](ErrorCode code, const std::string& message) { board->publish(code, message); });
    }
  } catch (...) {
    close();
    freeFailureState();
    throw;
  }
  PYCCL_LOG(Info, "communicator '" << options_.name << "' ready: rank " << rank_ << " of "
                                    << worldSize_ << "\n"
                                    << topology_.describe(rank_));
}

Communicator::~Communicator() {
  try {
    close();
  } catch (const std::exception& e) {
    PYCCL_LOG(Error, "closing communicator '" << options_.name << "' failed: " << e.what());
  }
  freeFailureState();
}

void Communicator::freeFailureState() {
  health_.reset();
  verdicts_.reset();  // after the health that publishes through it
  if (hostMode()) {
    delete abortFlagHost_;
    delete errorRecordHost_;
  } else {
    if (abortFlagHost_ != nullptr) gpu::freePinned(abortFlagHost_);
    if (errorRecordHost_ != nullptr) gpu::freePinned(errorRecordHost_);
    gpu::deviceFree(device_, abortFlagGpu_);
  }
  abortFlagGpu_ = nullptr;
  abortFlagHost_ = nullptr;
  errorRecordHost_ = nullptr;
  abortFlagDevice_ = nullptr;
  errorRecordDevice_ = nullptr;
}

void Communicator::checkOpen(const char* op) const {
  if (closed_.load()) {
    throw ClosedError(strCat(op, ": communicator '", options_.name, "' (rank ", rank_,
                             ") was destroyed"));
  }
  if (aborted()) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (proxy_ && !proxy_->error().empty()) why = strCat(" when its proxy stopped: ", proxy_->error());
    }
    throw AbortedError(strCat(op, ": communicator '", options_.name, "' (rank ", rank_, ") was aborted", why));
  }
}

bool Communicator::canAccessPeer(int peer) const {
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_, "peer", "must be in [0, ", worldSize_,
                  "), got ", peer);
  return topology_.p2p[rank_][peer];
}

int Communicator::firstUnreachablePeer() const {
  for (int p = 0; p < worldSize_; ++p) {
    if (p != rank_ && !topology_.p2p[rank_][p]) return p;
  }
  return -1;
}

std::vector<Bytes> Communicator::allGather(const Bytes& mine) {
  checkOpen("allgather");
  return bootstrap_->allGather(mine);
}

void Communicator::barrier() {
  checkOpen("barrier");
  bootstrap_->barrier();
}

void Communicator::send(int peer, int tag, const Bytes& data) {
  checkOpen("send");
  bootstrap_->send(peer, tag, data);
}

Bytes Communicator::recv(int peer, int tag) {
  checkOpen("recv");
  return bootstrap_->recv(peer, tag);
}

SemaphoreSlot* Communicator::allocateSemaphoreSlot(RegisteredMemory* page) {
  constexpr size_t kSlotsPerPage = kSemaphorePageBytes / sizeof(SemaphoreSlot);
  std::unique_lock<std::mutex> lock(mu_);
  if (!semaphorePage_.valid() || semaphoreSlotsUsed_ == kSlotsPerPage) {
    ownedAllocations_.push_back(allocateShareable(kSemaphorePageBytes));
    void* ptr = ownedAllocations_.back().get();
    lock.unlock();  // registerMemory takes mu_ itself
    RegisteredMemory reg = registerMemory(ptr, kSemaphorePageBytes);
    lock.lock();
    semaphorePage_ = reg;
    semaphoreSlotsUsed_ = 0;
  }
  *page = semaphorePage_;
  return static_cast<SemaphoreSlot*>(semaphorePage_.data()) + semaphoreSlotsUsed_++;
}

std::shared_ptr<Semaphore> Communicator::createLocalSemaphore(int peer) {
  checkOpen("create_semaphore");
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_ && peer != rank_, "peer",
                  "must be another rank in [0, ", worldSize_, "), got ", peer);
  RegisteredMemory localPage;
  SemaphoreSlot* slot = allocateSemaphoreSlot(&localPage);
  return std::make_shared<Semaphore>(peer, device_, localPage, slot, RegisteredMemory(), nullptr,
                                     abortState(), options_.name);
}

std::shared_ptr<Semaphore> Communicator::createSemaphore(int peer) {
  checkOpen("create_semaphore");
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_ && peer != rank_, "peer",
                  "must be another rank in [0, ", worldSize_, "), got ", peer);
  PYCCL_CHECK_ARG(topology_.p2p[rank_][peer], "peer",
                  "rank ", peer, " is not reachable by P2P from rank ", rank_,
                  " (other node, or the P2P probe failed)");
  RegisteredMemory localPage;
  SemaphoreSlot* slot = allocateSemaphoreSlot(&localPage);
  const uint64_t slotIndex = slot - static_cast<SemaphoreSlot*>(localPage.data());

  const Bytes localDesc = localPage.serialize();
  ByteWriter w;
  w.putBytes(localDesc.data(), localDesc.size()).put(slotIndex);
  bootstrap_->send(peer, kSemaphoreTag, w.take());
  Bytes reply = bootstrap_->recv(peer, kSemaphoreTag);
  ByteReader r(reply, "semaphore descriptor");
  Bytes pageDesc = r.getBytes();
  const auto peerSlot = r.get<uint64_t>();
  PYCCL_CHECK_ARG(peerSlot < kSemaphorePageBytes / sizeof(SemaphoreSlot), "semaphore descriptor",
                  "slot ", peerSlot, " out of range");

  // A peer's page holds many slots: map it once (the descriptor names owner and export).
  RegisteredMemory remotePage;
  const std::string pageKey(pageDesc.begin(), pageDesc.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = importedPages_.find(pageKey);
    if (it != importedPages_.end() && it->second.valid()) remotePage = it->second;
  }
  if (!remotePage.valid()) {
    remotePage = importMemory(pageDesc);
    std::lock_guard<std::mutex> lock(mu_);
    importedPages_[pageKey] = remotePage;
  }
  // Both sides have mapped each other's slot before either returns.
  bootstrap_->send(peer, kSemaphoreTag, Bytes{1});
  bootstrap_->recv(peer, kSemaphoreTag);
  auto* remoteInbound = &(static_cast<SemaphoreSlot*>(remotePage.data()) + peerSlot)->inbound;
  return std::make_shared<Semaphore>(peer, device_, localPage, slot, remotePage, remoteInbound,
                                     abortState(), options_.name, topology_.remoteAtomics[peer]);
}

std::shared_ptr<ProxyService> Communicator::proxyService() {
  checkOpen("proxy");
  std::lock_guard<std::mutex> lock(mu_);
  if (!proxy_) {
    CommunicatorHealth* health = health_.get();
    const std::string proxyName = strCat(options_.name, "/rank", rank_);
    proxy_ = std::make_shared<ProxyService>(device_, kProxyFifoSize, abortState(), proxyName,
                                            [health, proxyName](const std::string& why) {
                                              health->fail(ErrorCode::kInternal,
                                                           strCat("its proxy thread '", proxyName, "' died: ", why));
                                            });
  }
  return proxy_;
}

AbortState Communicator::abortState() const {
  AbortState s{};
  if (hostMode()) {
    s.abortFlag = abortFlagHost_;
    s.errorRecord = errorRecordHost_;
  } else {
    s.abortFlag = static_cast<const volatile uint32_t*>(abortFlagDevice_);
    s.deviceAbortFlag = abortFlagGpu_;
    s.errorRecord = static_cast<DeviceErrorRecord*>(errorRecordDevice_);
  }
  s.timeoutNs = static_cast<uint64_t>(options_.timeout.count()) * 1000000ull;
  return s;
}

void Communicator::raiseAbortFlag() noexcept {
  if (abortFlagHost_ != nullptr) std::atomic_ref<uint32_t>(*abortFlagHost_).store(1, std::memory_order_release);
  if (abortFlagGpu_ == nullptr) return;
  try {
    // The host flag is raised already: its pinned word is the DMA's source.
    gpu::raiseDeviceFlag(device_, abortFlagGpu_, abortFlagHost_);
  } catch (const std::exception& e) {
    // The GPU is gone (a sticky error): its kernels are not running either.
    PYCCL_LOG(Error, "communicator '" << options_.name << "': could not raise the abort flag on the GPU: "
                                      << e.what());
  }
}

void Communicator::checkUsable(const char* op) const {
  if (closed_.load()) throw ClosedError(strCat(op, ": communicator '", name(), "' is closed"));
  health_->check(op, /*refusing=*/true);
}

Communicator::CallStart Communicator::beginCall(CallOp op, void* stream, const std::string& signature,
                                               const CallFacts& facts) {
  const uint64_t seq = health_->nextSequence();
  if (callChecks_) checkCallMatches(callOpName(op), seq, signature);
  const bool captured = !hostMode() && gpu::isCapturing(stream);
  return CallStart{makeCallTag(op, seq, captured), noteCall(op, seq, captured, facts)};
}

CallLabel Communicator::noteCall(CallOp op, uint64_t seq, bool captured, const CallFacts& facts) {
  if (history_->capacity() != 0) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    history_->add(CallRecord{seq, op, facts.bytes, facts.dtype, facts.algorithm, captured,
                             static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(now).count())});
  }
  return CallLabel(op, seq, facts);
}

uint64_t Communicator::failedCallTag() const {
  const DeviceErrorRecord rec = deviceError();
  return rec.status != 0 ? rec.call : 0;
}

void Communicator::checkCallMatches(const char* op, uint64_t seq, const std::string& signature) {
  const std::string mine = strCat(signature, " (call ", seq, ")");
  std::vector<Bytes> all;
  try {
    all = allGather(Bytes(mine.begin(), mine.end()));
  } catch (const TimeoutError& e) {
    // A rank that never makes the call: the communicator breaks as a wait that gives up breaks it, so every
    // later call fails at once and the peers learn of it.
    health_->fail(ErrorCode::kTimeout, strCat(op, " call ", seq, " of communicator '", name(), "' (rank ", rank_,
                                              "): the ranks' check of the call (PYCCL_DEBUG) timed out: ", e.what()));
    health_->check(op, /*refusing=*/false);
    throw;
  }
  std::map<std::string, std::vector<int>> ranksBySignature;
  for (int q = 0; q < worldSize_; ++q) {
    ranksBySignature[std::string(all[q].begin(), all[q].end())].push_back(q);
  }
  if (ranksBySignature.size() == 1) return;
  std::string table;
  for (const auto& [sig, ranks] : ranksBySignature) table += strCat("\n  rank(s) ", rankList(ranks), ": ", sig);
  throw RemoteError(strCat(op, " (call ", seq, " of communicator '", name(), "'): the ranks disagree on the call, "
                           "so none of them ran it:", table));
}

DeviceErrorRecord Communicator::deviceError() const {
  DeviceErrorRecord rec{};
  if (errorRecordHost_ != nullptr) {
    rec.status = std::atomic_ref<uint32_t>(errorRecordHost_->status).load(std::memory_order_acquire);
    if (rec.status != 0) {
      rec.peer = errorRecordHost_->peer;
      rec.expected = errorRecordHost_->expected;
      rec.observed = errorRecordHost_->observed;
      rec.call = errorRecordHost_->call;
      rec.peerMask = std::atomic_ref<uint32_t>(errorRecordHost_->peerMask).load(std::memory_order_acquire);
    }
  }
  return rec;
}

void Communicator::abort() {
  if (closed_.load()) return;
  health_->fail(ErrorCode::kAborted, strCat("communicator '", name(), "' (rank ", rank_, ") was aborted"));
}

bool Communicator::aborted() const {
  return abortFlagHost_ != nullptr &&
         std::atomic_ref<uint32_t>(*abortFlagHost_).load(std::memory_order_acquire) != 0;
}

void Communicator::close() {
  if (closed_.exchange(true)) return;
  // A verdict this rank handed over goes out first (bounded); no peer's reaches this rank from here on.
  if (verdicts_) verdicts_->stop();
  // Any wait still running gives up.
  raiseAbortFlag();
  std::shared_ptr<ProxyService> proxy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    proxy = proxy_;
  }
  // Host-mode kernels see the abort flag within a poll interval; wait for them
  // (bounded) before their FIFO and memory go away.
  const uint64_t deadline = nowNs() + 10ull * 1000000000ull;
  while (hostKernels_.load() > 0 && nowNs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (hostKernels_.load() > 0) {
    PYCCL_LOG(Error, "closing communicator '" << options_.name << "' while "
                                              << hostKernels_.load() << " host-mode kernels still run");
  }
  // The proxy stops before the memory it copies from and into is unmapped.
  if (proxy) proxy->stop();
#ifdef PYCCL_WITH_CUDA
  if (!hostMode()) {
    // Kernels may still use the memory about to be unmapped.
    try {
      gpu::DeviceGuard guard(device_);
      if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    } catch (const Error&) {
    }
  }
#endif
  std::vector<std::weak_ptr<RegisteredMemory::Impl>> tracked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tracked.swap(tracked_);
    importedPages_.clear();
    semaphorePage_ = RegisteredMemory();
  }
  for (auto& w : tracked) {
    if (auto impl = w.lock()) impl->release();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ownedAllocations_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    proxy_.reset();
  }
  fdServer_.reset();  // joins the server thread, closes every published fd
  // The watchdog stops; the flag and the record stay until destruction, for
  // what still holds this communicator (a Work asking how its op went).
  if (health_) health_->stop();
}

}  // namespace pyccl
