// Export and import of device memory between processes of one node. Two kinds,
// chosen per allocation:
//  - cudaMalloc'd memory: a cudaIpcMemHandle_t (plain bytes);
//  - cuMem (virtual memory management) allocations, as torch's expandable
//    segments make them: one POSIX fd per physical chunk, passed over a Unix
//    socket, re-mapped contiguously by the importer.
// CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/fd_passing.hpp"

namespace pyccl {

/// One physical allocation backing part of an exported cuMem range.
struct CuMemChunk {
  uint64_t offset;  ///< from the first chunk's mapped base
  uint64_t size;
};

struct DeviceExport {
  bool isCuMem = false;
  // cudaMalloc'd memory:
  cudaIpcMemHandle_t ipcHandle{};
  uint64_t offsetInAllocation = 0;
  // cuMem memory:
  std::vector<CuMemChunk> chunks;
  std::vector<UniqueFd> fds;     ///< one per chunk, owned until published
  uint64_t offsetInRange = 0;    ///< of the registered pointer from chunk 0's base
  uint64_t granularity = 0;
};

/// Describes how to share [ptr, ptr + size) on `device`. Throws InvalidArgument
/// if the memory cannot be shared (e.g. from cudaMallocAsync pools).
DeviceExport exportDeviceMemory(int device, void* ptr, size_t size);

/// A peer's device memory mapped into this process; unmapped on destruction.
class ImportedDeviceMemory {
 public:
  ImportedDeviceMemory() { liveCount().fetch_add(1, std::memory_order_relaxed); }
  virtual ~ImportedDeviceMemory() { liveCount().fetch_sub(1, std::memory_order_relaxed); }
  ImportedDeviceMemory(const ImportedDeviceMemory&) = delete;
  ImportedDeviceMemory& operator=(const ImportedDeviceMemory&) = delete;
  /// Peer mappings alive in this process (for leak checks).
  static size_t live() { return liveCount().load(std::memory_order_relaxed); }
  /// Address of the registered range (not of the underlying allocation).
  void* ptr() const { return ptr_; }

 protected:
  void* ptr_ = nullptr;

 private:
  static std::atomic<size_t>& liveCount() {
    static std::atomic<size_t> count{0};
    return count;
  }
};

std::shared_ptr<ImportedDeviceMemory> importCudaIpc(int device, const cudaIpcMemHandle_t& handle,
                                                    uint64_t offset);
std::shared_ptr<ImportedDeviceMemory> importCuMem(int device, const std::vector<CuMemChunk>& chunks,
                                                  std::vector<UniqueFd> fds, uint64_t offsetInRange,
                                                  uint64_t granularity);

/// Device memory that can always be shared: a cuMem allocation with a POSIX-fd
/// handle, mapped read-write for `device`. What pyccl.empty hands out on GPUs.
class DeviceSharedAllocation {
 public:
  DeviceSharedAllocation(int device, size_t size);
  ~DeviceSharedAllocation();
  DeviceSharedAllocation(const DeviceSharedAllocation&) = delete;
  DeviceSharedAllocation& operator=(const DeviceSharedAllocation&) = delete;
  void* ptr() const { return reinterpret_cast<void*>(base_); }
  size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  int device_;
  size_t size_;
  unsigned long long base_ = 0;
  unsigned long long handle_ = 0;
};

}  // namespace pyccl
