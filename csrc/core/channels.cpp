#include "core/channels.hpp"

#include "core/communicator.hpp"
#include "core/debug_options.hpp"
#include "core/env_settings.hpp"
#include "core/errors.hpp"
#include "core/ibverbs.hpp"
#include "core/proxy.hpp"
#include "core/transport_rdma.hpp"
#include "core/transport_socket.hpp"

namespace pyccl {
namespace {
constexpr int kChannelTag = 0x5e0b;
}

MemoryChannel::MemoryChannel(std::shared_ptr<Semaphore> semaphore, RegisteredMemory local,
                             RegisteredMemory remote, RegisteredMemory localPackets,
                             RegisteredMemory remotePackets)
    : semaphore_(std::move(semaphore)),
      local_(std::move(local)),
      remote_(std::move(remote)),
      localPackets_(std::move(localPackets)),
      remotePackets_(std::move(remotePackets)) {}

bool MemoryChannel::valid() const {
  return semaphore_->valid() && local_.valid() && remote_.valid();
}

MemoryChannelDeviceHandle MemoryChannel::deviceHandle() const {
  if (!valid()) throw ClosedError(strCat("memory channel to rank ", peer(), " is closed"));
  MemoryChannelDeviceHandle h{};
  h.semaphore = semaphore_->deviceHandle();
  h.src = static_cast<char*>(local_.data());
  h.dst = static_cast<char*>(remote_.data());
  h.localPackets = localPackets_.valid() ? static_cast<char*>(localPackets_.data()) : nullptr;
  h.remotePackets = remotePackets_.valid() ? static_cast<char*>(remotePackets_.data()) : nullptr;
  return h;
}

PortChannel::PortChannel(std::shared_ptr<ProxyService> proxy, uint32_t channelId,
                         std::shared_ptr<Semaphore> semaphore, RegisteredMemory local,
                         RegisteredMemory remote, std::string transport)
    : proxy_(std::move(proxy)),
      channelId_(channelId),
      semaphore_(std::move(semaphore)),
      local_(std::move(local)),
      remote_(std::move(remote)),
      transport_(std::move(transport)) {}

bool PortChannel::valid() const {
  return semaphore_->valid() && local_.valid() && proxy_->running();
}

PortChannelDeviceHandle PortChannel::deviceHandle() const {
  if (!valid()) {
    const std::string why = proxy_->error();
    throw ClosedError(strCat("port channel to rank ", peer(), " is closed",
                             why.empty() ? std::string() : strCat(": its proxy thread died: ", why)));
  }
  PortChannelDeviceHandle h{};
  h.fifo = proxy_->fifoHandle();
  h.semaphore = semaphore_->deviceHandle();
  h.channelId = channelId_;
  return h;
}

// Pairwise exchange of registrations: sends ours, maps the peer's.
static std::vector<RegisteredMemory> exchangePair(Communicator& comm, int peer,
                                                  const std::vector<RegisteredMemory>& mine) {
  ByteWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(mine.size()));
  for (const auto& m : mine) {
    Bytes d = m.valid() ? m.serialize() : Bytes{};
    w.putBytes(d.data(), d.size());
  }
  comm.send(peer, kChannelTag, w.take());
  Bytes reply = comm.recv(peer, kChannelTag);
  ByteReader r(reply, "channel descriptor");
  const auto n = r.get<uint32_t>();
  PYCCL_CHECK_ARG(n == mine.size(), "channel descriptor",
                  "rank ", peer, " sent ", n, " buffers where this rank sent ", mine.size(),
                  " (both sides must create the same kind of channel)");
  std::vector<RegisteredMemory> theirs;
  for (uint32_t i = 0; i < n; ++i) {
    Bytes d = r.getBytes();
    theirs.push_back(d.empty() ? RegisteredMemory() : comm.importMemory(d));
  }
  return theirs;
}

