// Element types and reduction operators of every kernel that reduces (the
// collective algorithms and the plan interpreter), for device code and for
// host mode alike, and the dispatch of a call's runtime dtype and op to their
// templates. 16-bit floats are carried as their bits and reduced in fp32;
// every rank reduces contributions in rank order, so results are bitwise
// identical across ranks.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "channels/copy_device.hpp"  // Vec16
#include "channels/device_common.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace pyccl {

enum class DataType : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class ReduceOp : uint32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };

inline uint32_t dataTypeSize(DataType t) { return t == DataType::kFloat32 ? 4 : 2; }

inline const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
  }
  return "?";
}

inline const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

namespace detail {

PYCCL_HOST_DEVICE float bitsToFloat(uint32_t u) {
#if PYCCL_ON_DEVICE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

PYCCL_HOST_DEVICE uint32_t floatToBits(float f) {
#if PYCCL_ON_DEVICE
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

/// IEEE binary16 -> binary32 (exact), host side.
inline float halfToFloatHost(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bitsToFloat(sign);
    // Subnormal: normalize.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bitsToFloat(sign | (exp << 23) | (mant << 13));
  }
  return bitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

/// binary32 -> binary16, round to nearest even, host side.
inline uint16_t floatToHalfHost(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absu < 0x38800000u) {
    // Subnormal or zero in half: shift the implicit-one mantissa into place.
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = absu >> 23;
    const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((absu >> 13) - (112u << 10));
  const uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

inline uint16_t floatToBFloat16Host(float f) {
  const uint32_t u = floatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace detail

/// Conversions to and from the fp32 accumulator.
template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<float> {
  PYCCL_HOST_DEVICE static float toFloat(float v) { return v; }
  PYCCL_HOST_DEVICE static float fromFloat(float v) { return v; }
};

template <>
struct ElementTraits<Half> {
  PYCCL_HOST_DEVICE static float toFloat(Half v) {
#if PYCCL_ON_DEVICE
    return __half2float(__ushort_as_half(v.bits));
#else
    return detail::halfToFloatHost(v.bits);
#endif
  }
  PYCCL_HOST_DEVICE static Half fromFloat(float v) {
#if PYCCL_ON_DEVICE
    return Half{__half_as_ushort(__float2half_rn(v))};
#else
    return Half{detail::floatToHalfHost(v)};
#endif
  }
};

template <>
struct ElementTraits<BFloat16> {
  PYCCL_HOST_DEVICE static float toFloat(BFloat16 v) { return detail::bitsToFloat(static_cast<uint32_t>(v.bits) << 16); }
  PYCCL_HOST_DEVICE static BFloat16 fromFloat(float v) {
#if PYCCL_ON_DEVICE
    return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
#else
    return BFloat16{detail::floatToBFloat16Host(v)};
#endif
  }
};

namespace detail {

/// Lane `lane` of T values packed in 32-bit words, in memory order (lane 0 of
/// a 16-bit T is the low half of words[0]: both hosts and GPUs are
/// little-endian). A shift of the lane's word: byte copies compile to five or
/// six byte extractions per lane, and a reduction takes a lane per source.
/// `words` are read as 32-bit integers: they must be such objects (packet
/// payloads, a vector's int fields), not floats or 16-bit elements.
template <typename T>
PYCCL_HOST_DEVICE T laneOf(const uint32_t* words, uint32_t lane) {
  if constexpr (std::is_same_v<T, float>) {
    return bitsToFloat(words[lane]);
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T{static_cast<uint16_t>(words[lane / 2] >> (16 * (lane % 2)))};
  } else {
    T v;
    const auto* bytes = reinterpret_cast<const unsigned char*>(words) + lane * sizeof(T);
    auto* dst = reinterpret_cast<unsigned char*>(&v);
    for (uint32_t k = 0; k < sizeof(T); ++k) dst[k] = bytes[k];
    return v;
  }
}

/// The word of T lanes[0, 4 / sizeof(T)) (fp32), rounded as fromFloat rounds; laneOf's inverse.
template <typename T>
PYCCL_HOST_DEVICE uint32_t wordOfLanes(const float* lanes) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>,
                "reductions are over float32, float16 and bfloat16");
  if constexpr (sizeof(T) == 4) {
    return floatToBits(lanes[0]);
  } else {
    return static_cast<uint32_t>(ElementTraits<T>::fromFloat(lanes[0]).bits) |
           static_cast<uint32_t>(ElementTraits<T>::fromFloat(lanes[1]).bits) << 16;
  }
}

/// Word `w` of a vector, read by field (no cast, so no aliasing question).
PYCCL_HOST_DEVICE uint32_t wordOf(const Vec16& x, uint32_t w) {
  return static_cast<uint32_t>(w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w);
}

/// Lane `l` of a 16-byte vector of T, as fp32 (its word by field, then laneOf).
template <typename T>
PYCCL_HOST_DEVICE float laneOfVector(const Vec16& x, uint32_t l) {
  constexpr uint32_t kPerWord = 4 / sizeof(T);
  const uint32_t word = wordOf(x, l / kPerWord);
  return ElementTraits<T>::toFloat(laneOf<T>(&word, l % kPerWord));
}

/// The 16-byte vector of T holding `acc` (fp32 lanes, in memory order).
template <typename T>
PYCCL_HOST_DEVICE Vec16 vectorOfLanes(const float (&acc)[16 / sizeof(T)]) {
  constexpr uint32_t kPerWord = 4 / sizeof(T);
  Vec16 x;
  x.x = static_cast<int>(wordOfLanes<T>(acc));
  x.y = static_cast<int>(wordOfLanes<T>(acc + kPerWord));
  x.z = static_cast<int>(wordOfLanes<T>(acc + 2 * kPerWord));
  x.w = static_cast<int>(wordOfLanes<T>(acc + 3 * kPerWord));
  return x;
}

}  // namespace detail

/// The binary operator of a reduction, on fp32 accumulators. kAvg sums; the
/// division by the world size happens once, in finish().
template <ReduceOp Op>
struct Reducer {
  PYCCL_HOST_DEVICE static float apply(float a, float b) {
    if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return a + b;
    // As NCCL (fminf/fmaxf, __hmin/__hmax): NaN loses to any number, so the
    // result is NaN only where every rank holds NaN; otherwise the
    // smaller/larger value, the earlier rank's on ties (so -0/+0 resolve the
    // same on every rank).
    if constexpr (Op == ReduceOp::kMin) return (b < a || a != a) ? b : a;
    if constexpr (Op == ReduceOp::kMax) return (b > a || a != a) ? b : a;
    if constexpr (Op == ReduceOp::kProd) return a * b;
    return a;
  }
  PYCCL_HOST_DEVICE static float finish(float a, int worldSize) {
    if constexpr (Op == ReduceOp::kAvg) return a / static_cast<float>(worldSize);
    return a;
  }
};

/// Calls fn.template operator()<T, Op>() for the runtime dtype and op.
template <typename Fn>
void dispatchReduction(DataType dtype, ReduceOp op, Fn&& fn) {
  auto withOp = [&](auto typeTag) {
    using T = decltype(typeTag);
    switch (op) {
      case ReduceOp::kSum: fn.template operator()<T, ReduceOp::kSum>(); break;
      case ReduceOp::kAvg: fn.template operator()<T, ReduceOp::kAvg>(); break;
      case ReduceOp::kMin: fn.template operator()<T, ReduceOp::kMin>(); break;
      case ReduceOp::kMax: fn.template operator()<T, ReduceOp::kMax>(); break;
      case ReduceOp::kProd: fn.template operator()<T, ReduceOp::kProd>(); break;
    }
  };
  switch (dtype) {
    case DataType::kFloat32: withOp(float{}); break;
    case DataType::kFloat16: withOp(Half{}); break;
    case DataType::kBFloat16: withOp(BFloat16{}); break;
  }
}

/// Calls fn.template operator()<T>() for the runtime dtype (a reduction dtype).
template <typename Fn>
void dispatchFloat(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32: fn.template operator()<float>(); break;
    case DataType::kFloat16: fn.template operator()<Half>(); break;
    case DataType::kBFloat16: fn.template operator()<BFloat16>(); break;
  }
}

/// Calls fn.template operator()<T, Op>() for every dtype and op that reduces.
template <typename Fn>
void forEachReduction(Fn&& fn) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      dispatchReduction(dtype, op, fn);
    }
  }
}

}  // namespace pyccl
