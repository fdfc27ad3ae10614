// The FIFO between GPU threads (producers) and the CPU proxy (consumer) of
// PortChannels. Triggers are 16 bytes in host-pinned memory; producers claim
// slots with an atomic on `head` (device memory); the proxy executes slots in
// order, clears each, and publishes its progress in `tail` (host-pinned).
//
// Trigger layout (bits):
//   fst: srcOffset[0:40) | size[0:24) << 40
//   snd: size[24:32) | dstOffset << 8 (40 bits) | channel << 48 (12 bits) | type << 60 (4 bits)
// `type` is never 0, so snd != 0 marks a filled slot; fst is stored first and
// snd last with release order, so the proxy reading snd (acquire) sees fst.
#pragma once

#include "channels/device_common.hpp"

namespace pyccl {

enum TriggerBits : uint32_t {
  kTriggerPut = 1,     ///< copy size bytes from src+srcOffset to the peer's dst+dstOffset
  kTriggerSignal = 2,  ///< bump the peer's semaphore, ordered after earlier puts; alone (no put),
                       ///< a non-zero dstOffset names counter dstOffset - 1 of the peer's table instead
  kTriggerFlush = 4,   ///< complete earlier puts before advancing the tail
};

constexpr uint64_t kTriggerMaxBytes = (1ull << 32) - 1;
constexpr uint64_t kTriggerMaxOffset = (1ull << 40) - 1;
constexpr uint32_t kTriggerMaxChannels = 1u << 12;

struct alignas(16) ProxyTrigger {
  uint64_t fst;
  uint64_t snd;

  PYCCL_HOST_DEVICE static ProxyTrigger make(uint32_t type, uint32_t channel, uint64_t dstOffset,
                                             uint64_t srcOffset, uint64_t size) {
    ProxyTrigger t;
    t.fst = (srcOffset & kTriggerMaxOffset) | ((size & 0xffffffull) << 40);
    t.snd = ((size >> 24) & 0xffull) | ((dstOffset & kTriggerMaxOffset) << 8) |
            (static_cast<uint64_t>(channel & (kTriggerMaxChannels - 1)) << 48) |
            (static_cast<uint64_t>(type & 0xf) << 60);
    return t;
  }
  PYCCL_HOST_DEVICE uint32_t type() const { return static_cast<uint32_t>(snd >> 60); }
  PYCCL_HOST_DEVICE uint32_t channel() const { return static_cast<uint32_t>((snd >> 48) & 0xfff); }
  PYCCL_HOST_DEVICE uint64_t srcOffset() const { return fst & kTriggerMaxOffset; }
  PYCCL_HOST_DEVICE uint64_t dstOffset() const { return (snd >> 8) & kTriggerMaxOffset; }
  PYCCL_HOST_DEVICE uint64_t size() const { return (fst >> 40) | ((snd & 0xff) << 24); }
};
static_assert(sizeof(ProxyTrigger) == 16, "ProxyTrigger is 16 bytes");

struct FifoDeviceHandle {
  ProxyTrigger* triggers;  ///< `size` slots, host-pinned (device address)
  uint64_t* head;          ///< next slot to claim (device memory)
  uint64_t* tail;          ///< slots the proxy has executed (host-pinned, device address)
  uint64_t* tailCache;     ///< last tail seen by producers (device memory)
  uint32_t size;
  AbortState abort;

  /// Claims a slot and writes the trigger; returns its position, or ~0 if the
  /// FIFO stayed full past the timeout (or the abort flag rose). Any thread
  /// may push; a full FIFO makes the caller wait, bounded.
  PYCCL_HOST_DEVICE uint64_t push(ProxyTrigger trigger) {
#if PYCCL_ON_DEVICE
    const uint64_t pos = atomicAdd(reinterpret_cast<unsigned long long*>(head), 1ull);
#else
    const uint64_t pos = std::atomic_ref<uint64_t>(*head).fetch_add(1, std::memory_order_relaxed);
#endif
    if (pos >= atomicLoadRelaxed(tailCache) + size) {
      // Full as far as we know: read the proxy's progress (bounded wait).
      uint64_t seen = 0;
      if (spinUntilAtLeast(tail, pos + 1 - size, abort, -1, &seen) != WaitStatus::kOk) {
        return ~0ull;
      }
      atomicStoreRelaxed(tailCache, seen);
    }
    ProxyTrigger* slot = &triggers[pos % size];
    atomicStoreRelaxed(&slot->fst, trigger.fst);
    // Release: the proxy that sees snd also sees fst (and data the caller wrote).
    atomicStoreRelease(&slot->snd, trigger.snd);
    return pos;
  }

  /// Pushes a transfer of `bytes` on `channel`, split into triggers of at
  /// most 2 GiB; the signal/flush bits of `type` go on the last one. Returns
  /// the last position (~0 if that push failed, as push).
  PYCCL_HOST_DEVICE uint64_t pushTransfer(uint32_t type, uint32_t channel, uint64_t dstOffset, uint64_t srcOffset,
                                          uint64_t bytes) {
    constexpr uint64_t kChunk = 1ull << 31;
    uint64_t pos = ~0ull;
    do {
      const uint64_t n = bytes > kChunk ? kChunk : bytes;
      const bool last = n == bytes;
      const uint32_t t = last ? type : (type & kTriggerPut);
      pos = push(ProxyTrigger::make(t, channel, dstOffset, srcOffset, n));
      dstOffset += n;
      srcOffset += n;
      bytes -= n;
    } while (bytes > 0);
    return pos;
  }

  /// Waits until the proxy has executed the trigger at `pos` (and all before it).
  PYCCL_HOST_DEVICE WaitStatus sync(uint64_t pos) {
    if (pos == ~0ull) return WaitStatus::kTimeout;
    uint64_t seen = 0;
    return spinUntilAtLeast(tail, pos + 1, abort, -1, &seen);
  }
};

}  // namespace pyccl
