// Point-to-point sends and receives over the collective engine's scratch: what
// ncclSend and ncclRecv do, one call or a group of them (as between
// ncclGroupStart and ncclGroupEnd) in one launch.
//
// Every rank's scratch holds, for every source rank, p2pBlocks rings of
// p2pSlots slots of [16-byte header | p2pSliceBytes of data]. A transfer runs
// on p2pBlocks blocks on each side, whatever its size; step k moves bytes
// [(k * p2pBlocks + b) * slice, + slice) through block b's ring (possibly
// none: every block takes every step, so the two sides count alike). For its
// n-th chunk (n counted per peer, direction and block, in device memory),
// block b of the sender
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

/// One send or receive of a launch.
struct P2PTransfer {
  char* data;      ///< read (send) or written (receive); any alignment
  uint64_t bytes;  ///< 0 moves only the header
  int32_t peer;
  uint32_t send;  ///< 1: send to `peer`; 0: receive from it
};

/// A launch: transfer t runs on blocks [t * p2pBlocks, (t + 1) * p2pBlocks);
/// no two transfers share a (peer, direction).
struct P2PArgs {
  uint32_t count;
  P2PTransfer transfers[kMaxP2PTransfers];
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

/// Bytes [begin, begin + length) of a transfer that block `block` moves in step `step`.
PYCCL_HOST_DEVICE void p2pPiece(const CollectiveContext& c, uint64_t bytes, uint64_t step, uint32_t block,
                                uint64_t* begin, uint64_t* length) {
  *begin = (step * c.p2pBlocks + block) * c.p2pSliceBytes;
  *length = *begin >= bytes ? 0 : (bytes - *begin < c.p2pSliceBytes ? bytes - *begin : c.p2pSliceBytes);
}

}  // namespace detail

/// Steps of a transfer of `bytes` (the same on both sides): at least one, so
/// that an empty transfer still meets its peer's and has its size checked.
PYCCL_HOST_DEVICE uint64_t p2pSteps(const CollectiveContext& c, uint64_t bytes) {
  const uint64_t perStep = static_cast<uint64_t>(c.p2pBlocks) * c.p2pSliceBytes;
  return bytes == 0 ? 1 : (bytes + perStep - 1) / perStep;
}

/// Block `block`'s share of a send (see the top of this file).
PYCCL_HOST_DEVICE void p2pSendBlock(const CollectiveContext& c, const P2PTransfer& t, uint32_t block, uint32_t tid,
                                    uint32_t numThreads) {
  uint64_t* sent = &c.p2pSent[static_cast<uint64_t>(t.peer) * c.p2pBlocks + block];
  const uint64_t first = *sent;
  const uint64_t steps = p2pSteps(c, t.bytes);
  const uint64_t* acks = detail::p2pCount(c, c.rank, c.p2pAckOffset, t.peer, block);
  uint64_t* ready = detail::p2pCount(c, t.peer, c.p2pReadyOffset, c.rank, block);
  for (uint64_t k = 0; k < steps; ++k) {
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
    detail::p2pPiece(c, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(slot + kP2PHeaderBytes, t.data + begin, length, tid, numThreads);
    if (tid == 0) *reinterpret_cast<uint64_t*>(slot) = t.bytes;
    syncBlock();  // the block's stores happen before the releasing store below (cumulativity)
    if (tid == 0) atomicStoreRelease(ready, chunk + 1);
  }
  syncBlock();  // every thread read `first` before it changes
  if (tid == 0) *sent = first + steps;
}

/// Block `block`'s share of a receive (see the top of this file).
PYCCL_HOST_DEVICE void p2pReceiveBlock(const CollectiveContext& c, const P2PTransfer& t, uint32_t block,
                                       uint32_t tid, uint32_t numThreads) {
  uint64_t* received = &c.p2pReceived[static_cast<uint64_t>(t.peer) * c.p2pBlocks + block];
  const uint64_t first = *received;
  const uint64_t steps = p2pSteps(c, t.bytes);
  const uint64_t* ready = detail::p2pCount(c, c.rank, c.p2pReadyOffset, t.peer, block);
  uint64_t* ack = detail::p2pCount(c, t.peer, c.p2pAckOffset, c.rank, block);
  for (uint64_t k = 0; k < steps; ++k) {
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
    detail::p2pPiece(c, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(t.data + begin, slot + kP2PHeaderBytes, length, tid, numThreads);
    syncBlock();  // every thread's loads of the slot happen before it is handed back
    if (tid == 0) atomicStoreRelease(ack, chunk + 1);
  }
  syncBlock();
  if (tid == 0) *received = first + steps;
}

/// Block `blockIndex` of a launch of `a` (p2pBlocks per transfer).
PYCCL_HOST_DEVICE void sendRecvBlock(const CollectiveContext& c, const P2PArgs& a, uint32_t blockIndex, uint32_t tid,
                                     uint32_t numThreads) {
  const P2PTransfer t = a.transfers[blockIndex / c.p2pBlocks];
  const uint32_t block = blockIndex % c.p2pBlocks;
  if (t.send != 0) {
    p2pSendBlock(c, t, block, tid, numThreads);
  } else {
    p2pReceiveBlock(c, t, block, tid, numThreads);
  }
}

}  // namespace pyccl
