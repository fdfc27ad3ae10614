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
//
// The two-kernel algorithm (two_kernel, for more rows): the all-reduce
// kernel of allreduce.cu, then the residual add + RMSNorm of the rows it has
// summed (addRMSNormRow), per row of `hidden` elements:
//
//   residualOut = T(sum + residual)
//   normed      = T(residualOut * rsqrt(mean(residualOut^2) + eps) * weight)
//
// with the all-reduce's sum already rounded to T (as pyccl.all_reduce and a
// torch add would round it). One block per row; the squares are summed in a
// fixed order (each thread its elements in order, then the block's threads in
// a fixed tree), so equal inputs give the same bits on every rank.
// Launched with programmatic dependent launch after the all-reduce: the
// residual and the weight do not depend on it, so they are loaded before the
// wait for it, and only the sum after.
//
// The row sums: on GPUs a thread-block cluster's (ClusterRowGroup, below),
// in host mode a barrier of the row group's CPU threads (HostRowGroup).
#include "algorithms/fused_norm.hpp"

#include <barrier>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "core/gpu_runtime.hpp"
#include "device/kernel_launch.cuh"
#endif

namespace pyccl {

namespace detail {

template <typename T>
constexpr uint32_t kFusedLanes = LL16Packet::kDataBytes / sizeof(T);

template <typename T>
PYCCL_HOST_DEVICE float laneFloat(const uint32_t (&payload)[2], uint32_t lane) {
  return ElementTraits<T>::toAcc(laneOf<T>(payload, lane));
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
    setLaneOf<T>(out, l, ElementTraits<T>::fromAcc(acc[l] + laneFloat<T>(residual, l)));
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
    setLaneOf<T>(n, l, ElementTraits<T>::fromAcc(laneFloat<T>(v, l) * scale * laneFloat<T>(w, l)));
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
#ifdef __CUDACC__
// Host mode instantiates it with a RowGroup of CPU threads (HostRowGroup), whose calls are host code only.
#pragma nv_exec_check_disable
#endif
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

// ---------------------------------------------------------------------------
// The add + RMSNorm of the two-kernel algorithm.
// ---------------------------------------------------------------------------

/// Whether every row of the call moves as 16-byte vectors: each pointer
/// 16-byte aligned and each row a multiple of 16 bytes. Else element by element.
PYCCL_HOST_DEVICE bool addRMSNormVectorized(const AddRMSNormArgs& a, uint64_t elementSize) {
  const uintptr_t any = reinterpret_cast<uintptr_t>(a.sum) | reinterpret_cast<uintptr_t>(a.residual) |
                        reinterpret_cast<uintptr_t>(a.weight) | reinterpret_cast<uintptr_t>(a.normed) |
                        reinterpret_cast<uintptr_t>(a.residualOut);
  return (any & 15) == 0 && (a.hidden * elementSize) % 16 == 0;
}

/// Threads per block at most.
constexpr uint32_t kAddNormMaxThreads = 1024;

/// Threads per block for rows of `units` units (vectors or elements): one
/// unit each, in whole warps, kAddNormMaxThreads at most.
PYCCL_HOST_DEVICE uint32_t addRMSNormThreads(uint64_t units) {
  const uint64_t warps = (units + 31) / 32;
  return static_cast<uint32_t>(warps < 1 ? 32 : (warps * 32 < kAddNormMaxThreads ? warps * 32 : kAddNormMaxThreads));
}

/// Units (vectors or elements) per thread of a row kept in registers between
/// the add and the normalization; a thread's further units are loaded again.
constexpr uint32_t kAddNormCached = 4;

namespace detail {

/// Lane l of a unit (a 16-byte vector or one element) as float.
template <typename T, typename Unit>
PYCCL_HOST_DEVICE float unitLane(const Unit& u, uint32_t l) {
  if constexpr (std::is_same_v<Unit, T>) {
    return ElementTraits<T>::toAcc(u);  // one element: no words to read it through
  } else {
    return ElementTraits<T>::toAcc(laneOf<T>(reinterpret_cast<const uint32_t*>(&u), l));
  }
}

/// T(sum + residual), lane by lane; adds the squares of the rounded lanes to
/// `squares` in lane order (explicit fused multiply-adds, as the fused kernel).
template <typename T, typename Unit>
PYCCL_HOST_DEVICE Unit addUnit(const Unit& sum, const Unit& residual, float& squares) {
  Unit out;
  for (uint32_t l = 0; l < sizeof(Unit) / sizeof(T); ++l) {
    const T r = ElementTraits<T>::fromAcc(unitLane<T>(sum, l) + unitLane<T>(residual, l));
    setLaneOf<T>(reinterpret_cast<uint32_t*>(&out), l, r);
    squares = addSquare(ElementTraits<T>::toAcc(r), squares);
  }
  return out;
}

/// T(v * scale * w), lane by lane (the fused kernel's normalizePacket).
template <typename T, typename Unit>
PYCCL_HOST_DEVICE Unit normalizeUnit(const Unit& v, const Unit& w, float scale) {
  Unit out;
  for (uint32_t l = 0; l < sizeof(Unit) / sizeof(T); ++l) {
    setLaneOf<T>(reinterpret_cast<uint32_t*>(&out), l,
                 ElementTraits<T>::fromAcc(unitLane<T>(v, l) * scale * unitLane<T>(w, l)));
  }
  return out;
}

}  // namespace detail

/// Row `row` of the call, by threads [0, numThreads) of one block, in units of
/// `Unit` (detail::Vec16 where addRMSNormVectorized, else T). `waitForSum()`
/// is called once on every thread before the first load of the sum (the PDL
/// wait; it may do nothing); `blockSum(x)` returns the sum of x over the
/// block's threads, the same bits on every thread (a block barrier).
template <typename T, typename Unit, typename WaitForSum, typename BlockSum>
PYCCL_HOST_DEVICE void addRMSNormRow(const AddRMSNormArgs& a, uint64_t row, uint32_t tid, uint32_t numThreads,
                                     WaitForSum&& waitForSum, BlockSum&& blockSum) {
  const uint64_t units = a.hidden * sizeof(T) / sizeof(Unit);
  const uint64_t at = row * units;
  const Unit* sum = static_cast<const Unit*>(a.sum) + at;
  const Unit* residual = static_cast<const Unit*>(a.residual) + at;
  const Unit* weight = static_cast<const Unit*>(a.weight);
  Unit* normed = static_cast<Unit*>(a.normed) + at;
  Unit* residualOut = static_cast<Unit*>(a.residualOut) + at;
  // The residual and the weight, written before the all-reduce ran, are loaded before the wait.
  Unit res[kAddNormCached] = {}, w[kAddNormCached] = {}, kept[kAddNormCached] = {};
  PYCCL_UNROLL
  for (uint32_t k = 0; k < kAddNormCached; ++k) {
    const uint64_t u = tid + static_cast<uint64_t>(k) * numThreads;
    if (u < units) {
      res[k] = residual[u];
      w[k] = weight[u];
    }
  }
  waitForSum();
  // A thread reads and writes only its own units, in that order: `sum` may be
  // `normed` and `residualOut` may be `residual`.
  float squares = 0;
  PYCCL_UNROLL
  for (uint32_t k = 0; k < kAddNormCached; ++k) {
    const uint64_t u = tid + static_cast<uint64_t>(k) * numThreads;
    if (u < units) {
      kept[k] = detail::addUnit<T>(sum[u], res[k], squares);
      residualOut[u] = kept[k];
    }
  }
  for (uint64_t u = tid + static_cast<uint64_t>(kAddNormCached) * numThreads; u < units; u += numThreads) {
    residualOut[u] = detail::addUnit<T>(sum[u], residual[u], squares);
  }
  const float scale = detail::inverseRms(blockSum(squares), a.hidden, a.eps);
  PYCCL_UNROLL
  for (uint32_t k = 0; k < kAddNormCached; ++k) {
    const uint64_t u = tid + static_cast<uint64_t>(k) * numThreads;
    if (u < units) normed[u] = detail::normalizeUnit<T>(kept[k], w[k], scale);
  }
  for (uint64_t u = tid + static_cast<uint64_t>(kAddNormCached) * numThreads; u < units; u += numThreads) {
    normed[u] = detail::normalizeUnit<T>(residualOut[u], weight[u], scale);  // this thread's own store
  }
}

// ---------------------------------------------------------------------------
// Launch: host mode, then GPUs.
// ---------------------------------------------------------------------------

namespace {

/// The row sums of allReduceRMSNorm for one row group's blocks (CPU
/// threads of one block each): every thread stores its value, all meet at a
/// barrier, and each adds them in block order.
struct HostRowGroup {
  struct Shared {
    explicit Shared(uint32_t segments)
        : meet(segments), partials(2ull * segments * kMaxCollectiveRanks) {}
    std::barrier<> meet;
    std::vector<float> partials;  ///< [2 parities][segment][kMaxCollectiveRanks]
  };
  Shared* shared;
  uint32_t segment;
  uint32_t segments;
  uint32_t parity = 0;

  template <int N>
  void sums(float (&values)[N], int used) {
    used = used < N ? used : N;  // never more than the array (GCC cannot see that callers keep to it)
    float* slots = shared->partials.data() + static_cast<size_t>(parity) * segments * kMaxCollectiveRanks;
    for (int n = 0; n < used; ++n) slots[segment * kMaxCollectiveRanks + n] = values[n];
    shared->meet.arrive_and_wait();  // a parity is written again only after the next meeting
    for (int n = 0; n < used; ++n) {
      float total = 0;
      for (uint32_t s = 0; s < segments; ++s) total += slots[s * kMaxCollectiveRanks + n];
      values[n] = total;
    }
    parity ^= 1;
  }
  void finish() {}
};

}  // namespace

void allReduceRMSNormHost(const CollectiveContext& context, const FusedNormCall& call) {
  const FusedNormArgs& a = call.args;
  std::vector<std::unique_ptr<HostRowGroup::Shared>> groups;
  for (uint32_t g = 0; g < a.groups; ++g) groups.push_back(std::make_unique<HostRowGroup::Shared>(a.segments));
  dispatchFloat(call.dtype, [&]<typename T>() {
    runHostBlocks(a.groups * a.segments, [&](uint32_t b) {
      HostRowGroup rowGroup{groups[b / a.segments].get(), b % a.segments, a.segments};
      if (a.twoShot != 0) {
        allReduceRMSNorm<T, true>(context, a, b / a.segments, b % a.segments, 0, 1, rowGroup);
      } else {
        allReduceRMSNorm<T, false>(context, a, b / a.segments, b % a.segments, 0, 1, rowGroup);
      }
    });
  });
}

void addRMSNormHost(const AddRMSNormCall& call) {
  const AddRMSNormArgs& a = call.args;
  dispatchFloat(call.dtype, [&]<typename T>() {
    auto rows = [&]<typename Unit>() {
      for (uint64_t row = 0; row < a.rows; ++row) {
        addRMSNormRow<T, Unit>(a, row, 0, 1, [] {}, [](float x) { return x; });
      }
    };
    if (addRMSNormVectorized(a, sizeof(T))) {
      rows.template operator()<detail::Vec16>();
    } else {
      rows.template operator()<T>();
    }
  });
}

#ifdef PYCCL_WITH_CUDA
namespace {

namespace cg = cooperative_groups;

/// The row sums of allReduceRMSNorm for the blocks of one cluster (one
/// block when segments is 1): warp shuffles, then the block's warps in order;
/// each block stores its sums into every block's shared memory (distributed
/// shared memory stores, which need no reply), and after the cluster barrier
/// each adds the blocks' sums in block order. Every block adds the same values
/// in the same order, so each gets the same bits.
struct ClusterRowGroup {
  float* warpSums;  ///< shared [32 warps][kMaxCollectiveRanks]
  float* gathered;  ///< shared [2 parities][kFusedMaxSegments][kMaxCollectiveRanks], written by the cluster's blocks
  float* totals;    ///< shared [kMaxCollectiveRanks]
  uint32_t segment;
  uint32_t segments;
  uint32_t parity = 0;

  /// Block-wide then cluster-wide sums of values[0..used) (used <= N; the rest are left), on every
  /// thread of every block of the cluster. Synchronizes the block, and the cluster (release/acquire)
  /// when it has more than one block.
  template <int N>
  __device__ __forceinline__ void sums(float (&values)[N], int used) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    PYCCL_UNROLL
    for (int n = 0; n < N; ++n) {
      if (n >= used) break;
      PYCCL_UNROLL
      for (int offset = 16; offset > 0; offset >>= 1) values[n] += __shfl_xor_sync(0xffffffffu, values[n], offset);
      if (lane == 0) warpSums[warp * kMaxCollectiveRanks + n] = values[n];
    }
    __syncthreads();
    float* slots = gathered + parity * kFusedMaxSegments * kMaxCollectiveRanks;
    if (segments == 1) {
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t w = 0; w < warps; ++w) total += warpSums[w * kMaxCollectiveRanks + threadIdx.x];
        totals[threadIdx.x] = total;
      }
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t w = 0; w < warps; ++w) total += warpSums[w * kMaxCollectiveRanks + threadIdx.x];
        for (uint32_t s = 0; s < segments; ++s) {
          *cluster.map_shared_rank(slots + segment * kMaxCollectiveRanks + threadIdx.x, s) = total;
        }
      }
      // Releases the stores into the other blocks' slots; acquires theirs into ours. A parity's
      // slots are written again only after the next barrier, by which every block has read them.
      cluster.sync();
      if (threadIdx.x < static_cast<uint32_t>(used)) {
        float total = 0;
        for (uint32_t s = 0; s < segments; ++s) total += slots[s * kMaxCollectiveRanks + threadIdx.x];
        totals[threadIdx.x] = total;
      }
#endif
    }
    __syncthreads();  // totals are read after it, and written again only after the next call's barrier
    PYCCL_UNROLL
    for (int n = 0; n < N; ++n) {
      if (n >= used) break;
      values[n] = totals[n];
    }
    parity ^= 1;
  }

  /// Nothing to wait for: every store into a block's shared memory lands
  /// before the cluster barrier of the same call, which the block passes
  /// before it can exit.
  __device__ __forceinline__ void finish() {}
};

