// Low-latency (LL) packets: every store carries its own flag, so a reader
// needs no separate signal; it polls until the flags equal the value the
// writer used for this round. Two sizes:
//   LL8Packet:  4 data bytes + 4-byte flag, written with one 8-byte store;
//   LL16Packet: 8 data bytes as two (4 data + 4 flag) halves, written with one
//               16-byte store; each half carries the flag, so a store that
//               lands in two 8-byte pieces is still never read half-written.
// Flags must change from round to round (derive them from a sequence number)
// and never be 0, the value packet buffers start with.
//
// The device loads and stores are volatile asm without a "memory" clobber: a
// packet orders nothing but itself (its flag travels in the same store), and
// the hardware gives a volatile access no order with other memory anyway. A
// clobber would only make the compiler reload every value it keeps in memory
// (a plan op's fields in shared memory, for one) after each packet access.
#pragma once

#include "channels/device_common.hpp"

namespace pyccl {

struct alignas(8) LL8Packet {
  uint32_t data;
  uint32_t flag;

  static constexpr uint32_t kDataBytes = 4;

  /// Writes data and flag with one 8-byte store (no ordering with other writes).
  PYCCL_HOST_DEVICE void write(const uint32_t* payload, uint32_t flagValue) {
#if PYCCL_ON_DEVICE
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(this), "r"(payload[0]),
                 "r"(flagValue));
#else
    const uint64_t word = static_cast<uint64_t>(payload[0]) | (static_cast<uint64_t>(flagValue) << 32);
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(this)).store(word, std::memory_order_release);
#endif
  }

  /// Copies the data out if the flag matches; never blocks.
  PYCCL_HOST_DEVICE bool tryRead(uint32_t flagValue, uint32_t* out) const {
#if PYCCL_ON_DEVICE
    uint32_t d, f;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(d), "=r"(f) : "l"(this));
#else
    const uint64_t word = std::atomic_ref<const uint64_t>(*reinterpret_cast<const uint64_t*>(this))
                              .load(std::memory_order_acquire);
    const uint32_t d = static_cast<uint32_t>(word), f = static_cast<uint32_t>(word >> 32);
#endif
    if (f != flagValue) return false;
    out[0] = d;
    return true;
  }
};
static_assert(sizeof(LL8Packet) == 8, "LL8Packet is 8 bytes");

struct alignas(16) LL16Packet {
  uint32_t data0;
  uint32_t flag0;
  uint32_t data1;
  uint32_t flag1;

  static constexpr uint32_t kDataBytes = 8;

  /// Writes both halves with one 16-byte store.
  PYCCL_HOST_DEVICE void write(const uint32_t* payload, uint32_t flagValue) {
#if PYCCL_ON_DEVICE
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(this), "r"(payload[0]),
                 "r"(flagValue), "r"(payload[1]), "r"(flagValue));
#else
    auto* words = reinterpret_cast<uint64_t*>(this);
    std::atomic_ref<uint64_t>(words[0]).store(
        static_cast<uint64_t>(payload[0]) | (static_cast<uint64_t>(flagValue) << 32),
        std::memory_order_release);
    std::atomic_ref<uint64_t>(words[1]).store(
        static_cast<uint64_t>(payload[1]) | (static_cast<uint64_t>(flagValue) << 32),
        std::memory_order_release);
#endif
  }

  /// The packet's four words as one load, with no check: a poll that reads
  /// several packets issues every load before it checks any.
  struct Words {
    uint32_t data0, flag0, data1, flag1;
  };

  /// One 16-byte volatile load (no ordering with other memory).
  PYCCL_HOST_DEVICE Words load() const {
    Words w;
#if PYCCL_ON_DEVICE
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w.data0), "=r"(w.flag0), "=r"(w.data1), "=r"(w.flag1)
                 : "l"(this));
#else
    const auto* words = reinterpret_cast<const uint64_t*>(this);
    const uint64_t w0 = std::atomic_ref<const uint64_t>(words[0]).load(std::memory_order_acquire);
    const uint64_t w1 = std::atomic_ref<const uint64_t>(words[1]).load(std::memory_order_acquire);
    w = Words{static_cast<uint32_t>(w0), static_cast<uint32_t>(w0 >> 32), static_cast<uint32_t>(w1),
              static_cast<uint32_t>(w1 >> 32)};
#endif
    return w;
  }

  /// Copies the data of loaded words out if both halves carry `flagValue`.
  PYCCL_HOST_DEVICE static bool arrived(const Words& w, uint32_t flagValue, uint32_t* out) {
    if (w.flag0 != flagValue || w.flag1 != flagValue) return false;
    out[0] = w.data0;
    out[1] = w.data1;
    return true;
  }

  /// Copies the data out if the flag matches; never blocks.
  PYCCL_HOST_DEVICE bool tryRead(uint32_t flagValue, uint32_t* out) const { return arrived(load(), flagValue, out); }
};
static_assert(sizeof(LL16Packet) == 16, "LL16Packet is 16 bytes");

/// The data of packet `index` of a `bytes`-long message at `src`, zero-padded
/// past the end (any alignment).
template <typename Packet>
PYCCL_HOST_DEVICE void packPayload(const void* src, uint64_t index, uint64_t bytes,
                                   uint32_t (&payload)[Packet::kDataBytes / 4]) {
  constexpr uint32_t kData = Packet::kDataBytes;
  const auto* s = static_cast<const unsigned char*>(src);
  const uint64_t begin = index * kData;
  for (uint32_t w = 0; w < kData / 4; ++w) payload[w] = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 3) == 0 && begin + kData <= bytes) {
    for (uint32_t w = 0; w < kData / 4; ++w) payload[w] = reinterpret_cast<const uint32_t*>(s + begin)[w];
  } else {
    auto* p = reinterpret_cast<unsigned char*>(payload);
    for (uint32_t b = 0; b < kData && begin + b < bytes; ++b) p[b] = s[begin + b];
  }
}