std::shared_ptr<MemoryChannel> Communicator::createMemoryChannel(int peer, const RegisteredMemory& local,
                                                                 const RegisteredMemory& localPackets) {
  checkOpen("create_memory_channel");
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_ && peer != rank_, "peer",
                  "must be another rank in [0, ", worldSize_, "), got ", peer);
  PYCCL_CHECK_ARG(topology_.p2p[rank_][peer], "peer", "rank ", peer,
                  " is not reachable by P2P; a MemoryChannel needs load/store access (use a PortChannel)");
  PYCCL_CHECK_ARG(local.valid() && local.isLocal(), "memory", "must be memory registered by this rank");
  PYCCL_CHECK_ARG(!localPackets.valid() || localPackets.isLocal(), "packets",
                  "must be memory registered by this rank");
  auto theirs = exchangePair(*this, peer, {local, localPackets});
  PYCCL_CHECK_ARG(localPackets.valid() == theirs[1].valid(), "packets",
                  "this rank ", localPackets.valid() ? "gave" : "gave no", " packet buffer but rank ",
                  peer, theirs[1].valid() ? " gave one" : " gave none");
  auto semaphore = createSemaphore(peer);
  return std::make_shared<MemoryChannel>(semaphore, local, theirs[0], localPackets, theirs[1]);
}

std::shared_ptr<PortChannel> Communicator::createPortChannel(int peer, const RegisteredMemory& local,
                                                             const std::string& transport) {
  checkOpen("create_port_channel");
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_ && peer != rank_, "peer",
                  "must be another rank in [0, ", worldSize_, "), got ", peer);
  PYCCL_CHECK_ARG(local.valid() && local.isLocal(), "memory", "must be memory registered by this rank");
  std::string kind = transport;
  if (kind == "auto") kind = !topology_.p2p[rank_][peer] ? "socket" : hostMode() ? "host" : "cuda_ipc";
  PYCCL_CHECK_ARG(kind == "host" || kind == "cuda_ipc" || kind == "socket" || kind == "rdma",
                  "transport", "'", transport,
                  "' is not a transport (expected auto, host, cuda_ipc, socket or rdma)");
  if (kind == "rdma") return createRdmaPortChannel(peer, local);
  if (kind == "socket") return createSocketPortChannel(peer, local);
  PYCCL_CHECK_ARG((kind == "host") == hostMode(), "transport", "'", kind, "' does not fit a ",
                  hostMode() ? "host-mode" : "GPU", " communicator");
  PYCCL_CHECK_ARG(topology_.p2p[rank_][peer], "peer", "rank ", peer,
                  " is not reachable by P2P, which the ", kind, " transport needs (use 'socket')");
  auto theirs = exchangePair(*this, peer, {local});
  auto semaphore = createSemaphore(peer);
  auto proxy = proxyService();
  uint64_t* remoteInbound = semaphore->remoteInboundPtr();
  std::unique_ptr<ProxyChannel> channel;
  char* src = static_cast<char*>(local.data());
  char* dst = static_cast<char*>(theirs[0].data());
  if (kind == "host") {
    channel = makeHostCopyChannel(src, dst, remoteInbound);
  } else {
#ifdef PYCCL_WITH_CUDA
    channel = makeCudaIpcChannel(device_, src, dst, remoteInbound);
#endif
  }
  const uint32_t id = proxy->addChannel(std::move(channel));
  return std::make_shared<PortChannel>(proxy, id, semaphore, local, theirs[0], kind);
}

}  // namespace pyccl

