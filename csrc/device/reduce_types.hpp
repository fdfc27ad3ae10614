// Element types and reduction operators of every kernel that reduces (the
// collective algorithms and the plan interpreter), for device code and for
// host mode alike, and the dispatch of a call's runtime dtype and op to their
// templates.
//
// Every dtype NCCL reduces is reduced here, each in an accumulator of its own
// (ElementTraits<T>::Acc), with NCCL's results:
//   - float32, float16, bfloat16: in fp32, rounded to the type once;
//   - float8 (e4m3fn, e5m2): in fp32, rounded once; sum, avg and prod
//     saturate at the type's largest finite value, as NCCL's fp8 conversions
//     (satfinite) do, and NaN stays NaN;
//   - float64: in float64;
//   - integers (int8, uint8, int32, uint32, int64, uint64) in their own
//     width: sum and product wrap (taken in unsigned arithmetic, which gives
//     the same bits for signed types), min and max compare as the type does,
//     avg is the wrapped sum divided by the world size and truncated toward
//     zero (NCCL's SumPostDiv).
// Floating min and max: NaN loses to any number (fminf/fmaxf, as NCCL), and
// ties keep the earlier rank's value. Every rank reduces contributions in
// rank order, so results are bitwise identical across ranks.
//
// Only the 16-bit and fp32 floats have plans and the fused all-reduce +
// RMSNorm (isFloatType, dispatchFloat); the collective kernels take them all
// (dispatchReduction).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "channels/copy_device.hpp"  // Vec16
#include "channels/device_common.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace pyccl {

enum class DataType : uint32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kUInt32 = 7,
  kInt64 = 8,
  kUInt64 = 9,
  kFloat8E4M3 = 10,  ///< float8_e4m3fn (no infinities; NaN is S.1111.111)
  kFloat8E5M2 = 11,
};
enum class ReduceOp : uint32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };

inline uint32_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kFloat32:
    case DataType::kInt32:
    case DataType::kUInt32: return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
    case DataType::kUInt64: return 8;
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: return 1;
  }
  return 1;
}

inline const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUInt32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt64: return "uint64";
    case DataType::kFloat8E4M3: return "float8_e4m3fn";
    case DataType::kFloat8E5M2: return "float8_e5m2";
  }
  return "?";
}