template <typename T, bool kTwoShot>
__global__ void __launch_bounds__(kFusedMaxThreads) allReduceRMSNormKernel(CollectiveContext context,
                                                                           FusedNormArgs args) {
  __shared__ float warpSums[32 * kMaxCollectiveRanks];
  __shared__ float gathered[2 * kFusedMaxSegments * kMaxCollectiveRanks];
  __shared__ float totals[kMaxCollectiveRanks];
  collectiveKernelPrologue();
  ClusterRowGroup group{warpSums, gathered, totals, blockIdx.x % args.segments, args.segments};
  allReduceRMSNorm<T, kTwoShot>(context, args, blockIdx.x / args.segments, blockIdx.x % args.segments, threadIdx.x,
                      blockDim.x, group);
}

template <typename T, typename Unit>
__global__ void __launch_bounds__(kAddNormMaxThreads) addRMSNormKernel(AddRMSNormArgs args) {
  __shared__ float warpSums[32 * kMaxCollectiveRanks];
  __shared__ float gathered[2 * kFusedMaxSegments * kMaxCollectiveRanks];
  __shared__ float totals[kMaxCollectiveRanks];
  ClusterRowGroup block{warpSums, gathered, totals, 0, 1};
  auto blockSum = [&](float x) {
    float values[1] = {x};
    block.sums(values, 1);
    return values[0];
  };
  bool waited = false;
  auto waitForSum = [&] {
    if (waited) return;
    waited = true;
    waitForPriorGrid();
    allowDependentLaunch();
  };
  for (uint64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    addRMSNormRow<T, Unit>(args, row, threadIdx.x, blockDim.x, waitForSum, blockSum);
  }
  waitForSum();  // every kernel waits before it exits (a block without rows too)
}

