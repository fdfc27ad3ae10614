// The CPU and CUDA kernels of every torch.ops.pyccl op (all_reduce,
// all_gather, reduce_scatter, all_to_all, broadcast and
// fused_all_reduce_rmsnorm), in C++, with no Python on the path of a kernel
// choice or of a plan set up: each finds its group's runtime
// (op_runtimes.hpp), asks the group's selector, and runs a kernel choice
// straight on the engine, a plan choice on the plan set up for it. Every
// other choice (a plan's first call, NCCL, the collectives across nodes), a
// group with no runtime yet, and a call with an argument to refuse go to the
// op's Python path (pyccl/ops.py), which asks the same selector and raises
// the error naming the argument. Each kernel makes its output as the Python
// path does.
//
// pyccl.<collective> runs the same code first (CallRuntime): one call from
// Python that checks, chooses and launches, so an eager call's host time is
// the engine's plus one crossing into C++.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "python/op_runtimes.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

/// What a call runs on where `runtime` runs it itself: a kernel of its engine (`plan` empty), or a plan set up
/// on its communicator.
struct EngineChoice {
  Choice choice;
  std::optional<SetUpPlan> plan;
};

/// The selector's choice for `input` where `runtime` runs it itself (counted then): a kernel of its engine, or a
/// plan whose runner is set up; nullopt for the caller's other path to run (and count) the call. `forced`: the
/// call's algorithm argument ("" for none); `nccl`: the caller can hand the call to NCCL.
std::optional<EngineChoice> engineChoice(const GroupRuntime& runtime, Collective c, const at::Tensor& input,
                                         uint64_t bytes, const std::string& forced, bool nccl) {
  EngineChoice ec;
  try {
    ec.choice = runtime.selector->select(c, tableDtypeOf(input), bytes, static_cast<uint64_t>(input.numel()),
                                         forced, nccl && input.is_cuda(), true, /*counted=*/false);
  } catch (const Error&) {
    return std::nullopt;  // the other path asks again and raises the error
  }
  const Choice& choice = ec.choice;
  if (choice.route == Route::kPlan) {
    // A plan not set up yet is set up on the Python path (collectively: every rank takes it there).
    ec.plan = runtime.plans->find(planSlotOf(choice, c, bytes, runtime.comm->worldSize()).key);
    if (!ec.plan) return std::nullopt;
  } else if (choice.route != Route::kKernel || choice.symmetricAlgorithm == "nccl") {
    // NCCL, across nodes, and an all-reduce whose symmetric-buffer choice is NCCL: the Python path tells those
    // buffers apart.
    return std::nullopt;
  }
  runtime.selector->count(c, choice);
  return ec;
}

/// Runs collective `c` of `input` on `runtime` (as torch.ops.pyccl.<op>'s C++ kernel and pyccl.<op>, CallRuntime
/// below, both run it) where the selector chooses one of its engine's kernels or a plan set up on it: into `out`
/// where given, else into a new tensor shaped as pyccl.<op> shapes it, which it returns.
/// nullopt, with nothing run, where the selector chose anything else, or where a fact of the call (a dtype, a
/// shape, the op, the root) is for the other path to refuse or run. `root`: a broadcast's source rank.
/// `launch(engineCall)` makes the engine call.
template <typename Launch>
std::optional<at::Tensor> runKernelChoice(Collective c, const GroupRuntime& runtime, const at::Tensor& input,
                                          std::optional<at::Tensor> out, std::optional<ReduceOp> op, int root,
                                          const std::string& forced, bool nccl, Launch&& launch) {
  const int64_t world = runtime.comm->worldSize();
  uint64_t bytes = input.nbytes();
  switch (c) {
    case Collective::kAllReduce:
      if (!op || !reduces(input.scalar_type())) return std::nullopt;
      break;
    case Collective::kAllGather:
      bytes *= static_cast<uint64_t>(world);
      break;
    case Collective::kReduceScatter:
      if (!op || !reduces(input.scalar_type()) || input.dim() == 0 || input.size(0) % world != 0) {
        return std::nullopt;
      }
      break;
    case Collective::kAllToAll:
      if (input.numel() % world != 0) return std::nullopt;
      break;
    case Collective::kBroadcast:
      if (root < 0 || root >= world) return std::nullopt;
      break;
    case Collective::kCount:
      return std::nullopt;
  }
  const auto chosen = engineChoice(runtime, c, input, bytes, forced, nccl);
  if (!chosen) return std::nullopt;
  const Choice* choice = &chosen->choice;
  // The output pyccl.<op> makes where none is given: the input's shape, its first dimension times (all-gather)
  // or divided by (reduce-scatter) the world size.
  auto newOutput = [&] {
    if (c == Collective::kAllReduce || c == Collective::kAllToAll || c == Collective::kBroadcast) {
      return at::empty_like(input, at::MemoryFormat::Contiguous);
    }
    std::vector<int64_t> shape = input.sizes().vec();
    if (c == Collective::kReduceScatter) {
      shape[0] /= world;
    } else if (shape.empty()) {
      shape.push_back(world);
    } else {
      shape[0] *= world;
    }
    return at::empty(shape, input.options());
  };
  at::Tensor result = out ? *std::move(out) : newOutput();
  launch([&] {
    if (chosen->plan) {
      runPlanTensor(*chosen->plan->executor, *runtime.comm, c, input, result, op.value_or(ReduceOp::kSum),
                    chosen->plan->reduces);
      return;
    }
    CollectiveEngine& engine = *runtime.engine;
    switch (c) {
      case Collective::kAllReduce:
        allReduceTensor(engine, *runtime.comm, input, result, *op, kernelOf(*choice), symmetricOf(*choice));
        break;
      case Collective::kAllGather:
        allGatherTensor(engine, *runtime.comm, input, result, protocolOf(*choice));
        break;
      case Collective::kReduceScatter:
        reduceScatterTensor(engine, *runtime.comm, input, result, *op, protocolOf(*choice));
        break;
      case Collective::kAllToAll:
        allToAllTensor(engine, *runtime.comm, input, result, protocolOf(*choice));
        break;
      case Collective::kBroadcast:
        broadcastTensor(engine, *runtime.comm, input, result, root, protocolOf(*choice));
        break;
      case Collective::kCount:
        break;  // refused above
    }
  });
  return result;
}

