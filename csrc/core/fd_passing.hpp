// Passing file descriptors between processes of one node over a Unix socket
// (SCM_RIGHTS). Each communicator runs one FdServer: it publishes the fds of
// the memory it exports (memfd for host memory, POSIX-fd handles of cuMem
// allocations), and peers fetch them by export id and token when they import.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pyccl {

/// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class FdServer {
 public:
  /// Opens a listening socket in the abstract namespace and starts the serving thread.
  FdServer();
  /// Stops the thread and closes the socket and every published fd.
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  /// The socket's address, to be shared with peers.
  const std::string& address() const { return address_; }
  /// Publishes duplicates of `fds` under a new export id, readable with `token`.
  uint64_t publish(const std::vector<int>& fds, uint64_t token);
  /// Withdraws an export and closes its fds. Unknown ids are ignored.
  void withdraw(uint64_t exportId);
  /// Number of exports currently published.
  size_t numPublished();

 private:
  void serve();
  void handle(int conn);

  std::string address_;
  UniqueFd listenFd_;
  UniqueFd wakeFd_;  // eventfd that stops the thread
  std::thread thread_;
  std::mutex mu_;
  struct Export {
    uint64_t token;
    std::vector<UniqueFd> fds;
  };
  std::map<uint64_t, Export> exports_;
  uint64_t nextId_ = 1;
};

/// Fetches the fds of export `exportId` from the FdServer at `address`.
/// The caller owns the returned fds. Throws TimeoutError or RemoteError.
std::vector<UniqueFd> fetchFds(const std::string& address, uint64_t exportId, uint64_t token,
                               std::chrono::milliseconds timeout);

/// A random 64-bit value from the system's entropy source.
uint64_t randomU64();

}  // namespace pyccl
