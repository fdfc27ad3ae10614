#include "python/op_runtimes.hpp"

#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <array>
#include <atomic>
#include <cctype>
#include <mutex>
#include <string>
#include <unordered_map>

#include "python/bindings.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

constexpr int kOps = static_cast<int>(CustomOp::kCount);
constexpr std::array<const char*, kOps> kOpNames = {"all_reduce", "all_gather", "reduce_scatter",
                                                    "all_to_all", "broadcast", "fused_all_reduce_rmsnorm"};

/// One op's Python path and counts.
struct OpState {
  PyObject* fallback = nullptr;  // a strong reference, set with the GIL held
  std::atomic<uint64_t> engineCalls{0};
  std::atomic<uint64_t> pythonCalls{0};
};

/// Never destroyed (they hold Python references, and outlive the interpreter).
OpState& state(CustomOp op) {
  static auto* states = new std::array<OpState, kOps>();
  return (*states)[static_cast<int>(op)];
}

CustomOp customOpNamed(const std::string& name) {
  for (int k = 0; k < kOps; ++k) {
    if (name == kOpNames[k]) return static_cast<CustomOp>(k);
  }
  throw InvalidArgument(strCat("invalid argument 'op': '", name, "' (expected all_reduce, all_gather, "
                               "reduce_scatter, all_to_all, broadcast or fused_all_reduce_rmsnorm)"));
}

/// One registered runtime: weak references only, so that registering keeps nothing alive.
struct Registered {
  c10::weak_intrusive_ptr<c10d::ProcessGroup> group{c10::intrusive_ptr<c10d::ProcessGroup>()};
  const c10d::ProcessGroup* groupAddress = nullptr;
  std::weak_ptr<Communicator> comm;
  std::weak_ptr<CollectiveEngine> engine;
  std::weak_ptr<Selector> selector;
  std::weak_ptr<PlanRunners> plans;
  bool nccl = false;
};

struct RuntimeKey {
  std::string group;
  c10::Device device;
  bool operator==(const RuntimeKey& o) const { return device == o.device && group == o.group; }
};

struct RuntimeKeyHash {
  size_t operator()(const RuntimeKey& k) const {
    return std::hash<std::string>()(k.group) ^ (std::hash<c10::Device>()(k.device) << 1);
  }
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<RuntimeKey, Registered, RuntimeKeyHash> runtimes;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: kernels may run while the process exits
  return *r;
}

c10::intrusive_ptr<c10d::ProcessGroup> resolvedGroup(const std::string& name) {
  try {
    return c10d::resolve_process_group(name);
  } catch (const c10::Error&) {
    return {};
  }
}

void registerRuntime(const std::string& groupName, int device, std::shared_ptr<Communicator> comm,
                     std::shared_ptr<CollectiveEngine> engine, std::shared_ptr<Selector> selector,
                     std::shared_ptr<PlanRunners> plans, bool nccl) {
  auto group = resolvedGroup(groupName);
  PYCCL_CHECK_ARG(group, "group_name", "'", groupName, "' names no process group");
  PYCCL_CHECK_ARG(comm != nullptr, "comm", "must be a communicator");
  const c10::Device dev = device < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, device);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.runtimes.begin(); it != r.runtimes.end();) {  // forget what can never run again
    auto c = it->second.comm.lock();
    it = it->second.group.expired() || c == nullptr || c->closed() ? r.runtimes.erase(it) : std::next(it);
  }
  Registered& entry = r.runtimes[RuntimeKey{groupName, dev}];
  entry.group = c10::weak_intrusive_ptr<c10d::ProcessGroup>(group);
  entry.groupAddress = group.get();
  entry.comm = comm;
  entry.engine = engine;
  entry.selector = selector;
  entry.plans = plans;
  entry.nccl = nccl;
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

std::optional<GroupRuntime> groupRuntime(c10::string_view group, const c10::Device& device) {
  const std::string name(group);
  Registered entry;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.runtimes.find(RuntimeKey{name, device});
    if (it == r.runtimes.end()) return std::nullopt;
    entry = it->second;
  }
  // The entry's weak reference keeps a destroyed group's address from being reused while it is kept, so the
  // same address is the same group.
  if (entry.group.expired() || resolvedGroup(name).get() != entry.groupAddress) return std::nullopt;
  GroupRuntime runtime{entry.comm.lock(), entry.engine.lock(), entry.selector.lock(), entry.plans.lock(),
                       entry.nccl};
  if (runtime.comm == nullptr || runtime.engine == nullptr || runtime.selector == nullptr || runtime.plans == nullptr ||
      runtime.comm->closed()) {
    return std::nullopt;
  }
  return runtime;
}

py::object callPythonPath(CustomOp op, const py::tuple& args) {
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

void countEngineCall(CustomOp op) { state(op).engineCalls.fetch_add(1, std::memory_order_relaxed); }

void raiseAsPython(const Error& e) {
  py::gil_scoped_acquire gil;
  setPythonError(e);
  ::python_error err;
  err.persist();
  throw err;
}

void bindOpRuntimes(py::module_& m) {
  m.def("set_op_python",
        [](const std::string& op, py::function fallback) {
          OpState& s = state(customOpNamed(op));
          Py_XDECREF(s.fallback);
          s.fallback = fallback.release().ptr();
        },
        py::arg("op"), py::arg("fallback"),
        "Sets the Python kernel that torch.ops.pyccl.<op>'s C++ kernel hands every call to that the engine does "
        "not run.");
  m.def("register_group_runtime", &registerRuntime, py::arg("group_name"), py::arg("device"), py::arg("comm"),
        py::arg("engine"), py::arg("selector"), py::arg("plans"), py::arg("nccl"),
        "Lets torch.ops.pyccl.* on the group named `group_name` (device: CUDA ordinal, or -1 in host mode) run "
        "its selector's kernel choices straight on `engine`; `nccl`: the group takes calls handed to NCCL. "
        "Holds weak references only.");
  m.def("op_calls", [](const std::string& op) {
    const OpState& s = state(customOpNamed(op));
    return py::dict(py::arg("engine") = s.engineCalls.load(), py::arg("python") = s.pythonCalls.load());
  }, py::arg("op"), "Calls of torch.ops.pyccl.<op> so far: run in C++ ('engine': a kernel of the engine, or a plan set "
        "up), and handed to Python.");
}

}  // namespace pyccl
