#include "core/transport_rdma.hpp"

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "core/errors.hpp"

namespace pyccl {
namespace {

constexpr uint32_t kEndpointMagic = 0x72646d61;  // "rdma"
constexpr uint64_t kSignalBit = 1ull << 63;      // in a wrId: the request was a signal

/// A queue pair's send side as the channels drive it: posting with room
/// kept in the send queue, draining completions (bounded by the timeout and
/// the abort flag, naming the peer).
class RdmaSendQueue {
 public:
  RdmaSendQueue(std::unique_ptr<RdmaQueuePair> qp, RdmaChannelConfig cfg) : qp_(std::move(qp)), cfg_(cfg) {}

  RdmaQueuePair& qp() { return *qp_; }
  const RdmaChannelConfig& config() const { return cfg_; }

  /// Posts a write of `bytes` from local srcOffset to the peer's dstOffset, in
  /// messages the queue pair takes.
  void write(uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes, const char* op) {
    const uint64_t most = qp_->maxMessageBytes();
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = bytes - done < most ? bytes - done : most;
      reserve(op);
      qp_->postWrite(nextId_++, srcOffset + done, dstOffset + done, n);
      ++outstanding_;
      done += n;
    }
  }

  void signal(uint64_t value) {
    reserve("signal");
    qp_->postSignal(kSignalBit | nextId_++, value);
    ++outstanding_;
  }

  // Polls until at most `target` requests are outstanding.
  void drainTo(uint64_t target, const char* op) {
    const auto deadline = std::chrono::steady_clock::now() + cfg_.timeout;
    RdmaCompletion done[16];
    uint32_t idle = 0;
    while (outstanding_ > target) {
      const int n = qp_->poll(done, 16);
      for (int i = 0; i < n; ++i) {
        if (!done[i].ok) {
          const bool wasSignal = (done[i].wrId & kSignalBit) != 0;
          throw RemoteError(strCat("RDMA transport to rank ", cfg_.peer, ": ", wasSignal ? "signal" : "put",
                                   " (work request ", done[i].wrId & ~kSignalBit, ") failed: ", done[i].status,
                                   " (is the peer alive and its memory registered?)"));
        }
        --outstanding_;
      }
      if (n > 0) {
        idle = 0;
        continue;
      }
      if (cfg_.abort.aborted()) {
        throw AbortedError(strCat("RDMA transport to rank ", cfg_.peer, ": ", op, " aborted with ", outstanding_,
                                  " request(s) outstanding"));
      }
      if (++idle % 1024 == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw TimeoutError(strCat("RDMA transport to rank ", cfg_.peer, ": ", op, " waited ",
                                    cfg_.timeout.count(), " ms for ", outstanding_ - target,
                                    " completion(s) (is the peer alive?)"));
        }
        std::this_thread::yield();
      }
    }
  }

 private:
  // Room for one more request in the send queue.
  void reserve(const char* op) {
    if (outstanding_ >= qp_->depth()) drainTo(qp_->depth() - 1, op);
  }

  std::unique_ptr<RdmaQueuePair> qp_;
  RdmaChannelConfig cfg_;
  uint64_t nextId_ = 0;
  uint64_t outstanding_ = 0;
};

class RdmaChannel : public ProxyChannel {
 public:
  RdmaChannel(std::unique_ptr<RdmaQueuePair> qp, RdmaChannelConfig cfg) : queue_(std::move(qp), cfg) {}

  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    const RdmaChannelConfig& cfg = queue_.config();
    checkPutRange(dstOffset, srcOffset, bytes, cfg.localSize, cfg.remoteSize, cfg.peer);
    queue_.write(srcOffset, dstOffset, bytes, "put");
  }

  void signal() override { queue_.signal(++outbound_); }

  void flush() override { queue_.drainTo(0, "flush"); }

  // No shutdown(): requests still in flight complete or fail in the NIC, and
  // the queue pair is destroyed with the channel, after the proxy thread stopped.
  const char* transport() const override { return "rdma"; }

 private:
  RdmaSendQueue queue_;
  uint64_t outbound_ = 0;
};

