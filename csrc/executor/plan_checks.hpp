// What a plan must be for the interpreter to run it: checked when an executor
// is made, so that a malformed plan is refused by name instead of crashing a kernel.
#pragma once

#include <cstdint>
#include <string>

#include "executor/executor.hpp"

namespace pyccl {

/// Throws InvalidArgument ('plan') unless `p` is a program the interpreter can
/// run on `world` ranks: thread block offsets, channels, chunks within their
/// buffers, operand counts and chunk sizes per op kind.
void checkPlanProgram(const PlanProgram& p, int world);

/// Across nodes the interpreter only puts and signals to another node's ranks
/// (through the proxy, from this rank's own buffers); why this rank's ops
/// break that rule (`remote`: a bit per rank on another node), or empty where they keep it.
std::string planAcrossNodesRefusal(const PlanProgram& p, int rank, uint64_t remote);

}  // namespace pyccl
