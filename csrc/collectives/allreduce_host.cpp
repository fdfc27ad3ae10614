#include <thread>
#include <vector>

#include "collectives/allreduce_launch.hpp"

namespace pyccl {

void allReduceHost(const AllReduceContext& context, const AllReduceCall& call) {
  const bool ll = call.algorithm == AllReduceAlgorithm::kOnePhaseLL;
  const uint32_t blocks = ll ? context.llBlocks : context.hbBlocks;
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    std::vector<std::thread> threads;
    threads.reserve(blocks);
    for (uint32_t b = 0; b < blocks; ++b) {
      threads.emplace_back([&, b] {
        if (ll) {
          allReduceLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
        } else {
          allReduceHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
        }
      });
    }
    for (auto& t : threads) t.join();
  });
}

}  // namespace pyccl