at::Tensor allReduceKernel(const at::Tensor& x, c10::string_view op, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const auto runtime = groupRuntime(groupName, input.device());
  auto done = runtime ? runKernelChoice(Collective::kAllReduce, *runtime, input, std::nullopt, reduceOpNamed(op), -1, "",
                                        runtime->nccl, [](auto&& call) { runOnEngine(CustomOp::kAllReduce, call); })
                      : std::nullopt;
  if (!done) return pythonPath<at::Tensor>(CustomOp::kAllReduce, x, std::string(op), std::string(groupName));
  return *std::move(done);
}

at::Tensor allGatherKernel(const at::Tensor& x, int64_t groupSize, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  auto runtime = groupRuntime(groupName, input.device());
  if (runtime && runtime->comm->worldSize() != groupSize) runtime.reset();  // the Python path names the wrong size
  auto done = runtime ? runKernelChoice(Collective::kAllGather, *runtime, input, std::nullopt, std::nullopt, -1, "",
                                        runtime->nccl, [](auto&& call) { runOnEngine(CustomOp::kAllGather, call); })
                      : std::nullopt;
  if (!done) return pythonPath<at::Tensor>(CustomOp::kAllGather, x, groupSize, std::string(groupName));
  return *std::move(done);
}

at::Tensor reduceScatterKernel(const at::Tensor& x, c10::string_view op, int64_t groupSize,
                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  auto runtime = groupRuntime(groupName, input.device());
  if (runtime && runtime->comm->worldSize() != groupSize) runtime.reset();
  auto done = runtime ? runKernelChoice(Collective::kReduceScatter, *runtime, input, std::nullopt, reduceOpNamed(op),
                                        -1, "", runtime->nccl,
                                        [](auto&& call) { runOnEngine(CustomOp::kReduceScatter, call); })
                      : std::nullopt;
  if (!done) {
    return pythonPath<at::Tensor>(CustomOp::kReduceScatter, x, std::string(op), groupSize, std::string(groupName));
  }
  return *std::move(done);
}

at::Tensor allToAllKernel(const at::Tensor& x, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const auto runtime = groupRuntime(groupName, input.device());
  auto done = runtime ? runKernelChoice(Collective::kAllToAll, *runtime, input, std::nullopt, std::nullopt, -1, "",
                                        runtime->nccl, [](auto&& call) { runOnEngine(CustomOp::kAllToAll, call); })
                      : std::nullopt;
  if (!done) return pythonPath<at::Tensor>(CustomOp::kAllToAll, x, std::string(groupName));
  return *std::move(done);
}

