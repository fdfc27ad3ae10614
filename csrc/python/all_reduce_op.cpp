// The CPU and CUDA kernel of torch.ops.pyccl.all_reduce, in C++.
//
// The op's Python kernel cost an eager call about twice what the engine's own
// call costs: torch's dispatcher hands the call to Python, which looks the
// group up, makes the call's choice, allocates the output and calls the engine
// back in C++. This kernel runs a call straight into the engine where the
// Python path has already run the same call (group, device, dtype, size) and
// chose the engine, and nothing that choice was made from has changed since.
// Every other call, and every first call, goes to the Python path
// (pyccl/ops.py), which then teaches this kernel the choice.
//
// What a learned choice depends on:
//   - the process group: the name must still resolve to the same group object
//     (a destroyed group's name is reused by the next one);
//   - the communicator and engine the Python path used: still alive, not closed;
//   - the sources the Python memo keys on (pyccl.selection._Call): environment
//     variables and module-level values, watched as (dict, key[, item]) lookups
//     whose values must be the very objects seen when the choice was learned.
// The route table and the watched values are read and written with the GIL
// held; the engine runs without it.
#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/library.h>

#include <atomic>
#include <cctype>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/collective_engine.hpp"
#include "core/errors.hpp"
#include "python/bindings.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

constexpr size_t kChoicesKept = 256;  // per route, as the Python memo's bound

/// One watched source: `dict[key]`, then `[item]` of that where `item` is set.
struct Source {
  PyObject* dict;
  PyObject* key;
  PyObject* item;  // may be null
};

/// The choice learned for one (dtype, size): what the engine is given, and the
/// sources' values (new references) it was made from.
struct Learned {
  std::optional<AllReduceAlgorithm> algorithm;
  std::optional<AllReduceAlgorithm> symmetricAlgorithm;
  std::vector<PyObject*> seen;
};

/// One (group name, device): the objects the Python path ran the call on.
struct Route {
  c10::weak_intrusive_ptr<c10d::ProcessGroup> group{c10::intrusive_ptr<c10d::ProcessGroup>()};
  const c10d::ProcessGroup* groupAddress = nullptr;
  std::weak_ptr<Communicator> comm;
  std::weak_ptr<CollectiveEngine> engine;
  std::unordered_map<uint64_t, Learned> choices;  // key: choiceKey()
};

struct RouteKey {
  std::string group;
  c10::Device device;
  bool operator==(const RouteKey& o) const { return device == o.device && group == o.group; }
};

struct RouteKeyHash {
  size_t operator()(const RouteKey& k) const {
    return std::hash<std::string>()(k.group) ^ (std::hash<c10::Device>()(k.device) << 1);
  }
};

/// Never destroyed (they hold Python references, and outlive the interpreter).
struct State {
  PyObject* fallback = nullptr;  // pyccl.ops's Python kernel
  std::vector<Source> sources;
  std::unordered_map<RouteKey, Route, RouteKeyHash> routes;
  std::atomic<uint64_t> engineCalls{0};
  std::atomic<uint64_t> pythonCalls{0};
};

State& state() {
  static State* s = new State();
  return *s;
}

uint64_t choiceKey(const at::Tensor& t) {
  return (static_cast<uint64_t>(t.nbytes()) << 8) | static_cast<uint64_t>(t.scalar_type());
}

/// A source's current value (borrowed), or null where a lookup finds nothing.
PyObject* currentValue(const Source& s) {
  PyObject* v = PyDict_GetItemWithError(s.dict, s.key);
  if (v != nullptr && s.item != nullptr) v = PyDict_Check(v) ? PyDict_GetItemWithError(v, s.item) : nullptr;
  if (v == nullptr) PyErr_Clear();
  return v;
}

void releaseSeen(Learned& l) {
  for (PyObject* o : l.seen) Py_XDECREF(o);
  l.seen.clear();
}

void clearChoices(Route& route) {
  for (auto& [k, learned] : route.choices) releaseSeen(learned);
  route.choices.clear();
}

void forgetRoutes() {
  for (auto& [key, route] : state().routes) clearChoices(route);
  state().routes.clear();
}

/// `op` as pyccl.collectives reads a string (any case); nullopt for the Python path to refuse.
std::optional<ReduceOp> reduceOpNamed(c10::string_view op) {
  char lower[5] = {};
  if (op.size() < 3 || op.size() > 4) return std::nullopt;
  for (size_t i = 0; i < op.size(); ++i) lower[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(op[i])));
  const c10::string_view name(lower, op.size());
  if (name == "sum") return ReduceOp::kSum;
  if (name == "avg") return ReduceOp::kAvg;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  if (name == "prod") return ReduceOp::kProd;
  return std::nullopt;
}

c10::intrusive_ptr<c10d::ProcessGroup> resolvedGroup(const std::string& name) {
  try {
    return c10d::resolve_process_group(name);
  } catch (const c10::Error&) {
    return {};  // the Python path raises, naming the group
  }
}

/// What an engine call needs, found with the GIL held.
struct EngineCall {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CollectiveEngine> engine;
  ReduceOp op;
  std::optional<AllReduceAlgorithm> algorithm;
  std::optional<AllReduceAlgorithm> symmetricAlgorithm;
};

