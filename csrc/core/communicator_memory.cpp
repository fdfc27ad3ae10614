// Communicator: registering memory, mapping peers' registrations (CUDA IPC
// or host shared memory, by descriptor), and the allocations peers may map.
#include "core/communicator.hpp"

#include <cstring>

#include "core/errors.hpp"
#include "core/fd_passing.hpp"
#include "core/gpu_runtime.hpp"
#include "core/host_memory.hpp"
#include "core/logging.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/gpu_memory.hpp"
#endif

namespace pyccl {

RegisteredMemory Communicator::trackMemory(std::shared_ptr<RegisteredMemory::Impl> impl) {
  std::lock_guard<std::mutex> lock(mu_);
  // Forget registrations that were released or dropped.
  std::erase_if(tracked_, [](const auto& w) { return w.expired(); });
  tracked_.push_back(impl);
  return RegisteredMemory(std::move(impl));
}

RegisteredMemory Communicator::registerMemory(void* ptr, size_t size, std::shared_ptr<void> owner) {
  checkOpen("register_memory");
  PYCCL_CHECK_ARG(size > 0, "size", "must be > 0");
  PYCCL_CHECK_ARG(ptr != nullptr, "ptr", "must not be null");
  auto impl = std::make_shared<RegisteredMemory::Impl>();
  impl->local = true;
  impl->data = ptr;
  impl->server = fdServer_;
  impl->owner = std::move(owner);
  auto& d = impl->desc;
  d.ownerRank = rank_;
  d.size = size;
  d.nodeKey = nodeKey_;
  d.fdServer = fdServer_->address();
  d.token = randomU64();
  d.processKey = processKey();
  d.address = reinterpret_cast<uintptr_t>(ptr);

  if (hostMode()) {
    int ownerDevice = -1;
    PYCCL_CHECK_ARG(!gpu::isDevicePointer(ptr, &ownerDevice), "tensor",
                    "is CUDA memory (cuda:", ownerDevice, ") but this communicator is in host mode");
    auto mapping = findHostShared(ptr, size);
    PYCCL_CHECK_ARG(mapping != nullptr, "tensor",
                    "host memory at ", ptr, " (", size, " bytes) was not allocated by pyccl; "
                    "host-mode registration needs memory from pyccl.empty(..., device='cpu')");
    d.kind = MemoryKind::kHostShared;
    d.device = -1;
    d.offset = static_cast<char*>(ptr) - static_cast<char*>(mapping->base());
    d.mappingSize = mapping->size();
    d.exportId = fdServer_->publish({mapping->fd()}, d.token);
    impl->keepAlive = mapping;
    return trackMemory(std::move(impl));
  }

#ifdef PYCCL_WITH_CUDA
  int ownerDevice = -1;
  PYCCL_CHECK_ARG(gpu::isDevicePointer(ptr, &ownerDevice), "tensor",
                  "is not CUDA device memory, but this communicator is on cuda:", device_,
                  " (register a tensor on cuda:", device_, ")");
  PYCCL_CHECK_ARG(ownerDevice == device_, "tensor", "is on cuda:", ownerDevice,
                  " but this communicator is on cuda:", device_);
  DeviceExport ex = exportDeviceMemory(device_, ptr, size);
  d.device = device_;
  if (ex.isCuMem) {
    d.kind = MemoryKind::kCuMem;
    d.offset = ex.offsetInRange;
    d.granularity = ex.granularity;
    std::vector<int> fds;
    for (size_t i = 0; i < ex.chunks.size(); ++i) {
      d.chunkOffsets.push_back(ex.chunks[i].offset);
      d.chunkSizes.push_back(ex.chunks[i].size);
      fds.push_back(ex.fds[i].get());
    }
    d.exportId = fdServer_->publish(fds, d.token);  // publishes duplicates; ex.fds close here
  } else {
    d.kind = MemoryKind::kCudaIpc;
    d.offset = ex.offsetInAllocation;
    const auto* h = reinterpret_cast<const uint8_t*>(&ex.ipcHandle);
    d.ipcHandle.assign(h, h + sizeof(ex.ipcHandle));
  }
  return trackMemory(std::move(impl));
#else
  throw UnsupportedError("registering device memory needs a CUDA build of pyccl");
#endif
}

RegisteredMemory Communicator::importMemoryFrom(const Bytes& descriptor, bool sameNodeOnly) {
  checkOpen("import_memory");
  MemoryDescriptor d = MemoryDescriptor::deserialize(descriptor);
  PYCCL_CHECK_ARG(!sameNodeOnly || d.nodeKey == nodeKey_, "descriptor",
                  "describes memory of rank ", d.ownerRank, " on node '", d.nodeKey,
                  "', which cannot be mapped on this node ('", nodeKey_, "')");
  auto impl = std::make_shared<RegisteredMemory::Impl>();
  impl->desc = d;
  impl->local = false;
  const auto timeout = options_.timeout;

  if (d.kind == MemoryKind::kHostShared) {
    auto fds = fetchFds(d.fdServer, d.exportId, d.token, timeout);
    PYCCL_CHECK_ARG(fds.size() == 1, "descriptor", "host memory came with ", fds.size(), " fds");
    PYCCL_CHECK_ARG(d.offset + d.size <= d.mappingSize, "descriptor", "range past its mapping");
    auto mapping = mapHostShared(std::move(fds[0]), d.mappingSize);
    impl->data = static_cast<char*>(mapping->base()) + d.offset;
    impl->keepAlive = mapping;
    return trackMemory(std::move(impl));
  }

#ifdef PYCCL_WITH_CUDA
  PYCCL_CHECK_ARG(!hostMode(), "descriptor",
                  "describes CUDA memory of rank ", d.ownerRank,
                  ", which a host-mode communicator cannot map");
  std::shared_ptr<ImportedDeviceMemory> imported;
  if (d.kind == MemoryKind::kCudaIpc && d.processKey == processKey()) {
    // The owner is a communicator of this process on another GPU: its address, reached by peer access.
    if (d.device != device_) gpu::enablePeerAccess(device_, d.device);
    impl->data = reinterpret_cast<void*>(static_cast<uintptr_t>(d.address));
    return trackMemory(std::move(impl));
  }
  if (d.kind == MemoryKind::kCudaIpc) {
    PYCCL_CHECK_ARG(d.ipcHandle.size() == sizeof(cudaIpcMemHandle_t), "descriptor",
                    "has a CUDA IPC handle of ", d.ipcHandle.size(), " bytes");
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, d.ipcHandle.data(), sizeof(handle));
    imported = importCudaIpc(device_, handle, d.offset);
  } else {
    auto fds = fetchFds(d.fdServer, d.exportId, d.token, timeout);
    std::vector<CuMemChunk> chunks;
    for (size_t i = 0; i < d.chunkOffsets.size(); ++i) {
      chunks.push_back({d.chunkOffsets[i], d.chunkSizes[i]});
    }
    imported = importCuMem(device_, chunks, std::move(fds), d.offset, d.granularity);
  }
  impl->data = imported->ptr();
  impl->keepAlive = imported;
  return trackMemory(std::move(impl));
#else
  throw UnsupportedError("importing device memory needs a CUDA build of pyccl");
#endif
}