namespace pyccl {

UniqueFd Communicator::connectSocket(int peer, uint64_t localSize, uint64_t* peerSize) {
  // Both sides listen; the lower rank connects to the higher one's listener.
  SocketListener listener;
  ByteWriter w;
  w.putString(listener.address(topology_.sameNode[peer])).put<uint64_t>(localSize);
  send(peer, kChannelTag, w.take());
  Bytes reply = recv(peer, kChannelTag);
  ByteReader r(reply, "socket channel descriptor");
  const std::string peerAddress = r.getString();
  *peerSize = r.get<uint64_t>();
  return rank_ < peer ? connectTo(peerAddress, options_.timeout) : listener.accept(options_.timeout);
}

std::shared_ptr<PortChannel> Communicator::createSocketPortChannel(int peer, const RegisteredMemory& local) {
  uint64_t peerSize = 0;
  UniqueFd conn = connectSocket(peer, local.size(), &peerSize);
  auto semaphore = createLocalSemaphore(peer);
  SocketChannelConfig cfg{device_, static_cast<char*>(local.data()), local.size(), peerSize,
                          semaphore->localInboundPtr(), abortState(), peer};
  auto proxy = proxyService();
  const uint32_t id = proxy->addChannel(makeSocketChannel(std::move(conn), cfg));
  return std::make_shared<PortChannel>(proxy, id, semaphore, local, RegisteredMemory(), "socket");
}

namespace {

bool rdmaLoopback() { return debugOptions().rdmaLoopback; }

#ifdef PYCCL_WITH_IBVERBS
/// A verbs queue pair to `peer` over `bytes` at `data` (GPU `device`'s
/// memory, or host memory for -1) whose signals land in `inbound`: the
/// endpoints exchanged and connected, and neither side writing before the
/// other's queue pair is ready to receive. `peerBytes`: what the peer registered.
std::unique_ptr<RdmaQueuePair> connectVerbs(Communicator& comm, int peer, int device, char* data, uint64_t bytes,
                                            uint64_t* inbound, uint64_t* peerBytes) {
  auto endpoint = openVerbsEndpoint(device, data, bytes, inbound);
  comm.send(peer, kChannelTag, verbsEndpointInfo(*endpoint).serialize());
  const RdmaEndpointInfo theirs = RdmaEndpointInfo::parse(comm.recv(peer, kChannelTag), peer);
  *peerBytes = theirs.dataSize;
  auto qp = connectVerbsEndpoint(endpoint, theirs, peer);
  comm.send(peer, kChannelTag, Bytes{1});
  comm.recv(peer, kChannelTag);
  return qp;
}
#endif

}  // namespace

std::shared_ptr<PortChannel> Communicator::createRdmaPortChannel(int peer, const RegisteredMemory& local) {
  RdmaChannelConfig cfg{local.size(), 0, abortState(), options_.timeout, peer};
  std::shared_ptr<Semaphore> semaphore;
  std::unique_ptr<RdmaQueuePair> qp;
  RegisteredMemory remote;  // the peer's memory where this rank maps it (loopback)
  if (rdmaLoopback()) {
    PYCCL_CHECK_ARG(hostMode(), "transport", "PYCCL_RDMA_LOOPBACK=1 (the RDMA transport with memcpy in place of "
                    "the NIC, for tests) needs a host-mode communicator");
    remote = exchangePair(*this, peer, {local})[0];
    semaphore = createSemaphore(peer);
    // The descriptor goes through the same serialization as a real endpoint's.
    RdmaEndpointInfo mine;
    mine.dataAddr = reinterpret_cast<uint64_t>(local.data());
    mine.dataSize = local.size();
    send(peer, kChannelTag, mine.serialize());
    cfg.remoteSize = RdmaEndpointInfo::parse(recv(peer, kChannelTag), peer).dataSize;
    qp = makeLoopbackQueuePair(static_cast<char*>(local.data()), static_cast<char*>(remote.data()),
                               semaphore->remoteInboundPtr(), 16, 4096, debugOptions().rdmaLoopbackFailAt);
  } else {
    // Both ranks check before exchanging anything, so a machine without RDMA
    // fails on both sides at once (naming libibverbs where rdma-core is absent).
    if (listRdmaDevices().empty()) throw UnsupportedError(kNoRdmaDeviceMessage);
#ifdef PYCCL_WITH_IBVERBS
    semaphore = createLocalSemaphore(peer);
    qp = connectVerbs(*this, peer, device_, static_cast<char*>(local.data()), local.size(),
                      semaphore->localInboundPtr(), &cfg.remoteSize);
#else
    throw UnsupportedError("transport 'rdma': this build of pyccl has no RDMA data path (rdma-core's headers, "
                           "Debian libibverbs-dev, were missing when it was built); use transport='socket'");
#endif
  }
  auto proxy = proxyService();
  const uint32_t id = proxy->addChannel(makeRdmaChannel(std::move(qp), cfg));
  return std::make_shared<PortChannel>(proxy, id, semaphore, local, remote, "rdma");
}

namespace {

/// A queue pair that keeps what it writes into mapped (the loopback stand-in's peer memory).
class KeepingQueuePair : public RdmaQueuePair {
 public:
  KeepingQueuePair(std::unique_ptr<RdmaQueuePair> inner, RegisteredMemory kept)
      : inner_(std::move(inner)), kept_(std::move(kept)) {}
  void postWrite(uint64_t wrId, uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes) override {
    inner_->postWrite(wrId, srcOffset, dstOffset, bytes);
  }
  void postSignal(uint64_t wrId, uint64_t value) override { inner_->postSignal(wrId, value); }
  int poll(RdmaCompletion* out, int max) override { return inner_->poll(out, max); }
  uint32_t depth() const override { return inner_->depth(); }
  uint64_t maxMessageBytes() const override { return inner_->maxMessageBytes(); }

