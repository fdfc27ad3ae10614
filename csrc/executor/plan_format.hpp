// The binary form of an execution plan that the interpreter runs: one
// fixed-size PlanOp per op, and the context of one call. The op kinds, codes,
// limits and word layout are defined once, in src/pyccl/dsl/plan_format.py,
// from which the build writes executor/plan_codes.hpp; pyccl/plans.py packs
// plans by the same definitions. PlanOp mirrors that layout, as the checks
// below its definition assert.
#pragma once

#include <cstddef>
#include <cstdint>

#include "channels/device_common.hpp"
#include "channels/fifo_device.hpp"
#include "channels/inbox_device.hpp"
#include "device/reduce_types.hpp"
#include "executor/plan_codes.hpp"

namespace pyccl {

/// The table slot of every rank on another node: they share it, as their
/// buffers are offsets into a region laid out like this rank's.
constexpr int kPlanFarSlot = kPlanMaxLocalRanks;

struct PlanChunk {
  int32_t rank;
  int32_t buffer;  ///< PlanBuffer
  int32_t index;
  int32_t count;
};

struct PlanOp {
  int32_t kind;      ///< PlanOpKind
  int32_t reduceOp;  ///< kPlanCallReduction: the call's reduction, else ReduceOp
  int32_t numSrcs;
  int32_t numDsts;
  int32_t numChannels;
  /// kSignal / kWait: the semaphore count to add or reach in this call,
  /// per channel (the ordinal of the signal/wait within one call, plus one).
  /// kBarrier: [group, ordinal + 1, group size].
  int32_t ordinals[kPlanMaxOperands];
  int32_t channels[kPlanMaxOperands];
  /// kSignal: the rank whose counter each channel's signal adds to; kWait:
  /// the rank that signals it (named when the wait gives up).
  int32_t peers[kPlanMaxOperands];
  /// kSignal, kWait: signals per call on each channel; kBarrier: [0] arrivals per call.
  int32_t perCall[kPlanMaxOperands];
  PlanChunk srcs[kPlanMaxOperands];
  PlanChunk dsts[kPlanMaxOperands];
};
static_assert(sizeof(PlanChunk) == 4 * kPlanChunkWords, "a chunk is plan_format.py's CHUNK_WORDS");
static_assert(sizeof(PlanOp) == 4 * kPlanOpWords, "PlanOp is plan_format.py's OP_WORDS int32s");
static_assert(offsetof(PlanOp, reduceOp) == 4 * kPlanOpReduceOpWord && offsetof(PlanOp, numSrcs) == 4 * kPlanOpNumSrcsWord &&
                  offsetof(PlanOp, numDsts) == 4 * kPlanOpNumDstsWord &&
                  offsetof(PlanOp, numChannels) == 4 * kPlanOpNumChannelsWord &&
                  offsetof(PlanOp, ordinals) == 4 * kPlanOpOrdinalsWord &&
                  offsetof(PlanOp, channels) == 4 * kPlanOpChannelsWord &&
                  offsetof(PlanOp, peers) == 4 * kPlanOpPeersWord && offsetof(PlanOp, perCall) == 4 * kPlanOpPerCallWord &&
                  offsetof(PlanOp, srcs) == 4 * kPlanOpSrcsWord && offsetof(PlanOp, dsts) == 4 * kPlanOpDstsWord,
              "PlanOp's fields lie where plan_format.py's OP_FIELDS puts them");
static_assert(static_cast<int>(ReduceOp::kSum) == kPlanReduceSum && static_cast<int>(ReduceOp::kAvg) == kPlanReduceAvg &&
                  static_cast<int>(ReduceOp::kMin) == kPlanReduceMin && static_cast<int>(ReduceOp::kMax) == kPlanReduceMax &&
                  static_cast<int>(ReduceOp::kProd) == kPlanReduceProd,
              "ReduceOp has plan_format.py's REDUCE_OPS codes");

/// What one call of a plan needs; plain data, passed by value.
struct PlanContext {
  int rank;
  int worldSize;
  uint64_t chunkBytes;  ///< bytes per chunk in this call
  /// The table slot of each rank: ranks of this node in rank order, then
  /// kPlanFarSlot for every rank of another node.
  int8_t slot[kPlanMaxRanks];
  /// Every slot's buffers, mapped here, by call parity: [call & 1][slot][PlanBuffer].
  /// Staging regions (input, output, scratch) are double-buffered, as a peer
  /// may still be finishing the previous call in the other phase; this rank's
  /// unstaged buffers are the call's tensors in both phases (the host sets
  /// them per call, so a kernel does no set-up after its PDL wait).
  char* buffers[2][kPlanMaxLocalRanks + 1][3];
  /// Every slot's LL packet region (2 phases x scratch chunks x 2 x chunk bytes).
  char* packets[kPlanMaxLocalRanks + 1];
  uint64_t packetPhaseBytes;
  /// Every slot's semaphore counters: [channel] then [barrier group].
  uint64_t* counters[kPlanMaxLocalRanks + 1];
  const PlanOp* ops;
  const int32_t* tbOffsets;     ///< ops of thread block t: [tbOffsets[t], tbOffsets[t + 1])
  const int32_t* channelDst;    ///< the rank whose counter a channel's signal adds to
  const int32_t* channelSrc;    ///< the rank that signals a channel (named when a wait gives up)
  const int32_t* signalsPerCall;  ///< per channel; then barrier arrivals per call per group
  int32_t numChannels;
  int32_t numThreadBlocks;
  /// Counters from here: one per rank (call entries, added by that rank), then
  /// this rank's "entry passed" and rank-barrier counters.
  int32_t entryBase;
  bool inPlace;       ///< the output buffer is the input buffer
  bool inputStaged;   ///< this call's input is copied into staging (else the plan works on the user's tensor)
  bool outputStaged;  ///< the plan writes the output staging, copied out at the end (else the user's tensor)
  bool entryBarrier;  ///< the ranks meet before the ops (plans.py decides when the plan's own waits suffice)
  /// The call first copies its input into the buffer the plan reads it from
  /// (its staging, or the output of an in-place plan).
  bool copiesInput;
  /// Packet ops always take their any-shape form (plan_packets.hpp), for
  /// tests and comparisons: PYCCL_PLAN_GENERIC_PACKETS=1 when the executor is made.
  bool genericPacketOps;
  /// Bit slot * 3 + PlanBuffer: that buffer differs between the two phases.
  /// The others (the call's own tensors) are addressed without the call
  /// count, so loads from them need not wait for it to load.
  uint32_t phasedBuffers;
  const char* userInput;  ///< this call's tensors
  char* userOutput;
  uint64_t inputBytes;
  uint64_t outputBytes;
  uint64_t* calls;           ///< [thread block] calls completed (this rank's memory)
  uint64_t* rankBarriers;    ///< [thread block] rank barriers passed (this rank's memory)
  uint64_t* failed;          ///< non-zero once a wait of this executor gave up (this rank's memory)
  AbortState abort;
  /// Across nodes. Bit q: rank q is not reachable by loads and stores (another
  /// node); its slot is kPlanFarSlot, whose buffers hold offsets into its
  /// region, not pointers, and puts and signals to it go through the proxy.
  uint64_t remoteRanks;
  const char* regionBase;                 ///< this rank's region (proxy puts name offsets into it)
  FifoDeviceHandle fifo;                  ///< this communicator's proxy
  int16_t proxyChannel[kPlanMaxRanks];    ///< the proxy's channel to each remote rank (< kTriggerMaxChannels)
  /// The send mirror (host memory, the region's layout): a put to another
  /// node copies its source here, and the proxy sends from here.
  char* sendMirror;
  /// Counters that ranks on other nodes add to (host memory, the indexes of
  /// counters[rank]): their receiver threads write them.
  uint64_t* farCounters;
  InboxDeviceHandle inbox;  ///< their puts, applied by the waits (channels/inbox_device.hpp)
};

}  // namespace pyccl
