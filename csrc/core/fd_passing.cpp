#include "core/fd_passing.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace pyccl {
namespace {

constexpr uint32_t kRequestMagic = 0x70636366;  // "pccf"
constexpr uint32_t kStatusOk = 0;
constexpr uint32_t kStatusUnknown = 1;
constexpr uint32_t kStatusBadToken = 2;
constexpr size_t kMaxFdsPerMessage = 250;  // SCM_MAX_FD is 253
constexpr int kServerIoTimeoutMs = 5000;

struct Request {
  uint32_t magic;
  uint32_t reserved;
  uint64_t exportId;
  uint64_t token;
};

struct Reply {
  uint32_t status;
  uint32_t numFds;
};

sockaddr_un abstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  PYCCL_ASSERT(name.size() + 1 < sizeof(addr.sun_path), "socket name too long");
  addr.sun_path[0] = '\0';  // abstract namespace: no file, vanishes with the socket
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

void setIoTimeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Sends `size` bytes plus (optionally) fds in one message.
bool sendWithFds(int sock, const void* data, size_t size, const int* fds, size_t numFds) {
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (numFds > 0) {
    control.resize(CMSG_SPACE(sizeof(int) * numFds));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * numFds);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * numFds);
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(size);
}

// Receives exactly `size` bytes; fds that arrive with them are appended to `fds`.
bool recvWithFds(int sock, void* data, size_t size, std::vector<UniqueFd>* fds) {
  iovec iov{data, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && fds != nullptr) {
      size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* received = reinterpret_cast<const int*>(CMSG_DATA(cm));
      for (size_t i = 0; i < count; ++i) fds->emplace_back(received[i]);
    }
  }
  return n == static_cast<ssize_t>(size);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

uint64_t randomU64() {
  uint64_t value = 0;
  ssize_t n = getrandom(&value, sizeof(value), 0);
  PYCCL_ASSERT(n == static_cast<ssize_t>(sizeof(value)), "getrandom failed");
  return value;
}

FdServer::FdServer() {
  listenFd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listenFd_) throwSystemError("socket(AF_UNIX)", errno);
  for (int attempt = 0;; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof(name), "pyccl-fd-%d-%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(randomU64()));
    socklen_t len;
    sockaddr_un addr = abstractAddress(name, &len);
    if (::bind(listenFd_.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      address_ = name;
      break;
    }
    if (errno != EADDRINUSE || attempt > 8) throwSystemError("bind(fd server socket)", errno);
  }
  PYCCL_CHECK_SYS(::listen(listenFd_.get(), 64));
  wakeFd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wakeFd_) throwSystemError("eventfd", errno);
  thread_ = std::thread([this] { serve(); });
}

FdServer::~FdServer() {
  uint64_t one = 1;
  if (::write(wakeFd_.get(), &one, sizeof(one)) != sizeof(one)) {
    PYCCL_LOG(Error, "could not wake the fd server thread: " << std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t FdServer::publish(const std::vector<int>& fds, uint64_t token) {
  Export ex;
  ex.token = token;
  for (int fd : fds) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) throwSystemError("fcntl(F_DUPFD_CLOEXEC)", errno);
    ex.fds.emplace_back(dup);
  }
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = nextId_++;
  exports_.emplace(id, std::move(ex));
  return id;
}

void FdServer::withdraw(uint64_t exportId) {
  std::lock_guard<std::mutex> lock(mu_);
  exports_.erase(exportId);
}

size_t FdServer::numPublished() {
  std::lock_guard<std::mutex> lock(mu_);
  return exports_.size();
}

void FdServer::serve() {
  pollfd fds[2] = {{listenFd_.get(), POLLIN, 0}, {wakeFd_.get(), POLLIN, 0}};
  while (true) {
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      PYCCL_LOG(Error, "fd server poll failed: " << std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      UniqueFd conn(::accept4(listenFd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn) continue;
      setIoTimeout(conn.get(), std::chrono::milliseconds(kServerIoTimeoutMs));
      handle(conn.get());
    }
  }
}

void FdServer::handle(int conn) {
  Request req{};
  if (!recvWithFds(conn, &req, sizeof(req), nullptr) || req.magic != kRequestMagic) {
    PYCCL_LOG(Warn, "fd server: malformed request ignored");
    return;
  }
  std::vector<int> toSend;
  Reply reply{kStatusOk, 0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exports_.find(req.exportId);
    if (it == exports_.end()) {
      reply.status = kStatusUnknown;
    } else if (it->second.token != req.token) {
      reply.status = kStatusBadToken;
    } else {
      // Duplicate under the lock so a concurrent withdraw cannot close them mid-send.
      for (const auto& fd : it->second.fds) {
        int dup = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
        if (dup < 0) {
          for (int d : toSend) ::close(d);
          toSend.clear();
          reply.status = kStatusUnknown;
          break;
        }
        toSend.push_back(dup);
      }
    }
  }
  reply.numFds = static_cast<uint32_t>(toSend.size());
  bool ok = sendWithFds(conn, &reply, sizeof(reply), nullptr, 0);
  for (size_t i = 0; ok && i < toSend.size(); i += kMaxFdsPerMessage) {
    size_t count = std::min(kMaxFdsPerMessage, toSend.size() - i);
    uint32_t header = static_cast<uint32_t>(count);
    ok = sendWithFds(conn, &header, sizeof(header), toSend.data() + i, count);
  }
  for (int d : toSend) ::close(d);  // the kernel holds its own references in flight
  if (!ok) PYCCL_LOG(Warn, "fd server: could not send export " << req.exportId);
}

std::vector<UniqueFd> fetchFds(const std::string& address, uint64_t exportId, uint64_t token,
                               std::chrono::milliseconds timeout) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock) throwSystemError("socket(AF_UNIX)", errno);
  setIoTimeout(sock.get(), timeout);
  socklen_t len;
  sockaddr_un addr = abstractAddress(address, &len);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int err = errno;
    throw RemoteError(strCat("cannot reach the memory owner's fd server '", address,
                             "': ", std::strerror(err),
                             " (is the owner still alive and on this node?)"));
  }
  Request req{kRequestMagic, 0, exportId, token};
  Reply reply{};
  if (!sendWithFds(sock.get(), &req, sizeof(req), nullptr, 0) ||
      !recvWithFds(sock.get(), &reply, sizeof(reply), nullptr)) {
    throw TimeoutError(strCat("fetching export ", exportId, " from fd server '", address,
                              "' failed or timed out after ", timeout.count(), " ms"));
  }
  if (reply.status == kStatusUnknown) {
    throw RemoteError(strCat("the memory owner no longer exports id ", exportId,
                             " (was it deregistered or its communicator destroyed?)"));
  }
  if (reply.status == kStatusBadToken) {
    throw RemoteError(strCat("fd server '", address, "' refused export ", exportId,
                             ": wrong token"));
  }
  std::vector<UniqueFd> fds;
  while (fds.size() < reply.numFds) {
    uint32_t count = 0;
    size_t before = fds.size();
    if (!recvWithFds(sock.get(), &count, sizeof(count), &fds) || fds.size() - before != count) {
      throw TimeoutError(strCat("receiving fds of export ", exportId, " from '", address,
                                "' failed after ", fds.size(), " of ", reply.numFds));
    }
  }
  return fds;
}

}  // namespace pyccl