/// The plan interpreter's channel to a rank on another node over RDMA: each
/// put lands in the peer's receive mirror, then its record in the peer's
/// inbox ring and the ring's new count; a signal writes the counter's new
/// value. Every value written comes from its own slot of this rank's outbox
/// (a slot is reused only long after its write completed), so no write can
/// carry a value newer than the data before it.
class RdmaInboxChannel : public ProxyChannel {
 public:
  RdmaInboxChannel(std::unique_ptr<RdmaQueuePair> qp, char* staging, RdmaInboxLayout layout, RdmaChannelConfig cfg)
      : queue_(std::move(qp), cfg), staging_(staging), layout_(layout) {
    PYCCL_CHECK_ARG(queue_.qp().depth() < kRdmaInboxValueSlots, "queue pair", "a send queue of ",
                    queue_.qp().depth(), " requests outruns the outbox's ", kRdmaInboxValueSlots, " value slots");
  }

  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    const RdmaChannelConfig& cfg = queue_.config();
    checkPutRange(dstOffset, srcOffset, bytes, layout_.mirrorBytes, layout_.mirrorBytes, cfg.peer);
    queue_.write(layout_.sendMirror + srcOffset, layout_.receiveMirror + dstOffset, bytes, "put");
    const uint64_t ring = static_cast<uint64_t>(cfg.peer) * kInboxRecords + recorded_ % kInboxRecords;
    const uint64_t mine = layout_.outboxRecords + ring * sizeof(ReceivedPut);
    const ReceivedPut record{dstOffset, bytes};
    std::memcpy(staging_ + mine, &record, sizeof(record));
    const uint64_t theirs = static_cast<uint64_t>(layout_.self) * kInboxRecords + recorded_ % kInboxRecords;
    queue_.write(mine, layout_.records + theirs * sizeof(ReceivedPut), sizeof(ReceivedPut), "put");
    writeValue(++recorded_, layout_.published + static_cast<uint64_t>(layout_.self) * 8, "put");
  }

  void signal() override { throw InternalError("RDMA inbox channel: plans signal counters only"); }

  void signalCounter(uint64_t slot) override {
    PYCCL_CHECK_ARG(slot < layout_.numCounters, "slot", "counter ", slot, " of ", layout_.numCounters);
    if (counts_.size() < layout_.numCounters) counts_.assign(layout_.numCounters, 0);
    writeValue(++counts_[slot], layout_.farCounters + slot * 8, "signal");
  }

  void flush() override { queue_.drainTo(0, "flush"); }
  const char* transport() const override { return "rdma"; }

 private:
  void writeValue(uint64_t value, uint64_t dstOffset, const char* op) {
    const uint64_t slot = static_cast<uint64_t>(queue_.config().peer) * kRdmaInboxValueSlots +
                          values_++ % kRdmaInboxValueSlots;
    const uint64_t mine = layout_.outboxValues + slot * 8;
    std::memcpy(staging_ + mine, &value, 8);
    queue_.write(mine, dstOffset, 8, op);
  }

  RdmaSendQueue queue_;
  char* staging_;
  RdmaInboxLayout layout_;
  uint64_t recorded_ = 0;  ///< puts recorded in the peer's ring
  uint64_t values_ = 0;    ///< outbox value slots used
  std::vector<uint64_t> counts_;  ///< signals sent per counter
};

class LoopbackQueuePair : public RdmaQueuePair {
 public:
  LoopbackQueuePair(char* localData, char* remoteData, uint64_t* remoteInbound, uint32_t depth, uint64_t maxMessage,
                    int64_t failAt)
      : local_(localData), remote_(remoteData), inbound_(remoteInbound), depth_(depth), maxMessage_(maxMessage),
        failAt_(failAt) {}

  void postWrite(uint64_t wrId, uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes) override {
    admit(bytes);
    const bool ok = posted_++ != failAt_;
    if (ok) std::memcpy(remote_ + dstOffset, local_ + srcOffset, bytes);
    pending_.push_back({wrId, ok, ok ? "" : "remote access error"});
  }

