// A communicator's verdicts: no rank reports as done a call that a peer gave
// up on.
//
// A rank gives a call up when a wait times out, a send meets a receive of
// another size, or its proxy thread dies; its communicator breaks. Its peers
// may not notice by themselves: a rank that reaches the call late finds its
// peers' signals and data already there (they posted them before waiting) and
// would complete it, reporting success for a call its peer declared failed,
// and for plans that read a peer's buffers, a wrong result.
//
// So a rank that gives up publishes its verdict (the failure's message, which
// names the op, its sequence number and the peers waited on in vain) through
// the communicator's store, and every rank's board polls for its peers'
// verdicts every kPollPeriod and breaks its own communicator with the first
// one it finds. A broken communicator raises its abort flag, so waits in
// flight give up at once, and refuses every later call with the verdict. A
// rank that enters the call more than one poll period after its peer gave up
// fails it, naming the rank that gave up; the survivors of a dead or stopped
// peer stop within one poll period of the first of them to time out.
//
// The board's thread does every store operation, so a failing rank never
// blocks on a store whose server is gone: publish() only hands the message
// over. stop() waits a bounded time for the thread; a thread held in a store
// call past it finishes on its own, touching nothing of the communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/errors.hpp"
#include "core/store.hpp"

namespace pyccl {

class VerdictBoard {
 public:
  /// Called on the board's thread with the first peer verdict found: the rank
  /// that gave up, its failure's code and message. Never called after stop() returns.
  using OnVerdict = std::function<void(int rank, ErrorCode code, const std::string& message)>;

  /// `keyOf` names the board's keys in the communicator's namespace.
  VerdictBoard(std::shared_ptr<Store> store, std::function<std::string(const std::string&)> keyOf, int rank,
               int worldSize, OnVerdict onVerdict);
  ~VerdictBoard();
  VerdictBoard(const VerdictBoard&) = delete;
  VerdictBoard& operator=(const VerdictBoard&) = delete;

  /// Publishes this rank's verdict (the first one only); returns at once. A
  /// verdict handed over while stop() runs still goes out, within its bound.
  void publish(ErrorCode code, const std::string& message);
  /// Stops polling (idempotent, bounded).
  void stop();

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;  ///< joined by stop(), or left to finish its store call (it holds only the State)
};

}  // namespace pyccl
