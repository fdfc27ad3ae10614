// Sends and receives of the pyccl process group that do not run on their own
// call: those made between torch's startCoalescing and endCoalescing
// (`batch_isend_irecv`, `_coalescing_manager`), held until the end and then run
// together, as NCCL runs the ops of a group; and the host-staged transfers of
// CPU tensors through the communicator's bootstrap store.
//
// Holding them is what lets two ranks that each send before they receive meet:
// run one by one, each send of a large message would wait for a receive queued
// behind it on the peer.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"

namespace pyccl {

/// One send (`send`) to or receive from `peer`, held in a batch.
struct HeldTransfer {
  bool send;
  int peer;
  int tag;  ///< matched on the host-staged path only (the GPU kernels match in order per pair)
  at::Tensor tensor;
};

/// How a batch ended, shared by the works of its ops.
struct BatchOutcome {
  bool ended = false;
  c10::intrusive_ptr<c10d::Work> work;  ///< the end's work (null: nothing ran on pyccl)
  std::string failure;                  ///< why running the batch failed, if it did
};

/// The ops held between startCoalescing and endCoalescing. Not thread-safe:
/// torch makes a group's calls from one thread.
class P2PBatch {
 public:
  /// Opens a batch. InvalidArgument (naming process group `group`) if one is open.
  void open(const std::string& group);
  /// Drops an open batch that never ended (torch leaves a block open when an
  /// error is raised inside it): its transfers never run and its ops' works
  /// raise saying so. Returns whether there was one.
  bool abandon();
  bool isOpen() const { return open_; }
  /// Holds `t`. Returns the work that stands for it: its wait() is refused
  /// until the batch ends, then waits on the end's work.
  c10::intrusive_ptr<c10d::Work> hold(HeldTransfer t, int rank);
  /// Closes the batch; returns its transfers in the order they were held.
  /// InvalidArgument (naming `group`) if none is open.
  std::vector<HeldTransfer> close(const std::string& group);
  /// The batch just closed ran: its ops' works forward to `work` (may be null).
  void settle(c10::intrusive_ptr<c10d::Work> work);
  /// The batch just closed failed to run: its ops' works raise `why`.
  void fail(const std::string& why);

 private:
  bool open_ = false;
  std::vector<HeldTransfer> held_;
  std::shared_ptr<BatchOutcome> outcome_;
};

/// Sends a tensor (any device, any layout) through `comm`'s bootstrap, in
/// messages the store takes; matched in order per (peer, tag), as gloo matches them.
void hostSend(Communicator& comm, int peer, int tag, const at::Tensor& t);
/// Receives into `t` (contiguous) what the matching hostSend sent; RemoteError
/// naming peer and tag on a size mismatch.
void hostRecv(Communicator& comm, int peer, int tag, at::Tensor& t);

}  // namespace pyccl
