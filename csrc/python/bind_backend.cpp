// The constructor of the "pyccl" c10d backend, for pyccl.backend's creator.
#include <torch/extension.h>

#include "python/bindings.hpp"
#include "torch/process_group.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

/// `fn`, callable from the backend without the GIL: released with the GIL held.
std::shared_ptr<py::function> heldAcrossThreads(py::function fn) {
  return std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
}

/// Calls `fn(args...)` with the GIL held; pyccl's Python errors come back as its C++ ones, which the backend
/// maps to torch's.
template <typename... Args>
void callFromBackend(const py::function& fn, const Args&... args) {
  py::gil_scoped_acquire gil;
  try {
    fn(args...);
  } catch (py::error_already_set& e) {
    const std::string what = e.what();
    if (e.matches(PyExc_ValueError)) throw InvalidArgument(what);
    if (e.matches(PyExc_NotImplementedError)) throw UnsupportedError(what);
    if (e.matches(PyExc_TypeError)) throw TypeError(what);
    if (e.matches(PyExc_TimeoutError)) throw TimeoutError(what);
    throw InternalError(what);
  }
}

}  // namespace

void bindBackend(py::module_& m) {
  m.def(
      "_make_backend",
      [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, int64_t timeoutMs, const std::string& name,
         int cudaDevice, const py::dict& gpuSelector, const py::dict& hostSelector,
         std::optional<py::function> delegateFactory,
         std::optional<py::function> acrossNodes,
         const KernelChoices& kernelChoices, std::optional<py::function> plans) -> c10::intrusive_ptr<c10d::Backend> {
        BackendOptions o;
        applyKernelChoices(o.gpuEngine, kernelChoices);
        o.name = name;
        o.timeout = std::chrono::milliseconds(timeoutMs);
        o.cudaDevice = cudaDevice;
        o.gpuSelector = selectorConfigFrom(gpuSelector);
        o.hostSelector = selectorConfigFrom(hostSelector);
        DelegateFactory factory;
        if (delegateFactory) {
          factory = [fn = heldAcrossThreads(std::move(*delegateFactory))](int device) {
            py::gil_scoped_acquire gil;
            py::object made = (*fn)(device);
            return made.is_none() ? c10::intrusive_ptr<c10d::Backend>() : made.cast<c10::intrusive_ptr<c10d::Backend>>();
          };
        }
        if (acrossNodes) {
          o.acrossNodes = [fn = heldAcrossThreads(std::move(*acrossNodes))](
                              const std::string& collective, const std::shared_ptr<Communicator>& comm,
                              const at::Tensor& input, const at::Tensor& output, const std::string& op) {
            callFromBackend(*fn, collective, comm, input, output, op);
          };
        }
        if (plans) {
          o.plans = [fn = heldAcrossThreads(std::move(*plans))](
                        const std::string& collective, const std::shared_ptr<Communicator>& comm,
                        const std::shared_ptr<PlanRunners>& lanePlans, const Choice& choice,
                        const PlanSlot& slot, const at::Tensor& input, const at::Tensor& output,
                        const std::string& op) {
            py::gil_scoped_acquire gil;  // for the entry's dict
            callFromBackend(*fn, collective, comm, lanePlans, choice.registeredPlan, libraryEntryOf(choice),
                            py::make_tuple(slot.key, slot.inputLimit), input, output, op);
          };
        }
        py::gil_scoped_release release;
        return c10::make_intrusive<PycclBackend>(std::move(store), rank, size, std::move(o), std::move(factory));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("name"),
      py::arg("cuda_device"), py::arg("gpu_selector"), py::arg("host_selector"), py::arg("delegate_factory") = std::nullopt,
      py::arg("across_nodes") = std::nullopt, py::arg("kernel_choices") = KernelChoices{},
      py::arg("plans") = std::nullopt);
  m.def(
      "_backend_lane",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, int device) {
        auto* pyccl = dynamic_cast<PycclBackend*>(backend.get());
        PYCCL_CHECK_ARG(pyccl != nullptr, "group", "its backend is not pyccl's");
        PycclBackend::Lane lane;
        {
          py::gil_scoped_release release;  // collective where the lane is made now
          lane = pyccl->lane(device);
        }
        return py::make_tuple(lane.comm, lane.engine == nullptr ? py::none() : py::cast(lane.engine), lane.selector,
                              lane.plans);
      },
      py::arg("backend"), py::arg("device"),
      "(communicator, collective engine or None, selector, plans) of a pyccl process group's lane on `device` (a CUDA "
      "ordinal, or -1 for CPU), made now where it was not yet: the runtime pyccl.communicator_for(group) adopts.");
  m.def(
      "_backend_graph_capture",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& action, int device) -> size_t {
        auto* pyccl = dynamic_cast<PycclBackend*>(backend.get());
        PYCCL_CHECK_ARG(pyccl != nullptr, "group", "its backend is not pyccl's");
        py::gil_scoped_release release;
        if (action == "begin") {
          pyccl->beginGraphCapture(device);
        } else if (action == "finish") {
          return pyccl->finishGraphCapture();
        } else if (action == "abandon") {
          pyccl->abandonGraphCapture();
        } else {
          throw InvalidArgument(strCat("invalid argument 'action': ", action, " (begin, finish or abandon)"));
        }
        return 0;
      },
      py::arg("backend"), py::arg("action"), py::arg("device") = -1,
      "pyccl.graph_capture on a process group whose backend is pyccl: begin, finish (returns the calls) or abandon.");
}

}  // namespace pyccl