/// float32, float16 and bfloat16: the dtypes of plans and of the fused all-reduce + RMSNorm.
inline bool isFloatType(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16;
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
struct Float8E4M3 {
  uint8_t bits;
};
struct Float8E5M2 {
  uint8_t bits;
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

PYCCL_HOST_DEVICE double bitsToDouble(uint64_t u) {
#if PYCCL_ON_DEVICE
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

PYCCL_HOST_DEVICE uint64_t doubleToBits(double d) {
#if PYCCL_ON_DEVICE
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
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

/// float8_e4m3fn -> binary32 (exact), host side: bias 7, 3 mantissa bits, S.1111.111 is NaN.
inline float float8E4M3ToFloatHost(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return bitsToFloat(sign | 0x7fc00000u);
  if (exp == 0) return bitsToFloat(sign | floatToBits(static_cast<float>(mant) * 0x1p-9f));  // subnormal, exact
  return bitsToFloat(sign | ((exp + 120) << 23) | (mant << 20));
}

/// binary32 -> a float8 of `expBits` exponent and `mantBits` mantissa bits (bias 2^(expBits-1) - 1), round
/// to nearest even, without saturation: past the largest finite value, e4m3fn gives NaN and e5m2 infinity
/// (as CUDA's __NV_NOSAT conversions). Host side.
template <uint32_t expBits, uint32_t mantBits>
inline uint8_t floatToFloat8Host(float f) {
  constexpr bool kE4M3 = expBits == 4;
  constexpr int kBias = (1 << (expBits - 1)) - 1;
  constexpr uint32_t kNan = kE4M3 ? 0x7fu : 0x7eu;
  constexpr uint32_t kOverflow = kE4M3 ? 0x7fu : 0x7cu;  // NaN, or infinity
  constexpr uint32_t kLargest = kE4M3 ? 0x7eu : 0x7bu;   // the largest finite magnitude's bits
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint8_t>(sign | kNan);
  if (absu == 0x7f800000u) return static_cast<uint8_t>(sign | kOverflow);
  const int exp = static_cast<int>(absu >> 23) - 127;  // float subnormals are far below the type's range
  if (static_cast<int>(absu >> 23) == 0) return static_cast<uint8_t>(sign);
  const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
  int targetExp = exp + kBias;  // >= 1: normal in the type
  uint32_t shift = 23 - mantBits;
  if (targetExp < 1) {
    shift += static_cast<uint32_t>(1 - targetExp);
    targetExp = 0;
  }
  if (shift > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t mid = 1u << (shift - 1);
  if (rem > mid || (rem == mid && (q & 1))) ++q;
  // Normal: the exponent field plus the rounded mantissa (a carry moves the exponent on); subnormal: q itself.
  const uint32_t bits = targetExp >= 1 ? (static_cast<uint32_t>(targetExp) << mantBits) + q - (1u << mantBits) : q;
  return static_cast<uint8_t>(sign | (bits > kLargest ? kOverflow : bits));
}

}  // namespace detail

/// Each element type: its accumulator `Acc` and the conversions to and from
/// it (toAcc exact, fromAcc rounding to nearest even), and its bits (`Bits`,
/// an unsigned integer of its width) for packing lanes into words.
template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<float> {
  using Acc = float;
  using Bits = uint32_t;
  PYCCL_HOST_DEVICE static float toAcc(float v) { return v; }
  PYCCL_HOST_DEVICE static float fromAcc(float v) { return v; }
  PYCCL_HOST_DEVICE static Bits bits(float v) { return detail::floatToBits(v); }
  PYCCL_HOST_DEVICE static float ofBits(Bits b) { return detail::bitsToFloat(b); }
};

template <>
struct ElementTraits<Half> {
  using Acc = float;
  using Bits = uint16_t;
  PYCCL_HOST_DEVICE static float toAcc(Half v) {
#if PYCCL_ON_DEVICE
    return __half2float(__ushort_as_half(v.bits));
#else
    return detail::halfToFloatHost(v.bits);
#endif
  }
  PYCCL_HOST_DEVICE static Half fromAcc(float v) {
#if PYCCL_ON_DEVICE
    return Half{__half_as_ushort(__float2half_rn(v))};
#else
    return Half{detail::floatToHalfHost(v)};
#endif
  }
  PYCCL_HOST_DEVICE static Bits bits(Half v) { return v.bits; }
  PYCCL_HOST_DEVICE static Half ofBits(Bits b) { return Half{b}; }
};

template <>
struct ElementTraits<BFloat16> {
  using Acc = float;
  using Bits = uint16_t;
  PYCCL_HOST_DEVICE static float toAcc(BFloat16 v) { return detail::bitsToFloat(static_cast<uint32_t>(v.bits) << 16); }
  PYCCL_HOST_DEVICE static BFloat16 fromAcc(float v) {
#if PYCCL_ON_DEVICE
    return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
#else
    return BFloat16{detail::floatToBFloat16Host(v)};
#endif
  }
  PYCCL_HOST_DEVICE static Bits bits(BFloat16 v) { return v.bits; }
  PYCCL_HOST_DEVICE static BFloat16 ofBits(Bits b) { return BFloat16{b}; }
};

/// What the two float8 types share: an fp32 accumulator, and the rounding back (CUDA's __NV_NOSAT conversion
/// on GPUs, floatToFloat8Host in host mode).
template <typename T, uint32_t expBits, uint32_t mantBits>
struct Float8Traits {
  using Acc = float;
  using Bits = uint8_t;
  PYCCL_HOST_DEVICE static T fromAcc(float v) {
#if PYCCL_ON_DEVICE
    return T{static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_NOSAT, expBits == 4 ? __NV_E4M3 : __NV_E5M2))};
#else
    return T{detail::floatToFloat8Host<expBits, mantBits>(v)};
#endif
  }
  PYCCL_HOST_DEVICE static Bits bits(T v) { return v.bits; }
  PYCCL_HOST_DEVICE static T ofBits(Bits b) { return T{b}; }
};

template <>
struct ElementTraits<Float8E4M3> : Float8Traits<Float8E4M3, 4, 3> {
  /// The largest finite value, where sums, averages and products saturate.
  static constexpr float kLargest = 448.0f;
  PYCCL_HOST_DEVICE static float toAcc(Float8E4M3 v) {
#if PYCCL_ON_DEVICE
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.bits, __NV_E4M3)));
#else
    return detail::float8E4M3ToFloatHost(v.bits);
#endif
  }
};

