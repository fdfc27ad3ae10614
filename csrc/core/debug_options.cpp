#include "core/debug_options.hpp"

#include "core/env_settings.hpp"

namespace pyccl {

DebugOptions debugOptions() {
  DebugOptions o;
  o.programmaticLaunch = envFlag("PYCCL_PDL", true);
  o.planGenericPackets = envFlag("PYCCL_PLAN_GENERIC_PACKETS", false);
  o.preloadKernels = envFlag("PYCCL_PRELOAD_KERNELS", true);
  o.allowSharedGpu = envFlag("PYCCL_ALLOW_SHARED_GPU", false);
  o.rdmaLoopback = envFlag("PYCCL_RDMA_LOOPBACK", false);
  constexpr uint64_t kNone = ~0ull;
  const uint64_t failAt = envCount("PYCCL_RDMA_LOOPBACK_FAIL_AT", kNone, 1ull << 62, "work requests");
  o.rdmaLoopbackFailAt = failAt == kNone ? -1 : static_cast<int64_t>(failAt);
  return o;
}

}  // namespace pyccl
