// Point-to-point sends and receives over the collective engine's scratch: what
// ncclSend and ncclRecv do, one call or a group of them (as between
// ncclGroupStart and ncclGroupEnd) in one launch.
//
// Every rank's scratch holds, for every source rank, p2pBlocks rings of
// p2pSlots slots of [16-byte header | p2pSliceBytes of data]. A transfer of
// `bytes` runs on the same number of blocks on each side, its lanes (p2pShape:
// one per p2pMinPieceBytes, at most p2pBlocks), each with its ring; step k
// moves bytes [(k * lanes + b) * piece, + piece) through lane b's ring, where
// the piece is the slice, or less when one step holds the whole transfer
// (possibly nothing: every lane takes every step, so the two sides count
// alike). Both sides derive the shape from the size alone, and the engines
// agree on p2pBlocks, so the n-th send meets the n-th receive lane by lane.
// For its n-th chunk (n counted per peer, direction and lane, in device
// memory), lane b of the sender
//   1. waits until the receiver handed the slot back: the ack count it stores
//      into the sender's scratch has reached n - p2pSlots + 1 (acquire);
//   2. stores its piece and the header (the transfer's size) into the slot in
//      the receiver's scratch;
//   3. stores the ready count n + 1 into the receiver's scratch (release).
// Block b of the receiver acquires ready >= n + 1, checks the header against
// its own size (a mismatch is recorded and breaks the communicator: the two
// sides would no longer agree on the counts), copies the piece out and stores
// the ack count n + 1 into the sender's scratch (release, after every thread's
// loads of the slot).
//
// The counts carry on across calls and CUDA-graph replays, so no host
// synchronization is needed, and the n-th send to a peer meets the n-th
// receive from this rank there, as in NCCL. A send of at most p2pSlots steps
// completes without its receive having started; a larger one waits for it
// (two ranks that both send a large message before receiving need a group).
#pragma once

#include "collectives/collective_context.hpp"

