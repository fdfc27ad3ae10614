#include "core/transport_rdma.hpp"

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>

#include "core/errors.hpp"

namespace pyccl {
namespace {

constexpr uint32_t kEndpointMagic = 0x72646d61;  // "rdma"
constexpr uint64_t kSignalBit = 1ull << 63;      // in a wrId: the request was a signal

class RdmaChannel : public ProxyChannel {
 public:
  RdmaChannel(std::unique_ptr<RdmaQueuePair> qp, RdmaChannelConfig cfg) : qp_(std::move(qp)), cfg_(cfg) {}

  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    checkPutRange(dstOffset, srcOffset, bytes, cfg_.localSize, cfg_.remoteSize, cfg_.peer);
    const uint64_t most = qp_->maxMessageBytes();
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = bytes - done < most ? bytes - done : most;
      reserve("put");
      qp_->postWrite(nextId_++, srcOffset + done, dstOffset + done, n);
      ++outstanding_;
      done += n;
    }
  }

  void signal() override {
    reserve("signal");
    qp_->postSignal(kSignalBit | nextId_++, ++outbound_);
    ++outstanding_;
  }

  void flush() override { drainTo(0, "flush"); }

  // No shutdown(): requests still in flight complete or fail in the NIC, and
  // the queue pair is destroyed with the channel, after the proxy thread stopped.
  const char* transport() const override { return "rdma"; }

 private:
  // Room for one more request in the send queue.
  void reserve(const char* op) {
    if (outstanding_ >= qp_->depth()) drainTo(qp_->depth() - 1, op);
  }

  // Polls until at most `target` requests are outstanding; bounded by the
  // timeout and the abort flag.
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

  std::unique_ptr<RdmaQueuePair> qp_;
  RdmaChannelConfig cfg_;
  uint64_t nextId_ = 0;
  uint64_t outstanding_ = 0;
  uint64_t outbound_ = 0;
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

std::unique_ptr<RdmaQueuePair> makeLoopbackQueuePair(char* localData, char* remoteData, uint64_t* remoteInbound,
                                                     uint32_t depth, uint64_t maxMessageBytes, int64_t failAt) {
  return std::make_unique<LoopbackQueuePair>(localData, remoteData, remoteInbound, depth, maxMessageBytes, failAt);
}

}  // namespace pyccl
