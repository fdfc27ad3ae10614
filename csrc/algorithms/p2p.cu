// Point-to-point sends and receives over the collective engine's scratch: what
// ncclSend and ncclRecv do, one call or a group of them (as between
// ncclGroupStart and ncclGroupEnd) in one launch.
//
// A transfer runs on the same number of blocks on each side, its lanes
// (p2pShape: one per few KiB, at most p2pBlocks), each with a ring of
// p2pSlots slots per (source rank, lane) in the receiver's scratch. Both sides
// derive the shape from the size alone, and the engines agree on p2pBlocks,
// so the n-th send meets the n-th receive lane by lane. Lane b counts the
// chunks it moved per peer and direction (in device memory) and the receiver
// hands slots back with an ack count it stores into the sender's scratch.
// A transfer takes one of two protocols, by size:
//
// HB (larger than p2pLLMaxBytes): slots of [16-byte header | p2pSliceBytes].
// Step k moves bytes [(k * lanes + b) * piece, + piece) through lane b's ring,
// where the piece is the slice, or less when one step holds the whole transfer
// (possibly nothing: every lane takes every step, so the two sides count
// alike). For its n-th chunk, lane b of the sender
//   1. waits until the receiver handed the slot back: the ack count has
//      reached n - p2pSlots + 1 (acquire);
//   2. stores its piece and the header (the transfer's size and n) into the
//      slot in the receiver's scratch;
//   3. stores the ready count n + 1 into the receiver's scratch (release).
// Block b of the receiver acquires ready >= n + 1, checks the header against
// its own size and n, copies the piece out and stores the ack count n + 1
// (release, after every thread's loads of the slot).
//
// LL (at most p2pLLMaxBytes): one step, as LL16 packets whose flags derive
// from n (p2pFlag), so no ready count and no release: the receiver's threads
// poll the data itself. A slot holds a header packet (the size) and the
// lane's piece; the sender waits for the slot's ack as above and stores the
// packets; the receiver polls them, copies them out and acks. Small messages
// pay one trip over the link instead of a store, a release and a poll.
//
// A receive that meets a send of another size is recorded (kMismatch) and
// breaks the communicator: the two sides would no longer agree on the
// counts. Where the sizes put the two sides in different protocols, the
// header of the other protocol's slot names the size sent. Where they give
// the two sides different lanes, a receiving lane the send never reaches
// stops waiting once another lane has recorded the mismatch (its thread 0
// reads the error record now and then, and tells the block's other threads).
//
// The counts carry on across calls and CUDA-graph replays, so no host
// synchronization is needed, and the n-th send to a peer meets the n-th
// receive from this rank there, as in NCCL. A send of at most p2pSlots steps
// completes without its receive having started; a larger one waits for it
// (two ranks that both send a large message before receiving need a group).
#include "algorithms/p2p.hpp"

#ifdef PYCCL_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "device/kernel_launch.cuh"
#endif