namespace pyccl {

/// Transfers in one launch: a send to and a receive from every peer.
constexpr int kMaxP2PTransfers = 2 * (kMaxCollectiveRanks - 1);
/// Bytes of a slot's header (the transfer's size), before its data.
constexpr uint64_t kP2PHeaderBytes = 16;

/// Per-lane bytes of a step below which a transfer takes no further lane.
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
/// peer's and has its size checked).
struct P2PShape {
  uint32_t lanes;
  uint64_t piece;
  uint64_t steps;
};

namespace detail {

/// The slot of `source`'s ring `block` in `owner`'s scratch that holds chunk `chunk`.
PYCCL_HOST_DEVICE char* p2pSlot(const CollectiveContext& c, int owner, int source, uint32_t block, uint64_t chunk) {
  const uint64_t ring = static_cast<uint64_t>(source) * c.p2pBlocks + block;
  return c.scratch[owner] + c.p2pDataOffset +
         (ring * c.p2pSlots + chunk % c.p2pSlots) * (kP2PHeaderBytes + c.p2pSliceBytes);
}

/// The count word of (`peer`, `block`) in `owner`'s scratch, in the region at `offset` (ready or ack).
PYCCL_HOST_DEVICE uint64_t* p2pCount(const CollectiveContext& c, int owner, uint64_t offset, int peer,
                                     uint32_t block) {
  return reinterpret_cast<uint64_t*>(c.scratch[owner] + offset) + static_cast<uint64_t>(peer) * c.p2pBlocks + block;
}

/// Bytes [begin, begin + length) of a transfer of shape `s` that lane `lane` moves in step `step`.
PYCCL_HOST_DEVICE void p2pPiece(const P2PShape& s, uint64_t bytes, uint64_t step, uint32_t lane, uint64_t* begin,
                                uint64_t* length) {
  *begin = (step * s.lanes + lane) * s.piece;
  *length = *begin >= bytes ? 0 : (bytes - *begin < s.piece ? bytes - *begin : s.piece);
}

}  // namespace detail

/// The shape of a transfer of `bytes`, a function of the size and the
/// engine's p2pBlocks and p2pSliceBytes only, so that both sides cut alike:
/// a lane per kP2PMinPieceBytes (or slice, if smaller) up to p2pBlocks, and
/// pieces of the slice, or of the transfer spread over its lanes (16-byte
/// multiples) where one step holds it. A transfer that takes fewer than
/// p2pBlocks lanes takes one step, so every transfer of up to
/// p2pSlots * p2pBlocks * p2pSliceBytes fits its rings.
PYCCL_HOST_DEVICE P2PShape p2pShape(const CollectiveContext& c, uint64_t bytes) {
  const uint64_t minPiece = c.p2pSliceBytes < kP2PMinPieceBytes ? c.p2pSliceBytes : kP2PMinPieceBytes;
  const uint64_t wanted = (bytes + minPiece - 1) / minPiece;
  const uint32_t lanes = wanted < 1 ? 1u : (wanted > c.p2pBlocks ? c.p2pBlocks : static_cast<uint32_t>(wanted));
  const uint64_t spread = ((bytes + lanes - 1) / lanes + 15) / 16 * 16;
  const uint64_t piece = spread < c.p2pSliceBytes ? (spread < 16 ? 16 : spread) : c.p2pSliceBytes;
  const uint64_t perStep = lanes * piece;
  return P2PShape{lanes, piece, bytes == 0 ? 1 : (bytes + perStep - 1) / perStep};
}

/// Lane `block`'s share of a send (see the top of this file).
PYCCL_HOST_DEVICE void p2pSendBlock(const CollectiveContext& c, const P2PTransfer& t, uint32_t block, uint32_t tid,
                                    uint32_t numThreads) {
  uint64_t* sent = &c.p2pSent[static_cast<uint64_t>(t.peer) * c.p2pBlocks + block];
  const uint64_t first = *sent;
  const P2PShape shape = p2pShape(c, t.bytes);
  const uint64_t* acks = detail::p2pCount(c, c.rank, c.p2pAckOffset, t.peer, block);
  uint64_t* ready = detail::p2pCount(c, t.peer, c.p2pReadyOffset, c.rank, block);
  for (uint64_t k = 0; k < shape.steps; ++k) {
    const uint64_t chunk = first + k;
    bool ok = true;
    if (tid == 0 && chunk >= c.p2pSlots) {
      uint64_t seen = 0;
      ok = spinUntilAtLeast(acks, chunk - c.p2pSlots + 1, c.abort, t.peer, &seen) == WaitStatus::kOk;
    }
    // Acquired by thread 0, the receiver's loads of the slot happen before every thread's stores below.
    if (!detail::blockAll(ok)) return;  // the communicator is broken: its counts no longer matter
    char* slot = detail::p2pSlot(c, t.peer, c.rank, block, chunk);
    uint64_t begin = 0, length = 0;
    detail::p2pPiece(shape, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(slot + kP2PHeaderBytes, t.data + begin, length, tid, numThreads);
    if (tid == 0) *reinterpret_cast<uint64_t*>(slot) = t.bytes;
    syncBlock();  // the block's stores happen before the releasing store below (cumulativity)
    if (tid == 0) atomicStoreRelease(ready, chunk + 1);
  }
  syncBlock();  // every thread read `first` before it changes
  if (tid == 0) *sent = first + shape.steps;
}

/// Lane `block`'s share of a receive (see the top of this file).
PYCCL_HOST_DEVICE void p2pReceiveBlock(const CollectiveContext& c, const P2PTransfer& t, uint32_t block,
                                       uint32_t tid, uint32_t numThreads) {
  uint64_t* received = &c.p2pReceived[static_cast<uint64_t>(t.peer) * c.p2pBlocks + block];
  const uint64_t first = *received;
  const P2PShape shape = p2pShape(c, t.bytes);
  const uint64_t* ready = detail::p2pCount(c, c.rank, c.p2pReadyOffset, t.peer, block);
  uint64_t* ack = detail::p2pCount(c, t.peer, c.p2pAckOffset, c.rank, block);
  for (uint64_t k = 0; k < shape.steps; ++k) {
    const uint64_t chunk = first + k;
    const char* slot = detail::p2pSlot(c, c.rank, t.peer, block, chunk);
    bool ok = true;
    if (tid == 0) {
      uint64_t seen = 0;
      ok = spinUntilAtLeast(ready, chunk + 1, c.abort, t.peer, &seen) == WaitStatus::kOk;
      const uint64_t sentBytes = ok ? *reinterpret_cast<const uint64_t*>(slot) : t.bytes;
      if (sentBytes != t.bytes) {
        c.abort.record(WaitStatus::kMismatch, t.peer, t.bytes, sentBytes);
        ok = false;
      }
    }
    // Acquired by thread 0, the sender's stores into the slot happen before every thread's loads below.
    if (!detail::blockAll(ok)) return;
    uint64_t begin = 0, length = 0;
    detail::p2pPiece(shape, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(t.data + begin, slot + kP2PHeaderBytes, length, tid, numThreads);
    syncBlock();  // every thread's loads of the slot happen before it is handed back
    if (tid == 0) atomicStoreRelease(ack, chunk + 1);
  }
  syncBlock();
  if (tid == 0) *received = first + shape.steps;
}

/// Block `blockIndex` of a launch of `a` (a block per lane of each transfer, in order).
PYCCL_HOST_DEVICE void sendRecvBlock(const CollectiveContext& c, const P2PArgs& a, uint32_t blockIndex, uint32_t tid,
                                     uint32_t numThreads) {
  uint32_t i = 0;
  while (i + 1 < a.count && a.transfers[i + 1].firstBlock <= blockIndex) ++i;
  const P2PTransfer t = a.transfers[i];
  const uint32_t block = blockIndex - t.firstBlock;
  if (t.send != 0) {
    p2pSendBlock(c, t, block, tid, numThreads);
  } else {
    p2pReceiveBlock(c, t, block, tid, numThreads);
  }
}

}  // namespace pyccl