/// `src`: a rank of the group (the Python path names one that is not).
at::Tensor broadcastKernel(const at::Tensor& x, int64_t src, c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const auto runtime = groupRuntime(groupName, input.device());
  const bool rankOfGroup = runtime && src >= 0 && src < runtime->comm->worldSize();
  auto done = rankOfGroup ? runKernelChoice(Collective::kBroadcast, *runtime, input, std::nullopt, std::nullopt,
                                            static_cast<int>(src), "", runtime->nccl,
                                            [](auto&& call) { runOnEngine(CustomOp::kBroadcast, call); })
                          : std::nullopt;
  if (!done) return pythonPath<at::Tensor>(CustomOp::kBroadcast, x, src, std::string(groupName));
  return *std::move(done);
}

/// Whether a fused call of `input` runs fused by the automatic choice: a dtype the fused kernels take, at most
/// kFusedMaxBytes (above it, pyccl.all_reduce, then torch's add and rms_norm: the Python path).
bool fusedByDefault(const at::Tensor& input) {
  return input.nbytes() <= kFusedMaxBytes && isFloatDtype(input.scalar_type());
}

/// The fused all-reduce + residual add + RMSNorm of `input` on `runtime`'s engine, into `out` and `residualOut`
/// where given, else into new tensors, which it returns. `allReduceRMSNormTensor` checks every argument as the
/// Python path does (naming it) before anything runs; `algorithm` nullopt: the engine's own choice, as
/// pyccl.fused_all_reduce_rmsnorm's. `launch(engineCall)` makes the engine call.
template <typename Launch>
std::tuple<at::Tensor, at::Tensor> runFusedNorm(const GroupRuntime& runtime, const at::Tensor& input,
                                                const at::Tensor& residual, const at::Tensor& weight, double eps,
                                                std::optional<at::Tensor> out, std::optional<at::Tensor> residualOut,
                                                std::optional<FusedNormAlgorithm> algorithm, Launch&& launch) {
  at::Tensor normed = out ? *std::move(out) : at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor newResidual =
      residualOut ? *std::move(residualOut) : at::empty_like(residual, at::MemoryFormat::Contiguous);
  launch([&] {
    allReduceRMSNormTensor(*runtime.engine, *runtime.comm, input, residual, weight, normed, newResidual, eps,
                           algorithm);
  });
  return {std::move(normed), std::move(newResidual)};
}

std::tuple<at::Tensor, at::Tensor> fusedAllReduceRMSNormKernel(const at::Tensor& x, const at::Tensor& residual,
                                                               const at::Tensor& weight, double eps,
                                                               c10::string_view groupName) {
  const at::Tensor input = x.contiguous();
  const auto runtime = fusedByDefault(input) ? groupRuntime(groupName, input.device()) : std::nullopt;
  if (!runtime) {
    return pythonPath<std::tuple<at::Tensor, at::Tensor>>(CustomOp::kFusedNorm, x, residual, weight, eps,
                                                           std::string(groupName));
  }
  return runFusedNorm(*runtime, input, residual.contiguous(), weight.contiguous(), eps, std::nullopt, std::nullopt,
                      std::nullopt, [](auto&& call) { runOnEngine(CustomOp::kFusedNorm, call); });
}

/// Whether the engine takes `t` as it is: dense, contiguous, with data (else the Python path names what is wrong).
bool plainTensor(const at::Tensor& t) { return t.layout() == at::kStrided && t.is_contiguous() && !t.is_meta(); }

/// A tensor argument of a pyccl.<op> call where it is one; nullptr for the Python path to refuse.
const at::Tensor* tensorArg(py::handle arg) {
  return THPVariable_Check(arg.ptr()) ? &THPVariable_Unpack(arg.ptr()) : nullptr;
}

