// Stores for callers that have no torch Store to lend (the NCCL-API library,
// csrc/nccl/): a MemoryStore is the key-value map itself, for ranks that are
// threads of one process; a StoreServer serves one over TCP from the process
// that made it (as NCCL's unique id names its root's bootstrap socket); a
// TcpStore is a rank's connection to a StoreServer. Every wait is bounded by
// its timeout; a server that goes away fails its clients' calls at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/fd_passing.hpp"
#include "core/store.hpp"

namespace pyccl {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::string& key) override;
  /// Wakes every waiting get, which then fails (ClosedError); later gets fail too.
  void close();

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> values_;
  bool closed_ = false;
};

class SocketListener;

class StoreServer {
 public:
  /// Listens on a free TCP port of every interface and serves a new MemoryStore.
  StoreServer();
  /// Stops serving: closes the listener and every connection, fails waiting gets, joins the threads.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// "ip:port" for clients on other nodes too (SocketListener::address).
  std::string address() const;

 private:
  void acceptLoop();
  void serve(int fd);

  std::unique_ptr<SocketListener> listener_;
  std::shared_ptr<MemoryStore> store_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<UniqueFd> connections_;
  std::vector<std::thread> servers_;
  std::thread acceptor_;
};

class TcpStore : public Store {
 public:
  /// Connects to the StoreServer at `address` ("ip:port"), retrying for up to `timeout`.
  TcpStore(const std::string& address, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::string& key) override;

 private:
  struct Reply {
    uint8_t status;
    int64_t number;
    std::vector<uint8_t> bytes;
  };
  /// One request and its reply; the reply is awaited for `wait` plus the time a server takes to answer.
  Reply call(uint8_t op, const std::string& key, const std::vector<uint8_t>& value, int64_t arg,
             std::chrono::milliseconds wait);

  std::string address_;
  std::mutex mu_;
  UniqueFd fd_;
};

}  // namespace pyccl