template <>
struct ElementTraits<Float8E5M2> : Float8Traits<Float8E5M2, 5, 2> {
  static constexpr float kLargest = 57344.0f;
  /// Exact: e5m2 is binary16 without its low byte.
  PYCCL_HOST_DEVICE static float toAcc(Float8E5M2 v) {
    return ElementTraits<Half>::toAcc(Half{static_cast<uint16_t>(static_cast<uint16_t>(v.bits) << 8)});
  }
};

template <>
struct ElementTraits<double> {
  using Acc = double;
  using Bits = uint64_t;
  PYCCL_HOST_DEVICE static double toAcc(double v) { return v; }
  PYCCL_HOST_DEVICE static double fromAcc(double v) { return v; }
  PYCCL_HOST_DEVICE static Bits bits(double v) { return detail::doubleToBits(v); }
  PYCCL_HOST_DEVICE static double ofBits(Bits b) { return detail::bitsToDouble(b); }
};

/// The integers accumulate in themselves; a conversion between an integer
/// and its unsigned type keeps the bits (C++20).
template <typename T>
struct IntegerTraits {
  using Acc = T;
  using Bits = std::make_unsigned_t<T>;
  PYCCL_HOST_DEVICE static T toAcc(T v) { return v; }
  PYCCL_HOST_DEVICE static T fromAcc(T v) { return v; }
  PYCCL_HOST_DEVICE static Bits bits(T v) { return static_cast<Bits>(v); }
  PYCCL_HOST_DEVICE static T ofBits(Bits b) { return static_cast<T>(b); }
};
template <>
struct ElementTraits<int8_t> : IntegerTraits<int8_t> {};
template <>
struct ElementTraits<uint8_t> : IntegerTraits<uint8_t> {};
template <>
struct ElementTraits<int32_t> : IntegerTraits<int32_t> {};
template <>
struct ElementTraits<uint32_t> : IntegerTraits<uint32_t> {};
template <>
struct ElementTraits<int64_t> : IntegerTraits<int64_t> {};
template <>
struct ElementTraits<uint64_t> : IntegerTraits<uint64_t> {};

/// T's accumulator.
template <typename T>
using AccOf = typename ElementTraits<T>::Acc;

