#include "torch/tensor_collectives.hpp"

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>

#include "core/errors.hpp"

namespace pyccl {
namespace {

void checkPair(const Communicator& comm, const at::Tensor& input, const at::Tensor& output) {
  checkTensorFor(comm, input, "tensor");
  checkTensorFor(comm, output, "out");
  PYCCL_CHECK_ARG(input.scalar_type() == output.scalar_type(), "out", "dtype ", dtypeName(output.scalar_type()),
                  " differs from the input's ", dtypeName(input.scalar_type()));
}

void runExchange(CollectiveEngine& e, const Communicator& comm, ExchangeKind kind, const at::Tensor& input,
                 uint64_t inStride, const at::Tensor& output, uint64_t outStride, uint64_t chunkBytes, int root,
                 DataType dtype, ReduceOp op, std::optional<Protocol> protocol) {
  e.exchange(kind, input.data_ptr(), inStride, output.data_ptr(), outStride, chunkBytes, root, dtype, op, protocol,
             currentStream(comm));
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

void checkOutPlacement(OutPlacement placement, const at::Tensor& input, const at::Tensor& output, int rank) {
  if (!overlaps(input, output)) return;
  const auto* in = static_cast<const char*>(input.data_ptr());
  const auto* out = static_cast<const char*>(output.data_ptr());
  switch (placement) {
    case OutPlacement::kSameOrApart:
      PYCCL_CHECK_ARG(in == out && input.nbytes() == output.nbytes(), "out",
                      "partly overlaps the input; pass the input itself (in place) or memory apart from it");
      return;
    case OutPlacement::kInputAtRankChunk:
      PYCCL_CHECK_ARG(in == out + rank * input.nbytes(), "out",
                      "overlaps the input, which is not out's chunk ", rank, " (in place, the input is out[", rank,
                      " * n:", rank + 1, " * n] for an input of n elements)");
      return;
    case OutPlacement::kOutputAtRankChunk:
      PYCCL_CHECK_ARG(out == in + rank * output.nbytes(), "out",
                      "overlaps the input but is not the input's chunk ", rank, " (in place, out is tensor[", rank,
                      " * n:", rank + 1, " * n] for an out of n elements)");
      return;
  }
}

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
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    default: return strCat("torch ", c10::toString(t));
  }
}

namespace {

/// The kernels' dtype of `st`, where they reduce it (bool aside).
std::optional<DataType> kernelTypeOf(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return DataType::kFloat32;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kDouble: return DataType::kFloat64;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kInt: return DataType::kInt32;
    case at::kUInt32: return DataType::kUInt32;
    case at::kLong: return DataType::kInt64;
    case at::kUInt64: return DataType::kUInt64;
    case at::kFloat8_e4m3fn: return DataType::kFloat8E4M3;
    case at::kFloat8_e5m2: return DataType::kFloat8E5M2;
    default: return std::nullopt;
  }
}

}  // namespace

bool reduces(at::ScalarType st) { return st == at::kBool || kernelTypeOf(st).has_value(); }

std::pair<DataType, ReduceOp> reductionOf(const at::Tensor& t, ReduceOp op, const char* arg) {
  if (t.scalar_type() == at::kBool) {
    PYCCL_CHECK_ARG(op != ReduceOp::kAvg, "op",
                    "avg does not apply to bool tensors (sum and max give any, prod and min give all)");
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
    return {DataType::kUInt8, any ? ReduceOp::kMax : ReduceOp::kMin};
  }
  const std::optional<DataType> dtype = kernelTypeOf(t.scalar_type());
  if (!dtype) {
    throw TypeError(strCat("invalid argument '", arg, "': all_reduce and reduce_scatter reduce float32, float16, "
                           "bfloat16, float64, int8, uint8, int32, uint32, int64, uint64, float8_e4m3fn, "
                           "float8_e5m2 and bool, got ", dtypeName(t.scalar_type())));
  }
  return {*dtype, op};
}

DataType floatTypeOf(const at::Tensor& t, const char* arg, const char* what) {
  if (!isFloatDtype(t.scalar_type())) {
    throw TypeError(strCat("invalid argument '", arg, "': ", what, " float32, float16 and bfloat16, got ",
                           dtypeName(t.scalar_type())));
  }
  return *kernelTypeOf(t.scalar_type());
}

