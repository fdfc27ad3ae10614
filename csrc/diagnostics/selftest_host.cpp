#include <atomic>
#include <thread>

#include "diagnostics/selftest.hpp"

namespace pyccl {

SelftestResult runSelftestHost(const SelftestArgs& argsIn) {
  SelftestArgs args = argsIn;
  std::atomic<unsigned long long> mismatches{0};
  std::atomic<unsigned int> waitFailures{0};
  std::vector<std::thread> threads;
  for (int b = 0; b < args.numPeers; ++b) {
    threads.emplace_back([&, b] {
      const int peer = args.peers[b];
      int32_t* dst = args.peerBuffers[b] + static_cast<uint64_t>(args.rank) * args.wordsPerRank;
      for (uint64_t i = 0; i < args.wordsPerRank; ++i) dst[i] = selftestValue(args.rank, i, args.seed);
      args.semaphores[b].signal();  // release: the stores above come first
      if (args.semaphores[b].wait() != WaitStatus::kOk) {
        waitFailures++;
        return;
      }
      const int32_t* src = args.localBuffer + static_cast<uint64_t>(peer) * args.wordsPerRank;
      unsigned long long bad = 0;
      for (uint64_t i = 0; i < args.wordsPerRank; ++i) bad += src[i] != selftestValue(peer, i, args.seed);
      mismatches += bad;
      // Closing handshake: the peer reuses its slot only after this read.
      args.semaphores[b].signal();
      if (args.semaphores[b].wait() != WaitStatus::kOk) waitFailures++;
    });
  }
  for (auto& t : threads) t.join();
  return {mismatches.load(), waitFailures.load()};
}

}  // namespace pyccl
