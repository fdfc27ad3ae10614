#include "python/op_routes.hpp"

#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <array>
#include <atomic>
#include <cctype>
#include <string>
#include <unordered_map>
#include <vector>

#include "python/bindings.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

constexpr size_t kChoicesKept = 256;  // per route, as the Python memo's bound
constexpr int kOps = static_cast<int>(RoutedOp::kCount);
constexpr std::array<const char*, kOps> kOpNames = {"all_reduce", "all_gather", "reduce_scatter",
                                                    "fused_all_reduce_rmsnorm"};

/// One watched source: `dict[key]`, then `[item]` of that where `item` is set.
struct Source {
  PyObject* dict;
  PyObject* key;
  PyObject* item;  // may be null
};

/// The choice learned for one (dtype, size), and the sources' values (new references) it was made from.
struct Learned {
  RouteChoice choice;
  std::vector<PyObject*> seen;
};

/// One (group name, device): the objects the Python path ran the call on.
struct LearnedRoute {
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

/// One op's Python path, watched sources and routes.
struct OpState {
  PyObject* fallback = nullptr;
  std::vector<Source> sources;
  std::unordered_map<RouteKey, LearnedRoute, RouteKeyHash> routes;
  std::atomic<uint64_t> engineCalls{0};
  std::atomic<uint64_t> pythonCalls{0};
};

/// Never destroyed (they hold Python references, and outlive the interpreter).
OpState& state(RoutedOp op) {
  static auto* states = new std::array<OpState, kOps>();
  return (*states)[static_cast<int>(op)];
}

RoutedOp routedOpNamed(const std::string& name) {
  for (int k = 0; k < kOps; ++k) {
    if (name == kOpNames[k]) return static_cast<RoutedOp>(k);
  }
  throw InvalidArgument(strCat("invalid argument 'op': '", name, "' (expected all_reduce, all_gather, "
                               "reduce_scatter or fused_all_reduce_rmsnorm)"));
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

void clearChoices(LearnedRoute& route) {
  for (auto& [k, learned] : route.choices) releaseSeen(learned);
  route.choices.clear();
}

void forgetRoutes(OpState& s) {
  for (auto& [key, route] : s.routes) clearChoices(route);
  s.routes.clear();
}

c10::intrusive_ptr<c10d::ProcessGroup> resolvedGroup(const std::string& name) {
  try {
    return c10d::resolve_process_group(name);
  } catch (const c10::Error&) {
    return {};  // the Python path raises, naming the group
  }
}

void setPython(RoutedOp op, py::function fallback,
               const std::vector<std::tuple<py::dict, py::object, py::object>>& sources) {
  OpState& s = state(op);
  forgetRoutes(s);
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
}

void learn(RoutedOp op, const std::string& groupName, const at::Tensor& x, std::shared_ptr<Communicator> comm,
           std::shared_ptr<CollectiveEngine> engine, const RouteChoice& choice) {
  auto group = resolvedGroup(groupName);
  PYCCL_CHECK_ARG(group, "group_name", "'", groupName, "' names no process group");
  OpState& s = state(op);
  Learned learned{choice, {}};
  for (const Source& src : s.sources) {
    PyObject* v = currentValue(src);
    Py_XINCREF(v);
    learned.seen.push_back(v);
  }
  LearnedRoute& route = s.routes[RouteKey{groupName, x.device()}];
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
}

}  // namespace

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

std::optional<RoutedCall> learnedRoute(RoutedOp op, c10::string_view group, const at::Tensor& key) {
  py::gil_scoped_acquire gil;
  OpState& s = state(op);
  auto it = s.routes.find(RouteKey{std::string(group), key.device()});
  if (it == s.routes.end()) return std::nullopt;
  LearnedRoute& route = it->second;
  auto learned = route.choices.find(choiceKey(key));
  if (learned == route.choices.end()) return std::nullopt;
  for (size_t i = 0; i < s.sources.size(); ++i) {
    if (currentValue(s.sources[i]) != learned->second.seen[i]) return std::nullopt;
  }
  // The route's weak reference keeps a destroyed group's address from being reused, so the same address is the
  // same group.
  if (resolvedGroup(it->first.group).get() != route.groupAddress) return std::nullopt;
  RoutedCall call{route.comm.lock(), route.engine.lock(), learned->second.choice};
  if (call.comm == nullptr || call.engine == nullptr || call.comm->closed()) return std::nullopt;
  return call;
}

py::object callPythonPath(RoutedOp op, const py::tuple& args) {
  OpState& s = state(op);
  if (s.fallback == nullptr) {
    throw UnsupportedError(strCat("torch.ops.pyccl.", kOpNames[static_cast<int>(op)],
                                  ": import pyccl first (pyccl.ops registers the op)"));
  }
  s.pythonCalls.fetch_add(1, std::memory_order_relaxed);
  try {
    return py::reinterpret_borrow<py::object>(s.fallback)(*args);
  } catch (py::error_already_set& e) {
    e.restore();
    ::python_error err;
    err.persist();
    throw err;
  }
}

void countEngineCall(RoutedOp op) { state(op).engineCalls.fetch_add(1, std::memory_order_relaxed); }

void raiseAsPython(const Error& e) {
  py::gil_scoped_acquire gil;
  setPythonError(e);
  ::python_error err;
  err.persist();
  throw err;
}

void bindOpRoutes(py::module_& m) {
  m.def("set_op_python",
        [](const std::string& op, py::function fallback,
           const std::vector<std::tuple<py::dict, py::object, py::object>>& sources) {
          setPython(routedOpNamed(op), std::move(fallback), sources);
        },
        py::arg("op"), py::arg("fallback"), py::arg("sources"),
        "Sets the Python kernel that torch.ops.pyccl.<op>'s C++ kernel falls back to, and the (dict, key, item "
        "or None) lookups whose values a learned choice depends on. Forgets the op's learned choices.");
  m.def("learn_op_route",
        [](const std::string& op, const std::string& groupName, const at::Tensor& x,
           std::shared_ptr<Communicator> comm, std::shared_ptr<CollectiveEngine> engine,
           const std::optional<std::string>& algorithm, const std::optional<std::string>& symmetricAlgorithm) {
          const RoutedOp routed = routedOpNamed(op);
          RouteChoice choice;
          if (routed == RoutedOp::kAllReduce) {
            choice.algorithm = allReduceAlgorithmArg(algorithm, "algorithm");
            choice.symmetricAlgorithm = allReduceAlgorithmArg(symmetricAlgorithm, "symmetric_algorithm");
          } else if (routed != RoutedOp::kFusedNorm && algorithm && !algorithm->empty()) {
            choice.protocol = parseProtocol(*algorithm, "algorithm");
          }
          learn(routed, groupName, x, std::move(comm), std::move(engine), choice);
        },
        py::arg("op"), py::arg("group_name"), py::arg("tensor"), py::arg("comm"), py::arg("engine"),
        py::arg("algorithm") = py::none(), py::arg("symmetric_algorithm") = py::none(),
        "Lets torch.ops.pyccl.<op> run calls like this one (group, device, dtype, size) straight into `engine` "
        "with this choice (all_reduce: algorithm and symmetric algorithm; all_gather, reduce_scatter: 'll' or "
        "'hb'), while the watched sources keep their current values.");
  m.def("forget_op_routes", [] {
    for (int k = 0; k < kOps; ++k) forgetRoutes(state(static_cast<RoutedOp>(k)));
  }, "Forgets every learned choice of pyccl's custom ops.");
  m.def("op_calls", [](const std::string& op) {
    const OpState& s = state(routedOpNamed(op));
    return py::dict(py::arg("engine") = s.engineCalls.load(), py::arg("python") = s.pythonCalls.load());
  }, py::arg("op"), "Calls of torch.ops.pyccl.<op> so far: run straight into the engine, and handed to Python.");
}

}  // namespace pyccl
