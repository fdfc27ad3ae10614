// Collectives on torch tensors: the checks every entry point makes (naming
// the argument) and the calls into a CollectiveEngine on the current CUDA
// stream. Shared by the Python bindings and the c10d backend. None of these
// touch the GIL; callers that hold it release it around them.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/selector.hpp"
#include "engine/collective_engine.hpp"
#include "executor/executor.hpp"

namespace pyccl {

/// torch's name of a dtype ("torch.int32", not c10's "Int").
std::string dtypeName(at::ScalarType t);
/// float32, float16 and bfloat16: the dtypes of plans, of the fused all-reduce + RMSNorm and of the
/// collectives across nodes.
inline bool isFloatDtype(at::ScalarType st) { return st == at::kFloat || st == at::kHalf || st == at::kBFloat16; }
/// Whether allReduceTensor and reduceScatterTensor reduce tensors of `st`: every dtype NCCL reduces (float32,
/// float16, bfloat16, float64, int8, uint8, int32, uint32, int64, uint64, float8_e4m3fn, float8_e5m2), and
/// bool as ProcessGroupNCCL reduces it.
bool reduces(at::ScalarType st);
/// What the kernels reduce for a reduction `op` of `t`: its dtype, and the op; bool as uint8 0/1 bytes, sum
/// and max giving "any", prod and min "all" (ProcessGroupNCCL's mapping). TypeError naming `arg` for a dtype
/// that does not reduce; InvalidArgument naming 'op' for avg of bool.
std::pair<DataType, ReduceOp> reductionOf(const at::Tensor& t, ReduceOp op, const char* arg);
/// The dtype of `t` for the float-only calls (isFloatDtype); otherwise TypeError naming `arg`, saying
/// "<what> float32, float16 and bfloat16".
DataType floatTypeOf(const at::Tensor& t, const char* arg, const char* what);
/// "sum", "avg", "min", "max", "prod"; InvalidArgument otherwise.
ReduceOp reduceOpOf(const std::string& op);
/// Contiguous and on the communicator's device; InvalidArgument naming `arg` otherwise.
void checkTensorFor(const Communicator& comm, const at::Tensor& t, const char* arg);
/// Where a collective's output may lie against its input: the input itself
/// or apart (all-reduce, all-to-all, broadcast); apart, or holding the input
/// as this rank's chunk (all-gather in place); apart, or as this rank's chunk
/// of the input (reduce-scatter in place). Any other overlap would have peers'
/// writes land on data this rank has yet to send.
enum class OutPlacement { kSameOrApart, kInputAtRankChunk, kOutputAtRankChunk };
/// InvalidArgument naming 'out' where `output` overlaps `input` other than as
/// `placement` allows; `rank` is this rank in the communicator.
void checkOutPlacement(OutPlacement placement, const at::Tensor& input, const at::Tensor& output, int rank);
/// Where the output of a call of `c` may lie against its input.
OutPlacement outPlacementOf(Collective c);
/// The current CUDA stream of the communicator's device (nullptr in host mode).
void* currentStream(const Communicator& comm);

/// The selector's table dtype of `t` (dispatch/selector.hpp).
TableDtype tableDtypeOf(const at::Tensor& t);

/// `symmetricAlgorithm`: as CollectiveEngine::allReduce takes it. Every dtype of reduces() (reductionOf).
void allReduceTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, ReduceOp op, std::optional<AllReduceAlgorithm> algorithm,
                     std::optional<AllReduceAlgorithm> symmetricAlgorithm = std::nullopt);
/// output: world_size * input.numel() elements, rank order.
void allGatherTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, std::optional<Protocol> protocol);
/// input: world_size * output.numel() elements.
void reduceScatterTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                         const at::Tensor& output, ReduceOp op, std::optional<Protocol> protocol);
/// Equal splits: input.numel() a multiple of world_size.
void allToAllTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                    const at::Tensor& output, std::optional<Protocol> protocol);
/// The fused all-reduce (sum) + residual add + RMSNorm over the last
/// dimension (CollectiveEngine::allReduceRMSNorm). `residual`, `normed` and
/// `residualOut` have the input's shape and dtype, `weight` the last
/// dimension; `normed` may be the input and `residualOut` the residual, no
/// other two may overlap.
void allReduceRMSNormTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                            const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& normed,
                            const at::Tensor& residualOut, double eps, std::optional<FusedNormAlgorithm> algorithm);
/// One tensor sent to (`send`) or received from `peer` (sendRecvTensors).
struct TensorTransfer {
  bool send;
  int peer;
  at::Tensor tensor;
};
/// Sends and receives together (CollectiveEngine::sendRecv) on the current
/// stream: contiguous tensors of any dtype on the communicator's device; a
/// received tensor must not overlap another tensor of the call.
void sendRecvTensors(CollectiveEngine& e, const Communicator& comm, const std::vector<TensorTransfer>& transfers);
void broadcastTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, int root, std::optional<Protocol> protocol);
/// Runs the set-up plan `plan` of a call of `c` on `input` into `output`, on the current stream: both on the
/// communicator's device, of one dtype, placed as `c` allows (nullopt: a plan of no collective pyccl names, as
/// a send/receive pattern, placed as the plan says; the executor checks the sizes against the plan's chunks).
/// `reduces`: the plan reduces, with `op`; avg is the sum divided by the world size after it.
void runPlanTensor(PlanExecutor& plan, const Communicator& comm, std::optional<Collective> c,
                   const at::Tensor& input, const at::Tensor& output, ReduceOp op, bool reduces);

}  // namespace pyccl
