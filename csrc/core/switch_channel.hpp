// Host side of SwitchChannel: a multicast object over one buffer on every GPU
// of the group (NVLink SHARP). Creation is refused unless PYCCL_ENABLE_NVLS=1:
// multicast objects can disturb a shared host, so pyccl never makes one by
// default. CUDA builds only.
#pragma once

#include <memory>

#include "channels/switch_channel_device.hpp"
#include "core/registered_memory.hpp"

namespace pyccl {

class Communicator;

/// Whether PYCCL_ENABLE_NVLS=1 is set.
bool nvlsEnabled();

class SwitchChannel {
 public:
  virtual ~SwitchChannel() = default;
  virtual SwitchChannelDeviceHandle deviceHandle() const = 0;
};

/// Collective over the communicator: binds `local` (cuMem memory, e.g. from
/// pyccl.empty) of every rank into one multicast object. Throws
/// UnsupportedError unless NVLS is enabled and available.
std::shared_ptr<SwitchChannel> createSwitchChannel(Communicator& comm, const RegisteredMemory& local);

}  // namespace pyccl