  void postSignal(uint64_t wrId, uint64_t value) override {
    admit(8);
    const bool ok = posted_++ != failAt_;
    if (ok) std::atomic_ref<uint64_t>(*inbound_).store(value, std::memory_order_release);
    pending_.push_back({wrId, ok, ok ? "" : "transport retry counter exceeded"});
  }

  int poll(RdmaCompletion* out, int max) override {
    // At most 3 per poll, so that the channel's waiting loops run.
    int n = 0;
    while (n < max && n < 3 && !pending_.empty()) {
      out[n++] = pending_.front();
      pending_.pop_front();
    }
    return n;
  }

  uint32_t depth() const override { return depth_; }
  uint64_t maxMessageBytes() const override { return maxMessage_; }

 private:
  // A real send queue refuses a request beyond its depth (ENOMEM): so does this one.
  void admit(uint64_t bytes) {
    if (pending_.size() >= depth_) {
      throw InternalError(strCat("loopback queue pair: ", pending_.size(), " requests outstanding, depth ", depth_));
    }
    if (bytes > maxMessage_) throw InternalError(strCat("loopback queue pair: message of ", bytes, " bytes"));
  }

  char* local_;
  char* remote_;
  uint64_t* inbound_;
  uint32_t depth_;
  uint64_t maxMessage_;
  int64_t failAt_;
  int64_t posted_ = 0;
  std::deque<RdmaCompletion> pending_;
};

}  // namespace

Bytes RdmaEndpointInfo::serialize() const {
  ByteWriter w;
  w.put<uint32_t>(kEndpointMagic).put(qpn).put(psn).put(lid).put(port).put(ethernet).put(mtu);
  w.putBytes(gid, sizeof(gid));
  w.put(dataAddr).put(dataSize).put(dataRkey).put(inboundAddr).put(inboundRkey);
  return w.take();
}

RdmaEndpointInfo RdmaEndpointInfo::parse(const Bytes& bytes, int peer) {
  try {
    ByteReader r(bytes, "RDMA endpoint descriptor");
    if (r.get<uint32_t>() != kEndpointMagic) throw RemoteError("not an RDMA endpoint descriptor");
    RdmaEndpointInfo info;
    info.qpn = r.get<uint32_t>();
    info.psn = r.get<uint32_t>();
    info.lid = r.get<uint16_t>();
    info.port = r.get<uint8_t>();
    info.ethernet = r.get<uint8_t>();
    info.mtu = r.get<uint32_t>();
    const Bytes gid = r.getBytes();
    if (gid.size() != sizeof(info.gid)) throw RemoteError(strCat("a GID of ", gid.size(), " bytes"));
    std::memcpy(info.gid, gid.data(), sizeof(info.gid));
    info.dataAddr = r.get<uint64_t>();
    info.dataSize = r.get<uint64_t>();
    info.dataRkey = r.get<uint32_t>();
    info.inboundAddr = r.get<uint64_t>();
    info.inboundRkey = r.get<uint32_t>();
    return info;
  } catch (const Error& e) {
    throw RemoteError(strCat("rank ", peer, " sent a malformed RDMA endpoint descriptor (", bytes.size(),
                             " bytes): ", e.what(), " (do both ranks run the same pyccl?)"));
  }
}

std::unique_ptr<ProxyChannel> makeRdmaChannel(std::unique_ptr<RdmaQueuePair> qp, RdmaChannelConfig config) {
  return std::make_unique<RdmaChannel>(std::move(qp), config);
}

std::unique_ptr<ProxyChannel> makeRdmaInboxChannel(std::unique_ptr<RdmaQueuePair> qp, char* staging,
                                                   RdmaInboxLayout layout, RdmaChannelConfig config) {
  return std::make_unique<RdmaInboxChannel>(std::move(qp), staging, layout, config);
}

std::unique_ptr<RdmaQueuePair> makeLoopbackQueuePair(char* localData, char* remoteData, uint64_t* remoteInbound,
                                                     uint32_t depth, uint64_t maxMessageBytes, int64_t failAt) {
  return std::make_unique<LoopbackQueuePair>(localData, remoteData, remoteInbound, depth, maxMessageBytes, failAt);
}

}  // namespace pyccl
