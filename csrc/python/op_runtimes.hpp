// The runtimes of torch process groups that the C++ kernels of pyccl's torch
// custom ops (torch.ops.pyccl.*; collective_ops.cpp) run on without Python.
//
// pyccl.communicator_for registers every group communicator it makes or
// adopts (a "pyccl" group's own lane) here: the native communicator, its
// collective engine, its selector (dispatch/selector.hpp), its set-up plans
// (executor/plan_runners.hpp), and whether the group can take a call handed
// to NCCL. An op's C++ kernel finds the runtime of its group by (group name,
// device), asks that selector, and runs a kernel choice straight on the
// engine, and a plan choice on the plan set up for it. Every other choice
// (NCCL, the collectives across nodes, a plan not set up yet), and a group
// with no runtime yet, goes to the op's Python path (pyccl/ops.py), which
// runs pyccl.<op> and so asks the same selector: both paths choose alike,
// and the choice is counted once.
//
// The registry holds weak references and takes no GIL: a closed communicator,
// a destroyed group, or a new group that took a destroyed one's name is never
// run on (the Python path then registers the group's new runtime).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>

#include "engine/collective_engine.hpp"
#include "core/errors.hpp"
#include "dispatch/selector.hpp"
#include "executor/plan_runners.hpp"

namespace pyccl {

/// The ops whose kernels are C++.
enum class CustomOp : int { kAllReduce = 0, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kFusedNorm, kCount };

/// What a group's calls run on.
struct GroupRuntime {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CollectiveEngine> engine;
  std::shared_ptr<Selector> selector;
  std::shared_ptr<PlanRunners> plans;  ///< the communicator's set-up plans
  bool nccl = false;                   ///< the group can take a call of CUDA tensors handed to NCCL
};

/// The runtime registered for the group named `group` on `device`, if its group, communicator, engine and
/// selector are all still alive and the communicator is open.
std::optional<GroupRuntime> groupRuntime(c10::string_view group, const c10::Device& device);

/// With the GIL held: `op`'s Python path on `args`; its error is raised as
/// torch's own Python kernels raise theirs (python_error).
pybind11::object callPythonPath(CustomOp op, const pybind11::tuple& args);

/// `op`'s Python path on `args` (taking the GIL), its result cast to `Result`.
template <typename Result, typename... Args>
Result pythonPath(CustomOp op, const Args&... args) {
  pybind11::gil_scoped_acquire gil;
  return callPythonPath(op, pybind11::make_tuple(args...)).template cast<Result>();
}

/// Counts a call run straight into the engine.
void countEngineCall(CustomOp op);

/// Raises `e` (from an engine call made without the GIL) as its Python error.
[[noreturn]] void raiseAsPython(const Error& e);

/// Runs `engineCall` (without the GIL) as a call of `op` straight into the
/// engine: counted, and pyccl's errors raised as their Python errors.
template <typename EngineCall>
void runOnEngine(CustomOp op, EngineCall&& engineCall) {
  countEngineCall(op);
  try {
    engineCall();
  } catch (const Error& e) {
    raiseAsPython(e);
  }
}

/// pyccl's reduce op of a name as pyccl.collectives reads it (any case);
/// nullopt for the Python path to refuse.
std::optional<ReduceOp> reduceOpNamed(c10::string_view op);

/// set_op_python, register_group_runtime and op_calls.
void bindOpRuntimes(pybind11::module_& m);

/// CallRuntime: the kernel choices of pyccl.all_reduce, all_gather, reduce_scatter, all_to_all, broadcast and
/// fused_all_reduce_rmsnorm run as the ops' C++ kernels run them (collective_ops.cpp).
void bindCallRuntime(pybind11::module_& m);

}  // namespace pyccl
