#include "core/tcp_store.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/serialize.hpp"
#include "core/transport_socket.hpp"

namespace pyccl {
namespace {

// A request: op, key length (8 bytes), key, value length, value, argument (get: the wait in ms; add: the delta).
// A reply: status, number (add: the new value; delete, check: 0 or 1), length, bytes (get: the value).
constexpr uint8_t kOpSet = 1, kOpGet = 2, kOpAdd = 3, kOpDelete = 4, kOpCheck = 5;
constexpr uint8_t kReplyOk = 0, kReplyTimeout = 1, kReplyClosed = 2;
constexpr uint64_t kMaxValueBytes = 64ull << 20;
constexpr uint32_t kMaxKeyBytes = 4096;

/// Requests and replies are small and answered one at a time: each goes out in one send, with Nagle's
/// algorithm off, so that none waits for the peer's delayed ACK (about 40 ms a message otherwise).
void noDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct Request {
  uint8_t op = 0;
  std::string key;
  std::vector<uint8_t> value;
  int64_t arg = 0;
};

bool readRequest(int fd, Request& r) {
  uint64_t keyBytes = 0;
  uint64_t valueBytes = 0;
  if (!recvAll(fd, &r.op, 1) || !recvAll(fd, &keyBytes, sizeof(keyBytes)) || keyBytes > kMaxKeyBytes) return false;
  r.key.resize(keyBytes);
  if (!recvAll(fd, r.key.data(), keyBytes) || !recvAll(fd, &valueBytes, sizeof(valueBytes))) return false;
  if (valueBytes > kMaxValueBytes) return false;
  r.value.resize(valueBytes);
  return recvAll(fd, r.value.data(), valueBytes) && recvAll(fd, &r.arg, sizeof(r.arg));
}

bool writeReply(int fd, uint8_t status, int64_t number, const std::vector<uint8_t>& bytes) {
  const Bytes out = ByteWriter().put(status).put(number).putBytes(bytes.data(), bytes.size()).take();
  return sendAll(fd, out.data(), out.size());
}

}  // namespace

void MemoryStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::vector<uint8_t> MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = changed_.wait_for(lock, timeout, [&] { return closed_ || values_.count(key) != 0; });
  if (closed_) throw ClosedError(strCat("store: closed while waiting for key '", key, "'"));
  if (!ready) throw TimeoutError(strCat("store: key '", key, "' was not set within ", timeout.count(), " ms"));
  return values_[key];
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t now = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint8_t>& v = values_[key];
    if (v.size() == sizeof(int64_t)) std::memcpy(&now, v.data(), sizeof(now));
    now += delta;
    v.resize(sizeof(now));
    std::memcpy(v.data(), &now, sizeof(now));
  }
  changed_.notify_all();
  return now;
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.erase(key) != 0;
}

bool MemoryStore::check(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.count(key) != 0;
}

void MemoryStore::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  changed_.notify_all();
}

StoreServer::StoreServer()
    : listener_(std::make_unique<SocketListener>()), store_(std::make_shared<MemoryStore>()) {
  acceptor_ = std::thread([this] { acceptLoop(); });
}

StoreServer::~StoreServer() {
  stopping_ = true;
  store_->close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (UniqueFd& c : connections_) ::shutdown(c.get(), SHUT_RDWR);
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : servers_) {
    if (t.joinable()) t.join();
  }
}

std::string StoreServer::address() const { return listener_->address(false); }

