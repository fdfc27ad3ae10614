#include "core/transport_socket.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"

namespace pyccl {

bool sendAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool recvAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

namespace {

constexpr uint32_t kMsgPut = 1;
constexpr uint32_t kMsgSignal = 2;
constexpr uint32_t kMsgBye = 3;  // orderly close: the peer stops receiving quietly
constexpr uint32_t kMsgMagic = 0x70636373;  // "pccs"
constexpr size_t kStageBytes = 4 << 20;     // GPU staging chunk

struct MsgHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t offset;
  uint64_t bytes;
};

std::string firstNonLoopbackIPv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  const char* wanted = std::getenv("PYCCL_SOCKET_IFNAME");
  std::string found;
  for (ifaddrs* it = list; it != nullptr && found.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (wanted != nullptr && *wanted != '\0' && std::strcmp(it->ifa_name, wanted) != 0) continue;
    auto* sin = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
    if (wanted == nullptr && ntohl(sin->sin_addr.s_addr) >> 24 == 127) continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)) != nullptr) found = buf;
  }
  freeifaddrs(list);
  return found.empty() ? "127.0.0.1" : found;
}

void tuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

class SocketChannel : public ProxyChannel {
 public:
  SocketChannel(UniqueFd fd, SocketChannelConfig cfg) : fd_(std::move(fd)), cfg_(cfg) {
    tuneSocket(fd_.get());
    if (cfg_.device >= 0 && !hostStaged()) {
      // Page-locked: a copy between device memory and pageable host memory
      // is staged by the driver and waits for work queued on the legacy
      // default stream, where a kernel may be waiting for this very transfer
      // (it deadlocked whenever an op was queued behind the kernel).
      gpu::DeviceGuard guard(cfg_.device);
      sendStage_.reset(static_cast<char*>(gpu::allocPinnedMapped(kStageBytes)));
      recvStage_.reset(static_cast<char*>(gpu::allocPinnedMapped(kStageBytes + sizeof(uint64_t))));
    }
    counterCounts_.assign(cfg_.numCounters, 0);
    receiver_ = std::thread([this] { receive(); });
  }

  ~SocketChannel() override { shutdown(); }

  void shutdown() override {
    if (stopping_.exchange(true)) return;
    MsgHeader bye{kMsgMagic, kMsgBye, 0, 0};
    sendAll(fd_.get(), &bye, sizeof(bye));  // best effort: the peer may be gone
    ::shutdown(fd_.get(), SHUT_RDWR);       // wakes the receiver
    if (receiver_.joinable()) receiver_.join();
    // Closed here, not when the last owner lets go (a Python object may hold
    // this channel until the garbage collector runs): Communicator::close()
    // leaves no socket behind.
    fd_.reset();
  }

