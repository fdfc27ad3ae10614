// Python bindings of the collectives: tensors in, checks at the call (naming
// the argument), then the engine on the current CUDA stream.
#include <torch/extension.h>

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "collectives/collective_engine.hpp"
#include "core/errors.hpp"
#include "python/bindings.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

/// torch's name of a dtype ("int32", not c10's "Int").
std::string dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return strCat("torch ", c10::toString(t));
  }
}

DataType dataTypeOf(const at::Tensor& t, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    default:
      throw TypeError(strCat("invalid argument '", arg, "': reductions support float32, float16 and bfloat16, got ",
                             dtypeName(t.scalar_type())));
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

ExchangeKind exchangeKindOf(const std::string& name) {
  if (name == "all_gather") return ExchangeKind::kAllGather;
  if (name == "all_to_all") return ExchangeKind::kAllToAll;
  if (name == "broadcast") return ExchangeKind::kBroadcast;
  if (name == "reduce_scatter") return ExchangeKind::kReduceScatter;
  throw InvalidArgument(strCat("invalid argument 'collective': '", name,
                               "' (expected all_gather, all_to_all, broadcast or reduce_scatter)"));
}

void checkPair(const Communicator& comm, const at::Tensor& input, const at::Tensor& output) {
  checkTensorFor(comm, input, "tensor");
  checkTensorFor(comm, output, "out");
  PYCCL_CHECK_ARG(input.scalar_type() == output.scalar_type(), "out", "dtype ", dtypeName(output.scalar_type()),
                  " differs from the input's ", dtypeName(input.scalar_type()));
}

void* currentStream(const Communicator& comm) {
#ifdef PYCCL_WITH_CUDA
  if (!comm.hostMode()) return c10::cuda::getCurrentCUDAStream(comm.device()).stream();
#endif
  return nullptr;
}

void runExchange(CollectiveEngine& e, const Communicator& comm, ExchangeKind kind, const at::Tensor& input,
                 uint64_t inStride, const at::Tensor& output, uint64_t outStride, uint64_t chunkBytes, int root,
                 DataType dtype, ReduceOp op, const std::optional<std::string>& protocol) {
  std::optional<Protocol> proto;
  if (protocol && !protocol->empty()) proto = parseProtocol(*protocol, "protocol");
  void* stream = currentStream(comm);
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  py::gil_scoped_release release;
  e.exchange(kind, in, inStride, out, outStride, chunkBytes, root, dtype, op, proto, stream);
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

  py::class_<CollectiveEngine, std::shared_ptr<CollectiveEngine>>(m, "CollectiveEngine")
      .def(py::init([](Communicator& comm, uint32_t llBlocks, uint32_t hbBlocks, uint32_t llThreads,
                       uint32_t hbThreads, uint64_t llMaxBytes, uint64_t hbPieceBytes, uint64_t llThresholdBytes, uint64_t ll2ThresholdBytes,
                       std::vector<uint64_t> exchangeLLThresholdBytes) {
             CollectiveOptions o;
             o.llBlocks = llBlocks;
             o.hbBlocks = hbBlocks;
             o.llThreads = llThreads;
             o.hbThreads = hbThreads;
             o.llMaxBytes = llMaxBytes;
             o.hbPieceBytes = hbPieceBytes;
             o.llThresholdBytes = llThresholdBytes;
             o.ll2ThresholdBytes = ll2ThresholdBytes;
             PYCCL_CHECK_ARG(exchangeLLThresholdBytes.empty() || exchangeLLThresholdBytes.size() == 4,
                             "exchange_ll_threshold_bytes",
                             "needs 4 values (all_gather, all_to_all, broadcast, reduce_scatter), got ",
                             exchangeLLThresholdBytes.size());
             for (size_t k = 0; k < exchangeLLThresholdBytes.size(); ++k) {
               o.exchangeLLThresholdBytes[k] = exchangeLLThresholdBytes[k];
             }
             py::gil_scoped_release release;
             return std::make_shared<CollectiveEngine>(comm, o);
           }),
           py::arg("comm"), py::arg("ll_blocks") = 0, py::arg("hb_blocks") = 0, py::arg("ll_threads") = 1024,
           py::arg("hb_threads") = 256, py::arg("ll_max_bytes") = 0, py::arg("hb_piece_bytes") = 0,
           py::arg("ll_threshold_bytes") = 0, py::arg("ll2_threshold_bytes") = 0, py::arg("exchange_ll_threshold_bytes") = std::vector<uint64_t>{}, py::keep_alive<1, 2>())
      .def("all_reduce",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::string& op, const std::optional<std::string>& algorithm) {
             checkPair(comm, input, output);
             PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                             input.numel());
             const DataType dtype = dataTypeOf(input, "tensor");
             const ReduceOp rop = reduceOpOf(op);
             std::optional<AllReduceAlgorithm> algo;
             if (algorithm && !algorithm->empty()) algo = parseAllReduceAlgorithm(*algorithm, "algorithm");
             void* stream = currentStream(comm);
             const void* in = input.data_ptr();
             void* out = output.data_ptr();
             const uint64_t count = static_cast<uint64_t>(input.numel());
             py::gil_scoped_release release;
             e.allReduce(in, out, count, dtype, rop, algo, stream);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("algorithm") = std::nullopt)
      .def("all_gather",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::optional<std::string>& protocol) {
             checkPair(comm, input, output);
             PYCCL_CHECK_ARG(output.numel() == input.numel() * comm.worldSize(), "out", "has ", output.numel(),
                             " elements; an all-gather of ", input.numel(), " over ", comm.worldSize(),
                             " ranks needs ", input.numel() * comm.worldSize());
             const uint64_t chunk = input.nbytes();
             runExchange(e, comm, ExchangeKind::kAllGather, input, 0, output, chunk, chunk, 0, DataType::kFloat32,
                         ReduceOp::kSum, protocol);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("protocol") = std::nullopt)
      .def("reduce_scatter",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::string& op, const std::optional<std::string>& protocol) {
             checkPair(comm, input, output);
             PYCCL_CHECK_ARG(input.numel() == output.numel() * comm.worldSize(), "out", "has ", output.numel(),
                             " elements; a reduce-scatter of ", input.numel(), " over ", comm.worldSize(),
                             " ranks gives each ", input.numel() / comm.worldSize(),
                             input.numel() % comm.worldSize() ? " (and the input must divide evenly)" : "");
             const DataType dtype = dataTypeOf(input, "tensor");
             const ReduceOp rop = reduceOpOf(op);
             const uint64_t chunk = output.nbytes();
             runExchange(e, comm, ExchangeKind::kReduceScatter, input, chunk, output, 0, chunk, 0, dtype, rop,
                         protocol);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("protocol") = std::nullopt)
      .def("all_to_all",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::optional<std::string>& protocol) {
             checkPair(comm, input, output);
             PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                             input.numel());
             PYCCL_CHECK_ARG(input.numel() % comm.worldSize() == 0, "tensor", "has ", input.numel(),
                             " elements, not a multiple of the world size ", comm.worldSize());
             const uint64_t chunk = input.nbytes() / comm.worldSize();
             runExchange(e, comm, ExchangeKind::kAllToAll, input, chunk, output, chunk, chunk, 0,
                         DataType::kFloat32, ReduceOp::kSum, protocol);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("protocol") = std::nullopt)
      .def("broadcast",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output, int root,
              const std::optional<std::string>& protocol) {
             checkPair(comm, input, output);
             PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                             input.numel());
             runExchange(e, comm, ExchangeKind::kBroadcast, input, 0, output, 0, input.nbytes(), root,
                         DataType::kFloat32, ReduceOp::kSum, protocol);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("src"), py::arg("protocol") = std::nullopt)
      .def("select", [](const CollectiveEngine& e, uint64_t bytes) { return allReduceAlgorithmName(e.select(bytes)); },
           py::arg("nbytes"), "The all-reduce algorithm chosen for a message of nbytes.")
      .def("select_exchange",
           [](const CollectiveEngine& e, const std::string& collective, uint64_t bytes) {
             return protocolName(e.selectExchange(exchangeKindOf(collective), bytes));
           },
           py::arg("collective"), py::arg("nbytes"),
           "The protocol chosen for an exchange (all_gather, all_to_all, broadcast, reduce_scatter) whose whole "
           "buffer has nbytes.")
      .def_property_readonly("ll_max_bytes", [](const CollectiveEngine& e) { return e.options().llMaxBytes; })
      .def("close", &CollectiveEngine::close);
}

}  // namespace pyccl
