// RegisteredMemory: a range of memory that peers on the same node can map.
// One type for every kind of memory; the kind is chosen per allocation:
//   kHostShared  host memory from allocateHostShared (memfd), host mode;
//   kCudaIpc     cudaMalloc'd device memory (cudaIpcMemHandle_t);
//   kCuMem       cuMem device memory, e.g. torch's expandable segments or
//                pyccl.empty (one POSIX fd per physical chunk).
// A local RegisteredMemory is exported (its fds published on the owner's fd
// server); serialize() describes it, and a peer's Communicator::importMemory
// maps it. release() (or the communicator's close) unmaps and unexports.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/serialize.hpp"

namespace pyccl {

class FdServer;

enum class MemoryKind : uint8_t { kHostShared = 1, kCudaIpc = 2, kCuMem = 3 };
const char* memoryKindName(MemoryKind kind);

/// What a peer needs to map a registered range (the serialized form).
struct MemoryDescriptor {
  MemoryKind kind = MemoryKind::kHostShared;
  int32_t ownerRank = -1;
  int32_t device = -1;  ///< owner's CUDA device; -1 for host memory
  uint64_t size = 0;
  std::string nodeKey;  ///< memory is mappable only on the owner's node
  std::string fdServer;
  uint64_t exportId = 0;
  uint64_t token = 0;
  // kHostShared: offset of the range in the memfd, and the memfd's mapped size.
  uint64_t offset = 0;
  uint64_t mappingSize = 0;
  // kCudaIpc: the handle's bytes; `offset` is the range's offset in the allocation.
  std::vector<uint8_t> ipcHandle;
  // kCuMem: chunk layout; `offset` is the range's offset from chunk 0's base.
  std::vector<uint64_t> chunkOffsets;
  std::vector<uint64_t> chunkSizes;
  uint64_t granularity = 0;
  /// The owner's process (processKey()) and the range's address there. A peer in that same process (one
  /// process driving several GPUs, as ncclCommInitAll does) maps kCudaIpc memory by this address, with peer
  /// access enabled: CUDA IPC refuses to open a handle in the process that made it.
  uint64_t processKey = 0;
  uint64_t address = 0;

  Bytes serialize() const;
  static MemoryDescriptor deserialize(const Bytes& bytes);
};

/// This process's key in descriptors: its pid and a random number drawn once per process (a forked child
/// draws its own).
uint64_t processKey();

class RegisteredMemory {
 public:
  RegisteredMemory() = default;

  /// Address of the range in this process (the owner's address if local, the
  /// mapping if imported). Throws ClosedError once released.
  void* data() const;
  uint64_t size() const;
  /// The rank that owns the memory.
  int rank() const;
  bool isLocal() const;
  MemoryKind kind() const;
  /// The owner's CUDA device, or -1 for host memory.
  int device() const;
  /// Physical chunks behind the range (1 except for multi-segment cuMem memory).
  size_t numChunks() const;
  /// Whether the memory is still registered/mapped.
  bool valid() const;
  /// The descriptor a peer imports with Communicator::importMemory. Local only.
  Bytes serialize() const;
  /// Unexports (local) or unmaps (imported). Idempotent.
  void release();

  struct Impl;
  explicit RegisteredMemory(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  const Impl& checked() const;
  std::shared_ptr<Impl> impl_;
};

struct RegisteredMemory::Impl {
  MemoryDescriptor desc;
  bool local = false;
  void* data = nullptr;
  std::shared_ptr<void> keepAlive;   ///< the mapping or allocation kept alive
  std::shared_ptr<void> owner;       ///< what owns local memory (e.g. a tensor), held until release
  std::weak_ptr<FdServer> server;    ///< where a local export's fds are published
  mutable std::mutex mu;
  bool released = false;

  void release();
  ~Impl() { release(); }
};

/// A registration of this rank's memory and every rank's counterpart, mapped
/// here (this rank's own included; nullopt for ranks without P2P), as
/// Communicator::exchangeMemory makes them.
struct ExchangedMemory {
  RegisteredMemory local;
  std::vector<std::optional<RegisteredMemory>> peers;

  /// Releases the peers' mappings and then the local registration. Idempotent.
  void release() {
    for (auto& p : peers) {
      if (p) p->release();
    }
    peers.clear();
    local.release();
  }
};

}  // namespace pyccl
