#include "core/bootstrap.hpp"

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace pyccl {

Bootstrap::Bootstrap(std::shared_ptr<Store> store, std::string nameSpace, int rank, int worldSize,
                     std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      nameSpace_(std::move(nameSpace)),
      rank_(rank),
      worldSize_(worldSize),
      timeout_(timeout) {
  PYCCL_CHECK_ARG(store_ != nullptr, "store", "must not be None");
  PYCCL_CHECK_ARG(worldSize_ >= 1, "world_size", "must be >= 1, got ", worldSize_);
  PYCCL_CHECK_ARG(rank_ >= 0 && rank_ < worldSize_, "rank", "must be in [0, ", worldSize_,
                  "), got ", rank_);
  PYCCL_CHECK_ARG(timeout_.count() > 0, "timeout", "must be positive, got ", timeout_.count(),
                  " ms");
}

std::string Bootstrap::key(const std::string& suffix) const {
  return strCat("pyccl/", nameSpace_, "/", suffix);
}

Bytes Bootstrap::getOrThrow(const std::string& k, const char* op, int peer) {
  try {
    return store_->get(k, timeout_);
  } catch (const TimeoutError&) {
    throw TimeoutError(strCat("bootstrap ", op, " in communicator '", nameSpace_, "' (rank ",
                              rank_, " of ", worldSize_, "): peer rank ", peer,
                              " did not arrive within ", timeout_.count(), " ms (store key '", k,
                              "')"));
  }
}

std::vector<Bytes> Bootstrap::allGather(const Bytes& mine,
                                        const std::function<void(int, const Bytes&)>& onArrival) {
  const uint64_t round = gatherRound_++;
  const std::string myKey = key(strCat("ag/", round, "/", rank_));
  store_->set(myKey, mine);
  pendingDelete_.push_back(myKey);
  std::vector<Bytes> all(worldSize_);
  for (int peer = 0; peer < worldSize_; ++peer) {
    all[peer] = (peer == rank_) ? mine
                                : getOrThrow(key(strCat("ag/", round, "/", peer)), "allgather", peer);
    if (onArrival) onArrival(peer, all[peer]);
  }
  return all;
}

void Bootstrap::barrier() {
  const uint64_t round = barrierRound_++;
  const std::string counter = key(strCat("bar/", round));
  const std::string done = key(strCat("bar/", round, "/done"));
  const int64_t arrived = store_->add(counter, 1);
  if (arrived == worldSize_) store_->set(done, Bytes{1});
  try {
    store_->get(done, timeout_);
  } catch (const TimeoutError&) {
    int64_t seen = store_->add(counter, 0);
    bool late = false;
    if (seen >= worldSize_) {
      // The last rank arrived just now: give it a moment to publish "done".
      try {
        store_->get(done, std::chrono::milliseconds(2000));
        late = true;
      } catch (const TimeoutError&) {
      }
    }
    if (!late) throw TimeoutError(strCat("bootstrap barrier in communicator '", nameSpace_, "' (rank ",
                              rank_, " of ", worldSize_, "): only ", seen, " of ", worldSize_,
                              " ranks arrived within ", timeout_.count(), " ms"));
  }
  forgetOldKeys();
  // Everyone has passed barrier `round`, so nobody still waits on the keys of
  // barrier `round - 1`; rank 0 removes them.
  if (rank_ == 0 && round > 0) {
    store_->deleteKey(key(strCat("bar/", round - 1)));
    store_->deleteKey(key(strCat("bar/", round - 1, "/done")));
  }
}

void Bootstrap::forgetOldKeys() {
  // Every allgather issued before this barrier has been read by every rank.
  for (const auto& k : pendingDelete_) store_->deleteKey(k);
  pendingDelete_.clear();
}

void Bootstrap::send(int peer, int tag, const Bytes& data) {
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_, "peer", "must be in [0, ", worldSize_, "), got ",
                  peer);
  const uint64_t n = sendCount_[{peer, tag}]++;
  store_->set(key(strCat("p2p/", rank_, "-", peer, "/", tag, "/", n)), data);
}

Bytes Bootstrap::recv(int peer, int tag) {
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_, "peer", "must be in [0, ", worldSize_, "), got ",
                  peer);
  const uint64_t n = recvCount_[{peer, tag}]++;
  const std::string k = key(strCat("p2p/", peer, "-", rank_, "/", tag, "/", n));
  Bytes data = getOrThrow(k, "recv", peer);
  store_->deleteKey(k);  // the receiver is the key's only reader
  return data;
}

}  // namespace pyccl
