// Python bindings of the collectives: tensors in, checks at the call (naming
// the argument), then the engine on the current CUDA stream.
#include <torch/extension.h>

#include <algorithm>

#include "engine/collective_engine.hpp"
#include "core/errors.hpp"
#include "python/bindings.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

std::optional<Protocol> protocolArg(const std::optional<std::string>& name) {
  if (!name || name->empty()) return std::nullopt;
  return parseProtocol(*name, "protocol");
}

}  // namespace

std::optional<AllReduceAlgorithm> allReduceAlgorithmArg(const std::optional<std::string>& name, const char* arg) {
  if (!name || name->empty()) return std::nullopt;
  return parseAllReduceAlgorithm(*name, arg);
}

namespace {

/// CollectiveEngine's keywords: every row of PYCCL_COLLECTIVE_OPTIONS by its Python name (None: the default), and
/// kernel_choices, exchange_ll_threshold_bytes and agreed_settings.
void applyOptionKeywords(CollectiveOptions& o, const py::kwargs& kwargs) {
  const auto& infos = collectiveOptionInfos();
  std::optional<KernelChoices> kernelChoices;
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::cast<std::string>(key);
    if (name == "kernel_choices") {
      kernelChoices = value.cast<KernelChoices>();
      continue;
    }
    if (name == "agreed_settings") {
      o.agreedSettings = value.cast<std::map<std::string, std::string>>();
      continue;
    }
    if (name == "exchange_ll_threshold_bytes") {
      const auto values = value.cast<std::vector<uint64_t>>();
      PYCCL_CHECK_ARG(values.empty() || values.size() == 4, "exchange_ll_threshold_bytes",
                      "needs 4 values (all_gather, all_to_all, broadcast, reduce_scatter), got ", values.size());
      for (size_t k = 0; k < values.size(); ++k) o.exchangeLLThresholdBytes[k] = values[k];
      continue;
    }
    const auto info = std::find_if(infos.begin(), infos.end(), [&](const auto& i) { return name == i.name; });
    if (info == infos.end()) {
      std::string known;
      for (const auto& i : infos) known += strCat(known.empty() ? "" : ", ", i.name);
      throw InvalidArgument(strCat("invalid argument '", name, "': not an engine option (options: ", known,
                                   ", kernel_choices, exchange_ll_threshold_bytes, agreed_settings)"));
    }
    if (value.is_none()) continue;  // the default
    const bool isInt = py::isinstance<py::int_>(value);
    PYCCL_CHECK_ARG(info->isBool ? py::isinstance<py::bool_>(value) : isInt && !py::isinstance<py::bool_>(value),
                    info->name, "must be ", info->isBool ? "True or False" : "a whole number", " or None, got ",
                    py::cast<std::string>(py::repr(value)));
    PYCCL_CHECK_ARG(isInt ? value.cast<py::int_>() >= py::int_(0) : true, info->name,
                    "must not be negative, got ", py::cast<std::string>(py::repr(value)));
    PYCCL_CHECK_ARG(!isInt || value.cast<py::int_>() <= py::int_(UINT64_MAX), info->name,
                    "is too large: ", py::cast<std::string>(py::repr(value)));
    const uint64_t v = info->isBool ? (value.cast<bool>() ? 1 : 0) : value.cast<uint64_t>();
    PYCCL_CHECK_ARG(!info->unset || *info->unset == 0 || v != *info->unset, info->name,
                    "is out of range (None: the default), got ", v);
    info->set(o, v);
  }
  if (kernelChoices) applyKernelChoices(o, *kernelChoices);
}

/// The engine's docstring: its keywords by use.
const std::string& engineDoc() {
  static const std::string doc = [] {
    std::string user, experiment;
    for (const auto& i : collectiveOptionInfos()) {
      (i.use == OptionUse::kUser ? user : experiment) += strCat("  ", i.name, "\n");
    }
    return strCat("A collective engine on `comm` (collective: every rank makes one with the same options, else ",
                  "InvalidArgumentError naming the first that differs). Keywords, each None or absent for its ",
                  "default (csrc/engine/collective_options.hpp says what each does):\n", user,
                  "  kernel_choices (a tuning table's kernel entries), exchange_ll_threshold_bytes (4 values), ",
                  "agreed_settings (the caller's settings every rank must share)\n",
                  "Experiments (they may change or go):\n", experiment);
  }();
  return doc;
}

}  // namespace