void StoreServer::acceptLoop() {
  while (!stopping_) {
    UniqueFd conn;
    try {
      conn = listener_->accept(std::chrono::milliseconds(200));
    } catch (const TimeoutError&) {
      continue;
    } catch (const Error& e) {
      PYCCL_LOG(Warn, "store server: accept failed, serving no more clients: " << e.what());
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    const int fd = conn.get();
    noDelay(fd);
    connections_.push_back(std::move(conn));
    servers_.emplace_back([this, fd] { serve(fd); });
  }
}

void StoreServer::serve(int fd) {
  Request r;
  while (!stopping_ && readRequest(fd, r)) {
    bool ok = true;
    try {
      switch (r.op) {
        case kOpSet: store_->set(r.key, r.value); ok = writeReply(fd, kReplyOk, 0, {}); break;
        case kOpGet: {
          std::vector<uint8_t> v;
          try {
            v = store_->get(r.key, std::chrono::milliseconds(r.arg));
          } catch (const TimeoutError&) {
            ok = writeReply(fd, kReplyTimeout, 0, {});
            break;
          }
          ok = writeReply(fd, kReplyOk, 0, v);
          break;
        }
        case kOpAdd: ok = writeReply(fd, kReplyOk, store_->add(r.key, r.arg), {}); break;
        case kOpDelete: ok = writeReply(fd, kReplyOk, store_->deleteKey(r.key) ? 1 : 0, {}); break;
        case kOpCheck: ok = writeReply(fd, kReplyOk, store_->check(r.key) ? 1 : 0, {}); break;
        default: ok = false;
      }
    } catch (const ClosedError&) {
      writeReply(fd, kReplyClosed, 0, {});
      return;
    }
    if (!ok) return;
  }
}

TcpStore::TcpStore(const std::string& address, std::chrono::milliseconds timeout)
    : address_(address), fd_(connectTo(address, timeout)) {
  noDelay(fd_.get());
}

TcpStore::Reply TcpStore::call(uint8_t op, const std::string& key, const std::vector<uint8_t>& value, int64_t arg,
                               std::chrono::milliseconds wait) {
  PYCCL_CHECK_ARG(key.size() <= kMaxKeyBytes, "key", "is ", key.size(), " bytes (at most ", kMaxKeyBytes, ")");
  PYCCL_CHECK_ARG(value.size() <= kMaxValueBytes, "value", "is ", value.size(), " bytes (at most ",
                  kMaxValueBytes, ")");
  std::lock_guard<std::mutex> lock(mu_);
  const int fd = fd_.get();
  auto lost = [&](const char* what) {
    return RemoteError(strCat("store at ", address_, ": the connection failed while ", what, " key '", key,
                              "' (the process that made the unique id has exited or closed its store?)"));
  };
  const Bytes request = ByteWriter().put(op).putString(key).putBytes(value.data(), value.size()).put(arg).take();
  if (!sendAll(fd, request.data(), request.size())) throw lost("sending");
  // The server answers a get when its wait ends; anything else at once. Allow it time to do so.
  pollfd p{fd, POLLIN, 0};
  const auto limit = wait + std::chrono::seconds(30);
  int n;
  do {
    n = ::poll(&p, 1, static_cast<int>(limit.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) throw TimeoutError(strCat("store at ", address_, ": no reply about key '", key, "' within ",
                                        limit.count(), " ms"));
  Reply reply{};
  uint64_t bytes = 0;
  if (!recvAll(fd, &reply.status, 1) || !recvAll(fd, &reply.number, sizeof(reply.number)) ||
      !recvAll(fd, &bytes, sizeof(bytes)) || bytes > kMaxValueBytes) {
    throw lost("reading");
  }
  reply.bytes.resize(bytes);
  if (!recvAll(fd, reply.bytes.data(), bytes)) throw lost("reading");
  if (reply.status == kReplyClosed) throw ClosedError(strCat("store at ", address_, ": closed by its server"));
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(kOpSet, key, value, 0, std::chrono::milliseconds(0));
}

std::vector<uint8_t> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  // In slices, so other threads' calls on this connection (a communicator's verdict board) wait at most one.
  constexpr std::chrono::milliseconds kSlice(50);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const auto wait = std::max(std::chrono::milliseconds(0), std::min(left, kSlice));
    Reply r = call(kOpGet, key, {}, wait.count(), wait);
    if (r.status == kReplyOk) return std::move(r.bytes);
    if (left <= kSlice) break;
  }
  throw TimeoutError(strCat("store: key '", key, "' was not set within ", timeout.count(), " ms"));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return call(kOpAdd, key, {}, delta, std::chrono::milliseconds(0)).number;
}

bool TcpStore::deleteKey(const std::string& key) {
  return call(kOpDelete, key, {}, 0, std::chrono::milliseconds(0)).number != 0;
}

bool TcpStore::check(const std::string& key) {
  return call(kOpCheck, key, {}, 0, std::chrono::milliseconds(0)).number != 0;
}

}  // namespace pyccl
