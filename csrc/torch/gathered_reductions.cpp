// Reductions of the dtypes pyccl's kernels do not reduce: float64, the
// integers NCCL reduces (int8, uint8, int32, uint32, int64, uint64), the
// float8 types (e4m3fn, e5m2), and bool as ProcessGroupNCCL reduces it.
//
// The kernels carry float32, float16 and bfloat16 only (reduce_types.hpp:
// fp32 accumulators). For the other dtypes a reduction is two steps on the
// caller's stream: an all-gather (all-reduce) or all-to-all (reduce-scatter)
// of the engine, which move any bytes, puts every rank's contribution in a
// [world, n] tensor (tensor_collectives.cpp); then the reduction here, in
// ATen, over the ranks. Every rank reduces
// the same rows in the same order, so the results agree bit for bit. The
// traffic is world times an all-reduce's, which suits the small tensors
// these dtypes carry in practice (DDP's map of unused parameters, counters,
// float64 statistics); on GPUs the "pyccl" process group hands them to its
// NCCL delegate where it has one.
//
// The results are NCCL's:
//   - integers wrap in their width (sum and product are taken in int64 and
//     truncated, which gives the same bits); min and max compare as the
//     type does (unsigned as unsigned);
//   - avg of integers is the wrapped sum divided by the world size,
//     truncated (NCCL's SumPostDiv);
//   - float64 sums and multiplies in rank order, avg is that sum divided by
//     the world size, as pyccl's float kernels do; min and max follow those
//     kernels' Reducer: NaN loses to any number, ties keep the earlier rank's;
//   - float8 as pyccl's kernels reduce 16-bit floats: in fp32, in rank order,
//     rounded to the type once; sum, avg and prod saturate at the type's
//     largest finite value, as NCCL's fp8 conversions (satfinite) do, and NaN
//     stays NaN. NCCL itself rounds after every step of its ring or tree, so
//     its sums of more than two ranks may differ from these in the last bit;
//     these are the same on every rank;
//   - bool: sum and max are "any", prod and min "all" (ProcessGroupNCCL's
//     mapping); avg is refused, as there.
#include "torch/gathered_reductions.hpp"

#include <cstdint>
#include <limits>

#include "core/errors.hpp"

namespace pyccl {
namespace {

/// Integers other than uint64: computed in int64, where every value is exact, then truncated to `st`.
at::Tensor reduceIntegers(const at::Tensor& rows, ReduceOp op, int world, at::ScalarType st) {
  const at::Tensor wide = rows.to(at::kLong);
  switch (op) {
    case ReduceOp::kSum: return wide.sum(0, false, at::kLong).to(st);
    case ReduceOp::kProd: return wide.prod(0, false, at::kLong).to(st);
    case ReduceOp::kMin: return std::get<0>(wide.min(0)).to(st);
    case ReduceOp::kMax: return std::get<0>(wide.max(0)).to(st);
    case ReduceOp::kAvg: {
      // The sum wrapped in the type's width, read back as the type reads it, then divided.
      const at::Tensor wrapped = wide.sum(0, false, at::kLong).to(st).to(at::kLong);
      return at::div(wrapped, world, "trunc").to(st);
    }
  }
  return {};
}

/// uint64, on its bits as int64: sum and product wrap alike; flipping the sign bit orders them as unsigned.
at::Tensor reduceUInt64(const at::Tensor& rows, ReduceOp op, int world) {
  const at::Tensor bits = rows.view(at::kLong);
  const int64_t sign = std::numeric_limits<int64_t>::min();
  at::Tensor r;
  switch (op) {
    case ReduceOp::kSum: r = bits.sum(0, false, at::kLong); break;
    case ReduceOp::kProd: r = bits.prod(0, false, at::kLong); break;
    case ReduceOp::kMin: r = std::get<0>(bits.bitwise_xor(sign).min(0)).bitwise_xor(sign); break;
    case ReduceOp::kMax: r = std::get<0>(bits.bitwise_xor(sign).max(0)).bitwise_xor(sign); break;
    case ReduceOp::kAvg: {
      // u / w for u up to 2^64 - 1: with h = u >> 1 (logical) and b = u & 1, u = 2h + b, and
      // u / w = 2 (h / w) + (2 (h % w) + b) / w, every term within int64 but the first product, which wraps as
      // unsigned does.
      const at::Tensor s = bits.sum(0, false, at::kLong);
      const at::Tensor h = s.bitwise_right_shift(1).bitwise_and(std::numeric_limits<int64_t>::max());
      const at::Tensor b = s.bitwise_and(1);
      const at::Tensor q = at::div(h, world, "trunc");
      r = q * 2 + at::div((h - q * world) * 2 + b, world, "trunc");
      break;
    }
  }
  return r.view(at::kUInt64);
}

/// Floats in rank order, as the float kernels' Reducer takes it, in the precision of `rows`.
at::Tensor reduceFloats(const at::Tensor& rows, ReduceOp op, int world) {
  at::Tensor acc = rows[0].clone();
  for (int q = 1; q < world; ++q) {
    const at::Tensor x = rows[q];
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc.add_(x); break;
      case ReduceOp::kProd: acc.mul_(x); break;
      // NaN loses to any number; on ties the earlier rank's value stays (so -0 and +0 resolve alike everywhere).
      case ReduceOp::kMin: acc = at::where(x.lt(acc).logical_or(acc.isnan()), x, acc); break;
      case ReduceOp::kMax: acc = at::where(x.gt(acc).logical_or(acc.isnan()), x, acc); break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(static_cast<double>(world));
  return acc;
}

/// float8 in fp32 (reduceFloats), saturated where it was computed and rounded to `st` once.
at::Tensor reduceFloat8(const at::Tensor& rows, ReduceOp op, int world, at::ScalarType st) {
  at::Tensor acc = reduceFloats(rows.to(at::kFloat), op, world);
  if (op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kProd) {
    const double largest = st == at::kFloat8_e4m3fn ? static_cast<float>(std::numeric_limits<c10::Float8_e4m3fn>::max())
                                                    : static_cast<float>(std::numeric_limits<c10::Float8_e5m2>::max());
    acc.clamp_(-largest, largest);  // NaN stays NaN
  }
  return acc.to(st);
}

at::Tensor reduceBools(const at::Tensor& rows, ReduceOp op) {
  const at::Tensor bytes = rows.to(at::kByte);
  const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
  return std::get<0>(any ? bytes.max(0) : bytes.min(0)).to(at::kBool);
}

}  // namespace

at::Tensor reduceOverRanks(const at::Tensor& rows, ReduceOp op) {
  const at::ScalarType st = rows.scalar_type();
  const int world = static_cast<int>(rows.size(0));
  if (st == at::kBool) return reduceBools(rows, op);
  if (st == at::kDouble) return reduceFloats(rows, op, world);
  if (st == at::kFloat8_e4m3fn || st == at::kFloat8_e5m2) return reduceFloat8(rows, op, world, st);
  if (st == at::kUInt64) return reduceUInt64(rows, op, world);
  return reduceIntegers(rows, op, world, st);
}

bool reducesByGathering(at::ScalarType st) {
  switch (st) {
    case at::kDouble:
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kUInt32:
    case at::kLong:
    case at::kUInt64:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

void checkGatheredReduction(at::ScalarType st, ReduceOp op) {
  PYCCL_CHECK_ARG(st != at::kBool || op != ReduceOp::kAvg, "op",
                  "avg does not apply to bool tensors (sum and max give any, prod and min give all)");
}

}  // namespace pyccl
