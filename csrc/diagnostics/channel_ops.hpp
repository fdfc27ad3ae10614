// A tiny program runner over channels, for tests and benchmarks of the
// Primitive API: a list of ops (put, signal, wait, packets, port requests...)
// executed in order by every block, `repeat` times. Data ops are split across
// the blocks; semaphore and port ops are done by block 0's thread 0; a grid
// barrier separates consecutive ops. The same body runs as a CUDA kernel and,
// in host mode, on CPU threads (one per block).
#pragma once

#include <cstdint>

#include "channels/memory_channel_device.hpp"
#include "channels/port_channel_device.hpp"

namespace pyccl {

enum class ChannelOpCode : uint32_t {
  kPut = 1,            ///< mem.put(a=dstOffset, b=srcOffset, c=bytes)
  kGet = 2,            ///< mem.get(a=dstOffset, b=srcOffset, c=bytes)
  kSignal = 3,         ///< mem.signal()
  kWait = 4,           ///< mem.wait()
  kPutPackets8 = 5,    ///< mem.putPackets<LL8>(a=packetOffset, b=srcOffset, c=bytes, flag)
  kPutPackets16 = 6,   ///< mem.putPackets<LL16>(...)
  kReadPackets8 = 7,   ///< mem.readPackets<LL8>(a=dstOffset, b=packetOffset, c=bytes, flag)
  kReadPackets16 = 8,  ///< mem.readPackets<LL16>(...)
  kPortPut = 9,        ///< port.put(a=dstOffset, b=srcOffset, c=bytes)
  kPortSignal = 10,    ///< port.signal()
  kPortPutWithSignal = 11,
  kPortFlush = 12,     ///< port.flush()
  kPortWait = 13,      ///< port.wait()
  kRelaxedSignal = 14,
  kRelaxedWait = 15,
};

struct ChannelOp {
  uint32_t code;
  uint32_t channel;  ///< index into the memory or port channel array
  uint64_t a, b, c;
  uint32_t flag;     ///< LL ops: flag of the first repetition (+1 per repetition)
  uint32_t reserved;
};

constexpr int kMaxChannelOps = 64;
constexpr int kMaxOpChannels = 16;

struct ChannelOpsArgs {
  MemoryChannelDeviceHandle memory[kMaxOpChannels];
  PortChannelDeviceHandle port[kMaxOpChannels];
  ChannelOp ops[kMaxChannelOps];
  int numOps;
  int repeat;
  unsigned int* failures;  ///< out: waits that gave up (an LL read counts once per block)
  uint64_t* elapsedNs;     ///< out: block 0's time from first to last op
  uint64_t* barrier;       ///< two words, zeroed, for the grid barrier
};

/// Whether `pred` holds for any thread of the block (a block barrier).
PYCCL_HOST_DEVICE bool anyInBlock(bool pred) {
#if PYCCL_ON_DEVICE
  return __syncthreads_or(pred) != 0;
#else
  return pred;
#endif
}

/// Grid-wide barrier for co-resident blocks (generation counting).
PYCCL_HOST_DEVICE void gridBarrier(uint64_t* words, uint32_t numBlocks, uint32_t tid) {
  if (numBlocks == 1) {
    syncBlock();
    return;
  }
  syncBlock();
  if (tid == 0) {
    uint64_t* count = words;
    uint64_t* generation = words + 1;
    const uint64_t gen = atomicLoadAcquire(generation);
#if PYCCL_ON_DEVICE
    // Publish this block's stores (peer memory included) before arriving, so
    // the block that signals after the barrier orders them before its signal.
    __threadfence_system();
    const uint64_t arrived = atomicAdd(reinterpret_cast<unsigned long long*>(count), 1ull) + 1;
#else
    const uint64_t arrived = std::atomic_ref<uint64_t>(*count).fetch_add(1) + 1;
#endif
    if (arrived == numBlocks) {
      atomicStoreRelaxed(count, 0);
      atomicStoreRelease(generation, gen + 1);
    } else {
      while (atomicLoadAcquire(generation) == gen) {
#if !PYCCL_ON_DEVICE
        std::this_thread::yield();
#endif
      }
    }
  }
  syncBlock();
}

/// Byte range [begin, end) of `bytes` that block `block` of `numBlocks` takes,
/// in units of `unit` bytes (so packet boundaries line up).
PYCCL_HOST_DEVICE void blockSlice(uint64_t bytes, uint32_t block, uint32_t numBlocks, uint64_t unit,
                                  uint64_t* begin, uint64_t* end) {
  const uint64_t units = (bytes + unit - 1) / unit;
  const uint64_t per = (units + numBlocks - 1) / numBlocks;
  *begin = block * per * unit;
  *end = (block + 1) * per * unit;
  if (*begin > bytes) *begin = bytes;
  if (*end > bytes) *end = bytes;
}

/// This block's share of an LL put: packets for data bytes [lo, hi).
template <typename Packet>
PYCCL_HOST_DEVICE void putPacketsSlice(MemoryChannelDeviceHandle& mem, const ChannelOp& op, uint32_t flag,
                                       uint32_t block, uint32_t numBlocks, uint32_t tid,
                                       uint32_t numThreads) {
  uint64_t lo = 0, hi = 0;
  blockSlice(op.c, block, numBlocks, Packet::kDataBytes, &lo, &hi);
  if (hi > lo) {
    mem.putPackets<Packet>(op.a + lo / Packet::kDataBytes * sizeof(Packet), op.b + lo, hi - lo, flag,
                           tid, numThreads);
  }
}

/// This block's share of an LL read; false if a wait gave up.
template <typename Packet>
PYCCL_HOST_DEVICE bool readPacketsSlice(MemoryChannelDeviceHandle& mem, const ChannelOp& op, uint32_t flag,
                                        uint32_t block, uint32_t numBlocks, uint32_t tid,
                                        uint32_t numThreads) {
  uint64_t lo = 0, hi = 0;
  blockSlice(op.c, block, numBlocks, Packet::kDataBytes, &lo, &hi);
  return hi <= lo || mem.readPackets<Packet>(op.a + lo, op.b + lo / Packet::kDataBytes * sizeof(Packet),
                                             hi - lo, flag, tid, numThreads) == WaitStatus::kOk;
}

PYCCL_HOST_DEVICE void runChannelOps(ChannelOpsArgs& args, uint32_t block, uint32_t numBlocks,
                                     uint32_t tid, uint32_t numThreads) {
  const uint64_t start = nowNs();
  unsigned int failures = 0;
  for (int r = 0; r < args.repeat; ++r) {
    for (int i = 0; i < args.numOps; ++i) {
      const ChannelOp& op = args.ops[i];
      MemoryChannelDeviceHandle& mem = args.memory[op.channel];
      PortChannelDeviceHandle& port = args.port[op.channel];
      const auto code = static_cast<ChannelOpCode>(op.code);
      const uint32_t flag = op.flag + static_cast<uint32_t>(r);
      const bool leader = block == 0 && tid == 0;
      uint64_t lo = 0, hi = 0;
      switch (code) {
        case ChannelOpCode::kPut:
          blockSlice(op.c, block, numBlocks, 16, &lo, &hi);
          if (hi > lo) mem.put(op.a + lo, op.b + lo, hi - lo, tid, numThreads);
          break;
        case ChannelOpCode::kGet:
          blockSlice(op.c, block, numBlocks, 16, &lo, &hi);
          if (hi > lo) mem.get(op.a + lo, op.b + lo, hi - lo, tid, numThreads);
          break;
        case ChannelOpCode::kPutPackets8:
          putPacketsSlice<LL8Packet>(mem, op, flag, block, numBlocks, tid, numThreads);
          break;
        case ChannelOpCode::kPutPackets16:
          putPacketsSlice<LL16Packet>(mem, op, flag, block, numBlocks, tid, numThreads);
          break;
        case ChannelOpCode::kReadPackets8:
        case ChannelOpCode::kReadPackets16: {
          // One read by many threads is one wait: a block counts it once.
          const bool ok = code == ChannelOpCode::kReadPackets8
                              ? readPacketsSlice<LL8Packet>(mem, op, flag, block, numBlocks, tid, numThreads)
                              : readPacketsSlice<LL16Packet>(mem, op, flag, block, numBlocks, tid, numThreads);
          if (anyInBlock(!ok) && tid == 0) ++failures;
          break;
        }
        case ChannelOpCode::kSignal:
          if (leader) mem.signal();
          break;
        case ChannelOpCode::kRelaxedSignal:
          if (leader) mem.relaxedSignal();
          break;
        case ChannelOpCode::kWait:
          if (leader && mem.wait() != WaitStatus::kOk) ++failures;
          break;
        case ChannelOpCode::kRelaxedWait:
          if (leader && mem.relaxedWait() != WaitStatus::kOk) ++failures;
          break;
        case ChannelOpCode::kPortPut:
          if (leader) port.put(op.a, op.b, op.c);
          break;
        case ChannelOpCode::kPortSignal:
          if (leader) port.signal();
          break;
        case ChannelOpCode::kPortPutWithSignal:
          if (leader) port.putWithSignal(op.a, op.b, op.c);
          break;
        case ChannelOpCode::kPortFlush:
          if (leader && port.flush() != WaitStatus::kOk) ++failures;
          break;
        case ChannelOpCode::kPortWait:
          if (leader && port.wait() != WaitStatus::kOk) ++failures;
          break;
      }
      // Single-op programs of one block (latency loops) need no grid barrier
      // between signal and wait: the block barrier orders its own threads.
      gridBarrier(args.barrier, numBlocks, tid);
    }
  }
  if (block == 0 && tid == 0) {
    *args.elapsedNs = nowNs() - start;
  }
  if (failures) {
#if PYCCL_ON_DEVICE
    atomicAdd(args.failures, failures);
#else
    std::atomic_ref<unsigned int>(*args.failures).fetch_add(failures);
#endif
  }
}

struct ChannelOpsResult {
  unsigned int failures;
  uint64_t elapsedNs;  ///< measured inside the kernel by block 0
  double launchToDoneUs;  ///< host-side, including launch and synchronization
};

/// Runs the program on CPU threads (host mode); `numBlocks` threads.
ChannelOpsResult runChannelOpsHost(const ChannelOpsArgs& args, uint32_t numBlocks);
#ifdef PYCCL_WITH_CUDA
/// Launches the program on `device` and waits for it.
ChannelOpsResult runChannelOpsDevice(int device, const ChannelOpsArgs& args, uint32_t numBlocks,
                                     uint32_t numThreads);
#endif

}  // namespace pyccl
