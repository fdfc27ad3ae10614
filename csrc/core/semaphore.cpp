#include "core/semaphore.hpp"

#include <thread>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"

namespace pyccl {

Semaphore::Semaphore(int peer, int device, RegisteredMemory localPage, SemaphoreSlot* localSlot,
                     RegisteredMemory remotePage, uint64_t* remoteInbound, AbortState abort,
                     std::string commName, bool remoteAtomics)
    : peer_(peer),
      device_(device),
      localPage_(std::move(localPage)),
      localSlot_(localSlot),
      remotePage_(std::move(remotePage)),
      remoteInbound_(remoteInbound),
      abort_(abort),
      commName_(std::move(commName)),
      remoteAtomics_(remoteAtomics && remoteInbound != nullptr) {}

bool Semaphore::valid() const {
  // A semaphore of a socket channel maps no peer memory: the peer's proxy signals it.
  return localPage_.valid() && (remoteInbound_ == nullptr || remotePage_.valid());
}

void Semaphore::checkValid() const {
  if (!valid()) {
    throw ClosedError(strCat("semaphore with peer ", peer_, " in communicator '", commName_,
                             "' is closed (the communicator was destroyed)"));
  }
  if (abort_.aborted()) {
    throw AbortedError(strCat("communicator '", commName_, "' was aborted"));
  }
}

SemaphoreDeviceHandle Semaphore::deviceHandle() const {
  checkValid();
  return SemaphoreDeviceHandle{localSlot_, remoteInbound_, abort_, peer_, remoteAtomics_ ? 1u : 0u};
}

uint64_t* Semaphore::localInboundPtr() const { return &localSlot_->inbound; }

void Semaphore::signal() {
  checkValid();
  if (remoteInbound_ == nullptr) {
    throw InvalidArgument(strCat("invalid argument 'semaphore': the semaphore with rank ", peer_,
                                 " has no mapping of the peer (socket transport); signal through "
                                 "its PortChannel instead"));
  }
  if (device_ < 0) {
    // The host's signal stores the incremented count (remoteAtomics 0): only this rank writes the peer's
    // inbound, so the two ways agree.
    SemaphoreDeviceHandle h{localSlot_, remoteInbound_, abort_, peer_, /*remoteAtomics=*/0};
    h.signal();
    return;
  }
  // Device memory: the counters live on the GPU; go through the private stream.
  uint64_t outbound = 0;
  gpu::copyToHost(device_, &outbound, &localSlot_->outbound, sizeof(outbound));
  ++outbound;
  gpu::copyToDevice(device_, &localSlot_->outbound, &outbound, sizeof(outbound));
  gpu::copyToDevice(device_, remoteInbound_, &outbound, sizeof(outbound));
}

uint64_t Semaphore::received() const {
  checkValid();
  if (device_ < 0) return atomicLoadAcquire(&localSlot_->inbound);
  uint64_t value = 0;
  gpu::copyToHost(device_, &value, &localSlot_->inbound, sizeof(value));
  return value;
}

void Semaphore::wait(std::chrono::milliseconds timeout) {
  checkValid();
  AbortState abort = abort_;
  abort.errorRecord = nullptr;  // host waits raise instead of recording
  if (timeout.count() > 0) abort.timeoutNs = static_cast<uint64_t>(timeout.count()) * 1000000ull;
  WaitStatus status;
  uint64_t expected = 0, observed = 0;
  if (device_ < 0) {
    SemaphoreDeviceHandle h{localSlot_, remoteInbound_, abort, peer_, /*remoteAtomics=*/0};  // waits only
    status = h.wait();
    expected = localSlot_->expected;
    observed = atomicLoadAcquire(&localSlot_->inbound);
  } else {
    gpu::copyToHost(device_, &expected, &localSlot_->expected, sizeof(expected));
    ++expected;
    gpu::copyToDevice(device_, &localSlot_->expected, &expected, sizeof(expected));
    // Poll the device counter through the private stream (tens of µs a poll).
    status = boundedPoll(
        [&] {
          gpu::copyToHost(device_, &observed, &localSlot_->inbound, sizeof(observed));
          if (observed >= expected) return true;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
          return false;
        },
        [&] { return observed; }, abort, peer_, expected);
  }
  if (status != WaitStatus::kOk) {
    // Give the signal back so a later wait can still consume it.
    if (device_ < 0) {
      localSlot_->expected = expected - 1;
    } else {
      const uint64_t restored = expected - 1;
      gpu::copyToDevice(device_, &localSlot_->expected, &restored, sizeof(restored));
    }
  }
  if (status == WaitStatus::kTimeout) {
    throw TimeoutError(strCat("semaphore wait in communicator '", commName_, "': peer rank ",
                              peer_, " did not signal within ", abort.timeoutNs / 1000000,
                              " ms (waiting for signal ", expected, ", received ", observed, ")"));
  }
  if (status == WaitStatus::kAborted) {
    throw AbortedError(strCat("semaphore wait on peer rank ", peer_, " in communicator '",
                              commName_, "' was aborted"));
  }
}

}  // namespace pyccl
