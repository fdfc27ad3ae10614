// Settings for experiments, tests and diagnosis, kept apart from what users
// set (env_settings.hpp, the engine's options): one struct, read from the
// environment in one place. pyccl needs none of them; they may change or go.
#pragma once

#include <cstdint>

namespace pyccl {

struct DebugOptions {
  /// PYCCL_PDL=0: kernels launch without programmatic dependent launch
  /// (comparisons; every engine and executor made after it).
  bool programmaticLaunch = true;
  /// PYCCL_PLAN_GENERIC_PACKETS=1: the plan interpreter's packet ops always
  /// take their any-shape form (plan_packets.hpp), for tests and comparisons.
  bool planGenericPackets = false;
  /// PYCCL_PRELOAD_KERNELS=0: kernels load on their first launch, not when a
  /// communicator is made (diagnosis of load failures).
  bool preloadKernels = true;
  /// PYCCL_ALLOW_SHARED_GPU=1: ranks of one communicator may share a GPU
  /// (tests on a machine with fewer GPUs than ranks).
  bool allowSharedGpu = false;
  /// PYCCL_RDMA_LOOPBACK=1: the RDMA transport's queue pairs become memcpy
  /// stand-ins (host mode only), so its channel logic runs where no NIC exists.
  bool rdmaLoopback = false;
  /// PYCCL_RDMA_LOOPBACK_FAIL_AT: the work request (from 0) the stand-in
  /// fails, or -1 for none.
  int64_t rdmaLoopbackFailAt = -1;
};

/// The debug options the environment sets now; a bad value raises
/// InvalidArgument naming the variable. Read where a communicator, engine,
/// executor or channel is set up, never per collective.
DebugOptions debugOptions();

}  // namespace pyccl