/// The inverse of packPayload: stores packet `index`'s share of `bytes` (the
/// data bytes [index * kDataBytes, ...), clipped to `bytes`) at `dst`.
template <typename Packet>
PYCCL_HOST_DEVICE void unpackPayload(void* dst, uint64_t index, uint64_t bytes,
                                     const uint32_t (&payload)[Packet::kDataBytes / 4]) {
  constexpr uint32_t kData = Packet::kDataBytes;
  auto* d = static_cast<unsigned char*>(dst);
  const uint64_t begin = index * kData;
  if ((reinterpret_cast<uintptr_t>(dst) & 3) == 0 && begin + kData <= bytes) {
    for (uint32_t w = 0; w < kData / 4; ++w) reinterpret_cast<uint32_t*>(d + begin)[w] = payload[w];
  } else {
    const auto* p = reinterpret_cast<const unsigned char*>(payload);
    for (uint32_t b = 0; b < kData && begin + b < bytes; ++b) d[begin + b] = p[b];
  }
}

/// Packets that carry `bytes` of data (the last one may be partly padding).
template <typename Packet>
PYCCL_HOST_DEVICE uint64_t packetsFor(uint64_t bytes) {
  return (bytes + Packet::kDataBytes - 1) / Packet::kDataBytes;
}

/// Packs `bytes` of `src` into packets at `dst` (a peer's packet buffer):
/// packet i carries bytes [i * kDataBytes, (i + 1) * kDataBytes), the last one
/// zero-padded. Threads [0, numThreads) share the packets.
template <typename Packet>
PYCCL_HOST_DEVICE void putPacketsTo(Packet* dst, const void* src, uint64_t bytes, uint32_t flag,
                                    uint32_t tid, uint32_t numThreads) {
  const uint64_t numPackets = packetsFor<Packet>(bytes);
  for (uint64_t i = tid; i < numPackets; i += numThreads) {
    uint32_t payload[Packet::kDataBytes / 4];
    packPayload<Packet>(src, i, bytes, payload);
    dst[i].write(payload, flag);
  }
}

/// Waits for the packets at `src` (this rank's packet buffer) carrying `flag`
/// and stores their `bytes` of data at `dst`. Bounded by `abort`.
template <typename Packet>
PYCCL_HOST_DEVICE WaitStatus readPacketsFrom(void* dst, const Packet* src, uint64_t bytes,
                                             uint32_t flag, uint32_t tid, uint32_t numThreads,
                                             const AbortState& abort, int peer) {
  constexpr uint32_t kData = Packet::kDataBytes;
  const uint64_t numPackets = packetsFor<Packet>(bytes);
  for (uint64_t i = tid; i < numPackets; i += numThreads) {
    uint32_t payload[kData / 4];
    // On giving up, the record holds the flag waited for and the packet index.
    const WaitStatus status = boundedPoll([&] { return src[i].tryRead(flag, payload); },
                                          [&] { return i; }, abort, peer, flag);
    if (status != WaitStatus::kOk) return status;
    unpackPayload<Packet>(dst, i, bytes, payload);
  }
  return WaitStatus::kOk;
}

/// Packets that one pollPacketBatch call waits for together.
constexpr int kPacketPollBatch = 4;

/// Polls the LL16 packets src[k] (those not null) until every one carries
/// `flag`, and copies their data to payloads[k]. Each round issues the load
/// of every packet still missing before it checks any, so once the last one
/// has landed the wait costs one memory round trip, not one per packet
/// (packets check themselves, so the loads need no order among them).
/// Bounded like boundedPoll; on giving up, the record names the first
/// missing packet's sender, peers[k], with `index` as the last value seen.
template <typename Stop = NeverStop>
PYCCL_HOST_DEVICE WaitStatus pollPacketBatch(const LL16Packet* const (&src)[kPacketPollBatch],
                                             const int (&peers)[kPacketPollBatch], uint32_t flag,
                                             uint32_t (&payloads)[kPacketPollBatch][2], const AbortState& abort,
                                             uint64_t index, Stop&& stop = Stop{}) {
  uint32_t missing = 0;
  PYCCL_UNROLL
  for (int k = 0; k < kPacketPollBatch; ++k) {
    if (src[k] != nullptr) missing |= 1u << k;
  }
  auto ready = [&] {
    LL16Packet::Words words[kPacketPollBatch] = {};
    PYCCL_UNROLL
    for (int k = 0; k < kPacketPollBatch; ++k) {
      if (missing & (1u << k)) words[k] = src[k]->load();
    }
    PYCCL_UNROLL
    for (int k = 0; k < kPacketPollBatch; ++k) {
      if ((missing & (1u << k)) && LL16Packet::arrived(words[k], flag, payloads[k])) missing &= ~(1u << k);
    }
    return missing == 0;
  };
  auto firstMissing = [&] {
    int k = 0;
    while (k + 1 < kPacketPollBatch && !(missing & (1u << k))) ++k;
    return peers[k];
  };
  return boundedPoll(ready, [&] { return index; }, abort, firstMissing, flag, stop);
}

/// Bytes of packet buffer that `bytes` of data occupy.
template <typename Packet>
PYCCL_HOST_DEVICE uint64_t packetBytesFor(uint64_t bytes) {
  return packetsFor<Packet>(bytes) * sizeof(Packet);
}

}  // namespace pyccl
