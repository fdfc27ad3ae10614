// SwitchChannel: switch-mapped I/O through NVLink SHARP (NVLS). A multicast
// address maps the same buffer on every GPU of the group; `multimem` loads
// reduce across all of them in the switch, and `multimem` stores write to all.
//
// Gated off: pyccl creates multicast objects only when PYCCL_ENABLE_NVLS=1,
// and never on machines where multicast can disturb a shared host.
// Requires sm_90 or newer; elsewhere the methods trap.
#pragma once

#include <type_traits>

#include "channels/device_common.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace pyccl {

struct SwitchChannelDeviceHandle {
  char* multicast;  ///< the group's multicast address of the buffer
  char* local;      ///< this GPU's unicast address of the same buffer

#if defined(__CUDACC__)
  /// Loads 16 bytes of T (float, __half or __nv_bfloat16) at `offset`, summed
  /// over every GPU of the group (half types accumulate in fp32 in the switch).
  /// Relaxed: order it after the peers' writes with a barrier across the group.
  template <typename T>
  __device__ __forceinline__ uint4 reduce16(uint64_t offset) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint4 v;
    const char* p = multicast + offset;
    if constexpr (std::is_same_v<T, float>) {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    } else if constexpr (std::is_same_v<T, __half>) {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>, "reduce16 takes float, __half or __nv_bfloat16");
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    }
    return v;
#else
    __trap();
    return uint4{};
#endif
  }

  /// Stores 16 bytes at `offset` on every GPU of the group (broadcast).
  __device__ __forceinline__ void broadcast16(uint64_t offset, uint4 v) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(multicast + offset),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#else
    __trap();
#endif
  }

  /// All-reduce (sum) of `bytes` of float at `offset` by threads [tid,
  /// numThreads) of all participating GPUs, each taking its own slice: reduce
  /// in the switch, then broadcast the result. Slices must be disjoint across
  /// GPUs; bytes a multiple of 16.
  __device__ __forceinline__ void allReduceFloatSlice(uint64_t offset, uint64_t bytes, uint32_t tid,
                                                      uint32_t numThreads) const {
    for (uint64_t i = tid * 16ull; i < bytes; i += numThreads * 16ull) {
      broadcast16(offset + i, reduce16<float>(offset + i));
    }
  }
#endif
};

}  // namespace pyccl