std::vector<std::optional<RegisteredMemory>> Communicator::exchangeMemory(
    const RegisteredMemory& local) {
  checkOpen("exchange_memory");
  PYCCL_CHECK_ARG(local.valid() && local.isLocal(), "memory",
                  "must be memory registered by this rank");
  return std::move(exchangeMemories({local}, "exchange_memory").front());
}

std::vector<std::vector<std::optional<RegisteredMemory>>> Communicator::exchangeMemories(
    const std::vector<RegisteredMemory>& locals, const char* what) {
  checkOpen(what);
  ByteWriter w;
  w.put<uint64_t>(locals.size());
  for (const auto& local : locals) {
    PYCCL_CHECK_ARG(local.valid() && local.isLocal(), "memory", "must be memory registered by this rank");
    const Bytes desc = local.serialize();
    w.putBytes(desc.data(), desc.size());
  }
  const auto all = bootstrap_->allGather(w.take());
  // Every rank sees every count, so all raise together or none does.
  std::vector<ByteReader> readers;
  readers.reserve(worldSize_);
  std::string counts;
  bool same = true;
  for (int p = 0; p < worldSize_; ++p) {
    readers.emplace_back(all[p], "exchanged memory descriptors");
    const auto n = readers.back().get<uint64_t>();
    same = same && n == locals.size();
    counts += strCat(p == 0 ? "" : ", ", "rank ", p, ": ", n);
  }
  PYCCL_CHECK_ARG(same, "memory", what, ": every rank must pass as many registrations (", counts, ")");
  std::vector<std::vector<std::optional<RegisteredMemory>>> out(locals.size());
  for (size_t i = 0; i < locals.size(); ++i) {
    out[i].resize(worldSize_);
    for (int p = 0; p < worldSize_; ++p) {
      const Bytes desc = readers[p].getBytes();
      if (p == rank_) {
        out[i][p] = locals[i];
      } else if (topology_.p2p[rank_][p]) {
        out[i][p] = importMemory(desc);
      }
    }
  }
  // On return every rank has mapped every peer's memory, so an owner may
  // release its registration (or close) without racing a peer's import.
  bootstrap_->barrier();
  return out;
}

std::shared_ptr<void> Communicator::allocateShareable(size_t size) const {
  if (hostMode()) {
    auto mapping = allocateHostShared(size);
    return std::shared_ptr<void>(mapping, mapping->base());  // owns the mapping, points at its bytes
  }
  const int dev = device_;
  return std::shared_ptr<void>(gpu::deviceMalloc(dev, size), [dev](void* p) { gpu::deviceFree(dev, p); });
}

std::shared_ptr<void> Communicator::allocateLocal(size_t size) const {
  if (!hostMode()) return allocateShareable(size);  // device memory serves both
  void* p = std::calloc(1, size);
  if (p == nullptr) throw SystemError(strCat("out of host memory (", size, " bytes)"));
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

std::shared_ptr<void> Communicator::allocateHostMapped(size_t size) const {
  if (hostMode()) return allocateLocal(size);
  gpu::DeviceGuard guard(device_);
  return std::shared_ptr<void>(gpu::allocPinnedMapped(size), [](void* q) { gpu::freePinned(q); });
}

}  // namespace pyccl
