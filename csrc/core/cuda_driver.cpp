#include "core/cuda_driver.hpp"

#include <cuda_runtime.h>

#include <mutex>

#include "core/errors.hpp"

namespace pyccl {
namespace {

template <typename Fn>
void load(Fn* fn, const char* symbol) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  // Version 12000: the entry point as it exists since CUDA 12.0.
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, 12000, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
    cudaGetLastError();
    throw CudaError(strCat("CUDA driver entry point ", symbol, " is unavailable (",
                           cudaGetErrorString(err), "); is an NVIDIA driver installed?"));
  }
  *fn = reinterpret_cast<Fn>(ptr);
}

/// An entry point that older drivers lack: null there.
template <typename Fn>
void loadOptional(Fn* fn, const char* symbol, int version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status);
  if (err != cudaSuccess) cudaGetLastError();
  *fn = err == cudaSuccess && status == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(ptr) : nullptr;
}

DriverApi loadDriver() {
  DriverApi api{};
  load(&api.getErrorString, "cuGetErrorString");
  load(&api.memGetAddressRange, "cuMemGetAddressRange");
  load(&api.memRetainAllocationHandle, "cuMemRetainAllocationHandle");
  load(&api.memGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
  load(&api.memGetAllocationGranularity, "cuMemGetAllocationGranularity");
  load(&api.memExportToShareableHandle, "cuMemExportToShareableHandle");
  load(&api.memImportFromShareableHandle, "cuMemImportFromShareableHandle");
  load(&api.memCreate, "cuMemCreate");
  load(&api.memRelease, "cuMemRelease");
  load(&api.memAddressReserve, "cuMemAddressReserve");
  load(&api.memAddressFree, "cuMemAddressFree");
  load(&api.memMap, "cuMemMap");
  load(&api.memUnmap, "cuMemUnmap");
  load(&api.memSetAccess, "cuMemSetAccess");
  load(&api.pointerGetAttribute, "cuPointerGetAttribute");
  load(&api.memGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
  loadOptional(&api.funcLoad, "cuFuncLoad", 12040);
  return api;
}

}  // namespace

const DriverApi& driver() {
  // Not a function-local static of DriverApi: a failed load must be retried
  // (and rethrown) on the next call rather than leave a half-filled table.
  static std::mutex mu;
  static DriverApi api{};
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) {
    api = loadDriver();
    loaded = true;
  }
  return api;
}

std::string driverErrorString(CUresult result) {
  const char* msg = nullptr;
  try {
    if (driver().getErrorString(result, &msg) == CUDA_SUCCESS && msg != nullptr) {
      return strCat(msg, " (CUresult ", static_cast<int>(result), ")");
    }
  } catch (const Error&) {
  }
  return strCat("CUresult ", static_cast<int>(result));
}

}  // namespace pyccl