namespace detail {

/// Lane `lane` of T values packed in 32-bit words, in memory order (lane 0 of
/// a narrow T is the low bits of words[0]; an 8-byte T spans two words, low
/// word first: both hosts and GPUs are little-endian). Shifts of the lane's
/// words: byte copies compile to byte extractions per lane, and a reduction
/// takes a lane per source. `words` are read as 32-bit integers: they must be
/// such objects (packet payloads, a vector's int fields), not T elements.
template <typename T>
PYCCL_HOST_DEVICE T laneOf(const uint32_t* words, uint32_t lane) {
  using Traits = ElementTraits<T>;
  using Bits = typename Traits::Bits;
  if constexpr (sizeof(T) == 8) {
    return Traits::ofBits(static_cast<uint64_t>(words[2 * lane]) | static_cast<uint64_t>(words[2 * lane + 1]) << 32);
  } else {
    constexpr uint32_t kPerWord = 4 / sizeof(T);
    return Traits::ofBits(static_cast<Bits>(words[lane / kPerWord] >> (8 * sizeof(T) * (lane % kPerWord))));
  }
}

/// Word `w` of T lanes packed in memory order (laneOf's inverse): the lanes of acc it holds, each rounded by
/// fromAcc (an 8-byte T: half of lane w / 2).
template <typename T>
PYCCL_HOST_DEVICE uint32_t wordOfLanes(const AccOf<T>* acc, uint32_t w) {
  using Traits = ElementTraits<T>;
  auto bitsOf = [&](uint32_t lane) { return static_cast<uint32_t>(Traits::bits(Traits::fromAcc(acc[lane]))); };
  if constexpr (sizeof(T) == 8) {
    const uint64_t bits = Traits::bits(Traits::fromAcc(acc[w / 2]));
    return static_cast<uint32_t>(w % 2 == 0 ? bits : bits >> 32);
  } else if constexpr (sizeof(T) == 4) {
    return bitsOf(w);
  } else if constexpr (sizeof(T) == 2) {
    return bitsOf(2 * w) | bitsOf(2 * w + 1) << 16;
  } else {
    return bitsOf(4 * w) | bitsOf(4 * w + 1) << 8 | bitsOf(4 * w + 2) << 16 | bitsOf(4 * w + 3) << 24;
  }
}

/// The kWords words of T lanes acc[0, kWords * 4 / sizeof(T)) (wordOfLanes), as straight-line stores (a
/// loop here, even unrolled, makes nvcc schedule its callers' loops worse).
template <typename T, uint32_t kWords>
PYCCL_HOST_DEVICE void packLanes(const AccOf<T>* acc, uint32_t (&words)[kWords]) {
  [&]<uint32_t... w>(std::integer_sequence<uint32_t, w...>) {
    ((words[w] = wordOfLanes<T>(acc, w)), ...);
  }(std::make_integer_sequence<uint32_t, kWords>{});
}

/// Word `w` of a vector, read by field (no cast, so no aliasing question).
PYCCL_HOST_DEVICE uint32_t wordOf(const Vec16& x, uint32_t w) {
  return static_cast<uint32_t>(w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w);
}

/// Lane `l` of a 16-byte vector of T, as its accumulator (the vector's words by field, then laneOf).
template <typename T>
PYCCL_HOST_DEVICE AccOf<T> laneOfVector(const Vec16& x, uint32_t l) {
  const uint32_t words[4] = {wordOf(x, 0), wordOf(x, 1), wordOf(x, 2), wordOf(x, 3)};
  return ElementTraits<T>::toAcc(laneOf<T>(words, l));
}

/// The 16-byte vector of T holding `acc` (its lanes, in memory order).
template <typename T>
PYCCL_HOST_DEVICE Vec16 vectorOfLanes(const AccOf<T> (&acc)[16 / sizeof(T)]) {
  uint32_t words[4];
  packLanes<T>(acc, words);
  Vec16 x;
  x.x = static_cast<int>(words[0]);
  x.y = static_cast<int>(words[1]);
  x.z = static_cast<int>(words[2]);
  x.w = static_cast<int>(words[3]);
  return x;
}

}  // namespace detail

/// The binary operator of a reduction, on accumulators. kAvg sums; the
/// division by the world size happens once, in finishReduction().
template <ReduceOp Op>
struct Reducer {
  template <typename A>
  PYCCL_HOST_DEVICE static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      // Wrapping, in unsigned arithmetic of at least 32 bits (a narrower one would promote to int and overflow).
      using U = std::conditional_t<(sizeof(A) < 4), uint32_t, std::make_unsigned_t<A>>;
      if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) {
        return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      }
      if constexpr (Op == ReduceOp::kProd) return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return a + b;
      if constexpr (Op == ReduceOp::kProd) return a * b;
    }
    // As NCCL (fminf/fmaxf, __hmin/__hmax): NaN loses to any number, so the
    // result is NaN only where every rank holds NaN; otherwise the
    // smaller/larger value, the earlier rank's on ties (so -0/+0 resolve the
    // same on every rank). Integers compare as their type.
    if constexpr (Op == ReduceOp::kMin) return (b < a || a != a) ? b : a;
    if constexpr (Op == ReduceOp::kMax) return (b > a || a != a) ? b : a;
    return a;
  }
};