ReduceOp reduceOpOf(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "avg") return ReduceOp::kAvg;
  if (op == "min") return ReduceOp::kMin;
  if (op == "max") return ReduceOp::kMax;
  if (op == "prod" || op == "product") return ReduceOp::kProd;
  throw InvalidArgument(
      strCat("invalid argument 'op': '", op, "' is not a reduction (expected sum, avg, min, max or prod)"));
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

void* currentStream(const Communicator& comm) {
#ifdef PYCCL_WITH_CUDA
  if (!comm.hostMode()) return c10::cuda::getCurrentCUDAStream(comm.device()).stream();
#endif
  return nullptr;
}

void allReduceTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, ReduceOp op, std::optional<AllReduceAlgorithm> algorithm,
                     std::optional<AllReduceAlgorithm> symmetricAlgorithm) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  checkOutPlacement(OutPlacement::kSameOrApart, input, output, comm.rank());
  const auto [dtype, kernelOp] = reductionOf(input, op, "tensor");
  e.allReduce(input.data_ptr(), output.data_ptr(), static_cast<uint64_t>(input.numel()), dtype, kernelOp, algorithm,
              currentStream(comm), symmetricAlgorithm);
}

void allGatherTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(output.numel() == input.numel() * comm.worldSize(), "out", "has ", output.numel(),
                  " elements; an all-gather of ", input.numel(), " over ", comm.worldSize(), " ranks needs ",
                  input.numel() * comm.worldSize());
  checkOutPlacement(OutPlacement::kInputAtRankChunk, input, output, comm.rank());
  const uint64_t chunk = input.nbytes();
  runExchange(e, comm, ExchangeKind::kAllGather, input, 0, output, chunk, chunk, 0, DataType::kFloat32,
              ReduceOp::kSum, protocol);
}

void reduceScatterTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                         const at::Tensor& output, ReduceOp op, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel() * comm.worldSize(), "out", "has ", output.numel(),
                  " elements; a reduce-scatter of ", input.numel(), " over ", comm.worldSize(), " ranks gives each ",
                  input.numel() / comm.worldSize(),
                  input.numel() % comm.worldSize() ? " (and the input must divide evenly)" : "");
  checkOutPlacement(OutPlacement::kOutputAtRankChunk, input, output, comm.rank());
  const auto [dtype, kernelOp] = reductionOf(input, op, "tensor");
  const uint64_t chunk = output.nbytes();
  runExchange(e, comm, ExchangeKind::kReduceScatter, input, chunk, output, 0, chunk, 0, dtype, kernelOp, protocol);
}

void allToAllTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                    const at::Tensor& output, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  PYCCL_CHECK_ARG(input.numel() % comm.worldSize() == 0, "tensor", "has ", input.numel(),
                  " elements, not a multiple of the world size ", comm.worldSize());
  checkOutPlacement(OutPlacement::kSameOrApart, input, output, comm.rank());
  const uint64_t chunk = input.nbytes() / comm.worldSize();
  runExchange(e, comm, ExchangeKind::kAllToAll, input, chunk, output, chunk, chunk, 0, DataType::kFloat32,
              ReduceOp::kSum, protocol);
}

void allReduceRMSNormTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                            const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& normed,
                            const at::Tensor& residualOut, double eps, std::optional<FusedNormAlgorithm> algorithm) {
  const DataType dtype = floatTypeOf(input, "tensor", "the fused all-reduce + RMSNorm takes");
  PYCCL_CHECK_ARG(input.dim() >= 1, "tensor", "must have at least one dimension (rows x hidden)");
  const struct {
    const at::Tensor& t;
    const char* name;
  } all[] = {{input, "tensor"}, {residual, "residual"}, {weight, "weight"}, {normed, "out"},
             {residualOut, "residual_out"}};
  for (const auto& [t, name] : all) {
    checkTensorFor(comm, t, name);
    PYCCL_CHECK_ARG(t.scalar_type() == input.scalar_type(), name, "dtype ", dtypeName(t.scalar_type()),
                    " differs from the input's ", dtypeName(input.scalar_type()));
    if (&t != &weight) {
      PYCCL_CHECK_ARG(t.sizes() == input.sizes(), name, "has shape ", t.sizes(), ", the input ", input.sizes());
    }
  }
  const int64_t hidden = input.size(-1);
  PYCCL_CHECK_ARG(weight.dim() == 1 && weight.numel() == hidden, "weight", "must have shape [", hidden,
                  "] (the input's last dimension), got ", weight.sizes());
  PYCCL_CHECK_ARG(std::isfinite(eps) && eps >= 0, "eps", "must be finite and >= 0, got ", eps);
  if (input.numel() == 0) return;
  // In place as the engines do it: the normalized rows over the input, the new residual over the old.
  const struct {
    const at::Tensor& a;
    const at::Tensor& b;
    const char* name;
  } pairs[] = {{normed, residual, "out"}, {normed, weight, "out"}, {normed, residualOut, "out"},
               {residualOut, input, "residual_out"}, {residualOut, weight, "residual_out"},
               {input, residual, "residual"}, {input, weight, "weight"}, {residual, weight, "weight"}};
  for (const auto& [a, b, name] : pairs) PYCCL_CHECK_ARG(!overlaps(a, b), name, "overlaps another argument");
  PYCCL_CHECK_ARG(!overlaps(normed, input) || normed.data_ptr() == input.data_ptr(), "out",
                  "must be the input itself or not overlap it");
  PYCCL_CHECK_ARG(!overlaps(residualOut, residual) || residualOut.data_ptr() == residual.data_ptr(),
                  "residual_out", "must be the residual itself or not overlap it");
  e.allReduceRMSNorm(input.data_ptr(), residual.data_ptr(), weight.data_ptr(), normed.data_ptr(),
                     residualOut.data_ptr(), static_cast<uint64_t>(input.numel() / hidden),
                     static_cast<uint64_t>(hidden), static_cast<float>(eps), dtype, algorithm, currentStream(comm));
}

void broadcastTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, int root, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  checkOutPlacement(OutPlacement::kSameOrApart, input, output, comm.rank());
  runExchange(e, comm, ExchangeKind::kBroadcast, input, 0, output, 0, input.nbytes(), root, DataType::kFloat32,
              ReduceOp::kSum, protocol);
}

OutPlacement outPlacementOf(Collective c) {
  switch (c) {
    case Collective::kAllGather: return OutPlacement::kInputAtRankChunk;
    case Collective::kReduceScatter: return OutPlacement::kOutputAtRankChunk;
    default: return OutPlacement::kSameOrApart;
  }
}

void runPlanTensor(PlanExecutor& plan, const Communicator& comm, std::optional<Collective> c,
                   const at::Tensor& input, const at::Tensor& output, ReduceOp op, bool reduces) {
  checkTensorFor(comm, input, "tensor");
  checkTensorFor(comm, output, "out");
  PYCCL_CHECK_ARG(input.scalar_type() == output.scalar_type(), "out", "has dtype ", dtypeName(output.scalar_type()),
                  ", the input ", dtypeName(input.scalar_type()));
  if (c) checkOutPlacement(outPlacementOf(*c), input, output, comm.rank());
  const DataType dtype =
      reduces ? floatTypeOf(input, "tensor", "plans reduce (the built-in kernels reduce the other dtypes)")
              : DataType::kFloat32;
  const bool average = reduces && op == ReduceOp::kAvg;
  plan.run(input.data_ptr(), input.nbytes(), output.data_ptr(), output.nbytes(), dtype, input.element_size(),
           average ? ReduceOp::kSum : op, currentStream(comm), reduces);
  if (average) output.div_(comm.worldSize());
}

void sendRecvTensors(CollectiveEngine& e, const Communicator& comm, const std::vector<TensorTransfer>& transfers) {
  std::vector<CollectiveEngine::PeerTransfer> peerTransfers;
  peerTransfers.reserve(transfers.size());
  for (size_t i = 0; i < transfers.size(); ++i) {
    const TensorTransfer& t = transfers[i];
    checkTensorFor(comm, t.tensor, "tensor");
    for (size_t j = 0; j < i; ++j) {
      const TensorTransfer& o = transfers[j];
      const bool written = !t.send || !o.send;  // two sends may read the same memory
      PYCCL_CHECK_ARG(!written || t.tensor.nbytes() == 0 || o.tensor.nbytes() == 0 || !overlaps(t.tensor, o.tensor),
                      "tensor", "a received tensor overlaps another tensor of the call (transfers ", j, " and ", i,
                      ")");
    }
    peerTransfers.push_back({t.send, t.peer, t.tensor.data_ptr(), static_cast<uint64_t>(t.tensor.nbytes())});
  }
  e.sendRecv(peerTransfers, currentStream(comm));
}

TableDtype tableDtypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return TableDtype::kFloat32;
    case at::kHalf: return TableDtype::kFloat16;
    case at::kBFloat16: return TableDtype::kBFloat16;
    default: return TableDtype::kOther;
  }
}


}  // namespace pyccl
