// Ping-pong between two ranks over one channel: the latency benchmark and
// the signal-ordering stress test of the Primitive API. One thread per rank
// runs the whole loop with the channel handle in registers, so a round trip
// costs exactly what the primitives cost (no op decoding, no barriers).
//
// With `check`, every message carries the round number: the sender writes it
// into the peer's buffer (MemoryChannel: a peer store; PortChannel: a put)
// before signalling, or into the packet itself (LL). The receiver compares it
// after its wait returns, so a lost signal (a wait that times out) and an
// early wake-up (a wait that returns before the data) are both counted.
// The same body runs as a one-thread CUDA kernel and, in host mode, on a CPU
// thread.
#pragma once

#include <cstdint>

#include "channels/memory_channel_device.hpp"
#include "channels/port_channel_device.hpp"

namespace pyccl {

enum class PingPongMode : uint32_t {
  kSignal = 0,         ///< MemoryChannel signal()/wait()
  kRelaxedSignal = 1,  ///< MemoryChannel relaxedSignal()/relaxedWait() (no data ordering)
  kPackets8 = 2,       ///< one LL8 packet each way
  kPackets16 = 3,      ///< one LL16 packet each way
  kPortSignal = 4,     ///< PortChannel signal()/wait() (through both proxies)
};

/// Byte offsets in both ranks' registered buffers used by `check`: the sender
/// stages its word at kStageOffset (PortChannel source), the receiver finds it
/// at kLandingOffset.
constexpr uint64_t kPingPongStageOffset = 0;
constexpr uint64_t kPingPongLandingOffset = 64;

struct PingPongArgs {
  MemoryChannelDeviceHandle memory;
  PortChannelDeviceHandle port;
  uint64_t rounds;
  uint32_t mode;
  uint32_t initiator;  ///< 1: this rank sends first
  uint32_t flagBase;   ///< LL: flag of round 0 (+1 per round); never 0
  uint32_t check;      ///< 1: carry and verify the round number
};

struct PingPongResult {
  uint32_t failures;     ///< waits that gave up (timeout/abort); the loop stops at the first
  uint32_t reserved;
  uint64_t mismatches;   ///< messages whose payload was not this round's
  uint64_t elapsedNs;    ///< first send/wait to the last, on this rank's clock
  uint64_t roundsDone;
};

namespace detail {

PYCCL_HOST_DEVICE uint64_t pingPongPayload(uint64_t round, uint32_t initiator) {
  // Distinct per round and per direction, never 0 (buffers start at 0).
  return (round + 1) * 2 + initiator;
}

PYCCL_HOST_DEVICE void pingPongSend(PingPongArgs& a, uint64_t round) {
  const uint64_t value = detail::pingPongPayload(round, a.initiator);
  switch (static_cast<PingPongMode>(a.mode)) {
    case PingPongMode::kSignal:
      if (a.check) a.memory.write<uint64_t>(kPingPongLandingOffset / 8, value);
      a.memory.signal();  // release: orders the store above
      break;
    case PingPongMode::kRelaxedSignal:
      a.memory.relaxedSignal();
      break;
    case PingPongMode::kPackets8: {
      const uint32_t payload[1] = {static_cast<uint32_t>(value)};
      reinterpret_cast<LL8Packet*>(a.memory.remotePackets)->write(payload, a.flagBase + static_cast<uint32_t>(round));
      break;
    }
    case PingPongMode::kPackets16: {
      const uint32_t payload[2] = {static_cast<uint32_t>(value), static_cast<uint32_t>(value >> 32)};
      reinterpret_cast<LL16Packet*>(a.memory.remotePackets)->write(payload, a.flagBase + static_cast<uint32_t>(round));
      break;
    }
    case PingPongMode::kPortSignal:
      if (a.check) {
        // The previous message from this stage word was delivered (the peer
        // answered it), so the word may be overwritten.
        reinterpret_cast<uint64_t*>(a.memory.src)[kPingPongStageOffset / 8] = value;
        a.port.putWithSignal(kPingPongLandingOffset, kPingPongStageOffset, 8);  // push is a release
      } else {
        a.port.signal();
      }
      break;
  }
}

/// Waits for round `round`'s message; false if the wait gave up. Counts a
/// payload that is not this round's in `mismatches`.
PYCCL_HOST_DEVICE bool pingPongReceive(PingPongArgs& a, uint64_t round, uint64_t* mismatches) {
  const uint64_t expect = detail::pingPongPayload(round, 1 - a.initiator);
  const uint32_t flag = a.flagBase + static_cast<uint32_t>(round);
  uint64_t got = expect;
  WaitStatus status = WaitStatus::kOk;
  switch (static_cast<PingPongMode>(a.mode)) {
    case PingPongMode::kSignal:
      status = a.memory.wait();  // acquire: the peer's store is visible below
      if (a.check) got = atomicLoadRelaxed(reinterpret_cast<uint64_t*>(a.memory.src + kPingPongLandingOffset));
      break;
    case PingPongMode::kRelaxedSignal:
      status = a.memory.relaxedWait();
      break;
    case PingPongMode::kPackets8: {
      uint32_t payload[1] = {0};
      const auto* packet = reinterpret_cast<const LL8Packet*>(a.memory.localPackets);
      status = boundedPoll([&] { return packet->tryRead(flag, payload); }, [&] { return round; },
                           a.memory.semaphore.abort, a.memory.semaphore.peer, flag);
      if (status != WaitStatus::kOk) return false;
      // An LL8 packet carries 32 bits of payload: compare those.
      if (a.check && payload[0] != static_cast<uint32_t>(expect)) ++*mismatches;
      return true;
    }
    case PingPongMode::kPackets16: {
      uint32_t payload[2] = {0, 0};
      const auto* packet = reinterpret_cast<const LL16Packet*>(a.memory.localPackets);
      status = boundedPoll([&] { return packet->tryRead(flag, payload); }, [&] { return round; },
                           a.memory.semaphore.abort, a.memory.semaphore.peer, flag);
      got = static_cast<uint64_t>(payload[0]) | (static_cast<uint64_t>(payload[1]) << 32);
      break;
    }
    case PingPongMode::kPortSignal:
      status = a.port.wait();
      if (a.check) got = atomicLoadRelaxed(reinterpret_cast<uint64_t*>(a.memory.src + kPingPongLandingOffset));
      break;
  }
  if (status != WaitStatus::kOk) return false;
  if (a.check && got != expect) ++*mismatches;
  return true;
}

}  // namespace detail

/// The loop, on one thread per rank. The initiator sends then waits; the
/// other rank waits then answers.
PYCCL_HOST_DEVICE void runPingPong(PingPongArgs a, PingPongResult* out) {
  uint64_t mismatches = 0;
  uint32_t failures = 0;
  uint64_t round = 0;
  const uint64_t start = nowNs();
  for (; round < a.rounds; ++round) {
    if (a.initiator) detail::pingPongSend(a, round);
    if (!detail::pingPongReceive(a, round, &mismatches)) {
      failures = 1;
      break;
    }
    if (!a.initiator) detail::pingPongSend(a, round);
  }
  out->elapsedNs = nowNs() - start;
  out->failures = failures;
  out->mismatches = mismatches;
  out->roundsDone = round;
}

/// Runs the loop on a CPU thread (host mode).
PingPongResult runPingPongHost(const PingPongArgs& args);
#ifdef PYCCL_WITH_CUDA
/// Runs the loop as a one-thread kernel on `device` and waits for it.
PingPongResult runPingPongDevice(int device, const PingPongArgs& args);
#endif

}  // namespace pyccl
