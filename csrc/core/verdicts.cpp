#include "core/verdicts.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/serialize.hpp"

namespace pyccl {
namespace {

/// How often a board looks for its peers' verdicts: the window in which a
/// late rank can still complete a call its peer gave up on.
constexpr auto kPollPeriod = std::chrono::milliseconds(50);
/// After a store operation fails (its server gone), polls slow down to this.
constexpr auto kRetryPeriod = std::chrono::milliseconds(1000);
/// How long stop() waits for the thread to leave a store call.
constexpr auto kStopWait = std::chrono::milliseconds(500);

}  // namespace

/// What the board's thread shares with the board: the thread may outlive the board (held in a store call).
struct VerdictBoard::State {
  std::shared_ptr<Store> store;
  std::string countKey;
  std::vector<std::string> rankKeys;
  int rank;

  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;
  bool exited = false;
  std::optional<Bytes> pending;  ///< this rank's verdict, to publish: its code's byte, then its message
  bool published = false;
  OnVerdict onVerdict;  ///< cleared by stop()

  /// This rank's verdict to the store, or the first peer verdict from it (nullopt: none yet).
  std::optional<std::pair<int, Bytes>> step(const std::optional<Bytes>& mine) {
    if (mine) {
      store->set(rankKeys[rank], *mine);
      store->add(countKey, 1);
      return std::nullopt;
    }
    // One store operation per poll while nobody gave up.
    if (store->add(countKey, 0) <= (published ? 1 : 0)) return std::nullopt;
    for (int q = 0; q < static_cast<int>(rankKeys.size()); ++q) {
      if (q == rank || !store->check(rankKeys[q])) continue;
      Bytes value = store->get(rankKeys[q], std::chrono::milliseconds(1000));
      if (value.empty()) continue;
      return std::make_pair(q, std::move(value));
    }
    return std::nullopt;
  }

  void run() {
    auto period = kPollPeriod;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      wake.wait_for(lock, period, [this] { return stopping || pending.has_value(); });
      // A verdict handed over goes out even when the board is stopping: a rank that gave up and closed at once
      // still tells its peers.
      if (stopping && !pending) break;
      std::optional<Bytes> mine = std::move(pending);
      pending.reset();
      lock.unlock();
      std::optional<std::pair<int, Bytes>> found;
      try {
        found = step(mine);
        period = kPollPeriod;
        if (mine) PYCCL_LOG(Info, "verdict board: this rank's verdict is published");
      } catch (const std::exception& e) {
        // The store's server may be gone with its rank; the waits' own timeouts still bound every call.
        PYCCL_LOG(Debug, "verdict board: the store failed (" << e.what() << "); retrying in "
                                                              << kRetryPeriod.count() << " ms");
        period = kRetryPeriod;
      }
      lock.lock();
      if (mine && period == kRetryPeriod && !stopping) pending = std::move(mine);  // publishing is retried
      if (mine && !pending) published = true;
      if (found && !stopping && onVerdict) {
        PYCCL_LOG(Info, "verdict board: rank " << found->first << "'s verdict found");
        const Bytes& v = found->second;
        onVerdict(found->first, static_cast<ErrorCode>(v[0]), std::string(v.begin() + 1, v.end()));
      }
      // Broken either way now (its own verdict or a peer's): nothing more to find, once this rank's own verdict,
      // if it has one, is out.
      if ((found || published) && !pending) break;
    }
    exited = true;
    wake.notify_all();
  }
};

VerdictBoard::VerdictBoard(std::shared_ptr<Store> store, std::function<std::string(const std::string&)> keyOf,
                           int rank, int worldSize, OnVerdict onVerdict)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->countKey = keyOf("verdicts");
  for (int q = 0; q < worldSize; ++q) state_->rankKeys.push_back(keyOf(strCat("verdict/", q)));
  state_->rank = rank;
  state_->onVerdict = std::move(onVerdict);
  thread_ = std::thread([state = state_] {
    setLogRank(state->rank);
    state->run();
  });
}

VerdictBoard::~VerdictBoard() { stop(); }

void VerdictBoard::publish(ErrorCode code, const std::string& message) {
  std::lock_guard<std::mutex> lock(state_->mu);
  // Taken while the thread runs, stopping or not: stop() lets it publish what it holds before it ends.
  if (state_->published || state_->pending || state_->exited) return;
  Bytes value{static_cast<uint8_t>(code)};
  value.insert(value.end(), message.begin(), message.end());
  state_->pending = std::move(value);
  state_->wake.notify_all();
}

void VerdictBoard::stop() {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->stopping) {
    state_->stopping = true;
    state_->wake.notify_all();
  }
  // A verdict being published goes out first: a rank that gave up and closed at once still tells its peers.
  const bool exited = state_->wake.wait_for(lock, kStopWait, [this] { return state_->exited; });
  state_->onVerdict = nullptr;
  lock.unlock();
  if (!thread_.joinable()) return;
  if (exited) {
    thread_.join();
  } else {
    PYCCL_LOG(Warn, "verdict board: its thread is still in a store call; it ends on its own");
    thread_.detach();
  }
}

}  // namespace pyccl
