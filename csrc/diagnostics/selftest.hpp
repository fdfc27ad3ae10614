// A self-contained exchange that checks registration and semaphores end to end:
// each rank writes a pattern into a slot of every peer's registered buffer,
// signals the peer, waits for the peer's signal, and counts the words of its
// own buffer that do not hold the pattern the peer wrote, then signals and
// waits once more so the next exchange cannot overwrite a slot still being
// read. On GPUs one thread
// block serves one peer (stores from the SMs, over NVLink/PCIe); in host mode
// one CPU thread does.
#pragma once

#include <cstdint>
#include <vector>

#include "channels/semaphore_device.hpp"

namespace pyccl {

constexpr int kSelftestMaxPeers = 64;

struct SelftestArgs {
  int32_t* peerBuffers[kSelftestMaxPeers];  ///< each peer's buffer, mapped here
  SemaphoreDeviceHandle semaphores[kSelftestMaxPeers];
  int peers[kSelftestMaxPeers];
  int numPeers;
  int rank;
  int32_t* localBuffer;
  uint64_t wordsPerRank;  ///< each rank's slot in every buffer
  uint32_t seed;
  unsigned long long* mismatches;  ///< out: words that were wrong
  unsigned int* waitFailures;      ///< out: waits that timed out or were aborted
};

PYCCL_HOST_DEVICE int32_t selftestValue(int writer, uint64_t index, uint32_t seed) {
  uint64_t x = (static_cast<uint64_t>(writer) << 40) ^ index ^ (static_cast<uint64_t>(seed) << 20);
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return static_cast<int32_t>(x);
}

/// Runs the exchange; returns the number of wrong words. Waits that fail are
/// reported through the communicator's error record.
struct SelftestResult {
  unsigned long long mismatches;
  unsigned int waitFailures;
};
SelftestResult runSelftestHost(const SelftestArgs& args);
#ifdef PYCCL_WITH_CUDA
SelftestResult runSelftestDevice(int device, SelftestArgs args);
#endif

}  // namespace pyccl