void bindCollectives(py::module_& m) {
  m.attr("FUSED_MAX_BYTES") = kFusedMaxBytes;
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

  m.def(
      "check_out_placement",
      [](const std::string& collective, const at::Tensor& input, const at::Tensor& output, int rank) {
        checkOutPlacement(outPlacementOf(parseCollective(collective, "collective")), input, output, rank);
      },
      py::arg("collective"), py::arg("tensor"), py::arg("out"), py::arg("rank"),
      "InvalidArgumentError naming 'out' where it overlaps the input other than in place, as the engine checks.");

  py::class_<CollectiveEngine, std::shared_ptr<CollectiveEngine>>(m, "CollectiveEngine")
      .def(py::init([](Communicator& comm, const py::kwargs& kwargs) {
             CollectiveOptions o;
             applyOptionKeywords(o, kwargs);
             py::gil_scoped_release release;
             return std::make_shared<CollectiveEngine>(comm, o);
           }),
           py::arg("comm"), py::keep_alive<1, 2>(), engineDoc().c_str())
      .def("register_symmetric", &CollectiveEngine::registerSymmetric, py::arg("memory"),
           py::call_guard<py::gil_scoped_release>(),
           "Collective: makes a registration (the same size on every rank) a symmetric buffer.")
      .def("is_symmetric",
           [](const CollectiveEngine& e, const at::Tensor& t) {
             return t.numel() > 0 && e.isSymmetric(t.data_ptr(), t.nbytes());
           },
           py::arg("tensor"), "Whether the tensor's bytes lie within one symmetric buffer.")
      .def("all_reduce",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::string& op, const std::optional<std::string>& algorithm,
              const std::optional<std::string>& symmetricAlgorithm) {
             const ReduceOp rop = reduceOpOf(op);
             const auto algo = allReduceAlgorithmArg(algorithm, "algorithm");
             const auto symmetricAlgo = allReduceAlgorithmArg(symmetricAlgorithm, "symmetric_algorithm");
             py::gil_scoped_release release;
             allReduceTensor(e, comm, input, output, rop, algo, symmetricAlgo);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("algorithm") = std::nullopt, py::arg("symmetric_algorithm") = std::nullopt,
           "All-reduce enqueued on the current stream; `symmetric_algorithm` (where given) is used instead of "
           "`algorithm` when input and output lie in symmetric buffers or the call is captured on graph buffers.")
      .def("all_reduce_rmsnorm",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& residual,
              const at::Tensor& weight, const at::Tensor& normed, const at::Tensor& residualOut, double eps,
              const std::optional<std::string>& algorithm) {
             std::optional<FusedNormAlgorithm> algo;
             if (algorithm && !algorithm->empty()) algo = parseFusedNormAlgorithm(*algorithm, "algorithm");
             py::gil_scoped_release release;
             allReduceRMSNormTensor(e, comm, input, residual, weight, normed, residualOut, eps, algo);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("residual"), py::arg("weight"), py::arg("out"),
           py::arg("residual_out"), py::arg("eps"), py::arg("algorithm") = std::nullopt,
           "All-reduce (sum) + residual add + RMSNorm over the last dimension, in one kernel or two.")
      .def("select_fused",
           [](const CollectiveEngine& e, uint64_t rows, uint64_t rowBytes) {
             return fusedNormAlgorithmName(e.selectFused(rows, rowBytes));
           },
           py::arg("rows"), py::arg("row_bytes"), "The fused algorithm chosen for rows of row_bytes.")
      .def("fused_launch",
           [](const CollectiveEngine& e, uint64_t rows, uint64_t rowBytes, const std::string& algorithm) {
             const auto launch = e.fusedLaunchFor(rows, rowBytes, parseFusedNormAlgorithm(algorithm, "algorithm"));
             return std::make_pair(launch.segments, launch.threads);
           },
           py::arg("rows"), py::arg("row_bytes"), py::arg("algorithm"),
           "(blocks per row, threads per block) of the fused kernel for rows x row_bytes.")
      .def_property_readonly("fused_max_row_bytes", &CollectiveEngine::fusedMaxRowBytes,
                             "The longest row (bytes) the fused kernel takes.")
      .def("all_gather",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::optional<std::string>& protocol) {
             const auto proto = protocolArg(protocol);
             py::gil_scoped_release release;
             allGatherTensor(e, comm, input, output, proto);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("protocol") = std::nullopt)
      .def("reduce_scatter",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::string& op, const std::optional<std::string>& protocol) {
             const ReduceOp rop = reduceOpOf(op);
             const auto proto = protocolArg(protocol);
             py::gil_scoped_release release;
             reduceScatterTensor(e, comm, input, output, rop, proto);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("protocol") = std::nullopt)
      .def("all_to_all",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output,
              const std::optional<std::string>& protocol) {
             const auto proto = protocolArg(protocol);
             py::gil_scoped_release release;
             allToAllTensor(e, comm, input, output, proto);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("protocol") = std::nullopt)
      .def("broadcast",
           [](CollectiveEngine& e, Communicator& comm, const at::Tensor& input, const at::Tensor& output, int root,
              const std::optional<std::string>& protocol) {
             const auto proto = protocolArg(protocol);
             py::gil_scoped_release release;
             broadcastTensor(e, comm, input, output, root, proto);
           },
           py::arg("comm"), py::arg("tensor"), py::arg("out"), py::arg("src"), py::arg("protocol") = std::nullopt)
      .def("send_recv",
           [](CollectiveEngine& e, Communicator& comm, const std::vector<std::tuple<bool, int, at::Tensor>>& transfers) {
             std::vector<TensorTransfer> list;
             list.reserve(transfers.size());
             for (const auto& [send, peer, tensor] : transfers) list.push_back({send, peer, tensor});
             py::gil_scoped_release release;
             sendRecvTensors(e, comm, list);
           },
           py::arg("comm"), py::arg("transfers"),
           "Sends and receives together on the current stream: transfers are (send, peer, tensor), send True to "
           "send the tensor to peer, False to receive it from peer.")
      .def("select",
           [](const CollectiveEngine& e, uint64_t bytes, bool symmetric) {
             return allReduceAlgorithmName(e.select(bytes, symmetric));
           },
           py::arg("nbytes"), py::arg("symmetric") = false,
           "The all-reduce algorithm chosen for a message of nbytes (symmetric: in symmetric buffers).")
      .def("select_exchange",
           [](const CollectiveEngine& e, const std::string& collective, uint64_t bytes) {
             return protocolName(e.selectExchange(parseExchangeKind(collective, "collective"), bytes));
           },
           py::arg("collective"), py::arg("nbytes"),
           "The protocol chosen for an exchange (all_gather, all_to_all, broadcast, reduce_scatter) whose whole "
           "buffer has nbytes.")
      .def_property_readonly("ll_max_bytes", [](const CollectiveEngine& e) { return e.options().llMaxBytes; })
      .def_property_readonly("p2p_buffered_bytes",
                             [](const CollectiveEngine& e) {
                               const CollectiveOptions& o = e.options();
                               return static_cast<uint64_t>(o.p2pSlots) * o.p2pBlocks * o.p2pSliceBytes;
                             },
                             "The largest send that completes before its receive starts.")
      .def_property_readonly("p2p_ll_max_bytes", [](const CollectiveEngine& e) { return e.options().p2pLLMaxBytes; },
                             "Sends and receives of at most this many bytes go as LL packets.")
      .def_property_readonly("p2p_lanes", [](const CollectiveEngine& e) { return e.options().p2pBlocks; },
                             "Most lanes (blocks) of a send or receive: p2p_blocks, or fewer where a launch with "
                             "every peer would not stay resident on some rank's GPU.")
      .def_property_readonly("zero_copy_calls", &CollectiveEngine::zeroCopyCalls,
                             "All-reduces that ran zero-copy on symmetric buffers.")
      .def("begin_graph_capture", &CollectiveEngine::beginGraphCapture,
           "Starts collecting graph buffers: all-reduces captured from here on plain tensors may run zero-copy.")
      .def("finish_graph_capture", &CollectiveEngine::finishGraphCapture, py::call_guard<py::gil_scoped_release>(),
           "Collective, after the capture: registers the captured calls' tensors; returns how many calls.")
      .def("abandon_graph_capture", &CollectiveEngine::abandonGraphCapture,
           "Ends the collection without registering (the graph must not be replayed).")
      .def_property_readonly("graph_capturing", &CollectiveEngine::graphCapturing)
      .def_property_readonly("graph_buffer_calls", &CollectiveEngine::graphBufferCalls,
                             "Captured all-reduces registered on graph buffers so far.")
      .def_property_readonly("zero_copy_threshold_bytes",
                             [](const CollectiveEngine& e) { return e.options().zeroCopyThresholdBytes; })
      .def("close", &CollectiveEngine::close);
}

}  // namespace pyccl
