// Cooperative copies for the high-bandwidth (HB) protocol: `numThreads`
// threads (ids [0, numThreads)) together copy `bytes` from `src` to `dst`.
// Any size and alignment: a 16-byte vector body when source and destination
// are equally aligned modulo 16 (else 8, 4 or 1 bytes), with scalar head and tail.
// No ordering is implied: order the copy before a signal with a barrier.
#pragma once

#include <cstring>

#include "channels/device_common.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace pyccl {

namespace detail {

#if defined(__CUDACC__)
using Vec16 = int4;
#else
struct alignas(16) Vec16 {
  int x, y, z, w;
};
#endif

/// Copies whole `T` words; `count` words, threads stride by `numThreads`.
/// Four loads are issued before their stores so several are in flight.
template <typename T>
PYCCL_HOST_DEVICE void copyWords(T* dst, const T* src, uint64_t count, uint32_t tid,
                                 uint32_t numThreads) {
  uint64_t i = tid;
  const uint64_t stride = numThreads;
  for (; i + 3 * stride < count; i += 4 * stride) {
    T a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < count; i += stride) dst[i] = src[i];
}

template <typename T>
PYCCL_HOST_DEVICE void copyAligned(char* dst, const char* src, uint64_t bytes, uint32_t tid,
                                   uint32_t numThreads) {
  constexpr uint64_t kWidth = sizeof(T);
  uint64_t head = (kWidth - (reinterpret_cast<uintptr_t>(dst) & (kWidth - 1))) & (kWidth - 1);
  if (head > bytes) head = bytes;
  for (uint64_t i = tid; i < head; i += numThreads) dst[i] = src[i];
  const uint64_t words = (bytes - head) / kWidth;
  copyWords(reinterpret_cast<T*>(dst + head), reinterpret_cast<const T*>(src + head), words, tid,
            numThreads);
  const uint64_t done = head + words * kWidth;
  for (uint64_t i = done + tid; i < bytes; i += numThreads) dst[i] = src[i];
}

}  // namespace detail

/// Copies `bytes` from `src` to `dst` with `numThreads` cooperating threads.
PYCCL_HOST_DEVICE void copyBytes(void* dst, const void* src, uint64_t bytes, uint32_t tid,
                                 uint32_t numThreads) {
#if !PYCCL_ON_DEVICE
  if (numThreads == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
#endif
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const uintptr_t skew = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  if ((skew & 15) == 0) {
    detail::copyAligned<detail::Vec16>(d, s, bytes, tid, numThreads);
  } else if ((skew & 7) == 0) {
    detail::copyAligned<uint64_t>(d, s, bytes, tid, numThreads);
  } else if ((skew & 3) == 0) {
    detail::copyAligned<uint32_t>(d, s, bytes, tid, numThreads);
  } else {
    detail::copyAligned<uint8_t>(d, s, bytes, tid, numThreads);
  }
}

}  // namespace pyccl
