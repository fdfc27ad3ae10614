// All-reduce fused with the residual add and RMSNorm of a transformer layer:
//
//   s            = sum over ranks of input          (fp32, rank order)
//   residualOut  = T(s + residual)                  (rounded once)
//   normed       = T(residualOut * rsqrt(mean(residualOut^2) + eps) * weight)
//
// per row of `hidden` elements, in one kernel and on LL packets (collective_context.hpp):
//  - one-shot (few rows): every rank sends its rows to every peer as packets
//    and reduces every row itself;
//  - two-shot: rank q owns a contiguous run of rows; every rank sends each
//    owner its rows, the owner reduces them, adds the residual and sends the
//    rounded new residual rows to every rank; every rank normalizes every row
//    from the same bits, its own and the received ones of one step with one
//    row sum.
// A row is split into `segments` slices, one block each (a thread-block
// cluster on GPUs): each block sums the squares of its slice, and the cluster
// adds the blocks' sums in block order through distributed shared memory.
// Every rank runs the same threads over the same bits in the same order, so
// both outputs are bitwise identical across ranks.
//
// Block B = group * segments + segment uses only block B's LL regions, with
// block B's call counter, as the LL kernels do; so it interleaves with them
// on one engine. Each call has every rank receive packets from every peer
// (two-shot needs rows >= world size), which is what lets a packet region be
// rewritten two calls later without a barrier.
#pragma once

#include <cmath>

#include "collectives/collective_context.hpp"

namespace pyccl {

/// Threads per block of the fused kernel at most: it keeps a few packets of
/// every row in registers, more than 64 registers a thread.
constexpr uint32_t kFusedMaxThreads = 512;
/// Blocks per row at most: a portable thread-block cluster.
constexpr uint32_t kFusedMaxSegments = 8;

/// One fused call over `rows` rows of `hidden` elements (every pointer any alignment).
struct FusedNormArgs {
  const void* input;     ///< [rows][hidden] this rank's partial sums
  const void* residual;  ///< [rows][hidden]
  const void* weight;    ///< [hidden]
  void* normed;          ///< [rows][hidden]; may be `input`
  void* residualOut;     ///< [rows][hidden]; may be `residual`
  uint64_t rows;
  uint64_t hidden;
  float eps;
  uint32_t segments;  ///< blocks per row
  uint32_t groups;    ///< row groups; the grid is groups * segments blocks
  uint32_t twoShot;   ///< 0: one-shot, 1: two-shot (rows >= world size)
};

/// Where one block's slice of a row lies, and how its rows map to LL slots.
struct FusedNormSlice {
  uint64_t begin;          ///< byte offset of the slice in a row
  uint64_t bytes;          ///< its length (0 for a slice past a short row's end)
  uint64_t packets;        ///< packets that carry it
  uint64_t slotsPerRow;    ///< LL slots each row takes in the block's region (same for every slice)

