// Reductions of the dtypes pyccl's kernels do not reduce (float64, the
// integers NCCL reduces, float8, bool), over one row per rank that an all-gather or
// all-to-all of the engine brought together (tensor_collectives.cpp), in
// ATen on the current stream. The semantics, NCCL's, are at the top of
// gathered_reductions.cpp.
#pragma once

#include <ATen/ATen.h>

#include "device/reduce_types.hpp"

namespace pyccl {

/// Whether tensors of `st` are reduced by gathering: float64, int8, uint8, int32, uint32, int64, uint64,
/// float8_e4m3fn, float8_e5m2, bool.
bool reducesByGathering(at::ScalarType st);
/// InvalidArgument naming 'op' where `op` does not apply to `st` (avg of bool), before anything runs.
void checkGatheredReduction(at::ScalarType st, ReduceOp op);
/// The reduction of `rows` ([world, n], one row per rank in rank order) over its first dimension: n elements.
at::Tensor reduceOverRanks(const at::Tensor& rows, ReduceOp op);

}  // namespace pyccl