namespace pyccl {

namespace detail {

/// Index of the slot of `source`'s ring `block` that holds chunk `chunk`, among every ring's slots (HB and LL
/// rings are laid out alike).
PYCCL_HOST_DEVICE uint64_t p2pSlotIndex(const CollectiveContext& c, int source, uint32_t block, uint64_t chunk) {
  return (static_cast<uint64_t>(source) * c.p2pBlocks + block) * c.p2pSlots + chunk % c.p2pSlots;
}

/// The HB slot of `source`'s ring `block` in `owner`'s scratch that holds chunk `chunk`.
PYCCL_HOST_DEVICE char* p2pSlot(const CollectiveContext& c, int owner, int source, uint32_t block, uint64_t chunk) {
  return c.scratch[owner] + c.p2pDataOffset +
         p2pSlotIndex(c, source, block, chunk) * (kP2PHeaderBytes + c.p2pSliceBytes);
}

/// The LL slot (header packet, then data packets) of the same ring and chunk.
PYCCL_HOST_DEVICE LL16Packet* p2pPacketSlot(const CollectiveContext& c, int owner, int source, uint32_t block,
                                            uint64_t chunk) {
  return reinterpret_cast<LL16Packet*>(c.scratch[owner] + c.p2pLLOffset) +
         p2pSlotIndex(c, source, block, chunk) * c.p2pLLSlotPackets;
}

/// This rank's count of chunks sent to or received from `peer` on lane `block` (p2pSent or p2pReceived).
PYCCL_HOST_DEVICE uint64_t* p2pLaneCount(const CollectiveContext& c, uint64_t* counts, int peer, uint32_t block) {
  return &counts[static_cast<uint64_t>(peer) * c.p2pBlocks + block];
}

/// The packet flag of chunk `chunk`: never 0 (fresh scratch), and distinct
/// from the flag of every earlier chunk that shared its slot.
PYCCL_HOST_DEVICE uint32_t p2pFlag(uint64_t chunk) { return static_cast<uint32_t>(chunk % 0xFFFFFFFFull) + 1; }

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

/// The size a header packet carries (its two data words, low first).
PYCCL_HOST_DEVICE uint64_t p2pHeaderSize(const uint32_t (&words)[2]) {
  return static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
}

/// Whether the LL header of chunk `chunk` has arrived in `slot`, and the size it carries. Never blocks.
PYCCL_HOST_DEVICE bool p2pPacketHeader(const LL16Packet* slot, uint64_t chunk, uint64_t* bytes) {
  uint32_t words[2];
  if (!slot[0].tryRead(p2pFlag(chunk), words)) return false;
  *bytes = p2pHeaderSize(words);
  return true;
}

/// Whether `slot`'s HB header is chunk `chunk`'s, and the size it carries
/// (read after acquiring the chunk's ready count).
PYCCL_HOST_DEVICE bool p2pSlotHeader(const char* slot, uint64_t chunk, uint64_t* bytes) {
  const auto* header = reinterpret_cast<const uint64_t*>(slot);
  if (header[1] != chunk + 1) return false;
  *bytes = header[0];
  return true;
}


/// Thread 0 of lane `block`, before the sender's n-th chunk: waits until the
/// receiver handed its slot back (acquire). Every thread: whether to go on.
PYCCL_HOST_DEVICE bool p2pSlotFree(const CollectiveContext& c, const P2PTransfer& t, uint32_t block, uint64_t chunk,
                                   uint32_t tid) {
  bool ok = true;
  if (tid == 0 && chunk >= c.p2pSlots) {
    const uint64_t* acks = p2pCount(c, c.rank, c.p2pAckOffset, t.peer, block);
    uint64_t seen = 0;
    ok = spinUntilAtLeast(acks, chunk - c.p2pSlots + 1, c.abort, t.peer, &seen) == WaitStatus::kOk;
  }
  // Acquired by thread 0, the receiver's loads of the slot happen before every thread's stores after this.
  return blockAll(ok);  // false: the communicator is broken, its counts no longer matter
}

/// The size the sender announced for chunk `chunk` in the protocol other
/// than `ll`, where it has (a receive met a send of another protocol).
PYCCL_HOST_DEVICE bool p2pSentOtherwise(const CollectiveContext& c, const P2PTransfer& t, uint32_t block,
                                        uint64_t chunk, bool ll, uint64_t* sentBytes) {
  if (!ll) return p2pPacketHeader(p2pPacketSlot(c, c.rank, t.peer, block, chunk), chunk, sentBytes);
  const uint64_t* ready = p2pCount(c, c.rank, c.p2pReadyOffset, t.peer, block);
  // Acquired, every earlier chunk's stores are visible: no LL header means chunk `chunk` went HB.
  if (atomicLoadAcquire(ready) < chunk + 1) return false;
  uint64_t packetBytes = 0;
  if (p2pPacketHeader(p2pPacketSlot(c, c.rank, t.peer, block, chunk), chunk, &packetBytes)) return false;
  return p2pSlotHeader(p2pSlot(c, c.rank, t.peer, block, chunk), chunk, sentBytes);
}

/// Lane `block`'s share of an HB send (see the top of this file).
PYCCL_HOST_DEVICE void p2pSendHB(const CollectiveContext& c, const P2PTransfer& t, const P2PShape& shape,
                                 uint32_t block, uint32_t tid, uint32_t numThreads) {
  uint64_t* sent = p2pLaneCount(c, c.p2pSent, t.peer, block);
  const uint64_t first = *sent;
  uint64_t* ready = p2pCount(c, t.peer, c.p2pReadyOffset, c.rank, block);
  for (uint64_t k = 0; k < shape.steps; ++k) {
    const uint64_t chunk = first + k;
    if (!p2pSlotFree(c, t, block, chunk, tid)) return;
    char* slot = p2pSlot(c, t.peer, c.rank, block, chunk);
    uint64_t begin = 0, length = 0;
    p2pPiece(shape, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(slot + kP2PHeaderBytes, t.data + begin, length, tid, numThreads);
    if (tid == 0) {
      reinterpret_cast<uint64_t*>(slot)[0] = t.bytes;
      reinterpret_cast<uint64_t*>(slot)[1] = chunk + 1;  // never 0, as a fresh slot's
    }
    syncBlock();  // the block's stores happen before the releasing store below (cumulativity)
    if (tid == 0) atomicStoreRelease(ready, chunk + 1);
  }
  syncBlock();  // every thread read `first` before it changes
  if (tid == 0) *sent = first + shape.steps;
}

/// Lane `block`'s share of an LL send (see the top of this file).
PYCCL_HOST_DEVICE void p2pSendLL(const CollectiveContext& c, const P2PTransfer& t, const P2PShape& shape,
                                 uint32_t block, uint32_t tid, uint32_t numThreads) {
  uint64_t* sent = p2pLaneCount(c, c.p2pSent, t.peer, block);
  const uint64_t chunk = *sent;
  if (!p2pSlotFree(c, t, block, chunk, tid)) return;  // also: every thread has read `chunk`
  LL16Packet* slot = p2pPacketSlot(c, t.peer, c.rank, block, chunk);
  const uint32_t flag = p2pFlag(chunk);
  uint64_t begin = 0, length = 0;
  p2pPiece(shape, t.bytes, 0, block, &begin, &length);
  const uint64_t packets = packetsFor<LL16Packet>(length);
  for (uint64_t i = tid; i <= packets; i += numThreads) {
    uint32_t payload[2] = {static_cast<uint32_t>(t.bytes), static_cast<uint32_t>(t.bytes >> 32)};
    if (i > 0) packPayload<LL16Packet>(t.data + begin, i - 1, length, payload);
    slot[i].write(payload, flag);
  }
  if (tid == 0) *sent = chunk + 1;
}

/// Thread 0 of a receiving lane: records that chunk `chunk` of `sentBytes` met a receive of t.bytes.
PYCCL_HOST_DEVICE void p2pRecordMismatch(const CollectiveContext& c, const P2PTransfer& t, uint64_t sentBytes) {
  c.abort.record(WaitStatus::kMismatch, t.peer, t.bytes, sentBytes);
}

/// Lane `block`'s share of an HB receive (see the top of this file).
PYCCL_HOST_DEVICE void p2pReceiveHB(const CollectiveContext& c, const P2PTransfer& t, const P2PShape& shape,
                                    uint32_t block, uint32_t tid, uint32_t numThreads) {
  uint64_t* received = p2pLaneCount(c, c.p2pReceived, t.peer, block);
  const uint64_t first = *received;
  const uint64_t* ready = p2pCount(c, c.rank, c.p2pReadyOffset, t.peer, block);
  uint64_t* ack = p2pCount(c, t.peer, c.p2pAckOffset, c.rank, block);
  for (uint64_t k = 0; k < shape.steps; ++k) {
    const uint64_t chunk = first + k;
    const char* slot = p2pSlot(c, c.rank, t.peer, block, chunk);
    bool ok = true;
    if (tid == 0) {
      uint64_t seen = 0, sentBytes = t.bytes;
      // Checked now and then while waiting: an LL send met this receive, and may be the last send for a while.
      bool otherProtocol = false;
      const WaitStatus status = boundedPoll(
          [&] {
            seen = atomicLoadAcquire(ready);
            return seen >= chunk + 1;
          },
          [&] { return seen; }, c.abort, t.peer, chunk + 1,
          [&] {
            // Another lane met the send (fewer lanes than this receive's): this lane's never comes.
            if (c.abort.mismatchRecorded()) return true;
            return otherProtocol = p2pSentOtherwise(c, t, block, chunk, false, &sentBytes);
          });
      ok = status == WaitStatus::kOk;
      // A later chunk's ready count may have passed an LL chunk: the header names the chunk it came with.
      if (ok && !p2pSlotHeader(slot, chunk, &sentBytes)) {
        otherProtocol = p2pSentOtherwise(c, t, block, chunk, false, &sentBytes);
        if (!otherProtocol) sentBytes = ~0ull;  // unreachable while both sides count alike
      }
      if (otherProtocol || (ok && sentBytes != t.bytes)) {
        p2pRecordMismatch(c, t, sentBytes);
        ok = false;
      }
    }
    // Acquired by thread 0, the sender's stores into the slot happen before every thread's loads below.
    if (!blockAll(ok)) return;
    uint64_t begin = 0, length = 0;
    p2pPiece(shape, t.bytes, k, block, &begin, &length);
    if (length > 0) copyBytes(t.data + begin, slot + kP2PHeaderBytes, length, tid, numThreads);
    syncBlock();  // every thread's loads of the slot happen before it is handed back
    if (tid == 0) atomicStoreRelease(ack, chunk + 1);
  }
  syncBlock();
  if (tid == 0) *received = first + shape.steps;
}

/// Lane `block`'s share of an LL receive (see the top of this file).
PYCCL_HOST_DEVICE void p2pReceiveLL(const CollectiveContext& c, const P2PTransfer& t, const P2PShape& shape,
                                    uint32_t block, uint32_t tid, uint32_t numThreads) {
  uint64_t* received = p2pLaneCount(c, c.p2pReceived, t.peer, block);
  const uint64_t chunk = *received;
  const LL16Packet* slot = p2pPacketSlot(c, c.rank, t.peer, block, chunk);
  const uint32_t flag = p2pFlag(chunk);
  uint64_t begin = 0, length = 0;
  p2pPiece(shape, t.bytes, 0, block, &begin, &length);
  const uint64_t packets = packetsFor<LL16Packet>(length);
  bool ok = true;
  // Checked now and then while a packet is awaited: the send was of another size or went HB. Thread 0, which
  // reads the header, records it; the others only stop waiting. Thread 0 also stops the block's waits once
  // another lane recorded a mismatch (a send of fewer lanes never reaches this one).
#if PYCCL_ON_DEVICE
  __shared__ uint32_t otherLaneMismatch;
  if (tid == 0) otherLaneMismatch = 0;
  syncBlock();
#endif
  auto otherLaneFailed = [&] {
    if (tid != 0) {
#if PYCCL_ON_DEVICE
      return loadFlagVolatile(&otherLaneMismatch) != 0;
#else
      return false;
#endif
    }
    if (!c.abort.mismatchRecorded()) return false;
#if PYCCL_ON_DEVICE
    *static_cast<volatile uint32_t*>(&otherLaneMismatch) = 1;
#endif
    return true;
  };
  uint64_t sentBytes = t.bytes;
  bool mismatch = false;
  auto sentOtherwise = [&] {
    if (otherLaneFailed()) return true;  // ends the wait; the other lane recorded it
    uint64_t headerBytes = 0;
    if (p2pPacketHeader(slot, chunk, &headerBytes)) {
      mismatch = headerBytes != t.bytes;
      sentBytes = headerBytes;
    } else {
      mismatch = p2pSentOtherwise(c, t, block, chunk, true, &sentBytes);
    }
    return mismatch;
  };
  for (uint64_t i = tid; ok && i <= packets; i += numThreads) {
    uint32_t payload[2];
    const WaitStatus status = boundedPoll([&] { return slot[i].tryRead(flag, payload); }, [&] { return i; },
                                          c.abort, t.peer, flag, sentOtherwise);
    ok = status == WaitStatus::kOk;
    if (ok && i == 0) {
      sentBytes = p2pHeaderSize(payload);
      mismatch = sentBytes != t.bytes;
      ok = !mismatch;
    } else if (ok) {
      unpackPayload<LL16Packet>(t.data + begin, i - 1, length, payload);
    }
    if (mismatch && tid == 0) p2pRecordMismatch(c, t, sentBytes);
  }
  // Every thread's loads of the slot happen before it is handed back (cumulativity through the barrier).
  if (!blockAll(ok)) return;
  if (tid == 0) {
    atomicStoreRelease(p2pCount(c, t.peer, c.p2pAckOffset, c.rank, block), chunk + 1);
    *received = chunk + 1;
  }
}

}  // namespace detail

/// Block `blockIndex` of a launch of `a` (a block per lane of each transfer, in order).
PYCCL_HOST_DEVICE void sendRecvBlock(const CollectiveContext& c, const P2PArgs& a, uint32_t blockIndex, uint32_t tid,
                                     uint32_t numThreads) {
  uint32_t i = 0;
  while (i + 1 < a.count && a.transfers[i + 1].firstBlock <= blockIndex) ++i;
  const P2PTransfer t = a.transfers[i];
  const uint32_t block = blockIndex - t.firstBlock;
  const P2PShape shape = p2pShape(c, t.bytes);
  if (t.send != 0) {
    if (shape.ll) {
      detail::p2pSendLL(c, t, shape, block, tid, numThreads);
    } else {
      detail::p2pSendHB(c, t, shape, block, tid, numThreads);
    }
  } else if (shape.ll) {
    detail::p2pReceiveLL(c, t, shape, block, tid, numThreads);
  } else {
    detail::p2pReceiveHB(c, t, shape, block, tid, numThreads);
  }
}

// ---------------------------------------------------------------------------
// Launch: host mode, then GPUs.
// ---------------------------------------------------------------------------

void sendRecvHost(const CollectiveContext& context, const P2PArgs& args) {
  runHostBlocks(args.blocks, [&](uint32_t b) { sendRecvBlock(context, args, b, 0, 1); });
}

#ifdef PYCCL_WITH_CUDA
namespace {

__global__ void __launch_bounds__(1024) sendRecvKernel(CollectiveContext context, P2PArgs args) {
  collectiveKernelPrologue();
  sendRecvBlock(context, args, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace

void sendRecvDevice(const CollectiveContext& context, const P2PArgs& args, void* stream, const KernelLaunch& launch) {
  launchCollectiveKernel(sendRecvKernel, args.blocks, launch, static_cast<cudaStream_t>(stream),
                         context, args);
}

uint32_t sendRecvResidentBlocks(int device, uint32_t threads) {
  gpu::DeviceGuard onDevice(device);
  int sms = 0, perSm = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PYCCL_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, sendRecvKernel, static_cast<int>(threads), 0));
  return static_cast<uint32_t>(std::max(0, perSm * sms));
}

void sendRecvKernels(std::vector<const void*>* out) { out->push_back(reinterpret_cast<const void*>(sendRecvKernel)); }
#endif  // PYCCL_WITH_CUDA

}  // namespace pyccl