  void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) override {
    checkPutRange(dstOffset, srcOffset, bytes, cfg_.localSize, cfg_.remoteSize, cfg_.peer);
    MsgHeader h{kMsgMagic, kMsgPut, dstOffset, bytes};
    if (!sendAll(fd_.get(), &h, sizeof(h))) fail("send");
    if (cfg_.device < 0 || hostStaged()) {
      const char* from = hostStaged() ? cfg_.sendFrom : cfg_.local;
      if (!sendAll(fd_.get(), from + srcOffset, bytes)) fail("send");
      return;
    }
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min<uint64_t>(kStageBytes, bytes - done);
      gpu::copyToHost(cfg_.device, sendStage_.get(), cfg_.local + srcOffset + done, n);
      if (!sendAll(fd_.get(), sendStage_.get(), n)) fail("send");
      done += n;
    }
  }

  void signal() override {
    MsgHeader h{kMsgMagic, kMsgSignal, 0, 0};
    if (!sendAll(fd_.get(), &h, sizeof(h))) fail("send");
  }

  // The counter travels as offset + 1 (0: the semaphore).
  void signalCounter(uint64_t slot) override {
    MsgHeader h{kMsgMagic, kMsgSignal, slot + 1, 0};
    if (!sendAll(fd_.get(), &h, sizeof(h))) fail("send");
  }

  // send() returns once the kernel holds a copy of the data (and GPU data was
  // staged synchronously): the source is reusable after put() already.
  void flush() override {}
  const char* transport() const override { return "socket"; }

 private:
  [[noreturn]] void fail(const char* op) {
    throw RemoteError(strCat("socket transport to rank ", cfg_.peer, ": ", op, " failed: ",
                             std::strerror(errno), " (did the peer exit?)"));
  }

  bool hostStaged() const { return cfg_.receiveInto != nullptr; }

  void receive() {
    MsgHeader h{};
    try {
      if (cfg_.device >= 0 && !hostStaged()) gpu::relaxCaptureModeOfThisThread();
      while (recvAll(fd_.get(), &h, sizeof(h))) {
        if (h.magic == kMsgMagic && h.type == kMsgBye) return;  // the peer closed in order
        const bool badSignal = h.type == kMsgSignal && (h.offset == 0 ? cfg_.localInbound == nullptr
                                                                      : h.offset > cfg_.numCounters);
        if (h.magic != kMsgMagic || (h.type != kMsgPut && h.type != kMsgSignal) || badSignal ||
            (h.type == kMsgPut && h.offset + h.bytes > cfg_.localSize)) {
          throw RemoteError(strCat("socket transport from rank ", cfg_.peer,
                                   ": malformed message (type ", h.type, ", offset ", h.offset,
                                   ", bytes ", h.bytes, ")"));
        }
        if (h.type == kMsgPut) {
          receivePayload(h.offset, h.bytes);
        } else {
          // Data of earlier puts is in place (received in order, copied
          // synchronously). Only this connection adds to the word, so the
          // count it keeps is the word's value.
          uint64_t* word = h.offset == 0 ? cfg_.localInbound : cfg_.counters + (h.offset - 1);
          uint64_t& count = h.offset == 0 ? received_ : counterCounts_[h.offset - 1];
          ++count;
          if (cfg_.device < 0 || hostStaged()) {
            atomicStoreRelease(word, count);  // after the records of earlier puts
          } else {
            // From page-locked memory, as the payloads (the word after the stage).
            auto* pinned = reinterpret_cast<uint64_t*>(recvStage_.get() + kStageBytes);
            *pinned = count;
            gpu::copyToDevice(cfg_.device, word, pinned, sizeof(count));
          }
        }
      }
      if (!stopping_) throw RemoteError(strCat("socket transport: rank ", cfg_.peer, " closed the connection"));
    } catch (const std::exception& e) {
      if (stopping_) return;
      PYCCL_LOG(Error, e.what());
      if (cfg_.abort.abortFlag != nullptr) {
        std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(cfg_.abort.abortFlag)).store(1);
      }
    }
  }

  void receivePayload(uint64_t offset, uint64_t bytes) {
    if (hostStaged()) {
      if (!recvAll(fd_.get(), cfg_.receiveInto + offset, bytes)) throw RemoteError("socket transport: truncated put");
      record(offset, bytes);
      return;
    }
    if (cfg_.device < 0) {
      if (!recvAll(fd_.get(), cfg_.local + offset, bytes)) throw RemoteError("socket transport: truncated put");
      return;
    }
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min<uint64_t>(kStageBytes, bytes - done);
      if (!recvAll(fd_.get(), recvStage_.get(), n)) throw RemoteError("socket transport: truncated put");
      gpu::copyToDevice(cfg_.device, cfg_.local + offset + done, recvStage_.get(), n);
      done += n;
    }
  }

  /// Publishes a landed put to the kernel, once the ring has room (the
  /// kernel frees it as it applies records; bounded by the timeout).
  void record(uint64_t offset, uint64_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    const auto limit = std::chrono::nanoseconds(cfg_.abort.timeoutNs);
    while (recorded_ - atomicLoadAcquire(cfg_.consumed) >= kInboxRecords) {
      if (stopping_ || cfg_.abort.aborted()) throw RemoteError("socket transport: stopped while the inbox was full");
      if (cfg_.abort.timeoutNs != 0 && std::chrono::steady_clock::now() - start > limit) {
        throw TimeoutError(strCat("socket transport from rank ", cfg_.peer, ": the inbox of ", kInboxRecords,
                                  " puts stayed full (the plan puts that often between two signals, or the "
                                  "kernel stopped applying them)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    cfg_.records[recorded_ % kInboxRecords] = ReceivedPut{offset, bytes};
    atomicStoreRelease(cfg_.published, ++recorded_);  // the payload and the record before the count
  }

  UniqueFd fd_;
  SocketChannelConfig cfg_;
  uint64_t recorded_ = 0;  ///< puts recorded in the inbox
  struct FreePinned {
    void operator()(char* p) const { gpu::freePinned(p); }
  };
  std::unique_ptr<char, FreePinned> sendStage_, recvStage_;  ///< GPU data staged here (page-locked)
  uint64_t received_ = 0;
  std::vector<uint64_t> counterCounts_;  ///< signals received per counter of the table
  std::atomic<bool> stopping_{false};
  std::thread receiver_;
};

}  // namespace

SocketListener::SocketListener() {
  fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd_) throwSystemError("socket(AF_INET)", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  PYCCL_CHECK_SYS(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  PYCCL_CHECK_SYS(::listen(fd_.get(), 4));
  socklen_t len = sizeof(addr);
  PYCCL_CHECK_SYS(::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len));
  port_ = ntohs(addr.sin_port);
}

std::string SocketListener::address(bool peerOnSameNode) const {
  const char* forced = std::getenv("PYCCL_SOCKET_ADDR");
  std::string ip = (forced != nullptr && *forced != '\0') ? forced
                   : peerOnSameNode                      ? "127.0.0.1"
                                                         : firstNonLoopbackIPv4();
  return strCat(ip, ":", port_);
}

UniqueFd SocketListener::accept(std::chrono::milliseconds timeout) {
  pollfd p{fd_.get(), POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) throw TimeoutError(strCat("socket transport: the peer did not connect within ", timeout.count(), " ms"));
  if (n < 0) throwSystemError("poll(listen)", errno);
  UniqueFd conn(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn) throwSystemError("accept", errno);
  return conn;
}

UniqueFd connectTo(const std::string& address, std::chrono::milliseconds timeout) {
  const auto colon = address.rfind(':');
  PYCCL_CHECK_ARG(colon != std::string::npos, "address", "'", address, "' is not ip:port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  const std::string ip = address.substr(0, colon);
  PYCCL_CHECK_ARG(inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) == 1, "address",
                  "'", ip, "' is not an IPv4 address");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) throwSystemError("socket(AF_INET)", errno);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    const int err = errno;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(strCat("socket transport: cannot connect to ", address, " within ",
                                timeout.count(), " ms: ", std::strerror(err)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::unique_ptr<ProxyChannel> makeSocketChannel(UniqueFd connection, SocketChannelConfig config) {
  return std::make_unique<SocketChannel>(std::move(connection), config);
}

}  // namespace pyccl