std::optional<EngineCall> learnedCall(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  const auto rop = reduceOpNamed(op);
  if (!rop) return std::nullopt;
  auto& routes = state().routes;
  auto it = routes.find(RouteKey{std::string(groupName), x.device()});
  if (it == routes.end()) return std::nullopt;
  Route& route = it->second;
  auto learned = route.choices.find(choiceKey(x));
  if (learned == route.choices.end()) return std::nullopt;
  const auto& sources = state().sources;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (currentValue(sources[i]) != learned->second.seen[i]) return std::nullopt;
  }
  // The route's weak reference keeps a destroyed group's address from being reused, so the same address is the
  // same group.
  if (resolvedGroup(it->first.group).get() != route.groupAddress) return std::nullopt;
  EngineCall call{route.comm.lock(), route.engine.lock(), *rop, learned->second.algorithm,
                  learned->second.symmetricAlgorithm};
  if (call.comm == nullptr || call.engine == nullptr || call.comm->closed()) return std::nullopt;
  return call;
}

/// Raises what the Python path raised, as torch's own Python kernels do.
[[noreturn]] void rethrowPythonError() {
  ::python_error err;
  err.persist();
  throw err;
}

at::Tensor callPython(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  PyObject* fallback = state().fallback;
  if (fallback == nullptr) {
    throw UnsupportedError("torch.ops.pyccl.all_reduce: import pyccl first (pyccl.ops registers the op)");
  }
  state().pythonCalls.fetch_add(1, std::memory_order_relaxed);
  try {
    py::object result = py::reinterpret_borrow<py::object>(fallback)(x, std::string(op), std::string(groupName));
    return result.cast<at::Tensor>();
  } catch (py::error_already_set& e) {
    e.restore();
    rethrowPythonError();
  }
}

at::Tensor allReduceKernel(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  std::optional<EngineCall> call;
  at::Tensor input;
  {
    py::gil_scoped_acquire gil;
    input = x.contiguous();
    call = learnedCall(input, op, groupName);
    if (!call) return callPython(x, op, groupName);
  }
  state().engineCalls.fetch_add(1, std::memory_order_relaxed);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  try {
    allReduceTensor(*call->engine, *call->comm, input, out, call->op, call->algorithm, call->symmetricAlgorithm);
  } catch (const Error& e) {
    py::gil_scoped_acquire gil;
    setPythonError(e);
    rethrowPythonError();
  }
  return out;
}

}  // namespace

void bindAllReduceOp(py::module_& m) {
  m.def("set_all_reduce_op_python",
        [](py::function fallback, const std::vector<std::tuple<py::dict, py::object, py::object>>& sources) {
          forgetRoutes();
          State& s = state();
          Py_XDECREF(s.fallback);
          s.fallback = fallback.release().ptr();
          for (Source& src : s.sources) {
            Py_XDECREF(src.dict);
            Py_XDECREF(src.key);
            Py_XDECREF(src.item);
          }
          s.sources.clear();
          for (const auto& [dict, key, item] : sources) {
            s.sources.push_back({py::object(dict).release().ptr(), py::object(key).release().ptr(),
                                 item.is_none() ? nullptr : py::object(item).release().ptr()});
          }
        },
        py::arg("fallback"), py::arg("sources"),
        "Sets the Python kernel torch.ops.pyccl.all_reduce falls back to, and the (dict, key, item or None) "
        "lookups whose values a learned choice depends on. Forgets every learned choice.");
  m.def("learn_all_reduce_op_route",
        [](const std::string& groupName, const at::Tensor& x, std::shared_ptr<Communicator> comm,
           std::shared_ptr<CollectiveEngine> engine, const std::optional<std::string>& algorithm,
           const std::optional<std::string>& symmetricAlgorithm) {
          auto group = resolvedGroup(groupName);
          PYCCL_CHECK_ARG(group, "group_name", "'", groupName, "' names no process group");
          Learned learned{allReduceAlgorithmArg(algorithm, "algorithm"),
                          allReduceAlgorithmArg(symmetricAlgorithm, "symmetric_algorithm"), {}};
          for (const Source& src : state().sources) {
            PyObject* v = currentValue(src);
            Py_XINCREF(v);
            learned.seen.push_back(v);
          }
          Route& route = state().routes[RouteKey{groupName, x.device()}];
          if (route.groupAddress != group.get() || route.comm.lock() != comm || route.engine.lock() != engine) {
            clearChoices(route);
            route.group = c10::weak_intrusive_ptr<c10d::ProcessGroup>(group);
            route.groupAddress = group.get();
            route.comm = comm;
            route.engine = engine;
          }
          if (route.choices.size() >= kChoicesKept) clearChoices(route);  // sizes seen in turn: start again
          auto [it, fresh] = route.choices.try_emplace(choiceKey(x));
          if (!fresh) releaseSeen(it->second);
          it->second = std::move(learned);
        },
        py::arg("group_name"), py::arg("tensor"), py::arg("comm"), py::arg("engine"), py::arg("algorithm"),
        py::arg("symmetric_algorithm"),
        "Lets torch.ops.pyccl.all_reduce run calls like this one (group, device, dtype, size) straight into "
        "`engine` with these algorithms, while the watched sources keep their current values.");
  m.def("forget_all_reduce_op_routes", &forgetRoutes, "Forgets every learned choice of torch.ops.pyccl.all_reduce.");
  m.def("all_reduce_op_calls", [] {
    return py::dict(py::arg("engine") = state().engineCalls.load(), py::arg("python") = state().pythonCalls.load());
  }, "Calls of torch.ops.pyccl.all_reduce so far: run straight into the engine, and handed to Python.");
}

}  // namespace pyccl

TORCH_LIBRARY_IMPL(pyccl, CPU, m) { m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel)); }
TORCH_LIBRARY_IMPL(pyccl, CUDA, m) { m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel)); }
