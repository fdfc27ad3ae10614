// The pyccl process group's collectives: all-reduce, broadcast, reduce,
// all-gather, reduce-scatter and all-to-all (and their coalesced and list
// forms), each on pyccl's engine, across nodes on plans, or handed to the
// NCCL delegate where the lane's selector chooses NCCL (delegated()).
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "torch/backend_calls.hpp"
#include "torch/process_group.hpp"
#include "torch/tensor_collectives.hpp"

namespace pyccl {
namespace {

/// pyccl's op for torch's; TypeError for those pyccl does not reduce with.
ReduceOp reduceOpOfC10d(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    default:
      throw TypeError("invalid argument 'op': pyccl reduces with SUM, AVG, PRODUCT, MIN and MAX, not "
                      "BAND/BOR/BXOR/PREMUL_SUM");
  }
}

/// The kernel choice for one tensor of a coalesced op (the op's total chose the delegate or not).
Choice kernelChoice(const Selector& selector, Collective c, const at::Tensor& t, uint64_t wholeBytes) {
  return selector.select(c, tableDtypeOf(t), wholeBytes, static_cast<uint64_t>(t.numel()), "", false, false);
}

bool pycclReduces(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      return true;
    default:
      return false;
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PycclBackend::runAcrossNodes(
    Lane& lane, const char* op, const char* collective, const at::Tensor& input, const at::Tensor& output,
    const c10d::ReduceOp* reduceOp, c10d::OpType type,
    const std::function<c10::intrusive_ptr<c10d::Work>()>& delegateCall) {
  if (reduceOp == nullptr || (isFloatDtype(input.scalar_type()) && pycclReduces(*reduceOp))) {
    const char* name = "sum";
    if (reduceOp != nullptr) name = reduceOpName(reduceOpOfC10d(*reduceOp));
    options_.acrossNodes(collective, lane.comm, input, output, name);
    return done(type, {output});
  }
  if (delegate_ && input.is_cuda()) return delegateCall();
  throw UnsupportedError(strCat("process group '", options_.name, "' spans nodes, where pyccl runs ", op,
                                " on float32, float16 and bfloat16 with SUM, AVG, PRODUCT, MIN and MAX only, and ",
                                "it has no NCCL delegate for ", input.scalar_type(), " (PYCCL_NCCL_DELEGATE=1 ",
                                "on GPUs)"));
}

bool PycclBackend::delegated(Collective c, const at::Tensor& t, uint64_t wholeBytes, Choice& choice, bool plans) {
  const bool onGpu = t.is_cuda();
  if (onGpu) {
    gpuLaneFor(t.device().index(), "tensor");
    if (delegate_ && gpu_->acrossNodes) return true;  // what reaches here is not among the collectives run across nodes
  }
  Lane& lane = onGpu ? *gpu_ : laneFor(t, collectiveName(c));
  if (lane.selector == nullptr) return false;  // laneFor refused it already
  choice = lane.selector->select(c, tableDtypeOf(t), wholeBytes, static_cast<uint64_t>(t.numel()), "",
                                 onGpu && delegate_ != nullptr, plans && options_.plans != nullptr);
  return choice.route == Route::kNccl;
}

bool PycclBackend::ranPlan(const Choice& choice, const char* collective, const at::Tensor& input,
                           const at::Tensor& output, const c10d::ReduceOp* op) {
  if (choice.route != Route::kPlan) return false;
  Lane& lane = laneFor(input, collective);
  const ReduceOp rop = op == nullptr ? ReduceOp::kSum : reduceOpOfC10d(*op);
  const Collective c = parseCollective(collective, "collective");
  const uint64_t bytes = input.nbytes() * (c == Collective::kAllGather ? static_cast<uint64_t>(getSize()) : 1);
  const PlanSlot slot = planSlotOf(choice, c, bytes, getSize());
  if (const auto plan = lane.plans->find(slot.key)) {
    runPlanTensor(*plan->executor, *lane.comm, c, input, output, rop, plan->reduces);
  } else {
    options_.plans(collective, lane.comm, lane.plans, choice, slot, input, output, reduceOpName(rop));
  }
  return true;
}

bool PycclBackend::reducesHere(const at::Tensor& t, const c10d::ReduceOp& op) const {
  return !(delegate_ && t.is_cuda()) || pycclReduces(op);
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  return translated("allreduce", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    if (Lane* far = acrossNodesLane(t, "allreduce")) {
      return runAcrossNodes(*far, "allreduce", "all_reduce", t, t, &opts.reduceOp, c10d::OpType::ALLREDUCE,
                            [&] { return delegate_->allreduce(tensors, opts); });
    }
    Choice choice;
    if (delegated(Collective::kAllReduce, t, t.nbytes(), choice, true) || !reducesHere(t, opts.reduceOp)) {
      return delegate_->allreduce(tensors, opts);
    }
    if (ranPlan(choice, "all_reduce", t, t, &opts.reduceOp)) return done(c10d::OpType::ALLREDUCE, {t});
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(t, "allreduce");
    allReduceTensor(*lane.engine, *lane.comm, t, t, op, kernelOf(choice), symmetricOf(choice));
    return done(c10d::OpType::ALLREDUCE, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return translated("allreduce_coalesced", [&] {
    PYCCL_CHECK_ARG(!tensors.empty(), "tensors", "must not be empty");
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.nbytes();
    Choice choice;
    if (delegated(Collective::kAllReduce, tensors[0], total, choice) || !reducesHere(tensors[0], opts.reduceOp)) {
      return delegate_->allreduce_coalesced(tensors, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(tensors[0], "allreduce_coalesced");
    for (auto& t : tensors) {
      const Choice each = kernelChoice(*lane.selector, Collective::kAllReduce, t, t.nbytes());
      allReduceTensor(*lane.engine, *lane.comm, t, t, op, kernelOf(each), symmetricOf(each));
    }
    return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return translated("broadcast", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    Choice choice;
    if (delegated(Collective::kBroadcast, t, t.nbytes(), choice)) return delegate_->broadcast(tensors, opts);
    Lane& lane = laneFor(t, "broadcast");
    broadcastTensor(*lane.engine, *lane.comm, t, t, static_cast<int>(opts.rootRank), protocolOf(choice));
    return done(c10d::OpType::BROADCAST, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return translated("reduce", [&] {
    checkOne(tensors, "tensors");
    at::Tensor& t = tensors[0];
    Choice choice;
    if (delegated(Collective::kAllReduce, t, t.nbytes(), choice) || !reducesHere(t, opts.reduceOp)) {
      return delegate_->reduce(tensors, opts);
    }
    PYCCL_CHECK_ARG(opts.rootRank >= 0 && opts.rootRank < getSize(), "dst", "must be a rank of the group, got ",
                    opts.rootRank);
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(t, "reduce");
    // An all-reduce into scratch; only the root's tensor changes (as with NCCL).
    at::Tensor result = at::empty_like(t, at::MemoryFormat::Contiguous);
    allReduceTensor(*lane.engine, *lane.comm, t, result, op, kernelOf(choice), symmetricOf(choice));
    if (getRank() == opts.rootRank) t.copy_(result);
    return done(c10d::OpType::REDUCE, {t});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  return translated("all_gather_into_tensor", [&] {
    if (Lane* far = acrossNodesLane(input, "all_gather_into_tensor")) {
      return runAcrossNodes(*far, "all_gather_into_tensor", "all_gather", input, output, nullptr,
                            c10d::OpType::_ALLGATHER_BASE,
                            [&] { return delegate_->_allgather_base(output, input, opts); });
    }
    Choice choice;
    if (delegated(Collective::kAllGather, input, output.nbytes(), choice, true)) {
      return delegate_->_allgather_base(output, input, opts);
    }
    if (ranPlan(choice, "all_gather", input, output, nullptr)) return done(c10d::OpType::_ALLGATHER_BASE, {output});
    Lane& lane = laneFor(input, "all_gather_into_tensor");
    allGatherTensor(*lane.engine, *lane.comm, input, output, protocolOf(choice));
    return done(c10d::OpType::_ALLGATHER_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  return translated("all_gather", [&] {
    checkOne(inputs, "tensor");
    PYCCL_CHECK_ARG(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "tensor_list",
                    "must hold world_size (", getSize(), ") tensors");
    const at::Tensor& input = inputs[0];
    bool even = true;
    for (const auto& o : outputs[0]) {
      PYCCL_CHECK_ARG(o.scalar_type() == input.scalar_type(), "tensor_list", "every tensor must have the input's "
                      "dtype (", input.scalar_type(), "), got ", o.scalar_type());
      even = even && o.numel() == input.numel();
    }
    if (!even) {
      // Ranks of different sizes (as ProcessGroupNCCL takes them): the delegate, else a send to and a
      // receive from every peer.
      PYCCL_CHECK_ARG(outputs[0][getRank()].numel() == input.numel(), "tensor_list", "tensor ", getRank(),
                      " (this rank's) must have the input's ", input.numel(), " elements, got ",
                      outputs[0][getRank()].numel());
      if (delegateTakes(input, "all_gather")) return delegate_->allgather(outputs, inputs, opts);
      return allToAllByTransfers(outputs[0], std::vector<at::Tensor>(getSize(), input), c10d::OpType::ALLGATHER,
                                 "all_gather");
    }
    Choice choice;
    if (delegated(Collective::kAllGather, input, input.nbytes() * getSize(), choice)) {
      return delegate_->allgather(outputs, inputs, opts);
    }
    Lane& lane = laneFor(input, "all_gather");
    at::Tensor flat = at::empty({input.numel() * getSize()}, input.options());
    allGatherTensor(*lane.engine, *lane.comm, input, flat, protocolOf(choice));
    for (int q = 0; q < getSize(); ++q) {
      outputs[0][q].copy_(flat.narrow(0, q * input.numel(), input.numel()).view(outputs[0][q].sizes()));
    }
    return done(c10d::OpType::ALLGATHER, outputs[0]);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  return translated("all_gather_coalesced", [&] {
    PYCCL_CHECK_ARG(static_cast<int>(outputs.size()) == getSize(), "output_tensor_lists",
                    "must hold one list per rank (", getSize(), "), got ", outputs.size());
    for (const auto& list : outputs) {
      PYCCL_CHECK_ARG(list.size() == inputs.size(), "output_tensor_lists", "each list must hold one tensor per "
                      "input (", inputs.size(), "), got ", list.size());
    }
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> column(1);
      for (int r = 0; r < getSize(); ++r) column[0].push_back(outputs[r][i]);
      std::vector<at::Tensor> input{inputs[i]};
      // The caller's stream waits for each (a delegate's NCCL runs on a stream of its own).
      allgather(column, input, opts)->wait();
      all.insert(all.end(), column[0].begin(), column[0].end());
    }
    return done(c10d::OpType::ALLGATHER_COALESCED, std::move(all));
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  return translated("all_gather_into_tensor_coalesced", [&] {
    PYCCL_CHECK_ARG(!inputs.empty() && outputs.size() == inputs.size(), "output_tensors",
                    "must pair with the inputs, one output per input");
    uint64_t total = 0;
    for (const auto& o : outputs) total += o.nbytes();
    Choice choice;
    if (delegated(Collective::kAllGather, inputs[0], total, choice)) {
      return delegate_->allgather_into_tensor_coalesced(outputs, inputs, opts);
    }
    Lane& lane = laneFor(inputs[0], "all_gather_into_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Choice each = kernelChoice(*lane.selector, Collective::kAllGather, inputs[i], outputs[i].nbytes());
      allGatherTensor(*lane.engine, *lane.comm, inputs[i], outputs[i], protocolOf(each));
    }
    return done(c10d::OpType::COALESCED, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter_tensor", [&] {
    if (Lane* far = acrossNodesLane(input, "reduce_scatter_tensor")) {
      return runAcrossNodes(*far, "reduce_scatter_tensor", "reduce_scatter", input, output, &opts.reduceOp,
                            c10d::OpType::_REDUCE_SCATTER_BASE,
                            [&] { return delegate_->_reduce_scatter_base(output, input, opts); });
    }
    Choice choice;
    if (delegated(Collective::kReduceScatter, input, input.nbytes(), choice, true) ||
        !reducesHere(input, opts.reduceOp)) {
      return delegate_->_reduce_scatter_base(output, input, opts);
    }
    if (ranPlan(choice, "reduce_scatter", input, output, &opts.reduceOp)) {
      return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(input, "reduce_scatter_tensor");
    reduceScatterTensor(*lane.engine, *lane.comm, input, output, op, protocolOf(choice));
    return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter", [&] {
    checkOne(outputs, "output");
    PYCCL_CHECK_ARG(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "input_list",
                    "must hold world_size (", getSize(), ") tensors");
    at::Tensor& output = outputs[0];
    for (const auto& i : inputs[0]) {
      PYCCL_CHECK_ARG(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(), "input_list",
                      "every tensor must match the output's size and dtype");
    }
    Choice choice;
    if (delegated(Collective::kReduceScatter, output, output.nbytes() * getSize(), choice) ||
        !reducesHere(output, opts.reduceOp)) {
      return delegate_->reduce_scatter(outputs, inputs, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(output, "reduce_scatter");
    std::vector<at::Tensor> flats;
    for (const auto& i : inputs[0]) flats.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(flats);
    reduceScatterTensor(*lane.engine, *lane.comm, flat, output, op, protocolOf(choice));
    return done(c10d::OpType::REDUCE_SCATTER, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return translated("reduce_scatter_tensor_coalesced", [&] {
    PYCCL_CHECK_ARG(!inputs.empty() && outputs.size() == inputs.size(), "output_tensors",
                    "must pair with the inputs, one output per input");
    uint64_t total = 0;
    for (const auto& i : inputs) total += i.nbytes();
    Choice choice;
    if (delegated(Collective::kReduceScatter, inputs[0], total, choice) || !reducesHere(inputs[0], opts.reduceOp)) {
      return delegate_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    }
    const ReduceOp op = reduceOpOfC10d(opts.reduceOp);
    Lane& lane = laneFor(inputs[0], "reduce_scatter_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Choice each = kernelChoice(*lane.selector, Collective::kReduceScatter, inputs[i], inputs[i].nbytes());
      reduceScatterTensor(*lane.engine, *lane.comm, inputs[i], outputs[i], op, protocolOf(each));
    }
    return done(c10d::OpType::COALESCED, outputs);
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  return translated("all_to_all_single", [&] {
    auto even = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
      if (splits.empty()) return true;
      for (int64_t s : splits) {
        if (t.dim() == 0 || s * getSize() != t.size(0)) return false;
      }
      return true;
    };
    const bool equal = even(outputSplitSizes, output) && even(inputSplitSizes, input);
    Choice choice;
    if (!equal || delegated(Collective::kAllToAll, input, input.nbytes(), choice)) {
      if (delegate_ && input.is_cuda()) {
        return delegate_->alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
      }
      // No delegate: each piece is a send and a receive, all in one launch.
      return unevenAllToAllSingle(output, input, outputSplitSizes, inputSplitSizes);
    }
    Lane& lane = laneFor(input, "all_to_all_single");
    allToAllTensor(*lane.engine, *lane.comm, input, output, protocolOf(choice));
    return done(c10d::OpType::ALLTOALL_BASE, {output});
  });
}

c10::intrusive_ptr<c10d::Work> PycclBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  return translated("all_to_all", [&] {
    PYCCL_CHECK_ARG(static_cast<int>(inputs.size()) == getSize() && outputs.size() == inputs.size(),
                    "input_tensor_list", "must hold world_size (", getSize(), ") tensors, as must the outputs");
    bool equal = true;
    for (size_t q = 0; q < inputs.size(); ++q) {
      equal = equal && inputs[q].numel() == inputs[0].numel() && outputs[q].numel() == inputs[0].numel() &&
              inputs[q].scalar_type() == inputs[0].scalar_type() &&
              outputs[q].scalar_type() == inputs[0].scalar_type();
    }
    Choice choice;
    if (!equal || delegated(Collective::kAllToAll, inputs[0], inputs[0].nbytes() * getSize(), choice)) {
      if (delegate_ && inputs[0].is_cuda()) return delegate_->alltoall(outputs, inputs, opts);
      return allToAllByTransfers(outputs, inputs, c10d::OpType::ALLTOALL, "all_to_all");
    }
    Lane& lane = laneFor(inputs[0], "all_to_all");
    std::vector<at::Tensor> flats;
    for (const auto& i : inputs) flats.push_back(i.reshape({-1}));
    at::Tensor flatIn = at::cat(flats);
    at::Tensor flatOut = at::empty_like(flatIn);
    allToAllTensor(*lane.engine, *lane.comm, flatIn, flatOut, protocolOf(choice));
    const int64_t n = inputs[0].numel();
    for (size_t q = 0; q < outputs.size(); ++q) {
      outputs[q].copy_(flatOut.narrow(0, static_cast<int64_t>(q) * n, n).view(outputs[q].sizes()));
    }
    return done(c10d::OpType::ALLTOALL, outputs);
  });
}

}  // namespace pyccl
