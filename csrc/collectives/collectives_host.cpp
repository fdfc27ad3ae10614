// Host mode: each block of a collective body runs on its own CPU thread.
#include <thread>
#include <vector>

#include "collectives/collective_launch.hpp"

namespace pyccl {
namespace {

template <typename Body>
void runBlocks(uint32_t blocks, Body&& body) {
  std::vector<std::thread> threads;
  threads.reserve(blocks);
  for (uint32_t b = 0; b < blocks; ++b) threads.emplace_back([&body, b] { body(b); });
  for (auto& t : threads) t.join();
}

}  // namespace

void allReduceHost(const CollectiveContext& context, const AllReduceCall& call) {
  const bool hb = call.algorithm == AllReduceAlgorithm::kTwoPhaseHB;
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    runBlocks(hb ? context.hbBlocks : context.llActiveBlocks, [&](uint32_t b) {
      switch (call.algorithm) {
        case AllReduceAlgorithm::kOnePhaseLL:
          allReduceLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseLL:
          allReduceLL2<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseHB:
          if (call.symmetric != nullptr) {
            allReduceZeroCopy<T, Op>(context, *call.symmetric, call.count, b, context.hbBlocks, 0, 1);
            break;
          }
          allReduceHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
      }
    });
  });
}

void exchangeHost(const CollectiveContext& context, const ExchangeCall& call) {
  const bool ll = call.protocol == Protocol::kLL;
  const uint32_t blocks = ll ? context.llActiveBlocks : context.hbBlocks;
  const ExchangeArgs& a = call.args;
  if (call.kind != ExchangeKind::kReduceScatter) {
    runBlocks(blocks, [&](uint32_t b) {
      if (ll) {
        exchangeLL(call.kind, context, a, b, 0, 1);
      } else {
        exchangeHB(call.kind, context, a, b, 0, 1);
      }
    });
    return;
  }
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    runBlocks(blocks, [&](uint32_t b) {
      if (ll) {
        reduceLL<T, Op>(context, a.input, a.inStride, a.output, a.chunkBytes / sizeof(T), b, 0, 1);
      } else {
        reduceScatterHB<T, Op>(context, a, b, 0, 1);
      }
    });
  });
}

}  // namespace pyccl
