#include "core/bootstrap.hpp"

#include <algorithm>

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

void Bootstrap::claimNamespace() {
  // Never deleted: the count is what tells a later communicator of the name
  // that its keys may be stale (a barrier's leftover "done" would let it pass
  // without waiting; an all-gather's leftover value would be read as new).
  const int64_t joined = store_->add(key("ranks_joined"), 1);
  PYCCL_CHECK_ARG(joined <= worldSize_, "name", "'", nameSpace_, "' is taken on this store: ", joined - 1,
                  " ranks of communicators so named joined it before this one, for a world of ", worldSize_,
                  ". A name serves one communicator per store (its keys' namespace); give this one another "
                  "name, or none for a fresh one");
}

Bytes Bootstrap::getOrThrow(const std::string& k, const char* op, int peer) {
  try {
    return store_->get(k, timeout_);
  } catch (const TimeoutError&) {
    throw TimeoutError(strCat("bootstrap ", op, " in communicator '", nameSpace_, "' (rank ",
                              rank_, " of ", worldSize_, "): peer rank ", peer,
                              " did not arrive within the ", timeout_.count(), " ms timeout (store key '", k,
                              "')"));
  }
}

namespace {

// A value is one header byte and the data, or, above kStorePart, a header
// naming its parts, which are stored first under "<key>/part/<i>".
constexpr size_t kStorePart = 4u << 20;
constexpr uint8_t kWhole = 0;
constexpr uint8_t kInParts = 1;

}  // namespace

std::vector<std::string> Bootstrap::putValue(const std::string& k, const Bytes& data) {
  if (data.size() <= kStorePart) {
    Bytes value;
    value.reserve(data.size() + 1);
    value.push_back(kWhole);
    value.insert(value.end(), data.begin(), data.end());
    store_->set(k, value);
    return {k};
  }
  std::vector<std::string> keys;
  const uint64_t parts = (data.size() + kStorePart - 1) / kStorePart;
  for (uint64_t i = 0; i < parts; ++i) {
    const size_t begin = i * kStorePart;
    const size_t end = std::min(data.size(), begin + kStorePart);
    keys.push_back(strCat(k, "/part/", i));
    store_->set(keys.back(), Bytes(data.begin() + begin, data.begin() + end));
  }
  ByteWriter header;
  header.put<uint8_t>(kInParts).put<uint64_t>(parts).put<uint64_t>(data.size());
  store_->set(k, header.take());  // last: a reader that sees it finds every part
  keys.push_back(k);
  return keys;
}

Bytes Bootstrap::getValue(const std::string& k, const char* op, int peer, std::vector<std::string>* keys) {
  Bytes value = getOrThrow(k, op, peer);
  if (keys != nullptr) keys->push_back(k);
  PYCCL_CHECK_ARG(!value.empty() && (value[0] == kWhole || value[0] == kInParts), "store",
                  "key '", k, "' holds no pyccl bootstrap value (another program's key, or a different "
                  "pyccl version on rank ", peer, ")");
  if (value[0] == kWhole) return Bytes(value.begin() + 1, value.end());
  ByteReader header(value, "bootstrap value header");
  header.get<uint8_t>();
  const auto parts = header.get<uint64_t>();
  const auto size = header.get<uint64_t>();
  Bytes data;
  data.reserve(size);
  for (uint64_t i = 0; i < parts; ++i) {
    const std::string part = strCat(k, "/part/", i);
    const Bytes bytes = getOrThrow(part, op, peer);
    data.insert(data.end(), bytes.begin(), bytes.end());
    if (keys != nullptr) keys->push_back(part);
  }
  PYCCL_CHECK_ARG(data.size() == size, "store", "key '", k, "': ", data.size(), " bytes in its parts, ", size,
                  " announced");
  return data;
}

std::vector<Bytes> Bootstrap::allGather(const Bytes& mine,
                                        const std::function<void(int, const Bytes&)>& onArrival) {
  const uint64_t round = gatherRound_++;
  const std::string myKey = key(strCat("ag/", round, "/", rank_));
  for (auto& k : putValue(myKey, mine)) pendingDelete_.push_back(std::move(k));
  std::vector<Bytes> all(worldSize_);
  for (int peer = 0; peer < worldSize_; ++peer) {
    all[peer] = (peer == rank_) ? mine : getValue(key(strCat("ag/", round, "/", peer)), "allgather", peer);
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
                              rank_, " of ", worldSize_, "): timeout after ", timeout_.count(), " ms, only ",
                              seen, " of ", worldSize_, " ranks arrived"));
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
  putValue(key(strCat("p2p/", rank_, "-", peer, "/", tag, "/", n)), data);
}

Bytes Bootstrap::recv(int peer, int tag) {
  PYCCL_CHECK_ARG(peer >= 0 && peer < worldSize_, "peer", "must be in [0, ", worldSize_, "), got ",
                  peer);
  const uint64_t n = recvCount_[{peer, tag}]++;
  const std::string k = key(strCat("p2p/", peer, "-", rank_, "/", tag, "/", n));
  std::vector<std::string> keys;
  Bytes data = getValue(k, "recv", peer, &keys);
  for (const auto& read : keys) store_->deleteKey(read);  // the receiver is the keys' only reader
  return data;
}

}  // namespace pyccl
