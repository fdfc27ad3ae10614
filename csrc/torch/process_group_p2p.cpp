// The pyccl process group's ops made of sends and receives: send/recv,
// torch's coalescing blocks, gather and scatter, and all-to-all of uneven
// splits where there is no NCCL delegate to take it. CPU tensors go through
// the bootstrap store; CUDA tensors run on pyccl's send/recv kernels, all the
// transfers of one op in one launch (CollectiveEngine::sendRecv).
#include <utility>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "torch/backend_calls.hpp"
#include "torch/process_group.hpp"
#include "torch/tensor_collectives.hpp"

namespace pyccl {
namespace {

// Host-staged messages of the group's own ops, clear of the tags users give send/recv (>= 0).
constexpr int kGatherTag = -1;
constexpr int kScatterTag = -2;
constexpr int kAllToAllTag = -3;

/// Row offsets of `splits` (dim-0 sizes per rank) into a tensor of `rows` rows;
/// InvalidArgument naming `arg` unless they are non-negative and cover it exactly.
std::vector<int64_t> splitOffsets(const std::vector<int64_t>& splits, int64_t rows, int world, const char* arg) {
  PYCCL_CHECK_ARG(static_cast<int>(splits.size()) == world, arg, "must give world_size (", world,
                  ") sizes, got ", splits.size());
  std::vector<int64_t> offsets(splits.size());
  int64_t at = 0;
  for (size_t q = 0; q < splits.size(); ++q) {
    PYCCL_CHECK_ARG(splits[q] >= 0, arg, "must not be negative, got ", splits[q], " for rank ", q);
    offsets[q] = at;
    at += splits[q];
  }
  PYCCL_CHECK_ARG(at == rows, arg, "must add up to the tensor's ", rows, " rows (dim 0), got ", at);
  return offsets;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PycclBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return translated("send", [&] {
    checkOne(tensors, "tensor");
    return pointToPoint(true, tensors[0], dstRank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return translated("recv", [&] {
    checkOne(tensors, "tensor");
    return pointToPoint(false, tensors[0], srcRank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::pointToPoint(bool send, at::Tensor& t, int peer, int tag) {
  const char* op = send ? "send" : "recv";
  PYCCL_CHECK_ARG(peer >= 0 && peer < getSize() && peer != getRank(), send ? "dst" : "src",
                  "must be another rank of the group, got ", peer);
  PYCCL_CHECK_ARG(send || t.is_contiguous(), "tensor", "must be contiguous");
  if (delegateTakes(t, op)) {
    // In a coalescing block the transfer is held, as pyccl's own are: the block's end hands it to the
    // delegate's group, so a block dropped on an error runs none of them (an NCCL group cannot be dropped).
    if (batch_.isOpen()) return batch_.hold(HeldTransfer{send, peer, tag, t}, getRank());
    std::vector<at::Tensor> tensors{t};
    return send ? delegate_->send(tensors, peer, tag) : delegate_->recv(tensors, peer, tag);
  }
  Lane& lane = laneFor(t, op);
  HeldTransfer transfer{send, peer, tag, t};
  if (batch_.isOpen()) {
    // Checked at the call, as a transfer run now is (sendRecvTensors): the block runs it later.
    if (t.is_cuda()) checkTensorFor(*lane.comm, t, "tensor");
    return batch_.hold(std::move(transfer), getRank());
  }
  // GPUs without a delegate: pyccl's kernels on the current stream, matched in order per peer (tags
  // ignored), as ProcessGroupNCCL matches them. CPU tensors: through the store, in order per (peer, tag),
  // as gloo matches them.
  runTransfers({transfer}, op);
  return done(send ? c10d::OpType::SEND : c10d::OpType::RECV, {t});
}

bool PycclBackend::delegateTakes(const at::Tensor& t, const char* op) {
  if (!t.is_cuda()) return false;
  checkUsable(op);
  gpuLaneFor(t.device().index(), "tensor");  // and its delegate
  return delegate_ != nullptr;
}

void PycclBackend::startCoalescing() {
  translated("startCoalescing", [&] {
    checkUsable("startCoalescing");
    // torch never nests blocks, but leaves one open when an error is raised inside it (at a call, say).
    if (batch_.abandon()) {
      PYCCL_LOG(Warn, "pyccl process group '" << options_.name << "': a coalescing block never ended; its sends "
                                              << "and receives are dropped" << (delegateCoalescing_ ? ", and the NCCL "
                                              "delegate's group is ended (running what it holds)" : ""));
      if (delegateCoalescing_) {
        delegateCoalescing_ = false;
        delegate_->endCoalescing();
      }
    }
    batch_.open(options_.name);
    std::lock_guard<std::mutex> lock(laneMutex_);
    startDelegateCoalescing();
  });
}

void PycclBackend::startDelegateCoalescing() {
  if (!batch_.isOpen() || !delegate_ || delegateCoalescing_) return;
  delegate_->startCoalescing();
  delegateCoalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> PycclBackend::endCoalescing() {
  return translated("endCoalescing", [&] {
    std::vector<HeldTransfer> held = batch_.close(options_.name);
    try {
      c10::intrusive_ptr<c10d::Work> delegated;
      std::vector<at::Tensor> delegatedTensors;
      if (delegateCoalescing_) {
        // The delegate's group takes the block's CUDA transfers (with its collectives), in the order held.
        std::vector<HeldTransfer> here;
        for (HeldTransfer& h : held) {
          if (!h.tensor.is_cuda()) {
            here.push_back(std::move(h));
            continue;
          }
          std::vector<at::Tensor> tensors{h.tensor};
          if (h.send) {
            delegate_->send(tensors, h.peer, h.tag);
          } else {
            delegate_->recv(tensors, h.peer, h.tag);
          }
          delegatedTensors.push_back(h.tensor);
        }
        held = std::move(here);
        delegateCoalescing_ = false;
        delegated = delegate_->endCoalescing();
      }
      c10::intrusive_ptr<c10d::Work> work;
      if (!delegatedTensors.empty()) {
        // ProcessGroupNCCL may return no work for its group (having made the current stream wait for it):
        // the block's work is then an event on the current stream, after it.
        work = delegated ? delegated : done(c10d::OpType::COALESCED, delegatedTensors);
        if (!held.empty()) runTransfers(held, "endCoalescing");  // CPU ones: done on return
      } else if (!held.empty()) {
        runTransfers(held, "endCoalescing");
        // Held CUDA and CPU transfers together: the work follows the GPU's (the CPU ones are done).
        std::vector<at::Tensor> gpuTensors, cpuTensors;
        for (const HeldTransfer& h : held) (h.tensor.is_cuda() ? gpuTensors : cpuTensors).push_back(h.tensor);
        work = done(c10d::OpType::COALESCED, gpuTensors.empty() ? std::move(cpuTensors) : std::move(gpuTensors));
      } else {
        work = delegated;
      }
      batch_.settle(work);
      return work;
    } catch (const std::exception& e) {
      batch_.fail(e.what());
      throw;
    }
  });
}

void PycclBackend::runTransfers(const std::vector<HeldTransfer>& transfers, const char* op) {
  checkUsable(op);
  Lane* host = nullptr;
  std::vector<TensorTransfer> onGpu;
  for (const HeldTransfer& h : transfers) {
    if (h.tensor.is_cuda()) {
      onGpu.push_back(TensorTransfer{h.send, h.peer, h.tensor});
    } else if (host == nullptr) {
      host = &laneFor(h.tensor, op);
    }
  }
  if (host != nullptr) {
    // Sends through the store do not wait for their receives: every send first, then the receives.
    for (const HeldTransfer& h : transfers) {
      if (!h.tensor.is_cuda() && h.send) hostSend(*host->comm, h.peer, h.tag, h.tensor);
    }
    for (const HeldTransfer& h : transfers) {
      at::Tensor t = h.tensor;
      if (!t.is_cuda() && !h.send) hostRecv(*host->comm, h.peer, h.tag, t);
    }
  }
  if (!onGpu.empty()) {
    // One launch of every transfer (a second one per repeated (peer, direction)).
    Lane& lane = laneFor(onGpu[0].tensor, op);
    sendRecvTensors(*lane.engine, *lane.comm, onGpu);
  }
}

c10::intrusive_ptr<c10d::Work> PycclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return translated("gather", [&] {
    checkOne(inputs, "tensor");
    if (delegateTakes(inputs[0], "gather")) return delegate_->gather(outputs, inputs, opts);
    return rootedByTransfers(true, inputs[0], outputs, static_cast<int>(opts.rootRank));
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  return translated("scatter", [&] {
    checkOne(outputs, "tensor");
    if (delegateTakes(outputs[0], "scatter")) return delegate_->scatter(outputs, inputs, opts);
    return rootedByTransfers(false, outputs[0], inputs, static_cast<int>(opts.rootRank));
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::rootedByTransfers(bool gathering, at::Tensor& own,
                                                               std::vector<std::vector<at::Tensor>>& lists, int root) {
  const char* op = gathering ? "gather" : "scatter";
  const char* listArg = gathering ? "gather_list" : "scatter_list";
  const char* rootArg = gathering ? "dst" : "src";
  const int tag = gathering ? kGatherTag : kScatterTag;
  const c10d::OpType type = gathering ? c10d::OpType::GATHER : c10d::OpType::SCATTER;
  PYCCL_CHECK_ARG(root >= 0 && root < getSize(), rootArg, "must be a rank of the group, got ", root);
  Lane& lane = laneFor(own, op);
  checkTensorFor(*lane.comm, own, "tensor");
  if (getRank() != root) {
    PYCCL_CHECK_ARG(lists.empty() || (lists.size() == 1 && lists[0].empty()), listArg,
                    "must be None on ranks other than ", rootArg, " (", root, ")");
    // A gather sends this rank's tensor to the root; a scatter receives into it.
    runTransfers({HeldTransfer{gathering, root, tag, own}}, op);
    return done(type, {own});
  }
  PYCCL_CHECK_ARG(lists.size() == 1 && static_cast<int>(lists[0].size()) == getSize(), listArg,
                  "must hold world_size (", getSize(), ") tensors on ", rootArg);
  std::vector<HeldTransfer> transfers;
  for (int q = 0; q < getSize(); ++q) {
    const at::Tensor& t = lists[0][q];
    PYCCL_CHECK_ARG(t.numel() == own.numel() && t.scalar_type() == own.scalar_type(), listArg,
                    "tensors must match 'tensor' (", own.numel(), " elements of ", own.scalar_type(), "), tensor ",
                    q, " has ", t.numel(), " of ", t.scalar_type());
    checkTensorFor(*lane.comm, t, listArg);
    if (q != root) transfers.push_back(HeldTransfer{!gathering, q, tag, t});
  }
  runTransfers(transfers, op);
  at::Tensor& mine = lists[0][root];
  if (gathering) {
    mine.copy_(own.view(mine.sizes()));
    return done(type, lists[0]);
  }
  own.copy_(mine.view(own.sizes()));
  return done(type, {own});
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allToAllByTransfers(const std::vector<at::Tensor>& outputs,
                                                                 const std::vector<at::Tensor>& inputs,
                                                                 c10d::OpType type, const char* op) {
  Lane& lane = laneFor(inputs[getRank()], op);
  std::vector<HeldTransfer> transfers;
  for (int q = 0; q < getSize(); ++q) {
    checkTensorFor(*lane.comm, inputs[q], "input");
    checkTensorFor(*lane.comm, outputs[q], "output");
    PYCCL_CHECK_ARG(inputs[q].scalar_type() == inputs[0].scalar_type() &&
                        outputs[q].scalar_type() == inputs[0].scalar_type(),
                    "output", "must have the input's dtype (", inputs[0].scalar_type(), ")");
    if (q == getRank()) continue;
    transfers.push_back(HeldTransfer{true, q, kAllToAllTag, inputs[q]});
    transfers.push_back(HeldTransfer{false, q, kAllToAllTag, outputs[q]});
  }
  const at::Tensor& own = outputs[getRank()];
  PYCCL_CHECK_ARG(own.numel() == inputs[getRank()].numel(), "output", "takes ", own.numel(),
                  " elements from this rank, which sends itself ", inputs[getRank()].numel());
  runTransfers(transfers, op);
  outputs[getRank()].copy_(inputs[getRank()].view(own.sizes()));
  return done(type, outputs);
}

c10::intrusive_ptr<c10d::Work> PycclBackend::unevenAllToAllSingle(at::Tensor& output, const at::Tensor& input,
                                                                  const std::vector<int64_t>& outputSplits,
                                                                  const std::vector<int64_t>& inputSplits) {
  PYCCL_CHECK_ARG(input.dim() > 0 && output.dim() > 0, "input", "must have at least one dimension to split");
  PYCCL_CHECK_ARG(input.is_contiguous() && output.is_contiguous(), "input", "and output must be contiguous");
  auto pieces = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* arg) {
    std::vector<int64_t> sizes = splits;
    if (sizes.empty()) sizes.assign(getSize(), t.size(0) / getSize());
    const std::vector<int64_t> offsets = splitOffsets(sizes, t.size(0), getSize(), arg);
    std::vector<at::Tensor> out;
    for (int q = 0; q < getSize(); ++q) out.push_back(t.narrow(0, offsets[q], sizes[q]));
    return out;
  };
  return allToAllByTransfers(pieces(output, outputSplits, "output_split_sizes"),
                             pieces(input, inputSplits, "input_split_sizes"), c10d::OpType::ALLTOALL_BASE,
                             "all_to_all_single");
}

}  // namespace pyccl
