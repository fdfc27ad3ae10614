// How every kernel of pyccl is launched, for the collective algorithms and the
// plan interpreter alike: on GPUs, a grid of blocks on a stream
// (kernel_launch.cuh enqueues it); in host mode, the same body with each block
// on a CPU thread of its own and one thread per block (runHostBlocks).
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

#include "core/debug_options.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {

/// The shape of one kernel launch (kernel_launch.cuh).
struct KernelLaunch {
  uint32_t threadsPerBlock;
  /// Programmatic dependent launch (sm_90+): the kernel may be scheduled
  /// before the previous one on the stream completes, and waits for it on the GPU.
  bool programmatic;
  /// Dynamic shared memory per block.
  uint32_t sharedBytes = 0;
  /// Blocks per thread-block cluster (sm_90+); 1: no clusters.
  uint32_t clusterBlocks = 1;
};

/// Threads per block for `items` work items, one per thread: whole warps,
/// at least one, at most `maxThreads` (a multiple of 32).
inline uint32_t wholeWarpsFor(uint64_t items, uint32_t maxThreads) {
  const uint64_t threads = items <= 32 ? 32 : (items + 31) / 32 * 32;
  return threads < maxThreads ? static_cast<uint32_t>(threads) : maxThreads;
}

/// Whether kernels on `device` launch with programmatic dependent launch: on
/// sm_90 and newer (the kernels' griddepcontrol instructions are compiled for
/// those only), unless PYCCL_PDL=0 turns it off; for the collective engines
/// and the plan executors alike. Host mode (device < 0): as PYCCL_PDL says.
inline bool programmaticLaunchAllowed(int device) {
  return debugOptions().programmaticLaunch && (device < 0 || gpu::computeCapability(device) >= 90);
}

/// Host mode: runs body(b) for every block b of `blocks`, each on a CPU thread
/// of its own (the blocks of a collective wait on each other's peers, so they
/// must all run at once), and returns when every one has returned.
template <typename Body>
void runHostBlocks(uint32_t blocks, Body&& body) {
  std::vector<std::thread> threads;
  threads.reserve(blocks);
  for (uint32_t b = 0; b < blocks; ++b) threads.emplace_back([&body, b] { body(b); });
  for (auto& t : threads) t.join();
}

}  // namespace pyccl
