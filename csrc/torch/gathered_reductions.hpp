// Reductions of the dtypes pyccl's kernels do not reduce (float64, the
// integers NCCL reduces, bool): an all-gather or all-to-all of the engine,
// then ATen over the ranks, on the caller's stream. The semantics, NCCL's,
// are at the top of gathered_reductions.cpp.
#pragma once

#include <ATen/ATen.h>

#include "collectives/collective_engine.hpp"

namespace pyccl {

/// Whether tensors of `st` are reduced by gathering: float64, int8, uint8, int32, uint32, int64, uint64, bool.
bool reducesByGathering(at::ScalarType st);
/// InvalidArgument naming 'op' where `op` does not apply to `st` (avg of bool), before anything runs.
void checkGatheredReduction(at::ScalarType st, ReduceOp op);
/// All-reduce of `input` into `output` (same numel and dtype; may be `input`) over `world` ranks on `stream`.
void allReduceByGathering(CollectiveEngine& e, const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                          int world, void* stream);
/// Reduce-scatter of `input` (world * output.numel() elements) into `output` over `world` ranks on `stream`.
void reduceScatterByGathering(CollectiveEngine& e, const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                              int world, void* stream);

}  // namespace pyccl
