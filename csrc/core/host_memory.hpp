// Host shared memory: page-aligned allocations backed by a memfd, so that a
// peer process on the same node maps the same pages after receiving the fd.
// Nothing is named in /dev/shm, so nothing outlives the processes that map it.
#pragma once

#include <cstddef>
#include <memory>

#include "core/fd_passing.hpp"

namespace pyccl {

/// A shared mapping of a memfd: owned by the process that allocated it, or
/// imported from a peer. Unmapped (and the fd closed) on destruction.
class HostSharedMapping {
 public:
  HostSharedMapping(void* base, size_t size, UniqueFd fd) : base_(base), size_(size), fd_(std::move(fd)) {}
  ~HostSharedMapping();
  HostSharedMapping(const HostSharedMapping&) = delete;
  HostSharedMapping& operator=(const HostSharedMapping&) = delete;

  void* base() const { return base_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  void* base_;
  size_t size_;
  UniqueFd fd_;
};

/// Allocates `size` bytes (rounded up to pages) of shareable host memory,
/// zero-filled, and records it so registerMemory can find it by address.
std::shared_ptr<HostSharedMapping> allocateHostShared(size_t size);

/// The live allocation made by allocateHostShared that contains
/// [ptr, ptr + size), or nullptr when there is none.
std::shared_ptr<HostSharedMapping> findHostShared(const void* ptr, size_t size);

/// Maps `size` bytes of a memfd received from a peer (takes ownership of fd).
std::shared_ptr<HostSharedMapping> mapHostShared(UniqueFd fd, size_t size);

/// Number of live allocations made by allocateHostShared in this process.
size_t numHostSharedAllocations();

}  // namespace pyccl
