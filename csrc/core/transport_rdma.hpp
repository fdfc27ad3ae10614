// The RDMA transport of PortChannels (rdma-core's libibverbs, loaded at run
// time). One reliable-connected queue pair per channel pair:
//   - put: RDMA WRITE from this rank's registered memory into the peer's;
//   - signal: an 8-byte inline RDMA WRITE of the outbound count into the
//     peer's semaphore inbound word. A reliable connection executes a QP's
//     writes in order at the responder, so the count lands after the data of
//     every earlier put. (Where the inbound word is GPU memory, the data and
//     the count reach it through the NIC's PCIe writes, which PCIe keeps in order.)
//   - flush: polls the completion queue until every posted write has completed.
// The channel logic works on the RdmaQueuePair interface; VerbsQueuePair is
// the libibverbs implementation, LoopbackQueuePair a memcpy stand-in that runs
// the same logic where no RDMA device exists (the CPU tests).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "channels/device_common.hpp"
#include "channels/inbox_device.hpp"
#include "core/proxy.hpp"
#include "core/serialize.hpp"

namespace pyccl {

/// What a peer needs to reach this endpoint: its queue pair's address, and the
/// memory its writes may target (data buffer and semaphore inbound word).
struct RdmaEndpointInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  uint8_t port = 0;
  uint8_t ethernet = 0;  ///< RoCE: addressed by GID only
  uint32_t mtu = 0;      ///< enum ibv_mtu
  uint8_t gid[16] = {};
  uint64_t dataAddr = 0;
  uint64_t dataSize = 0;
  uint32_t dataRkey = 0;
  uint64_t inboundAddr = 0;
  uint32_t inboundRkey = 0;

  Bytes serialize() const;
  /// Throws RemoteError naming `peer` if `bytes` is not an endpoint descriptor.
  static RdmaEndpointInfo parse(const Bytes& bytes, int peer);
};

/// A completed work request.
struct RdmaCompletion {
  uint64_t wrId;
  bool ok;
  std::string status;  ///< the verbs status text when !ok
};

/// The send side of one connected queue pair, as the RDMA channel drives it.
class RdmaQueuePair {
 public:
  virtual ~RdmaQueuePair() = default;
  /// Posts an RDMA WRITE of `bytes` (<= maxMessageBytes()) from local data +
  /// srcOffset to the peer's data + dstOffset; completes as `wrId`.
  virtual void postWrite(uint64_t wrId, uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes) = 0;
  /// Posts an inline 8-byte RDMA WRITE of `value` to the peer's inbound word;
  /// it takes effect after every write posted before it.
  virtual void postSignal(uint64_t wrId, uint64_t value) = 0;
  /// Appends the completions available now (at most `max`) to `out`; returns how many.
  virtual int poll(RdmaCompletion* out, int max) = 0;
  /// Work requests that may be outstanding at once.
  virtual uint32_t depth() const = 0;
  virtual uint64_t maxMessageBytes() const = 0;
};

struct RdmaChannelConfig {
  uint64_t localSize;   ///< this rank's registered bytes (source of puts)
  uint64_t remoteSize;  ///< the peer's registered bytes (target of puts)
  AbortState abort;     ///< waits give up when it is raised
  std::chrono::milliseconds timeout;  ///< bound on waiting for completions
  int peer;
};

/// The PortChannel transport over `qp` (put/signal/flush on the proxy thread).
std::unique_ptr<ProxyChannel> makeRdmaChannel(std::unique_ptr<RdmaQueuePair> qp, RdmaChannelConfig config);

/// Offsets in a plan executor's host staging block, laid out alike on every
/// rank and registered as the queue pair's memory (channels/inbox_device.hpp).
struct RdmaInboxLayout {
  uint64_t mirrorBytes;    ///< bytes of each mirror (the region's size)
  uint64_t sendMirror;     ///< what this rank's puts send
  uint64_t receiveMirror;  ///< where peers' puts land
  uint64_t farCounters;    ///< counters peers on other nodes signal (8 bytes each)
  uint64_t numCounters;
  uint64_t published;      ///< [rank] records each peer wrote into this rank's ring
  uint64_t records;        ///< [rank][kInboxRecords] each peer's ring
  uint64_t outboxRecords;  ///< [peer][kInboxRecords] the records this rank wrote to each peer
  uint64_t outboxValues;   ///< [peer][kRdmaInboxValueSlots] the counts and counters this rank wrote
  int self;                ///< this rank
};

/// Outbox slots per peer for written values; must exceed a send queue's depth.
constexpr uint64_t kRdmaInboxValueSlots = 1024;

/// The plan interpreter's transport to a rank on another node over `qp`
/// (put/signalCounter/flush on the proxy thread): no thread on the receiving
/// side; the data, its record and the counts land by RDMA WRITE in order.
std::unique_ptr<ProxyChannel> makeRdmaInboxChannel(std::unique_ptr<RdmaQueuePair> qp, char* staging,
                                                   RdmaInboxLayout layout, RdmaChannelConfig config);

/// A queue pair that "writes" with memcpy into `remoteData` / `remoteInbound`
/// and completes every request at once, or fails the request numbered
/// `failAt` (0-based; -1: never) with a status as a NIC would report it. For
/// tests of the channel logic where no RDMA device exists.
std::unique_ptr<RdmaQueuePair> makeLoopbackQueuePair(char* localData, char* remoteData, uint64_t* remoteInbound,
                                                     uint32_t depth, uint64_t maxMessageBytes, int64_t failAt);

#ifdef PYCCL_WITH_IBVERBS
/// An RC queue pair on this machine's RDMA device, with `data` (`bytes`, GPU
/// memory of `device` or host memory if device < 0) and the 8-byte `inbound`
/// word registered for the peer's writes. The device is PYCCL_IB_HCA
/// ("name" or "name:port"), else the first with an active port; the GID index
/// (RoCE) PYCCL_IB_GID_INDEX, else the last IPv4-mapped GID of the port.
class VerbsEndpoint;
std::shared_ptr<VerbsEndpoint> openVerbsEndpoint(int device, char* data, uint64_t bytes, uint64_t* inbound);
RdmaEndpointInfo verbsEndpointInfo(const VerbsEndpoint& endpoint);
/// Connects to the peer (INIT -> RTR -> RTS) and returns the queue pair to drive.
std::unique_ptr<RdmaQueuePair> connectVerbsEndpoint(std::shared_ptr<VerbsEndpoint> endpoint,
                                                    const RdmaEndpointInfo& remote, int peer);
#endif

}  // namespace pyccl
