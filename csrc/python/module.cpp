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

}  // namespace
}  // namespace pyccl

PYBIND11_MODULE(_C, m) {
  using namespace pyccl;
  m.doc() = "pyccl runtime core (C++/CUDA)";

  static PyObject* base = newException(m, "PycclError", {PyExc_RuntimeError},
                                       "Base class of pyccl errors.");
  static PyObject* invalid = newException(m, "InvalidArgumentError", {base, PyExc_ValueError},
                                          "A bad argument; the message names it.");
  static PyObject* timeout = newException(m, "PycclTimeoutError", {base, PyExc_TimeoutError},
                                          "A bounded wait ran out; the message names op and peer.");
  static PyObject* aborted = newException(m, "AbortedError", {base},
                                          "The communicator was aborted.");
  static PyObject* closed = newException(m, "ClosedError", {base},
                                         "The communicator or memory was destroyed.");
  static PyObject* cuda = newException(m, "CudaError", {base}, "A CUDA call failed.");
  static PyObject* system = newException(m, "SystemError", {base, PyExc_OSError},
                                         "A system call failed.");
  static PyObject* unsupported = newException(m, "UnsupportedError", {base, PyExc_NotImplementedError},
                                              "Not available in this build or on this machine.");
  static PyObject* remote = newException(m, "RemoteError", {base},
                                         "A peer reported an error or a mismatch.");
  static PyObject* type_error = newException(m, "PycclTypeError", {base, PyExc_TypeError},
                                             "An unsupported dtype or dtype/op pair; the message names it.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = base;
      switch (e.code()) {
        case ErrorCode::kInvalidArgument: type = invalid; break;
        case ErrorCode::kTimeout: type = timeout; break;
        case ErrorCode::kAborted: type = aborted; break;
        case ErrorCode::kClosed: type = closed; break;
        case ErrorCode::kCuda: type = cuda; break;
        case ErrorCode::kSystem: type = system; break;
        case ErrorCode::kUnsupported: type = unsupported; break;
        case ErrorCode::kRemote: type = remote; break;
        case ErrorCode::kType: type = type_error; break;
        case ErrorCode::kInternal: type = base; break;
      }
      PyErr_SetString(type, e.what());
    }
  });

  m.def("cuda_built", &gpu::built, "Whether this build of pyccl includes CUDA.");
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
}
