// The residual add + RMSNorm of rows that an all-reduce has summed: the
// second kernel of the fused call's two_kernel algorithm (the all-reduce
// kernel runs first; fused_norm_device.hpp has the one-kernel algorithms).
// Per row of `hidden` elements:
//
//   residualOut = T(sum + residual)
//   normed      = T(residualOut * rsqrt(mean(residualOut^2) + eps) * weight)
//
// with the all-reduce's sum already rounded to T (as pyccl.all_reduce and a
// torch add would round it). One block per row; the squares are summed in a
// fixed order (each thread its elements in order, then the block's threads in
// a fixed tree), so equal inputs give the same bits on every rank.
//
// Launched with programmatic dependent launch after the all-reduce: the
// residual and the weight do not depend on it, so they are loaded before the
// wait for it, and only the sum after.
#pragma once

#include "collectives/fused_norm_device.hpp"

namespace pyccl {

/// One add + RMSNorm call over `rows` rows of `hidden` elements.
struct AddRMSNormArgs {
  const void* sum;       ///< [rows][hidden] the all-reduced rows; may be `normed`
  const void* residual;  ///< [rows][hidden]
  const void* weight;    ///< [hidden]
  void* normed;          ///< [rows][hidden]
  void* residualOut;     ///< [rows][hidden]; may be `residual`
  uint64_t rows;
  uint64_t hidden;
  float eps;
};

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
    return ElementTraits<T>::toFloat(u);  // one element: no words to read it through
  } else {
    return ElementTraits<T>::toFloat(laneOf<T>(reinterpret_cast<const uint32_t*>(&u), l));
  }
}

/// T(sum + residual), lane by lane; adds the squares of the rounded lanes to
/// `squares` in lane order (explicit fused multiply-adds, as the fused kernel).
template <typename T, typename Unit>
PYCCL_HOST_DEVICE Unit addUnit(const Unit& sum, const Unit& residual, float& squares) {
  Unit out;
  for (uint32_t l = 0; l < sizeof(Unit) / sizeof(T); ++l) {
    const T r = ElementTraits<T>::fromFloat(unitLane<T>(sum, l) + unitLane<T>(residual, l));
    setLaneOf<T>(reinterpret_cast<uint32_t*>(&out), l, r);
    squares = addSquare(ElementTraits<T>::toFloat(r), squares);
  }
  return out;
}

/// T(v * scale * w), lane by lane (the fused kernel's normalizePacket).
template <typename T, typename Unit>
PYCCL_HOST_DEVICE Unit normalizeUnit(const Unit& v, const Unit& w, float scale) {
  Unit out;
  for (uint32_t l = 0; l < sizeof(Unit) / sizeof(T); ++l) {
    setLaneOf<T>(reinterpret_cast<uint32_t*>(&out), l,
                 ElementTraits<T>::fromFloat(unitLane<T>(v, l) * scale * unitLane<T>(w, l)));
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

}  // namespace pyccl
