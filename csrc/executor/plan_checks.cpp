#include "executor/plan_checks.hpp"

#include "core/errors.hpp"
#include "executor/plan_format.hpp"

namespace pyccl {
namespace {

/// Whether every source and destination chunk of `op` (at least one) has the same chunk count.
bool oneChunkSize(const PlanOp& op) {
  const int32_t count = op.numSrcs > 0 ? op.srcs[0].count : op.dsts[0].count;
  for (int s = 0; s < op.numSrcs; ++s) {
    if (op.srcs[s].count != count) return false;
  }
  for (int d = 0; d < op.numDsts; ++d) {
    if (op.dsts[d].count != count) return false;
  }
  return true;
}

}  // namespace

void checkPlanProgram(const PlanProgram& p, int world) {
  const int numTbs = static_cast<int>(p.tbOffsets.size()) - 1;
  PYCCL_CHECK_ARG(numTbs >= 1 && numTbs <= 1024, "plan", "needs 1 to 1024 thread blocks per rank, has ", numTbs);
  PYCCL_CHECK_ARG(p.tbOffsets.front() == 0 && p.tbOffsets.back() == static_cast<int32_t>(p.ops.size()), "plan",
                  "thread block offsets do not cover its ops");
  const int channels = static_cast<int>(p.channelDst.size());
  PYCCL_CHECK_ARG(static_cast<int>(p.channelSrc.size()) == channels &&
                      static_cast<int>(p.signalsPerCall.size()) >= channels,
                  "plan", "channel tables disagree");
  const int counters = static_cast<int>(p.signalsPerCall.size());
  auto chunkOk = [&](const PlanChunk& c) {
    const int32_t limit[3] = {p.inputChunks, p.inPlace ? p.inputChunks : p.outputChunks, p.scratchChunks};
    return c.rank >= 0 && c.rank < world && c.buffer >= 0 && c.buffer < 3 && c.index >= 0 && c.count > 0 &&
           static_cast<int64_t>(c.index) + c.count <= limit[c.buffer];
  };
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const PlanOp& op = p.ops[i];
    const bool ok = op.kind >= 0 && op.kind < static_cast<int32_t>(PlanOpKind::kCount) && op.numSrcs >= 0 &&
                    op.numSrcs <= kPlanMaxOperands && op.numDsts >= 0 && op.numDsts <= kPlanMaxOperands &&
                    op.numChannels >= 0 && op.numChannels <= kPlanMaxOperands;
    PYCCL_CHECK_ARG(ok, "plan", "op ", i, " is malformed");
    // What each kind reads of srcs[0] and dsts[0] must be there; pairs come whole.
    const auto kind = static_cast<PlanOpKind>(op.kind);
    const bool moves = kind == PlanOpKind::kCopy || kind == PlanOpKind::kPut || kind == PlanOpKind::kPutPackets;
    const bool paired = moves || kind == PlanOpKind::kUnpack;
    if (paired || kind == PlanOpKind::kReduceTo) {
      PYCCL_CHECK_ARG(op.numSrcs >= 1 && op.numDsts >= 1, "plan", "op ", i, " needs a source and a destination");
      // One source for every destination (moves only), or one per destination (pairs).
      PYCCL_CHECK_ARG(!paired || op.numSrcs == op.numDsts || (moves && op.numSrcs == 1), "plan", "op ", i, " pairs ",
                      op.numSrcs, " sources with ", op.numDsts, " destinations");
      PYCCL_CHECK_ARG(oneChunkSize(op), "plan", "op ", i, paired ? " moves" : " reduces", " chunks of different sizes");
    }
    if (kind == PlanOpKind::kReducePackets || kind == PlanOpKind::kReducePutPackets) {
      // reduce_packets: the packet sources, and the destination (then where it starts);
      // reduce_put_packets: where it starts then the packet sources, the destination then the packet destinations.
      const bool puts = kind == PlanOpKind::kReducePutPackets;
      PYCCL_CHECK_ARG(puts ? op.numSrcs >= 2 && op.numDsts >= 2 : op.numSrcs >= 1 && op.numDsts >= 1 && op.numDsts <= 2,
                      "plan", "op ", i, " has ", op.numSrcs, " sources and ", op.numDsts, " destinations");
      PYCCL_CHECK_ARG(oneChunkSize(op), "plan", "op ", i, " reduces chunks of different sizes");
    }
    // Packet chunks live in the packet region, which has one slot per scratch chunk.
    auto packetChunk = [&](bool isSource, int k) {
      switch (kind) {
        case PlanOpKind::kPutPackets: return !isSource;
        case PlanOpKind::kUnpack:
        case PlanOpKind::kReducePackets: return isSource;
        case PlanOpKind::kReducePutPackets: return k >= 1;
        default: return false;
      }
    };
    for (int s = 0; s < op.numSrcs; ++s) {
      PYCCL_CHECK_ARG(!packetChunk(true, s) || op.srcs[s].buffer == 2, "plan", "op ", i,
                      " reads packets outside the scratch buffer");
    }
    for (int d = 0; d < op.numDsts; ++d) {
      PYCCL_CHECK_ARG(!packetChunk(false, d) || op.dsts[d].buffer == 2, "plan", "op ", i,
                      " writes packets outside the scratch buffer");
    }
    for (int s = 0; s < op.numSrcs; ++s) PYCCL_CHECK_ARG(chunkOk(op.srcs[s]), "plan", "op ", i, " reads out of range");
    for (int d = 0; d < op.numDsts; ++d) PYCCL_CHECK_ARG(chunkOk(op.dsts[d]), "plan", "op ", i, " writes out of range");
    for (int k = 0; k < op.numChannels; ++k) {
      PYCCL_CHECK_ARG(op.channels[k] >= 0 && op.channels[k] < channels, "plan", "op ", i, " names no channel");
    }
    if (static_cast<PlanOpKind>(op.kind) == PlanOpKind::kBarrier) {
      PYCCL_CHECK_ARG(op.ordinals[0] >= 0 && channels + op.ordinals[0] < counters, "plan", "op ", i,
                      " names no barrier group");
    }
  }
  for (int ch = 0; ch < channels; ++ch) {
    PYCCL_CHECK_ARG(p.channelDst[ch] >= -1 && p.channelDst[ch] < world, "plan", "channel ", ch, " has no rank");
  }
}

std::string planAcrossNodesRefusal(const PlanProgram& p, int rank, uint64_t remote) {
  auto far = [&](const PlanChunk& c) { return ((remote >> c.rank) & 1u) != 0; };
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const PlanOp& op = p.ops[i];
    const auto kind = static_cast<PlanOpKind>(op.kind);
    const bool put = kind == PlanOpKind::kPut || kind == PlanOpKind::kCopy;
    bool anyFarDst = false;
    for (int d = 0; d < op.numDsts; ++d) anyFarDst = anyFarDst || far(op.dsts[d]);
    for (int s = 0; s < op.numSrcs; ++s) {
      const PlanChunk& c = op.srcs[s];
      if (far(c) || (anyFarDst && c.rank != rank)) {
        return strCat("op ", i, " reads rank ", c.rank, "'s memory",
                      far(c) ? ", which is on another node" : " for a put to another node",
                      "; across nodes a plan may only put its own data and signal (PortChannel)");
      }
    }
    for (int d = 0; d < op.numDsts; ++d) {
      if (!put && far(op.dsts[d])) {
        return strCat("op ", i, " writes rank ", op.dsts[d].rank,
                      "'s memory directly, but that rank is on another node; across nodes a plan may only put ",
                      "and signal (PortChannel)");
      }
    }
  }
  return std::string();
}

}  // namespace pyccl
