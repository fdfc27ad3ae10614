#include "torch/tensor_collectives.hpp"

#ifdef PYCCL_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

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

}  // namespace

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

DataType reductionTypeOf(const at::Tensor& t, const char* arg) {
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
                     const at::Tensor& output, ReduceOp op, std::optional<AllReduceAlgorithm> algorithm) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  const DataType dtype = reductionTypeOf(input, "tensor");
  e.allReduce(input.data_ptr(), output.data_ptr(), static_cast<uint64_t>(input.numel()), dtype, op, algorithm,
              currentStream(comm));
}

void allGatherTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(output.numel() == input.numel() * comm.worldSize(), "out", "has ", output.numel(),
                  " elements; an all-gather of ", input.numel(), " over ", comm.worldSize(), " ranks needs ",
                  input.numel() * comm.worldSize());
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
  const DataType dtype = reductionTypeOf(input, "tensor");
  const uint64_t chunk = output.nbytes();
  runExchange(e, comm, ExchangeKind::kReduceScatter, input, chunk, output, 0, chunk, 0, dtype, op, protocol);
}

void allToAllTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                    const at::Tensor& output, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  PYCCL_CHECK_ARG(input.numel() % comm.worldSize() == 0, "tensor", "has ", input.numel(),
                  " elements, not a multiple of the world size ", comm.worldSize());
  const uint64_t chunk = input.nbytes() / comm.worldSize();
  runExchange(e, comm, ExchangeKind::kAllToAll, input, chunk, output, chunk, chunk, 0, DataType::kFloat32,
              ReduceOp::kSum, protocol);
}

void broadcastTensor(CollectiveEngine& e, const Communicator& comm, const at::Tensor& input,
                     const at::Tensor& output, int root, std::optional<Protocol> protocol) {
  checkPair(comm, input, output);
  PYCCL_CHECK_ARG(input.numel() == output.numel(), "out", "has ", output.numel(), " elements, the input ",
                  input.numel());
  runExchange(e, comm, ExchangeKind::kBroadcast, input, 0, output, 0, input.nbytes(), root, DataType::kFloat32,
              ReduceOp::kSum, protocol);
}

}  // namespace pyccl
