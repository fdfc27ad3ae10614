// Bootstrap: the host-side collectives a communicator needs to set itself up,
// over a Store. Every key lives under "pyccl/<namespace>/", so several
// communicators can share one store. All calls are blocking, bounded by the
// bootstrap timeout, and raise TimeoutError naming the op and the peer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/serialize.hpp"
#include "core/store.hpp"

namespace pyccl {

class Bootstrap {
 public:
  Bootstrap(std::shared_ptr<Store> store, std::string nameSpace, int rank, int worldSize,
            std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }
  const std::string& nameSpace() const { return nameSpace_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// The store, and the key of `suffix` in this namespace, for other users of
  /// the namespace (a communicator's verdicts).
  const std::shared_ptr<Store>& store() const { return store_; }
  std::string key(const std::string& suffix) const;

  /// Counts this rank into the namespace; InvalidArgument naming 'name' where
  /// more ranks than the world have joined it: an earlier communicator of the
  /// name on this store left keys that this one would read as its own. Every
  /// rank of a reused name fails alike. Call once, before any other call.
  void claimNamespace();
  /// Every rank contributes `mine`; returns all contributions, indexed by rank.
  /// Collective: all ranks call it in the same order.
  /// `onArrival(rank, bytes)`, if given, sees each contribution in rank order
  /// as it arrives (so a caller can fail fast on a bad one).
  std::vector<Bytes> allGather(const Bytes& mine,
                               const std::function<void(int, const Bytes&)>& onArrival = {});
  /// Returns once every rank has entered the barrier. Collective.
  void barrier();
  /// Sends `data` to `peer` under `tag`. Does not wait for the receiver;
  /// messages with the same (peer, tag) arrive in order.
  void send(int peer, int tag, const Bytes& data);
  /// Receives the next message from `peer` under `tag`, waiting up to the timeout.
  Bytes recv(int peer, int tag);

 private:
  Bytes getOrThrow(const std::string& key, const char* op, int peer);
  /// Stores `data` under `key`, in parts where it is large (stores cap one
  /// message: torch's TCPStore at 8 MiB); returns every key written.
  std::vector<std::string> putValue(const std::string& key, const Bytes& data);
  /// Waits for and reads what putValue stored; `keys` (if given) gets every key read.
  Bytes getValue(const std::string& key, const char* op, int peer, std::vector<std::string>* keys = nullptr);
  void forgetOldKeys();

  std::shared_ptr<Store> store_;
  std::string nameSpace_;
  int rank_;
  int worldSize_;
  std::chrono::milliseconds timeout_;
  uint64_t gatherRound_ = 0;
  uint64_t barrierRound_ = 0;
  std::map<std::pair<int, int>, uint64_t> sendCount_;
  std::map<std::pair<int, int>, uint64_t> recvCount_;
  // Keys this rank wrote that are safe to delete once everyone passes the next barrier.
  std::vector<std::string> pendingDelete_;
};

}  // namespace pyccl
