// Host mode: each block of a collective body runs on its own CPU thread.
#include <barrier>
#include <memory>
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

/// The row sums of fused_norm_device.hpp for one row group's blocks (CPU
/// threads of one block each): every thread stores its value, all meet at a
/// barrier, and each adds them in block order.
struct HostRowGroup {
  struct Shared {
    explicit Shared(uint32_t segments)
        : meet(segments), partials(2ull * segments * kMaxCollectiveRanks) {}
    std::barrier<> meet;
    std::vector<float> partials;  ///< [2 parities][segment][kMaxCollectiveRanks]
  };
  Shared* shared;
  uint32_t segment;
  uint32_t segments;
  uint32_t parity = 0;

  template <int N>
  void sums(float (&values)[N], int used) {
    used = used < N ? used : N;  // never more than the array (GCC cannot see that callers keep to it)
    float* slots = shared->partials.data() + static_cast<size_t>(parity) * segments * kMaxCollectiveRanks;
    for (int n = 0; n < used; ++n) slots[segment * kMaxCollectiveRanks + n] = values[n];
    shared->meet.arrive_and_wait();  // a parity is written again only after the next meeting
    for (int n = 0; n < used; ++n) {
      float total = 0;
      for (uint32_t s = 0; s < segments; ++s) total += slots[s * kMaxCollectiveRanks + n];
      values[n] = total;
    }
    parity ^= 1;
  }
  void finish() {}
};

}  // namespace

void allReduceRMSNormHost(const CollectiveContext& context, const FusedNormCall& call) {
  const FusedNormArgs& a = call.args;
  std::vector<std::unique_ptr<HostRowGroup::Shared>> groups;
  for (uint32_t g = 0; g < a.groups; ++g) groups.push_back(std::make_unique<HostRowGroup::Shared>(a.segments));
  dispatchFloat(call.dtype, [&]<typename T>() {
    runBlocks(a.groups * a.segments, [&](uint32_t b) {
      HostRowGroup rowGroup{groups[b / a.segments].get(), b % a.segments, a.segments};
      if (a.twoShot != 0) {
        allReduceRMSNorm<T, true>(context, a, b / a.segments, b % a.segments, 0, 1, rowGroup);
      } else {
        allReduceRMSNorm<T, false>(context, a, b / a.segments, b % a.segments, 0, 1, rowGroup);
      }
    });
  });
}

void addRMSNormHost(const AddRMSNormCall& call) {
  const AddRMSNormArgs& a = call.args;
  dispatchFloat(call.dtype, [&]<typename T>() {
    auto rows = [&]<typename Unit>() {
      for (uint64_t row = 0; row < a.rows; ++row) {
        addRMSNormRow<T, Unit>(a, row, 0, 1, [] {}, [](float x) { return x; });
      }
    };
    if (addRMSNormVectorized(a, sizeof(T))) {
      rows.template operator()<detail::Vec16>();
    } else {
      rows.template operator()<T>();
    }
  });
}

void allReduceHost(const CollectiveContext& context, const AllReduceCall& call) {
  uint32_t blocks = context.llActiveBlocks;
  if (call.algorithm == AllReduceAlgorithm::kTwoPhaseHB) blocks = context.hbBlocks;
  if (call.algorithm == AllReduceAlgorithm::kOnePhaseHB) blocks = context.hbActiveBlocks;
  dispatchReduction(call.dtype, call.op, [&]<typename T, ReduceOp Op>() {
    runBlocks(blocks, [&](uint32_t b) {
      switch (call.algorithm) {
        case AllReduceAlgorithm::kOnePhaseLL:
          allReduceOnePhaseLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseLL:
          allReduceTwoPhaseLL<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kOnePhaseHB:
          allReduceOnePhaseHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
          break;
        case AllReduceAlgorithm::kTwoPhaseHB:
          if (call.symmetric != nullptr || call.graphSlot != nullptr) {
            // Host memory in host mode, so a graph slot reads like the pointers themselves.
            const SymmetricPointers& p = call.symmetric != nullptr ? *call.symmetric : *call.graphSlot;
            allReduceZeroCopy<T, Op>(context, p, call.count, b, context.hbBlocks, 0, 1);
            break;
          }
          allReduceTwoPhaseHB<T, Op>(context, call.input, call.output, call.count, b, 0, 1);
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

void sendRecvHost(const CollectiveContext& context, const P2PArgs& args) {
  runBlocks(args.blocks, [&](uint32_t b) { sendRecvBlock(context, args, b, 0, 1); });
}

}  // namespace pyccl
