#include "torch/coalesced_p2p.hpp"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "core/errors.hpp"

namespace pyccl {
namespace {

// Bootstrap tags of the host-staged send/recv (clear of the core's own tags).
constexpr int kP2PTagBase = 1 << 24;
constexpr size_t kP2PChunk = 4u << 20;  // under the TCP store's message limit

/// Messages a host-staged send of `bytes` takes (one, empty, for an empty tensor).
size_t p2pMessages(size_t bytes) { return bytes == 0 ? 1 : (bytes + kP2PChunk - 1) / kP2PChunk; }

/// The work of one op held in a batch: refuses a wait before the batch ends
/// (nothing has run yet, and a wait there could never be satisfied), then
/// forwards to the work of the batch's end.
class HeldWork : public c10d::Work {
 public:
  HeldWork(int rank, const HeldTransfer& t, std::shared_ptr<BatchOutcome> outcome)
      : c10d::Work(rank, t.send ? c10d::OpType::SEND : c10d::OpType::RECV), tensor_(t.tensor), peer_(t.peer),
        outcome_(std::move(outcome)) {}

  bool isCompleted() override { return outcome_->ended && (!outcome_->work || outcome_->work->isCompleted()); }
  bool isSuccess() const override {
    return outcome_->failure.empty() && (!outcome_->work || outcome_->work->isSuccess());
  }
  std::vector<at::Tensor> result() override { return {tensor_}; }

  /// Once the batch ended: the end's wait (it orders the caller's stream after the batch).
  bool wait(std::chrono::milliseconds timeout) override {
    checkEnded();
    return !outcome_->work || outcome_->work->wait(timeout);
  }
  void synchronize() override {
    checkEnded();
    if (outcome_->work) outcome_->work->synchronize();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    checkEnded();
    TORCH_CHECK(outcome_->work, "pyccl ", what(), ": its batch handed it to the NCCL delegate, whose work the "
                "batch's end returned");
    return outcome_->work->getFuture();
  }

 private:
  std::string what() const {
    return strCat(opType_ == c10d::OpType::SEND ? "send to rank " : "recv from rank ", peer_);
  }

  void checkEnded() const {
    TORCH_CHECK_VALUE(outcome_->ended, "pyccl ", what(), ": waited on inside its coalescing block "
                      "(batch_isend_irecv, _coalescing_manager); the block's sends and receives run together when "
                      "it ends, so wait on the works it returns, after it");
    if (!outcome_->failure.empty()) {
      C10_THROW_ERROR(DistBackendError, strCat("pyccl ", what(), ": its batch failed: ", outcome_->failure));
    }
  }

  at::Tensor tensor_;
  int peer_;
  std::shared_ptr<BatchOutcome> outcome_;
};

}  // namespace

void P2PBatch::open(const std::string& group) {
  if (open_) {
    throw InvalidArgument(strCat("process group '", group, "': startCoalescing while a coalescing block is open "
                                 "(blocks do not nest)"));
  }
  open_ = true;
  held_.clear();
  outcome_ = std::make_shared<BatchOutcome>();
}

c10::intrusive_ptr<c10d::Work> P2PBatch::hold(HeldTransfer t, int rank) {
  auto work = c10::make_intrusive<HeldWork>(rank, t, outcome_);
  held_.push_back(std::move(t));
  return work;
}

bool P2PBatch::abandon() {
  if (!open_) return false;
  fail(strCat("its coalescing block never ended (an error inside it?), so its ", held_.size(),
              " sends and receives never ran"));
  open_ = false;
  held_.clear();
  return true;
}

std::vector<HeldTransfer> P2PBatch::close(const std::string& group) {
  if (!open_) {
    throw InvalidArgument(strCat("process group '", group, "': endCoalescing without startCoalescing"));
  }
  open_ = false;
  return std::exchange(held_, {});
}

void P2PBatch::settle(c10::intrusive_ptr<c10d::Work> work) {
  outcome_->work = std::move(work);
  outcome_->ended = true;
}

void P2PBatch::fail(const std::string& why) {
  outcome_->failure = why.empty() ? "unknown error" : why;
  outcome_->ended = true;
}

void hostSend(Communicator& comm, int peer, int tag, const at::Tensor& t) {
  const at::Tensor host = t.to(at::kCPU).contiguous();
  const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
  const size_t n = host.nbytes();
  for (size_t m = 0; m < p2pMessages(n); ++m) {
    const size_t off = m * kP2PChunk;
    comm.send(peer, kP2PTagBase + tag, Bytes(bytes + off, bytes + off + std::min(kP2PChunk, n - off)));
  }
}

void hostRecv(Communicator& comm, int peer, int tag, at::Tensor& t) {
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
  auto* bytes = static_cast<uint8_t*>(host.data_ptr());
  const size_t n = host.nbytes();
  for (size_t m = 0; m < p2pMessages(n); ++m) {
    const size_t off = m * kP2PChunk;
    const Bytes part = comm.recv(peer, kP2PTagBase + tag);
    const size_t expect = std::min(kP2PChunk, n - off);
    if (part.size() != expect) {
      throw RemoteError(strCat("recv from rank ", peer, " (tag ", tag, "): got ", part.size(),
                               " bytes where the tensor expects ", expect, " (a size mismatch with the send)"));
    }
    std::copy(part.begin(), part.end(), bytes + off);
  }
  t.copy_(host);
}

}  // namespace pyccl