 private:
  std::unique_ptr<RdmaQueuePair> inner_;
  RegisteredMemory kept_;
};

}  // namespace

bool Communicator::plansUseRdma() const {
  const std::string choice = planTransport();
  if (choice == "rdma") return true;
  // "auto": sockets, but for the stand-in. The plans' verbs path has not run
  // on a NIC yet, so a machine with one still asks for it by name.
  return choice != "socket" && rdmaLoopback();
}

std::unique_ptr<ProxyChannel> Communicator::connectRdmaInbox(int peer, char* staging, uint64_t bytes,
                                                             const RegisteredMemory& shared,
                                                             const RdmaInboxLayout& layout) {
  RdmaChannelConfig cfg{bytes, 0, abortState(), options_.timeout, peer};
  char* base = staging;
  std::unique_ptr<RdmaQueuePair> qp;
  if (rdmaLoopback()) {
    PYCCL_CHECK_ARG(hostMode(), "transport", "PYCCL_RDMA_LOOPBACK=1 (the RDMA transport with memcpy in place of "
                    "the NIC, for tests) needs a host-mode communicator");
    // The stand-in writes into the peer's staging, mapped here: this machine's
    // memory, though the peer counts as another node.
    PYCCL_CHECK_ARG(shared.valid() && shared.data() == staging, "shared", "must register the staging");
    send(peer, kChannelTag, shared.serialize());
    RegisteredMemory theirs = importMemoryFrom(recv(peer, kChannelTag), /*sameNodeOnly=*/false);
    PYCCL_CHECK_ARG(theirs.size() == bytes, "plan", "rank ", peer, " staged ", theirs.size(),
                    " bytes where this rank stages ", bytes);
    cfg.remoteSize = theirs.size();
    auto* remote = static_cast<char*>(theirs.data());
    qp = std::make_unique<KeepingQueuePair>(
        makeLoopbackQueuePair(base, remote, reinterpret_cast<uint64_t*>(remote + layout.farCounters), 16, 4096,
                              debugOptions().rdmaLoopbackFailAt),
        std::move(theirs));
  } else {
    if (listRdmaDevices().empty()) throw UnsupportedError(kNoRdmaDeviceMessage);
#ifdef PYCCL_WITH_IBVERBS
    // Host memory (the staging is page-locked on GPUs), so the endpoint registers it as such.
    qp = connectVerbs(*this, peer, -1, base, bytes, reinterpret_cast<uint64_t*>(base + layout.farCounters),
                      &cfg.remoteSize);
    PYCCL_CHECK_ARG(cfg.remoteSize == bytes, "plan", "rank ", peer, " staged ", cfg.remoteSize,
                    " bytes where this rank stages ", bytes);
#else
    throw UnsupportedError("plans over RDMA: this build of pyccl has no RDMA data path (rdma-core's headers, "
                           "Debian libibverbs-dev, were missing when it was built); set PYCCL_PLAN_TRANSPORT=socket");
#endif
  }
  return makeRdmaInboxChannel(std::move(qp), base, layout, cfg);
}

}  // namespace pyccl