/// A string argument (or None: ""); nullopt where it is neither, for the Python path to refuse.
std::optional<std::string> stringArg(py::handle arg) {
  if (arg.is_none()) return std::string();
  if (!PyUnicode_Check(arg.ptr())) return std::nullopt;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(arg.ptr(), &size);
  if (text == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return std::string(text, static_cast<size_t>(size));
}

/// pyccl.<op>'s call on `runtime` where its selector chooses a kernel: the result tensor, else None (nothing
/// ran) for the Python path to run the call, or refuse it, naming the argument.
py::object callKernelChoice(Collective c, const GroupRuntime& runtime, py::handle tensor, py::handle out,
                            py::handle op, py::handle algorithm, bool nccl, py::handle src = py::none()) {
  const at::Tensor* input = tensorArg(tensor);
  const at::Tensor* given = out.is_none() ? nullptr : tensorArg(out);
  const auto forced = stringArg(algorithm);
  // What the engine refuses (a tensor that is not contiguous, on another device, without data) goes to the
  // Python path, whose checks name it first.
  if (input == nullptr || (given == nullptr && !out.is_none()) || !forced || runtime.comm->closed() ||
      !plainTensor(*input) || (given != nullptr && !given->is_contiguous())) {
    return py::none();
  }
  int root = -1;
  if (c == Collective::kBroadcast) {
    // A Python int (not a bool) that is a rank; anything else is the Python path's to name.
    if (PyBool_Check(src.ptr()) || !PyLong_Check(src.ptr())) return py::none();
    const long value = PyLong_AsLong(src.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return py::none();
    }
    if (value < 0 || value >= runtime.comm->worldSize()) return py::none();
    root = static_cast<int>(value);
  }
  std::optional<ReduceOp> rop;
  if (c == Collective::kAllReduce || c == Collective::kReduceScatter) {
    const auto name = stringArg(op);
    if (!name) return py::none();  // a torch ReduceOp: the Python path reads it
    rop = reduceOpNamed(*name);    // None ("") and unknown names: nullopt, the Python path's to refuse
  }
  auto done = runKernelChoice(c, runtime, *input, given ? std::optional<at::Tensor>(*given) : std::nullopt, rop, root,
                              *forced, nccl, [](auto&& call) {
                                py::gil_scoped_release release;
                                call();
                              });
  if (!done) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(*std::move(done)));
}

/// pyccl.fused_all_reduce_rmsnorm's call on `runtime` where it is well formed and fused (not above kFusedMaxBytes
/// unless an algorithm is forced): (normed, new residual); else None, having run nothing, for the Python path to
/// run it unfused or refuse it, naming the argument.
py::object callFusedNorm(const GroupRuntime& runtime, py::handle x, py::handle residual, py::handle weight,
                         py::handle eps, py::handle out, py::handle residualOut, py::handle algorithm) {
  const at::Tensor* input = tensorArg(x);
  const at::Tensor* res = tensorArg(residual);
  const at::Tensor* w = tensorArg(weight);
  const at::Tensor* given = out.is_none() ? nullptr : tensorArg(out);
  const at::Tensor* givenResidual = residualOut.is_none() ? nullptr : tensorArg(residualOut);
  const auto forced = stringArg(algorithm);
  const bool number = !PyBool_Check(eps.ptr()) && (PyFloat_Check(eps.ptr()) || PyLong_Check(eps.ptr()));
  if (input == nullptr || res == nullptr || w == nullptr || (given == nullptr && !out.is_none()) ||
      (givenResidual == nullptr && !residualOut.is_none()) || !forced || !number || runtime.comm->closed()) {
    return py::none();
  }
  const double epsilon = PyFloat_AsDouble(eps.ptr());
  if (PyErr_Occurred()) {  // an int too large for a double
    PyErr_Clear();
    return py::none();
  }
  std::optional<FusedNormAlgorithm> algo;
  if (forced->empty()) {
    if (!fusedByDefault(*input)) return py::none();
  } else {
    if (*forced == "unfused" || !isFloatDtype(input->scalar_type())) return py::none();
    try {
      algo = parseFusedNormAlgorithm(*forced, "algorithm");
    } catch (const Error&) {
      return py::none();  // the Python path names the algorithms
    }
  }
  // What the engine refuses goes to the Python path, whose checks name it first.
  const at::Tensor* all[] = {input, res, w, given, givenResidual};
  for (const at::Tensor* t : all) {
    if (t != nullptr && (!plainTensor(*t) || t->scalar_type() != input->scalar_type() ||
                         t->device() != input->device())) {
      return py::none();
    }
  }
  auto [normed, newResidual] =
      runFusedNorm(runtime, *input, *res, *w, epsilon, given ? std::optional<at::Tensor>(*given) : std::nullopt,
                   givenResidual ? std::optional<at::Tensor>(*givenResidual) : std::nullopt, algo, [](auto&& call) {
                     py::gil_scoped_release release;
                     call();
                   });
  return py::make_tuple(py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(normed))),
                        py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(newResidual))));
}

}  // namespace

