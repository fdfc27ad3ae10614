// Host-side owners of channels: they keep both ranks' memory mapped and the
// semaphores alive, and hand kernels the plain device handles of
// csrc/channels/. Created pairwise (this rank and the peer both call
// Communicator::createMemoryChannel / createPortChannel, in matching order).
#pragma once

#include <memory>
#include <string>

#include "channels/memory_channel_device.hpp"
#include "channels/port_channel_device.hpp"
#include "core/registered_memory.hpp"
#include "core/semaphore.hpp"

namespace pyccl {

class ProxyService;

class MemoryChannel {
 public:
  MemoryChannel(std::shared_ptr<Semaphore> semaphore, RegisteredMemory local, RegisteredMemory remote,
                RegisteredMemory localPackets, RegisteredMemory remotePackets);
  int peer() const { return semaphore_->peer(); }
  uint64_t localSize() const { return local_.size(); }
  uint64_t remoteSize() const { return remote_.size(); }
  uint64_t packetBytes() const { return localPackets_.valid() ? localPackets_.size() : 0; }
  /// The handle kernels use. Throws ClosedError once the communicator closed.
  MemoryChannelDeviceHandle deviceHandle() const;
  bool valid() const;

 private:
  std::shared_ptr<Semaphore> semaphore_;
  RegisteredMemory local_, remote_, localPackets_, remotePackets_;
};

class PortChannel {
 public:
  PortChannel(std::shared_ptr<ProxyService> proxy, uint32_t channelId,
              std::shared_ptr<Semaphore> semaphore, RegisteredMemory local, RegisteredMemory remote,
              std::string transport);
  int peer() const { return semaphore_->peer(); }
  const std::string& transport() const { return transport_; }
  uint32_t channelId() const { return channelId_; }
  PortChannelDeviceHandle deviceHandle() const;
  bool valid() const;

 private:
  std::shared_ptr<ProxyService> proxy_;
  uint32_t channelId_;
  std::shared_ptr<Semaphore> semaphore_;
  RegisteredMemory local_, remote_;
  std::string transport_;
};

}  // namespace pyccl
