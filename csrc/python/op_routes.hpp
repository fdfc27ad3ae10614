// The routes that let the C++ kernels of pyccl's torch custom ops
// (torch.ops.pyccl.all_reduce, all_gather, reduce_scatter and
// fused_all_reduce_rmsnorm; collective_ops.cpp) skip Python.
//
// An op's Python kernel (pyccl/ops.py) costs an eager call about twice what
// the engine's own call costs: torch's dispatcher hands the call to Python,
// which looks the group up, makes the call's choice, allocates the output and
// calls the engine back in C++. So the C++ kernel runs a call straight into
// the engine where the Python path has already run the same call (op, group,
// device, dtype, size) on the engine and taught it the choice, while nothing
// that choice was made from has changed:
//   - the process group: the name must still resolve to the same group object
//     (a destroyed group's name is reused by the next one);
//   - the communicator and engine the Python path used: still alive, not closed;
//   - the sources the selector's choice was made from (pyccl.selection,
//     pyccl.fused's size limit): environment variables and module-level
//     values, watched as (dict, key[, item]) lookups whose values must be the
//     very objects seen when the choice was learned.
// Every other call, and every first call, goes to the Python path. The tables
// are read and written with the GIL held; the engine runs without it.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>

#include "collectives/collective_engine.hpp"
#include "core/errors.hpp"

namespace pyccl {

/// The ops whose C++ kernels learn routes.
enum class RoutedOp : int { kAllReduce = 0, kAllGather, kReduceScatter, kFusedNorm, kCount };

/// What the Python path gave the engine, beyond the tensors.
struct RouteChoice {
  std::optional<AllReduceAlgorithm> algorithm;           ///< all_reduce
  std::optional<AllReduceAlgorithm> symmetricAlgorithm;  ///< all_reduce
  std::optional<Protocol> protocol;                      ///< all_gather, reduce_scatter
};

/// A call the engine may run without Python: its communicator, engine and choice.
struct RoutedCall {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CollectiveEngine> engine;
  RouteChoice choice;
};

/// The learned call of `op` on the group named `group` for `key` (its device,
/// dtype and size), if everything it was made from still holds. Takes the GIL.
std::optional<RoutedCall> learnedRoute(RoutedOp op, c10::string_view group, const at::Tensor& key);

/// With the GIL held: `op`'s Python path on `args`; its error is raised as
/// torch's own Python kernels raise theirs (python_error).
pybind11::object callPythonPath(RoutedOp op, const pybind11::tuple& args);

/// `op`'s Python path on `args` (taking the GIL), its result cast to `Result`.
template <typename Result, typename... Args>
Result pythonPath(RoutedOp op, const Args&... args) {
  pybind11::gil_scoped_acquire gil;
  return callPythonPath(op, pybind11::make_tuple(args...)).template cast<Result>();
}

/// Counts a call run straight into the engine.
void countEngineCall(RoutedOp op);

/// Raises `e` (from an engine call made without the GIL) as its Python error.
[[noreturn]] void raiseAsPython(const Error& e);

/// Runs `engineCall` (without the GIL) as a call of `op` straight into the
/// engine: counted, and pyccl's errors raised as their Python errors.
template <typename EngineCall>
void runOnEngine(RoutedOp op, EngineCall&& engineCall) {
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

/// set_op_python, learn_op_route, forget_op_routes and op_calls.
void bindOpRoutes(pybind11::module_& m);

}  // namespace pyccl