/// Blocks of the add + RMSNorm kernel at most (rows beyond it loop).
constexpr uint64_t kAddNormMaxBlocks = 1u << 16;

}  // namespace

void addRMSNormDevice(const AddRMSNormCall& call, void* stream, bool programmatic) {
  const AddRMSNormArgs& a = call.args;
  if (a.rows == 0 || a.hidden == 0) return;
  dispatchFloat(call.dtype, [&]<typename T>() {
    const bool vectorized = addRMSNormVectorized(a, sizeof(T));
    const uint64_t units = vectorized ? a.hidden * sizeof(T) / 16 : a.hidden;
    const KernelLaunch shape{addRMSNormThreads(units), programmatic};
    const auto blocks = static_cast<uint32_t>(a.rows < kAddNormMaxBlocks ? a.rows : kAddNormMaxBlocks);
    auto* kernel = vectorized ? addRMSNormKernel<T, detail::Vec16> : addRMSNormKernel<T, T>;
    launchCollectiveKernel(kernel, blocks, shape, static_cast<cudaStream_t>(stream), a);
  });
}

bool clusterLaunchSupported(int device) {
  int supported = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device));
  return supported != 0;
}

void allReduceRMSNormDevice(const CollectiveContext& context, const FusedNormCall& call, void* stream,
                            KernelLaunch launch) {
  launch.clusterBlocks = call.args.segments;
  dispatchFloat(call.dtype, [&]<typename T>() {
    auto* kernel = call.args.twoShot != 0 ? allReduceRMSNormKernel<T, true> : allReduceRMSNormKernel<T, false>;
    launchCollectiveKernel(kernel, call.args.groups * call.args.segments, launch, static_cast<cudaStream_t>(stream),
                           context, call.args);
  });
}

