// pyccl._C: the Python module. Exceptions are mapped here; each class's
// bindings live in bind_*.cpp.
#include <Python.h>
#include <torch/csrc/utils/pybind.h>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/host_memory.hpp"
#include "core/ibverbs.hpp"
#include "core/logging.hpp"
#include "python/bindings.hpp"
#include "python/op_runtimes.hpp"
#include "torch/profiler_labels.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/gpu_memory.hpp"
#endif

namespace py = pybind11;

namespace pyccl {
namespace {

PyObject* newException(py::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                       const char* doc) {
  py::tuple baseTuple(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) baseTuple[i++] = py::reinterpret_borrow<py::object>(b);
  const std::string qualified = std::string("pyccl._C.") + name;
  PyObject* exc = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, baseTuple.ptr(), nullptr);
  if (exc == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(exc));
  return exc;
}

/// pyccl._C's exception classes (made once, with the module; never freed).
struct ErrorTypes {
  PyObject* base = nullptr;
  PyObject* invalid = nullptr;
  PyObject* timeout = nullptr;
  PyObject* aborted = nullptr;
  PyObject* closed = nullptr;
  PyObject* cuda = nullptr;
  PyObject* system = nullptr;
  PyObject* unsupported = nullptr;
  PyObject* remote = nullptr;
  PyObject* type = nullptr;
};

ErrorTypes& errorTypes() {
  static ErrorTypes types;
  return types;
}

}  // namespace

void setPythonError(const Error& e) {
  const ErrorTypes& t = errorTypes();
  PyObject* type = t.base;
  switch (e.code()) {
    case ErrorCode::kInvalidArgument: type = t.invalid; break;
    case ErrorCode::kTimeout: type = t.timeout; break;
    case ErrorCode::kAborted: type = t.aborted; break;
    case ErrorCode::kClosed: type = t.closed; break;
    case ErrorCode::kCuda: type = t.cuda; break;
    case ErrorCode::kSystem: type = t.system; break;
    case ErrorCode::kUnsupported: type = t.unsupported; break;
    case ErrorCode::kRemote: type = t.remote; break;
    case ErrorCode::kType: type = t.type; break;
    case ErrorCode::kInternal: type = t.base; break;
  }
  PyErr_SetString(type, e.what());
}

}  // namespace pyccl

PYBIND11_MODULE(_C, m) {
  using namespace pyccl;
  m.doc() = "pyccl runtime core (C++/CUDA)";

  ErrorTypes& t = errorTypes();
  t.base = newException(m, "PycclError", {PyExc_RuntimeError}, "Base class of pyccl errors.");
  t.invalid = newException(m, "InvalidArgumentError", {t.base, PyExc_ValueError},
                           "A bad argument; the message names it.");
  t.timeout = newException(m, "PycclTimeoutError", {t.base, PyExc_TimeoutError},
                           "A bounded wait ran out; the message names op and peer.");
  t.aborted = newException(m, "AbortedError", {t.base}, "The communicator was aborted.");
  t.closed = newException(m, "ClosedError", {t.base}, "The communicator or memory was destroyed.");
  t.cuda = newException(m, "CudaError", {t.base}, "A CUDA call failed.");
  t.system = newException(m, "SystemError", {t.base, PyExc_OSError}, "A system call failed.");
  t.unsupported = newException(m, "UnsupportedError", {t.base, PyExc_NotImplementedError},
                               "Not available in this build or on this machine.");
  t.remote = newException(m, "RemoteError", {t.base}, "A peer reported an error or a mismatch.");
  t.type = newException(m, "PycclTypeError", {t.base, PyExc_TypeError},
                        "An unsupported dtype or dtype/op pair; the message names it.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      setPythonError(e);
    }
  });

  installProfilerLabels();

  m.def("cuda_built", &gpu::built, "Whether this build of pyccl includes CUDA.");
  m.def("build_info", [] {
    py::dict info;
    info["git"] = PYCCL_BUILD_GIT;
    info["torch"] = PYCCL_BUILD_TORCH;
    info["cuda"] = PYCCL_BUILD_CUDA;  // "none": a CPU-only build
    info["archs"] = PYCCL_BUILD_ARCHS;
#ifdef PYCCL_WITH_IBVERBS
    info["rdma"] = true;
#else
    info["rdma"] = false;
#endif
    return info;
  }, "What this build was made from: git commit, torch and CUDA versions, CUDA architectures, RDMA transport.");
  m.def("device_count", &gpu::deviceCount, "Visible CUDA devices (0 without a driver or GPU).");
  m.def("set_log_level", [](const std::string& level) {
    setLogLevel(parseLogLevel(level, "level"));
  }, py::arg("level"), "Sets the C++ log level (TRACE, DEBUG, INFO, WARN, ERROR, OFF).");
  m.def("num_host_shared_allocations", &numHostSharedAllocations,
        "Live host shared-memory allocations in this process (for leak checks).");
  m.def("num_peer_device_mappings", [] {
#ifdef PYCCL_WITH_CUDA
    return ImportedDeviceMemory::live();
#else
    return size_t{0};
#endif
  }, "Peers' device memory mapped into this process (CUDA IPC or cuMem imports; for leak checks).");

  m.def("rdma_devices", &listRdmaDevices,
        "RDMA devices libibverbs sees; raises UnsupportedError where rdma-core is absent.");

  bindCommunicator(m);
  bindTensors(m);
  bindSelftest(m);
  bindCollectives(m);
  bindExecutor(m);
  bindBackend(m);
  bindDispatch(m);
  bindOpRuntimes(m);
  bindCallRuntime(m);
}
