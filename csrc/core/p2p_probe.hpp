// The kernel behind the P2P probe: stores one 64-bit value into each target
// address from the GPU's SMs (the path MemoryChannel uses), then waits for it.
#pragma once

#include <cstdint>
#include <vector>

namespace pyccl {

/// Launches the probe on `device` and synchronizes. Throws CudaError on failure.
void probeWritePeers(int device, const std::vector<uint64_t*>& targets,
                     const std::vector<uint64_t>& values);

}  // namespace pyccl