  PYCCL_HOST_DEVICE FusedNormSlice(uint64_t rowBytes, uint32_t segments, uint32_t segment) {
    const uint64_t per = ((rowBytes + segments - 1) / segments + LL16Packet::kDataBytes - 1) /
                         LL16Packet::kDataBytes * LL16Packet::kDataBytes;
    begin = segment * per < rowBytes ? segment * per : rowBytes;
    bytes = begin + per < rowBytes ? per : rowBytes - begin;
    packets = packetsFor<LL16Packet>(bytes);
    slotsPerRow = per / LL16Packet::kDataBytes;
  }
};

/// Rows of the two-shot that rank q owns, and the first of them: every rank
/// owns rows / world, the first rows % world one more.
PYCCL_HOST_DEVICE uint64_t fusedRowsOf(uint64_t rows, int world, int q) {
  return rows / world + (static_cast<uint64_t>(q) < rows % world ? 1 : 0);
}
PYCCL_HOST_DEVICE uint64_t fusedFirstRow(uint64_t rows, int world, int q) {
  const uint64_t extra = rows % world;
  return q * (rows / world) + (static_cast<uint64_t>(q) < extra ? q : extra);
}

/// Rows of one group's share per call that a block's LL region holds.
PYCCL_HOST_DEVICE uint64_t fusedRowsPerBlock(const CollectiveContext& c, uint64_t rowBytes, uint32_t segments) {
  return c.llBlockPackets / FusedNormSlice(rowBytes, segments, 0).slotsPerRow;
}

namespace detail {

template <typename T>
constexpr uint32_t kFusedLanes = LL16Packet::kDataBytes / sizeof(T);

template <typename T>
PYCCL_HOST_DEVICE float laneFloat(const uint32_t (&payload)[2], uint32_t lane) {
  return ElementTraits<T>::toFloat(laneOf<T>(payload, lane));
}

/// squares + v * v in one rounding (an explicit fused multiply-add, on the
/// GPU and on the host alike).
PYCCL_HOST_DEVICE float addSquare(float v, float squares) {
#if PYCCL_ON_DEVICE
  return __fmaf_rn(v, v, squares);
#else
  return std::fma(v, v, squares);
#endif
}

/// The sum of the squares of a packet's lanes (padding lanes are zero), in
/// lane order with explicit fused multiply-adds: every block that sums a
/// row's squares, owner or receiver, must round exactly alike.
template <typename T>
PYCCL_HOST_DEVICE float packetSquares(const uint32_t (&payload)[2]) {
  float squares = 0;
  for (uint32_t l = 0; l < kFusedLanes<T>; ++l) squares = addSquare(laneFloat<T>(payload, l), squares);
  return squares;
}

/// A reduced packet plus the residual, rounded to T, into `out`.
template <typename T>
PYCCL_HOST_DEVICE void addResidual(const float (&acc)[kFusedLanes<T>], const uint32_t (&residual)[2],
                                   uint32_t (&out)[2]) {
  for (uint32_t l = 0; l < kFusedLanes<T>; ++l) {
    setLaneOf<T>(out, l, ElementTraits<T>::fromFloat(acc[l] + laneFloat<T>(residual, l)));
  }
}

PYCCL_HOST_DEVICE float inverseRms(float sumSquares, uint64_t hidden, float eps) {
#if PYCCL_ON_DEVICE
  return rsqrtf(sumSquares / static_cast<float>(hidden) + eps);
#else
  return 1.0f / std::sqrt(sumSquares / static_cast<float>(hidden) + eps);
#endif
}

/// Packets per thread of a row's slice that stay in registers: the weight
/// (the same slice for every row, loaded once) and an owner's rounded sums
/// until it normalizes them. A thread's further packets are loaded again.
constexpr uint32_t kFusedCached = 2;

/// Calls fn(i, k) for this thread's packets i of the slice, in order: the
/// first kFusedCached with k = 0, 1, ... (an unrolled loop, so that k indexes
/// registers), the rest with k = kFusedCached (not cached).
template <typename Fn>
PYCCL_HOST_DEVICE void forEachSlicePacket(const FusedNormSlice& s, uint32_t tid, uint32_t numThreads, Fn&& fn) {
  PYCCL_UNROLL
  for (uint32_t k = 0; k < kFusedCached; ++k) {
    const uint64_t i = tid + static_cast<uint64_t>(k) * numThreads;
    if (i >= s.packets) return;
    fn(i, k);
  }
  for (uint64_t i = tid + static_cast<uint64_t>(kFusedCached) * numThreads; i < s.packets; i += numThreads) {
    fn(i, kFusedCached);
  }
}

/// This thread's first kFusedCached packets of the weight's slice (zero past its end).
template <typename T>
PYCCL_HOST_DEVICE void loadWeights(const FusedNormArgs& a, const FusedNormSlice& s, uint32_t tid, uint32_t numThreads,
                                   uint32_t (&weights)[kFusedCached][2]) {
  for (auto& w : weights) w[0] = w[1] = 0;
  forEachSlicePacket(s, tid, numThreads, [&](uint64_t i, uint32_t k) {
    if (k < kFusedCached) packPayload<LL16Packet>(static_cast<const char*>(a.weight) + s.begin, i, s.bytes, weights[k]);
  });
}

/// Packet i of `out` = v * scale * w, rounded to T.
template <typename T>
PYCCL_HOST_DEVICE void normalizePacket(char* out, const FusedNormSlice& s, uint64_t i, const uint32_t (&v)[2],
                                       const uint32_t (&w)[2], float scale) {
  uint32_t n[2];
  for (uint32_t l = 0; l < kFusedLanes<T>; ++l) {
    setLaneOf<T>(n, l, ElementTraits<T>::fromFloat(laneFloat<T>(v, l) * scale * laneFloat<T>(w, l)));
  }
  unpackPayload<LL16Packet>(out, i, s.bytes, n);
}

/// normed = residualOut * scale * weight over this thread's packets of the
/// slice of row `row`: the first kFusedCached from `sums` (this thread's
/// rounded sums) where given, else reloaded from residualOut (this thread's
/// own stores).
template <typename T>
PYCCL_HOST_DEVICE void normalizeSlice(const FusedNormArgs& a, const FusedNormSlice& s, uint64_t row, float scale,
                                      const uint32_t (&weights)[kFusedCached][2],
                                      const uint32_t (*sums)[2], uint32_t tid, uint32_t numThreads) {
  const uint64_t at = row * a.hidden * sizeof(T) + s.begin;
  const char* res = static_cast<const char*>(a.residualOut) + at;
  char* out = static_cast<char*>(a.normed) + at;
  const char* weight = static_cast<const char*>(a.weight) + s.begin;
  forEachSlicePacket(s, tid, numThreads, [&](uint64_t i, uint32_t k) {
    uint32_t v[2], w[2];
    if (k < kFusedCached && sums != nullptr) {
      v[0] = sums[k][0];
      v[1] = sums[k][1];
    } else {
      packPayload<LL16Packet>(res, i, s.bytes, v);
    }
    if (k < kFusedCached) {
      w[0] = weights[k][0];
      w[1] = weights[k][1];
    } else {
      packPayload<LL16Packet>(weight, i, s.bytes, w);
    }
    normalizePacket<T>(out, s, i, v, w, scale);
  });
}

/// Reduces this block's slice of `row` (LL slots from `slot0`), adds the
/// residual, stores residualOut, sends the rounded sums to every peer's second
/// LL region, slot for slot, when `forward` (two-shot owners), and returns the
/// slice's sum of squares over this thread's packets. The first kFusedCached
/// rounded sums stay in `sums` for normalizeSlice.
template <typename T>
PYCCL_HOST_DEVICE float reduceRowSlice(const CollectiveContext& c, const FusedNormArgs& a, const FusedNormSlice& s,
                                       uint64_t row, uint64_t slot0, uint32_t phase, uint32_t block, uint32_t flag,
                                       bool forward, bool& ok, uint32_t tid, uint32_t numThreads,
                                       uint32_t (&sums)[kFusedCached][2]) {
  const uint64_t at = row * a.hidden * sizeof(T) + s.begin;
  const char* mine = static_cast<const char*>(a.input) + at;
  const char* residual = static_cast<const char*>(a.residual) + at;
  char* out = static_cast<char*>(a.residualOut) + at;
  auto finishPacket = [&](uint64_t i, const float (&acc)[kFusedLanes<T>], const uint32_t (&res)[2],
                          uint32_t (&sum)[2]) {
    addResidual<T>(acc, res, sum);
    if (forward) {
      for (int k = 1; k < c.worldSize; ++k) {
        ll2Packets(c, (c.rank + k) % c.worldSize, phase, c.rank, block)[slot0 + i].write(sum, flag);
      }
    }
    unpackPayload<LL16Packet>(out, i, s.bytes, sum);
    return packetSquares<T>(sum);
  };
  // This rank's input and the residual are loaded before the polls, so their loads wait with them.
  uint32_t res[kFusedCached][2], own[kFusedCached][2];
  forEachSlicePacket(s, tid, numThreads, [&](uint64_t i, uint32_t k) {
    if (k >= kFusedCached) return;
    packPayload<LL16Packet>(residual, i, s.bytes, res[k]);
    packPayload<LL16Packet>(mine, i, s.bytes, own[k]);
  });
  float squares = 0;
  forEachSlicePacket(s, tid, numThreads, [&](uint64_t i, uint32_t k) {
    float acc[kFusedLanes<T>] = {};
    reducePolledPacket<T, ReduceOp::kSum>(
        c, phase, block, slot0 + i,
        [&](uint32_t (&payload)[2]) {
          if (k < kFusedCached) {
            payload[0] = own[k][0];
            payload[1] = own[k][1];
          } else {
            packPayload<LL16Packet>(mine, i, s.bytes, payload);
          }
        },
        flag, ok, acc);
    if (k < kFusedCached) {
      squares += finishPacket(i, acc, res[k], sums[k]);
    } else {
      uint32_t more[2], sum[2];
      packPayload<LL16Packet>(residual, i, s.bytes, more);
      squares += finishPacket(i, acc, more, sum);
    }
  });
  return squares;
}

}  // namespace detail

/// The fused all-reduce + residual add + RMSNorm, block (group, segment)'s
/// share. `rowGroup` adds a value over the blocks of the group in block
/// order, the same on every one of them:
///   template <int N> void sums(float (&values)[N], int used);  // values[0..used), block- then group-wide
///   void finish();                                    // before the block exits
/// Both are called the same number of times on every block of a group.
/// kTwoShot must equal a.twoShot != 0: each algorithm is its own kernel, so
/// that a call fetches only its own machine code.
template <typename T, bool kTwoShot, typename RowGroup>
PYCCL_HOST_DEVICE void allReduceRMSNorm(const CollectiveContext& c, const FusedNormArgs& a, uint32_t group,
                                        uint32_t segment, uint32_t tid, uint32_t numThreads, RowGroup& rowGroup) {
  const uint32_t block = group * a.segments + segment;
  const uint32_t flag = c.llCalls[block] + 1;
  const uint32_t phase = flag & 1;
  const int world = c.worldSize;
  const uint64_t rowBytes = a.hidden * sizeof(T);
  const FusedNormSlice s(rowBytes, a.segments, segment);
  const auto* in = static_cast<const char*>(a.input);
  uint32_t weights[detail::kFusedCached][2];
  detail::loadWeights<T>(a, s, tid, numThreads, weights);
  uint32_t sums[detail::kFusedCached][2];
  bool ok = true;
  if constexpr (!kTwoShot) {
    // 1. This group's rows to every peer: row group + m * groups in slots [m * slotsPerRow, ...).
    for (uint64_t m = 0, row = group; row < a.rows; ++m, row += a.groups) {
      const char* src = in + row * rowBytes + s.begin;
      for (uint64_t i = tid; i < s.packets; i += numThreads) {
        uint32_t payload[2];
        packPayload<LL16Packet>(src, i, s.bytes, payload);
        for (int k = 1; k < world; ++k) {
          detail::llPackets(c, (c.rank + k) % world, phase, c.rank, block)[m * s.slotsPerRow + i].write(payload,
                                                                                                       flag);
        }
      }
    }
    // 2. Reduce each row, add the residual, normalize.
    for (uint64_t m = 0, row = group; row < a.rows; ++m, row += a.groups) {
      float squares[1] = {detail::reduceRowSlice<T>(c, a, s, row, m * s.slotsPerRow, phase, block, flag, false, ok,
                                                    tid, numThreads, sums)};
      rowGroup.sums(squares, 1);
      detail::normalizeSlice<T>(a, s, row, detail::inverseRms(squares[0], a.hidden, a.eps), weights, sums, tid,
                                numThreads);
    }
  } else {
    // Local row j of every owner's run: j = group + m * groups, in slots [m * slotsPerRow, ...).
    const uint64_t mostRows = fusedRowsOf(a.rows, world, 0);
    auto ownerRow = [&](int q, uint64_t j) { return fusedFirstRow(a.rows, world, q) + j; };
    // 1. Each owner's rows to it: every peer's packet is loaded before any is sent, so the
    // loads wait together (loops over ranks unrolled, so that the payloads stay in registers).
    for (uint64_t m = 0, j = group; j < mostRows; ++m, j += a.groups) {
      for (uint64_t i = tid; i < s.packets; i += numThreads) {
        uint32_t payloads[kMaxCollectiveRanks][2];
        PYCCL_UNROLL
        for (int k = 1; k < kMaxCollectiveRanks; ++k) {
          const int q = (c.rank + k) % world;
          if (k >= world) break;
          if (j < fusedRowsOf(a.rows, world, q)) {
            packPayload<LL16Packet>(in + ownerRow(q, j) * rowBytes + s.begin, i, s.bytes, payloads[k]);
          }
        }
        PYCCL_UNROLL
        for (int k = 1; k < kMaxCollectiveRanks; ++k) {
          const int q = (c.rank + k) % world;
          if (k >= world) break;
          if (j < fusedRowsOf(a.rows, world, q)) {
            detail::llPackets(c, q, phase, c.rank, block)[m * s.slotsPerRow + i].write(payloads[k], flag);
          }
        }
      }
    }
    // 2. Row j of every owner, one j at a time: this rank's own (reduce it, add the residual,
    // send the rounded sums to every rank) and the other owners' as they arrive; then one
    // row sum for all of them, and normalize. The first kFusedCached packets of each row stay
    // in registers (loops over ranks unrolled to kMaxCollectiveRanks, so that they index
    // registers).
    const uint64_t myRows = fusedRowsOf(a.rows, world, c.rank);
    for (uint64_t m = 0, j = group; j < mostRows; ++m, j += a.groups) {
      float squares[kMaxCollectiveRanks] = {};
      uint32_t got[kMaxCollectiveRanks][detail::kFusedCached][2];
      const uint64_t slot = m * s.slotsPerRow;
      const bool mine = j < myRows;
      const float own = mine ? detail::reduceRowSlice<T>(c, a, s, ownerRow(c.rank, j), slot, phase, block, flag,
                                                         true, ok, tid, numThreads, sums)
                             : 0.0f;
      auto owns = [&](int q) { return j < fusedRowsOf(a.rows, world, q); };
      auto receive = [&](uint64_t i, uint32_t k) {
        PYCCL_UNROLL
        for (int q0 = 0; q0 < kMaxCollectiveRanks; q0 += kPacketPollBatch) {
          if (q0 >= world) break;
          uint32_t payloads[kPacketPollBatch][2];
          const uint32_t polled = detail::pollPeerPackets(c, true, phase, block, slot + i, q0, flag, owns,
                                                          payloads, ok);
          PYCCL_UNROLL
          for (int b = 0; b < kPacketPollBatch; ++b) {
            if (!(polled & (1u << b))) continue;
            const int q = q0 + b;
            squares[q] += detail::packetSquares<T>(payloads[b]);
            unpackPayload<LL16Packet>(static_cast<char*>(a.residualOut) + ownerRow(q, j) * rowBytes + s.begin, i,
                                      s.bytes, payloads[b]);
            if (k < detail::kFusedCached) {
              got[q][k][0] = payloads[b][0];
              got[q][k][1] = payloads[b][1];
            }
          }
        }
      };
      detail::forEachSlicePacket(s, tid, numThreads, receive);
      PYCCL_UNROLL
      for (int q = 0; q < kMaxCollectiveRanks; ++q) {
        if (q == c.rank) squares[q] = own;
      }
      rowGroup.sums(squares, world);
      PYCCL_UNROLL
      for (int q = 0; q < kMaxCollectiveRanks; ++q) {
        if (q >= world) break;
        if (!owns(q)) continue;
        const float scale = detail::inverseRms(squares[q], a.hidden, a.eps);
        detail::normalizeSlice<T>(a, s, ownerRow(q, j), scale, weights, q == c.rank ? sums : got[q], tid,
                                  numThreads);
      }
    }
  }
  (void)ok;  // a wait that gave up is recorded in the abort state; the host reports it
  syncBlock();
  if (tid == 0) c.llCalls[block] = flag;
  rowGroup.finish();
}

}  // namespace pyccl