void bindCallRuntime(py::module_& m) {
  py::class_<GroupRuntime>(m, "CallRuntime",
                           "What pyccl.all_reduce, all_gather, reduce_scatter, all_to_all, broadcast and "
                           "fused_all_reduce_rmsnorm on a "
                           "communicator run first: the selector's choice (the engine's, for the fused call) and, "
                           "where it is a kernel or a plan set up, its run, in one call from Python (as "
                           "torch.ops.pyccl.<op>'s C++ kernels run them). Each method returns the result, or None, "
                           "having run nothing, for the Python path to run the call (a plan, NCCL, the collectives "
                           "across nodes, the unfused norm) or refuse it, naming the argument.")
      .def(py::init([](std::shared_ptr<Communicator> comm, std::shared_ptr<CollectiveEngine> engine,
                       std::shared_ptr<Selector> selector, std::shared_ptr<PlanRunners> plans) {
             PYCCL_CHECK_ARG(comm && engine && selector && plans, "comm", "a call runtime needs a communicator, "
                             "its engine, its selector and its plans");
             return GroupRuntime{std::move(comm), std::move(engine), std::move(selector), std::move(plans), false};
           }),
           py::arg("comm"), py::arg("engine"), py::arg("selector"), py::arg("plans"))
      .def("all_reduce",
           [](const GroupRuntime& r, py::handle tensor, py::handle out, py::handle op, py::handle algorithm,
              bool nccl) { return callKernelChoice(Collective::kAllReduce, r, tensor, out, op, algorithm, nccl); },
           py::arg("tensor"), py::arg("out"), py::arg("op"), py::arg("algorithm"), py::arg("nccl"))
      .def("all_gather",
           [](const GroupRuntime& r, py::handle tensor, py::handle out, py::handle algorithm, bool nccl) {
             return callKernelChoice(Collective::kAllGather, r, tensor, out, py::none(), algorithm, nccl);
           },
           py::arg("tensor"), py::arg("out"), py::arg("algorithm"), py::arg("nccl"))
      .def("reduce_scatter",
           [](const GroupRuntime& r, py::handle tensor, py::handle out, py::handle op, py::handle algorithm,
              bool nccl) { return callKernelChoice(Collective::kReduceScatter, r, tensor, out, op, algorithm, nccl); },
           py::arg("tensor"), py::arg("out"), py::arg("op"), py::arg("algorithm"), py::arg("nccl"))
      .def("all_to_all",
           [](const GroupRuntime& r, py::handle tensor, py::handle out, py::handle algorithm, bool nccl) {
             return callKernelChoice(Collective::kAllToAll, r, tensor, out, py::none(), algorithm, nccl);
           },
           py::arg("tensor"), py::arg("out"), py::arg("algorithm"), py::arg("nccl"))
      .def("broadcast",
           [](const GroupRuntime& r, py::handle tensor, py::handle src, py::handle out, py::handle algorithm,
              bool nccl) {
             return callKernelChoice(Collective::kBroadcast, r, tensor, out, py::none(), algorithm, nccl, src);
           },
           py::arg("tensor"), py::arg("src"), py::arg("out"), py::arg("algorithm"), py::arg("nccl"))
      .def("fused_all_reduce_rmsnorm",
           [](const GroupRuntime& r, py::handle tensor, py::handle residual, py::handle weight, py::handle eps,
              py::handle out, py::handle residualOut, py::handle algorithm) {
             return callFusedNorm(r, tensor, residual, weight, eps, out, residualOut, algorithm);
           },
           py::arg("tensor"), py::arg("residual"), py::arg("weight"), py::arg("eps"), py::arg("out"),
           py::arg("residual_out"), py::arg("algorithm"));
}

}  // namespace pyccl

TORCH_LIBRARY_IMPL(pyccl, CPU, m) {
  m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel));
  m.impl("all_gather", TORCH_FN(pyccl::allGatherKernel));
  m.impl("reduce_scatter", TORCH_FN(pyccl::reduceScatterKernel));
  m.impl("all_to_all", TORCH_FN(pyccl::allToAllKernel));
  m.impl("broadcast", TORCH_FN(pyccl::broadcastKernel));
  m.impl("fused_all_reduce_rmsnorm", TORCH_FN(pyccl::fusedAllReduceRMSNormKernel));
}
TORCH_LIBRARY_IMPL(pyccl, CUDA, m) {
  m.impl("all_reduce", TORCH_FN(pyccl::allReduceKernel));
  m.impl("all_gather", TORCH_FN(pyccl::allGatherKernel));
  m.impl("reduce_scatter", TORCH_FN(pyccl::reduceScatterKernel));
  m.impl("all_to_all", TORCH_FN(pyccl::allToAllKernel));
  m.impl("broadcast", TORCH_FN(pyccl::broadcastKernel));
  m.impl("fused_all_reduce_rmsnorm", TORCH_FN(pyccl::fusedAllReduceRMSNormKernel));
}
