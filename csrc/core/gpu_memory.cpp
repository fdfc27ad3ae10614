#include "core/gpu_memory.hpp"

#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"

namespace pyccl {
namespace {

CUmemAccessDesc readWriteAccess(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// A cudaIpc mapping, shared by every import of the same allocation in this
// process (cudaIpcOpenMemHandle refuses to open one handle twice).
class IpcMapping {
 public:
  IpcMapping(int device, const cudaIpcMemHandle_t& handle) : device_(device) {
    gpu::DeviceGuard guard(device);
    PYCCL_CHECK_CUDA(cudaIpcOpenMemHandle(&base_, handle, cudaIpcMemLazyEnablePeerAccess));
  }
  ~IpcMapping() {
    gpu::DeviceGuard guard(device_);
    if (cudaIpcCloseMemHandle(base_) != cudaSuccess) {
      cudaGetLastError();
      PYCCL_LOG(Error, "cudaIpcCloseMemHandle failed");
    }
  }
  void* base() const { return base_; }

 private:
  int device_;
  void* base_ = nullptr;
};

class IpcImport : public ImportedDeviceMemory {
 public:
  IpcImport(std::shared_ptr<IpcMapping> mapping, uint64_t offset) : mapping_(std::move(mapping)) {
    ptr_ = static_cast<char*>(mapping_->base()) + offset;
  }

 private:
  std::shared_ptr<IpcMapping> mapping_;
};

class CuMemImport : public ImportedDeviceMemory {
 public:
  CuMemImport(int device, const std::vector<CuMemChunk>& chunks, std::vector<UniqueFd> fds,
              uint64_t offsetInRange, uint64_t granularity)
      : device_(device) {
    const auto& d = driver();
    PYCCL_CHECK_ARG(!chunks.empty() && chunks.size() == fds.size(), "memory descriptor",
                    "has ", chunks.size(), " chunks but ", fds.size(), " fds");
    reserved_ = chunks.back().offset + chunks.back().size;
    if (granularity > 0) reserved_ = (reserved_ + granularity - 1) / granularity * granularity;
    gpu::DeviceGuard guard(device);
    PYCCL_CHECK_CU(d.memAddressReserve(&base_, reserved_, granularity, 0, 0));
    try {
      for (size_t i = 0; i < chunks.size(); ++i) {
        CUmemGenericAllocationHandle handle;
        PYCCL_CHECK_CU(d.memImportFromShareableHandle(
            &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i].get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        CUresult r = d.memMap(base_ + chunks[i].offset, chunks[i].size, 0, handle, 0);
        // The mapping holds its own reference to the physical memory.
        d.memRelease(handle);
        PYCCL_CHECK_CU(r);
        mapped_.push_back(chunks[i]);
      }
      CUmemAccessDesc access = readWriteAccess(device);
      PYCCL_CHECK_CU(d.memSetAccess(base_, reserved_, &access, 1));
    } catch (...) {
      release();
      throw;
    }
    ptr_ = reinterpret_cast<void*>(base_ + offsetInRange);
  }
  ~CuMemImport() override { release(); }

 private:
  void release() {
    const auto& d = driver();
    for (const auto& c : mapped_) d.memUnmap(base_ + c.offset, c.size);
    mapped_.clear();
    if (base_ != 0) d.memAddressFree(base_, reserved_);
    base_ = 0;
  }
  int device_;
  CUdeviceptr base_ = 0;
  size_t reserved_ = 0;
  std::vector<CuMemChunk> mapped_;
};

DeviceExport exportCuMem(int device, uintptr_t ptr, size_t size, CUmemGenericAllocationHandle first) {
  const auto& d = driver();
  DeviceExport ex;
  ex.isCuMem = true;
  CUdeviceptr firstBase = 0;
  uintptr_t cursor = ptr;
  CUmemGenericAllocationHandle handle = first;
  while (true) {
    CUmemAllocationProp prop{};
    CUresult r = d.memGetAllocationPropertiesFromHandle(&prop, handle);
    if (r == CUDA_SUCCESS && ex.granularity == 0) {
      size_t gran = 0;
      r = d.memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      ex.granularity = gran;
    }
    if (r != CUDA_SUCCESS) {
      d.memRelease(handle);
      PYCCL_CHECK_CU(r);
    }
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      d.memRelease(handle);
      throw InvalidArgument(strCat(
          "invalid argument 'tensor': its cuMem allocation was not created exportable as a POSIX "
          "file descriptor (requestedHandleTypes=", static_cast<int>(prop.requestedHandleTypes),
          "); allocate it with pyccl.empty or torch's default or expandable-segments allocator"));
    }
    CUdeviceptr chunkBase = 0;
    size_t chunkSize = 0;
    r = d.memGetAddressRange(&chunkBase, &chunkSize, static_cast<CUdeviceptr>(cursor));
    int fd = -1;
    if (r == CUDA_SUCCESS) {
      r = d.memExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    }
    d.memRelease(handle);  // balance cuMemRetainAllocationHandle
    PYCCL_CHECK_CU(r);
    if (ex.chunks.empty()) {
      firstBase = chunkBase;
      ex.offsetInRange = ptr - chunkBase;
    }
    ex.fds.emplace_back(fd);
    ex.chunks.push_back({chunkBase - firstBase, chunkSize});
    cursor = chunkBase + chunkSize;
    if (cursor >= ptr + size) break;
    r = d.memRetainAllocationHandle(&handle, reinterpret_cast<void*>(cursor));
    if (r != CUDA_SUCCESS) {
      throw InvalidArgument(strCat("invalid argument 'tensor': the range [0x", std::hex, ptr,
                                   ", +", std::dec, size, ") is not backed by contiguous cuMem "
                                   "mappings past offset ", cursor - ptr));
    }
  }
  return ex;
}

}  // namespace

DeviceExport exportDeviceMemory(int device, void* ptr, size_t size) {
  const auto& d = driver();
  gpu::DeviceGuard guard(device);
  CUmemGenericAllocationHandle handle;
  if (d.memRetainAllocationHandle(&handle, ptr) == CUDA_SUCCESS) {
    return exportCuMem(device, reinterpret_cast<uintptr_t>(ptr), size, handle);
  }
  int ipcCapable = 0;
  CUresult r = d.pointerGetAttribute(&ipcCapable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                     reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS || !ipcCapable) {
    throw InvalidArgument(
        "invalid argument 'tensor': its memory cannot be shared between processes (memory from "
        "cudaMallocAsync pools is not IPC-capable); use torch's default allocator or pyccl.empty");
  }
  CUdeviceptr base = 0;
  size_t allocSize = 0;
  PYCCL_CHECK_CU(d.memGetAddressRange(&base, &allocSize, reinterpret_cast<CUdeviceptr>(ptr)));
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  PYCCL_CHECK_ARG(p + size <= base + allocSize, "size", size, " bytes at offset ", p - base,
                  " run past the end of the allocation of ", allocSize, " bytes");
  DeviceExport ex;
  PYCCL_CHECK_CUDA(cudaIpcGetMemHandle(&ex.ipcHandle, reinterpret_cast<void*>(base)));
  ex.offsetInAllocation = p - base;
  return ex;
}

std::shared_ptr<ImportedDeviceMemory> importCudaIpc(int device, const cudaIpcMemHandle_t& handle,
                                                    uint64_t offset) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::weak_ptr<IpcMapping>>();
  std::string key(reinterpret_cast<const char*>(&handle), sizeof(handle));
  key += std::to_string(device);
  std::shared_ptr<IpcMapping> mapping;
  {
    std::lock_guard<std::mutex> lock(mu);
    mapping = (*cache)[key].lock();
    if (!mapping) {
      mapping = std::make_shared<IpcMapping>(device, handle);
      (*cache)[key] = mapping;
    }
    // Drop dead entries so the cache does not grow without bound.
    for (auto it = cache->begin(); it != cache->end();) {
      it = it->second.expired() ? cache->erase(it) : std::next(it);
    }
  }
  return std::make_shared<IpcImport>(std::move(mapping), offset);
}

std::shared_ptr<ImportedDeviceMemory> importCuMem(int device, const std::vector<CuMemChunk>& chunks,
                                                  std::vector<UniqueFd> fds, uint64_t offsetInRange,
                                                  uint64_t granularity) {
  return std::make_shared<CuMemImport>(device, chunks, std::move(fds), offsetInRange, granularity);
}

DeviceSharedAllocation::DeviceSharedAllocation(int device, size_t size) : device_(device) {
  PYCCL_CHECK_ARG(size > 0, "size", "must be > 0");
  const auto& d = driver();
  gpu::DeviceGuard guard(device);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  PYCCL_CHECK_CU(d.memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  size_ = (size + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle handle;
  PYCCL_CHECK_CU(d.memCreate(&handle, size_, &prop, 0));
  handle_ = handle;
  CUdeviceptr base = 0;
  CUresult r = d.memAddressReserve(&base, size_, gran, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = d.memMap(base, size_, 0, handle, 0);
    if (r != CUDA_SUCCESS) d.memAddressFree(base, size_);
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = readWriteAccess(device);
    r = d.memSetAccess(base, size_, &access, 1);
    if (r != CUDA_SUCCESS) {
      d.memUnmap(base, size_);
      d.memAddressFree(base, size_);
    }
  }
  if (r != CUDA_SUCCESS) {
    d.memRelease(handle);
    PYCCL_CHECK_CU(r);
  }
  base_ = base;
  PYCCL_CHECK_CUDA(cudaMemset(ptr(), 0, size_));
  PYCCL_CHECK_CUDA(cudaDeviceSynchronize());
}

DeviceSharedAllocation::~DeviceSharedAllocation() {
  const auto& d = driver();
  try {
    gpu::DeviceGuard guard(device_);
    // Pending work may still use the memory.
    cudaDeviceSynchronize();
  } catch (const Error&) {
  }
  d.memUnmap(base_, size_);
  d.memAddressFree(base_, size_);
  d.memRelease(handle_);
}

}  // namespace pyccl
