// Point-to-point sends and receives of the collective engine, as the engine
// sees them: one launch's transfers, how a transfer is cut (both sides derive
// it from the size alone), and the launch on CPU threads (host mode) or on a
// stream. p2p.cu holds the protocol and its bodies.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/collective_context.hpp"
#include "device/kernel_launch.hpp"

namespace pyccl {

/// Transfers in one launch: a send to and a receive from every peer.
constexpr int kMaxP2PTransfers = 2 * (kMaxCollectiveRanks - 1);
/// Bytes of an HB slot's header (the transfer's size, and the chunk's number + 1), before its data.
constexpr uint64_t kP2PHeaderBytes = 16;

/// Per-lane bytes of an HB step below which a transfer takes no further lane.
constexpr uint64_t kP2PMinPieceBytes = 4096;

/// One send or receive of a launch.
struct P2PTransfer {
  char* data;      ///< read (send) or written (receive); any alignment
  uint64_t bytes;  ///< 0 moves only the header
  int32_t peer;
  uint32_t send;        ///< 1: send to `peer`; 0: receive from it
  uint32_t firstBlock;  ///< its lanes run on blocks [firstBlock, firstBlock + p2pShape(bytes).lanes)
};

/// A launch: `blocks` blocks in all; no two transfers share a (peer, direction).
struct P2PArgs {
  uint32_t count;
  uint32_t blocks;
  P2PTransfer transfers[kMaxP2PTransfers];
};

/// How a transfer is cut: `lanes` rings, `piece` bytes per lane and step,
/// `steps` steps (at least one, so that an empty transfer still meets its
/// peer's and has its size checked); `ll`: as packets (one step).
struct P2PShape {
  uint32_t lanes;
  uint64_t piece;
  uint64_t steps;
  bool ll;
};

namespace detail {

/// Ceiling of a / b, rounded up to a multiple of 8 (an LL16 packet's data).
PYCCL_HOST_DEVICE uint64_t p2pPacketPiece(uint64_t a, uint64_t b) { return ((a + b - 1) / b + 7) / 8 * 8; }

/// Lanes of a transfer of `bytes`: one per `perLane` bytes (rounded up), at least one, at most `blocks`.
PYCCL_HOST_DEVICE uint32_t p2pLanes(uint64_t bytes, uint64_t perLane, uint32_t blocks) {
  const uint64_t wanted = (bytes + perLane - 1) / perLane;
  return wanted < 1 ? 1u : (wanted > blocks ? blocks : static_cast<uint32_t>(wanted));
}

}  // namespace detail

/// The shape of a transfer of `bytes`, a function of the size and the
/// engine's p2pBlocks, p2pSliceBytes, p2pLLMaxBytes and p2pLLLaneBytes only,
/// so that both sides cut alike.
///  - LL (bytes <= p2pLLMaxBytes): a lane per p2pLLLaneBytes up to p2pBlocks,
///    the transfer spread over them (multiples of 8 bytes), one step.
///  - HB: a lane per kP2PMinPieceBytes (or slice, if smaller) up to
///    p2pBlocks, and pieces of the slice, or of the transfer spread over its
///    lanes (16-byte multiples) where one step holds it. A transfer that takes
///    fewer than p2pBlocks lanes takes one step, so every transfer of up to
///    p2pSlots * p2pBlocks * p2pSliceBytes fits its rings.
PYCCL_HOST_DEVICE P2PShape p2pShape(const CollectiveContext& c, uint64_t bytes) {
  if (bytes <= c.p2pLLMaxBytes) {
    const uint32_t lanes = detail::p2pLanes(bytes, c.p2pLLLaneBytes, c.p2pBlocks);
    return P2PShape{lanes, detail::p2pPacketPiece(bytes, lanes), 1, true};
  }
  const uint64_t minPiece = c.p2pSliceBytes < kP2PMinPieceBytes ? c.p2pSliceBytes : kP2PMinPieceBytes;
  const uint32_t lanes = detail::p2pLanes(bytes, minPiece, c.p2pBlocks);
  const uint64_t spread = ((bytes + lanes - 1) / lanes + 15) / 16 * 16;
  const uint64_t piece = spread < c.p2pSliceBytes ? (spread < 16 ? 16 : spread) : c.p2pSliceBytes;
  const uint64_t perStep = lanes * piece;
  return P2PShape{lanes, piece, bytes == 0 ? 1 : (bytes + perStep - 1) / perStep, false};
}

/// Packets per LL slot (the header and the largest piece) for these limits:
/// the engine sizes its scratch with it.
PYCCL_HOST_DEVICE uint64_t p2pLLSlotPackets(uint64_t llMaxBytes, uint64_t laneBytes, uint32_t blocks) {
  const uint64_t oneLane = detail::p2pPacketPiece(llMaxBytes < laneBytes ? llMaxBytes : laneBytes, 1);
  const uint64_t spread = detail::p2pPacketPiece(llMaxBytes, blocks);
  return 1 + (oneLane > spread ? oneLane : spread) / LL16Packet::kDataBytes;
}

/// Runs one launch's transfers on CPU threads (args.blocks of them) and returns when they are done.
void sendRecvHost(const CollectiveContext& context, const P2PArgs& args);
#ifdef PYCCL_WITH_CUDA
/// Enqueues sends and receives on args.blocks blocks.
void sendRecvDevice(const CollectiveContext& context, const P2PArgs& args, void* stream, const KernelLaunch& launch);
/// Blocks of the send/receive kernel of `threads` threads that `device` holds at once.
uint32_t sendRecvResidentBlocks(int device, uint32_t threads);
/// Appends the host stub of the send/receive kernel (core/kernel_loading.hpp).
void sendRecvKernels(std::vector<const void*>* out);
#endif

}  // namespace pyccl
