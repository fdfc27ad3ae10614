// Loading kernels into a device's context before their first launch.
//
// With lazy module loading (CUDA's default since 12.2, and what torch sets), a
// kernel's code is loaded at its first launch, and loading may wait for every
// kernel running on the device. A collective kernel spins until its peers'
// kernels run, so a first launch can close a cycle across ranks: rank A's
// launch waits for A's running collective, which waits for rank B, whose
// launch waits for B's running collective of another communicator, which
// waits for rank A. Loading every kernel a communicator may launch when it is
// made keeps pyccl's own launches out of such cycles.
#pragma once

#include <vector>

namespace pyccl::gpu {

/// Loads `kernels` (host stubs of __global__ functions) into `device`'s context.
/// The first call for `set` on a device does the work; later calls return at
/// once. PYCCL_PRELOAD_KERNELS=0 turns it off (kernels then load at first launch).
void loadKernelsOnce(int device, const char* set, const std::vector<const void*>& kernels);

}  // namespace pyccl::gpu
