#include <chrono>
#include <thread>
#include <vector>

#include "diagnostics/channel_ops.hpp"

namespace pyccl {

ChannelOpsResult runChannelOpsHost(const ChannelOpsArgs& hostArgs, uint32_t numBlocks) {
  ChannelOpsArgs args = hostArgs;
  unsigned int failures = 0;
  uint64_t elapsed = 0;
  uint64_t barrier[2] = {0, 0};
  args.failures = &failures;
  args.elapsedNs = &elapsed;
  args.barrier = barrier;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> blocks;
  for (uint32_t b = 0; b < numBlocks; ++b) {
    blocks.emplace_back([&args, b, numBlocks] { runChannelOps(args, b, numBlocks, 0, 1); });
  }
  for (auto& t : blocks) t.join();
  const auto t1 = std::chrono::steady_clock::now();
  return {failures, elapsed, std::chrono::duration<double, std::micro>(t1 - t0).count()};
}

}  // namespace pyccl
