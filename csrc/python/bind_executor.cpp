// Python bindings of the plan executor (pyccl/plans.py builds its arguments
// from a JSON plan).
#include <torch/extension.h>

#include "core/errors.hpp"
#include "executor/executor.hpp"
#include "executor/plan_runners.hpp"
#include "python/bindings.hpp"
#include "torch/tensor_collectives.hpp"

namespace py = pybind11;

namespace pyccl {

void bindExecutor(py::module_& m) {
  py::class_<PlanExecutor, std::shared_ptr<PlanExecutor>>(m, "PlanExecutor")
      .def(py::init([](Communicator& comm, const at::Tensor& ops, std::vector<int32_t> tbOffsets,
                       std::vector<int32_t> channelSrc, std::vector<int32_t> channelDst,
                       std::vector<int32_t> signalsPerCall, int32_t inputChunks, int32_t outputChunks,
                       int32_t scratchChunks, bool inPlace, bool stageInput, bool stageOutput, bool entryBarrier,
                       uint64_t maxChunkBytes, uint32_t threads, const std::string& name) {
             constexpr int64_t kWords = kPlanOpWords;
             PYCCL_CHECK_ARG(ops.device().is_cpu() && ops.scalar_type() == at::kInt && ops.is_contiguous() &&
                                 ops.dim() == 2 && ops.size(1) == kWords,
                             "ops", "must be a contiguous int32 CPU tensor of shape (n, ", kWords, ")");
             PlanProgram p;
             p.ops.resize(ops.size(0));
             std::memcpy(p.ops.data(), ops.data_ptr<int32_t>(), ops.numel() * 4);
             p.tbOffsets = std::move(tbOffsets);
             p.channelSrc = std::move(channelSrc);
             p.channelDst = std::move(channelDst);
             p.signalsPerCall = std::move(signalsPerCall);
             p.inputChunks = inputChunks;
             p.outputChunks = outputChunks;
             p.scratchChunks = scratchChunks;
             p.inPlace = inPlace;
             p.stageInput = stageInput;
             p.stageOutput = stageOutput;
             p.entryBarrier = entryBarrier;
             p.name = "plan " + name;
             py::gil_scoped_release release;
             return std::make_shared<PlanExecutor>(comm, std::move(p), maxChunkBytes, threads);
           }),
           py::arg("comm"), py::arg("ops"), py::arg("tb_offsets"), py::arg("channel_src"), py::arg("channel_dst"),
           py::arg("signals_per_call"), py::arg("input_chunks"), py::arg("output_chunks"), py::arg("scratch_chunks"),
           py::arg("in_place"), py::arg("stage_input"), py::arg("stage_output"),
           py::arg("entry_barrier"), py::arg("max_chunk_bytes"), py::arg("threads") = 512, py::arg("name") = "",
           py::keep_alive<1, 2>())
      .def("run",
           [](PlanExecutor& e, Communicator& comm, const std::optional<std::string>& collective,
              const at::Tensor& input, const at::Tensor& output, const std::string& op, bool reduces) {
             std::optional<Collective> c;
             if (collective) c = parseCollective(*collective, "collective");
             const ReduceOp rop = reduceOpOf(op);
             py::gil_scoped_release release;
             runPlanTensor(e, comm, c, input, output, rop, reduces);
           },
           py::arg("comm"), py::arg("collective"), py::arg("tensor"), py::arg("out"), py::arg("op") = "sum",
           py::arg("reduces") = true,
           "Runs the plan, as a call of `collective` (None: a plan of no collective pyccl names), on the current "
           "stream (avg: the sum divided by the world size after it).")
      .def_property_readonly("max_chunk_bytes", &PlanExecutor::maxChunkBytes)
      .def_property_readonly("calls", &PlanExecutor::calls,
                             "Calls run so far, from every entry point (Python, the call runtime, torch.ops).")
      .def_property_readonly("num_thread_blocks", &PlanExecutor::numThreadBlocks)
      .def("threads_for", &PlanExecutor::threadsFor, py::arg("input_bytes"),
           "Threads per block that a GPU call with this many input bytes runs on (whole warps for its "
           "largest op, at most the executor's threads).")
      .def("close", &PlanExecutor::close);

  py::class_<PlanRunners, std::shared_ptr<PlanRunners>>(
      m, "PlanRunners",
      "A communicator's set-up plans, by the selector's slot (executor/plan_runners.hpp): what every entry point "
      "of the communicator runs a plan choice on.")
      .def(py::init<>())
      .def(
          "add",
          [](PlanRunners& r, const std::string& key, std::shared_ptr<PlanExecutor> executor, bool reduces,
             uint64_t inputChunks, uint64_t outputChunks) {
            PYCCL_CHECK_ARG(executor != nullptr, "executor", "must be a PlanExecutor");
            PYCCL_CHECK_ARG(inputChunks >= 1 && outputChunks >= 1, "input_chunks", "chunk counts must be positive");
            r.add(key, SetUpPlan{std::move(executor), reduces, inputChunks, outputChunks});
          },
          py::arg("key"), py::arg("executor"), py::arg("reduces"), py::arg("input_chunks"), py::arg("output_chunks"))
      .def("keys", &PlanRunners::keys)
      .def("clear", &PlanRunners::clear);
}

}  // namespace pyccl
