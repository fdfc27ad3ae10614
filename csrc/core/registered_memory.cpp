#include "core/registered_memory.hpp"

#include <unistd.h>

#include <mutex>
#include <random>

#include "core/errors.hpp"
#include "core/fd_passing.hpp"

namespace pyccl {
namespace {
constexpr uint32_t kDescriptorMagic = 0x50434d44;  // "PCMD"
constexpr uint32_t kDescriptorVersion = 2;
}  // namespace

uint64_t processKey() {
  static std::mutex mu;
  static pid_t drawnIn = 0;
  static uint64_t key = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (drawnIn != getpid()) {
    drawnIn = getpid();
    key = (std::random_device{}() | (uint64_t{std::random_device{}()} << 32)) ^ static_cast<uint64_t>(drawnIn);
  }
  return key;
}

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostShared: return "host_shared";
    case MemoryKind::kCudaIpc: return "cuda_ipc";
    case MemoryKind::kCuMem: return "cumem";
  }
  return "unknown";
}

Bytes MemoryDescriptor::serialize() const {
  ByteWriter w;
  w.put(kDescriptorMagic).put(kDescriptorVersion).put(static_cast<uint8_t>(kind));
  w.put(ownerRank).put(device).put(size);
  w.putString(nodeKey).putString(fdServer);
  w.put(exportId).put(token).put(offset).put(mappingSize);
  w.putBytes(ipcHandle.data(), ipcHandle.size());
  w.put<uint64_t>(chunkOffsets.size());
  for (size_t i = 0; i < chunkOffsets.size(); ++i) w.put(chunkOffsets[i]).put(chunkSizes[i]);
  w.put(granularity).put(processKey).put(address);
  return w.take();
}

MemoryDescriptor MemoryDescriptor::deserialize(const Bytes& bytes) {
  ByteReader r(bytes, "memory descriptor");
  PYCCL_CHECK_ARG(r.get<uint32_t>() == kDescriptorMagic, "memory descriptor",
                  "is not a pyccl memory descriptor");
  const auto version = r.get<uint32_t>();
  PYCCL_CHECK_ARG(version == kDescriptorVersion, "memory descriptor", "has version ", version,
                  "; this pyccl reads version ", kDescriptorVersion);
  MemoryDescriptor d;
  const auto kind = r.get<uint8_t>();
  PYCCL_CHECK_ARG(kind >= 1 && kind <= 3, "memory descriptor", "has unknown memory kind ",
                  static_cast<int>(kind));
  d.kind = static_cast<MemoryKind>(kind);
  d.ownerRank = r.get<int32_t>();
  d.device = r.get<int32_t>();
  d.size = r.get<uint64_t>();
  d.nodeKey = r.getString();
  d.fdServer = r.getString();
  d.exportId = r.get<uint64_t>();
  d.token = r.get<uint64_t>();
  d.offset = r.get<uint64_t>();
  d.mappingSize = r.get<uint64_t>();
  d.ipcHandle = r.getBytes();
  const auto chunks = r.get<uint64_t>();
  PYCCL_CHECK_ARG(chunks <= (1u << 20), "memory descriptor", "claims ", chunks, " chunks");
  for (uint64_t i = 0; i < chunks; ++i) {
    d.chunkOffsets.push_back(r.get<uint64_t>());
    d.chunkSizes.push_back(r.get<uint64_t>());
  }
  d.granularity = r.get<uint64_t>();
  d.processKey = r.get<uint64_t>();
  d.address = r.get<uint64_t>();
  PYCCL_CHECK_ARG(r.atEnd(), "memory descriptor", "has trailing bytes");
  PYCCL_CHECK_ARG(d.size > 0, "memory descriptor", "has size 0");
  return d;
}

void RegisteredMemory::Impl::release() {
  std::shared_ptr<void> drop, dropOwner;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (released) return;
    released = true;
    if (local && desc.exportId != 0) {
      if (auto s = server.lock()) s->withdraw(desc.exportId);
    }
    drop = std::move(keepAlive);
    dropOwner = std::move(owner);
    data = nullptr;
  }
  // The mapping and owner are dropped outside the lock.
}

const RegisteredMemory::Impl& RegisteredMemory::checked() const {
  if (!impl_) throw ClosedError("RegisteredMemory is empty (default-constructed)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->released) {
    throw ClosedError(strCat("RegisteredMemory of rank ", impl_->desc.ownerRank, " (",
                             impl_->desc.size, " bytes) was released, or its communicator "
                             "was destroyed"));
  }
  return *impl_;
}

void* RegisteredMemory::data() const { return checked().data; }
uint64_t RegisteredMemory::size() const { return checked().desc.size; }
int RegisteredMemory::rank() const { return checked().desc.ownerRank; }
bool RegisteredMemory::isLocal() const { return checked().local; }
MemoryKind RegisteredMemory::kind() const { return checked().desc.kind; }
int RegisteredMemory::device() const { return checked().desc.device; }
size_t RegisteredMemory::numChunks() const {
  const auto& impl = checked();
  return impl.desc.kind == MemoryKind::kCuMem ? impl.desc.chunkOffsets.size() : 1;
}

bool RegisteredMemory::valid() const {
  if (!impl_) return false;
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->released;
}

Bytes RegisteredMemory::serialize() const {
  const auto& impl = checked();
  if (!impl.local) {
    throw InvalidArgument(
        "invalid argument 'memory': only locally registered memory can be serialized");
  }
  return impl.desc.serialize();
}

void RegisteredMemory::release() {
  if (impl_) impl_->release();
}

}  // namespace pyccl
