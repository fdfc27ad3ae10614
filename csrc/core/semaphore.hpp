// The host-side owner of a semaphore between this rank and one peer: it keeps
// both ranks' slot memory mapped and hands kernels a SemaphoreDeviceHandle.
// Its own signal()/wait() let host threads take part (host mode, proxies,
// tests); on a GPU communicator they go through a private stream, so they work
// while kernels run. Do not signal one semaphore from host and device at once.
#pragma once

#include <chrono>
#include <memory>

#include "channels/semaphore_device.hpp"
#include "core/registered_memory.hpp"

namespace pyccl {

class Semaphore {
 public:
  Semaphore(int peer, int device, RegisteredMemory localPage, SemaphoreSlot* localSlot,
            RegisteredMemory remotePage, uint64_t* remoteInbound, AbortState abort,
            std::string commName, bool remoteAtomics = false);

  int peer() const { return peer_; }
  /// Signals the peer from the host (release order after this thread's writes).
  void signal();
  /// Waits for the next signal from the peer. Throws TimeoutError naming the
  /// peer after `timeout` (default: the communicator's), AbortedError on abort.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  /// Signals received from the peer so far.
  uint64_t received() const;
  /// The handle kernels use (its pointers are device addresses on GPU).
  SemaphoreDeviceHandle deviceHandle() const;
  bool valid() const;
  /// The peer's inbound counter mapped here (what a proxy on this rank writes).
  uint64_t* remoteInboundPtr() const { return remoteInbound_; }
  /// This rank's inbound counter (what a receiver of the peer's signals writes).
  uint64_t* localInboundPtr() const;

 private:
  void checkValid() const;
  int peer_;
  int device_;  ///< -1: host mode
  RegisteredMemory localPage_;
  SemaphoreSlot* localSlot_;
  RegisteredMemory remotePage_;
  uint64_t* remoteInbound_;
  AbortState abort_;
  std::string commName_;
  bool remoteAtomics_;  ///< kernels signal with an atomic add on the peer's counter
};

}  // namespace pyccl
