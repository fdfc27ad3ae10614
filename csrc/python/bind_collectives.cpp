// Python bindings of the collectives: tensors in, checks at the call (naming
// the argument), then the engine on the current CUDA stream.
#include <torch/extension.h>

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "collectives/allreduce_engine.hpp"
#include "core/errors.hpp"
#include "python/bindings.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

DataType dataTypeOf(const at::Tensor& t, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    default:
      throw InvalidArgument(strCat("invalid argument '", arg, "': all_reduce supports float32, float16 and bfloat16, got ",
                                   c10::toString(t.scalar_type())));
  }
}

ReduceOp reduceOpOf(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "avg") return ReduceOp::kAvg;
  if (op == "min") return ReduceOp::kMin;
  if (op == "max") return ReduceOp::kMax;
  if (op == "prod" || op == "product") return ReduceOp::kProd;
  throw InvalidArgument(strCat("invalid argument 'op': '", op, "' is not a reduction (expected sum, avg, min, max or prod)"));
}

void checkTensorFor(const Communicator& comm, const at::Tensor& t, const char* arg) {
  PYCCL_CHECK_ARG(t.is_contiguous(), arg, "must be contiguous");
  if (comm.hostMode()) {
    PYCCL_CHECK_ARG(t.device().is_cpu(), arg, "must be a CPU tensor for a host-mode communicator, got ",
                    t.device().str());
  } else {
    PYCCL_CHECK_ARG(t.device().is_cuda() && t.device().index() == comm.device(), arg, "must be on cuda:",
                    comm.device(), " (the communicator's device), got ", t.device().str());
  }
}

}  // namespace

void bindCollectives(py::module_& m) {
  // The host-mode fp32 -> fp16/bf16 conversions, exposed for tests.
  m.def("_round_trip_16bit", [](const at::Tensor& x, py::object dtype) {
    const at::ScalarType st = torch::python::detail::py_object_to_dtype(dtype);
    PYCCL_CHECK_ARG(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), "x",
                    "must be a contiguous float32 CPU tensor");
    PYCCL_CHECK_ARG(st == at::kHalf || st == at::kBFloat16, "dtype", "must be float16 or bfloat16");
    at::Tensor out = at::empty(x.sizes(), x.options().dtype(st));
    const float* src = x.data_ptr<float>();
    auto* dst = static_cast<uint16_t*>(out.data_ptr());
    for (int64_t i = 0; i < x.numel(); ++i) {
      dst[i] = st == at::kHalf ? detail::floatToHalfHost(src[i]) : detail::floatToBFloat16Host(src[i]);
    }
    return out;
  }, py::arg("x"), py::arg("dtype"));

  py::class_<AllReduceEngine, std::shared_ptr<AllReduceEngine>>(m, "AllReduceEngine")
      .def(py::init([](Communicator& comm, uint32_t llBlocks, uint32_t hbBlocks, uint32_t llThreads,
                       uint32_t hbThreads, uint64_t llMaxBytes, uint64_t hbPieceBytes, uint64_t llThresholdBytes) {
             AllReduceOptions o;
             o.llBlocks = llBlocks;
             o.hbBlocks = hbBlocks;
             o.llThreads = llThreads;
             o.hbThreads = hbThreads;
             o.llMaxBytes = llMaxBytes;
             o.hbPieceBytes = hbPieceBytes;
             o.llThresholdBytes = llThresholdBytes;
             py::gil_scoped_release release;
             return std::make_shared<AllReduceEngine>(comm, o);
           }),
           py::arg("comm"), py::arg("ll_blocks") = 0, py::arg("hb_blocks") = 0, py::arg("ll_threads") = 1024,
           py::arg("hb_threads") = 256,
           py::arg("ll_max_bytes") = 0, py::arg("hb_piece_bytes") = 0, py::arg("ll_threshold_bytes") = 0,
           py::keep_alive<1, 2>())
      .def("all_reduce",
           [](AllReduceEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::string& op, const std::optional<std::string>& algorithm) {
             checkTensorFor(comm, input, "tensor");
             checkTensorFor(comm, output, "out");
             PYCCL_CHECK_ARG(input.scalar_type() == output.scalar_type(), "out", "dtype ",
                             c10::toString(output.scalar_type()), " differs from the input's ",
                             c10::toString(input.scalar_type()));
             PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                             input.numel());
             const DataType dtype = dataTypeOf(input, "tensor");
             const ReduceOp rop = reduceOpOf(op);
             std::optional<AllReduceAlgorithm> algo;
             if (algorithm && !algorithm->empty()) algo = parseAllReduceAlgorithm(*algorithm, "algorithm");
             void* stream = nullptr;
#ifdef PYCCL_WITH_CUDA
             if (!comm.hostMode()) stream = c10::cuda::getCurrentCUDAStream(comm.device()).stream();
#endif
             const void* in = input.data_ptr();
             void* out = output.data_ptr();
             const uint64_t count = static_cast<uint64_t>(input.numel());
             py::gil_scoped_release release;
             e.allReduce(in, out, count, dtype, rop, algo, stream);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("algorithm") = std::nullopt)
      .def("select", [](const AllReduceEngine& e, uint64_t bytes) { return allReduceAlgorithmName(e.select(bytes)); },
           py::arg("nbytes"))
      .def_property_readonly("ll_max_bytes", [](const AllReduceEngine& e) { return e.options().llMaxBytes; })
      .def("close", &AllReduceEngine::close);
}

}  // namespace pyccl
