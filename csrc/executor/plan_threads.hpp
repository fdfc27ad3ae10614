// How many threads per block a call of a plan runs on.
//
// Every thread of a block steps through every op of the block (dispatch,
// operand addresses, the op's loop bounds) whether or not the op leaves it
// any data, and that per-warp cost is what made small LL plans slower than
// their kernels: on 2 x H200, 1PA LL at 1 KiB took 3.60 us on 512 threads,
// 6.12 on 1024 and 3.09 on 128 (the kernel: 2.99). So a call runs on as many
// whole warps as its largest op has work items for (packets, 16-byte
// vectors, channels), up to the executor's thread count. No thread then gets
// more items than it would on the full block; the rest would only wait.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "channels/packet_device.hpp"          // packetsFor, LL16Packet
#include "device/kernel_launch.hpp"     // wholeWarpsFor
#include "executor/plan_format.hpp"

namespace pyccl {

/// Chunks that op `op` moves per operand (its loop runs over this many).
inline uint64_t planOpChunks(const PlanOp& op) {
  int32_t count = 0;
  if (op.numSrcs > 0) count = std::max(count, op.srcs[0].count);
  if (op.numDsts > 0) count = std::max(count, op.dsts[0].count);
  return static_cast<uint64_t>(std::max(count, 1));
}

/// Iterations of op `op`'s loop that one thread would make alone, in a call
/// with chunks of `chunkBytes`: LL packets for packet ops, 16-byte vectors
/// for copies and reductions, channels for signals and waits, 1 for the rest.
inline uint64_t planOpWorkItems(const PlanOp& op, uint64_t chunkBytes) {
  const uint64_t bytes = planOpChunks(op) * chunkBytes;
  switch (static_cast<PlanOpKind>(op.kind)) {
    case PlanOpKind::kPutPackets:
    case PlanOpKind::kUnpack:
    case PlanOpKind::kReducePackets:
    case PlanOpKind::kReducePutPackets:
      return packetsFor<LL16Packet>(bytes);
    case PlanOpKind::kCopy:
    case PlanOpKind::kPut:
    case PlanOpKind::kReduce:
    case PlanOpKind::kReducePut:
    case PlanOpKind::kSwitchReduce:
    case PlanOpKind::kReduceTo:
    case PlanOpKind::kChannelReduce:
      return (bytes + 15) / 16;
    case PlanOpKind::kSignal:
    case PlanOpKind::kWait:
      return static_cast<uint64_t>(std::max(op.numChannels, 1));
    default:
      return 1;
  }
}

/// Threads per block for a call: whole warps, one per 32 work items of the
/// largest op of any block or of a block's share of the staging copies
/// (`stagingBytesPerBlock`), at least one warp and at most `maxThreads` (a
/// multiple of 32).
inline uint32_t planCallThreads(const std::vector<PlanOp>& ops, uint64_t chunkBytes, uint64_t stagingBytesPerBlock,
                                uint32_t maxThreads) {
  uint64_t items = (stagingBytesPerBlock + 15) / 16;
  for (const PlanOp& op : ops) {
    items = std::max(items, planOpWorkItems(op, chunkBytes));
    if (items >= maxThreads) return maxThreads;
  }
  return wholeWarpsFor(items, maxThreads);
}

}  // namespace pyccl