/// The reduction `a` of every rank's T, finished: avg divided by the world
/// size (integers truncated toward zero), and a float8's sum, avg and
/// product saturated at its largest finite value (NaN stays NaN).
template <typename T, ReduceOp Op>
PYCCL_HOST_DEVICE AccOf<T> finishReduction(AccOf<T> a, int worldSize) {
  using A = AccOf<T>;
  if constexpr (Op == ReduceOp::kAvg) a = a / static_cast<A>(worldSize);
  if constexpr ((std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>) && Op != ReduceOp::kMin &&
                Op != ReduceOp::kMax) {
    constexpr float kLargest = ElementTraits<T>::kLargest;
    a = a > kLargest ? kLargest : a < -kLargest ? -kLargest : a;  // NaN compares false both times
  }
  return a;
}

/// Whether an integer's `op` gives the same bits for its signed and unsigned
/// type (sum and product wrap alike), so that one kernel serves both.
constexpr bool bitsAgreeAcrossSignedness(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kProd; }

/// Calls fn.template operator()<T, Op>() for the runtime dtype and op; a
/// signed integer's sum and product as its unsigned type's.
template <typename Fn>
void dispatchReduction(DataType dtype, ReduceOp op, Fn&& fn) {
  auto call = [&]<typename T, ReduceOp Op>() {
    if constexpr (std::is_integral_v<T> && bitsAgreeAcrossSignedness(Op)) {
      fn.template operator()<std::make_unsigned_t<T>, Op>();
    } else {
      fn.template operator()<T, Op>();
    }
  };
  auto withOp = [&](auto typeTag) {
    using T = decltype(typeTag);
    switch (op) {
      case ReduceOp::kSum: call.template operator()<T, ReduceOp::kSum>(); break;
      case ReduceOp::kAvg: call.template operator()<T, ReduceOp::kAvg>(); break;
      case ReduceOp::kMin: call.template operator()<T, ReduceOp::kMin>(); break;
      case ReduceOp::kMax: call.template operator()<T, ReduceOp::kMax>(); break;
      case ReduceOp::kProd: call.template operator()<T, ReduceOp::kProd>(); break;
    }
  };
  switch (dtype) {
    case DataType::kFloat32: withOp(float{}); break;
    case DataType::kFloat16: withOp(Half{}); break;
    case DataType::kBFloat16: withOp(BFloat16{}); break;
    case DataType::kFloat64: withOp(double{}); break;
    case DataType::kInt8: withOp(int8_t{}); break;
    case DataType::kUInt8: withOp(uint8_t{}); break;
    case DataType::kInt32: withOp(int32_t{}); break;
    case DataType::kUInt32: withOp(uint32_t{}); break;
    case DataType::kInt64: withOp(int64_t{}); break;
    case DataType::kUInt64: withOp(uint64_t{}); break;
    case DataType::kFloat8E4M3: withOp(Float8E4M3{}); break;
    case DataType::kFloat8E5M2: withOp(Float8E5M2{}); break;
  }
}

/// Calls fn.template operator()<T>() for a dtype of isFloatType (the caller
/// checks; any other dtype calls nothing).
template <typename Fn>
void dispatchFloat(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32: fn.template operator()<float>(); break;
    case DataType::kFloat16: fn.template operator()<Half>(); break;
    case DataType::kBFloat16: fn.template operator()<BFloat16>(); break;
    default: break;
  }
}

/// Calls fn.template operator()<T, Op>() for every dtype and op that reduces
/// (a signed integer's sum and product as its unsigned type's, once each).
template <typename Fn>
void forEachReduction(Fn&& fn) {
  constexpr DataType kAll[] = {DataType::kFloat32, DataType::kFloat16,    DataType::kBFloat16, DataType::kFloat64,
                               DataType::kInt8,    DataType::kUInt8,      DataType::kInt32,    DataType::kUInt32,
                               DataType::kInt64,   DataType::kUInt64,     DataType::kFloat8E4M3,
                               DataType::kFloat8E5M2};
  for (DataType dtype : kAll) {
    const bool signedInteger = dtype == DataType::kInt8 || dtype == DataType::kInt32 || dtype == DataType::kInt64;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      if (signedInteger && bitsAgreeAcrossSignedness(op)) continue;  // the unsigned type's, listed there
      dispatchReduction(dtype, op, fn);
    }
  }
}

}  // namespace pyccl