void fusedNormKernels(std::vector<const void*>* out) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    dispatchFloat(dtype, [&]<typename T>() {
      out->push_back(reinterpret_cast<const void*>(allReduceRMSNormKernel<T, false>));
      out->push_back(reinterpret_cast<const void*>(allReduceRMSNormKernel<T, true>));
      out->push_back(reinterpret_cast<const void*>(addRMSNormKernel<T, detail::Vec16>));
      out->push_back(reinterpret_cast<const void*>(addRMSNormKernel<T, T>));
    });
  }
}
#endif  // PYCCL_WITH_CUDA

// ---------------------------------------------------------------------------
// Names (docs, algorithm=).
// ---------------------------------------------------------------------------

FusedNormAlgorithm parseFusedNormAlgorithm(const std::string& name, const char* what) {
  if (name == "one_shot") return FusedNormAlgorithm::kOneShot;
  if (name == "two_shot") return FusedNormAlgorithm::kTwoShot;
  if (name == "two_kernel") return FusedNormAlgorithm::kTwoKernel;
  throw InvalidArgument(strCat("invalid argument '", what, "': '", name,
                               "' is not a fused all-reduce algorithm (expected one_shot, two_shot or two_kernel)"));
}

const char* fusedNormAlgorithmName(FusedNormAlgorithm a) {
  switch (a) {
    case FusedNormAlgorithm::kOneShot: return "one_shot";
    case FusedNormAlgorithm::kTwoShot: return "two_shot";
    case FusedNormAlgorithm::kTwoKernel: return "two_kernel";
  }
  return "?";
}

}  // namespace pyccl
