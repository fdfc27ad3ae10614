#include "core/cuda_driver.hpp"

#include <cuda_runtime.h>

#include <mutex>

#include "core/errors.hpp"

namespace pyccl {
namespace {

/// The driver's `symbol` as of CUDA `version`, or null (the runtime's answer in `*err`).
void* entryPoint(const char* symbol, int version, cudaError_t* err) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  *err = cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status);
  if (*err != cudaSuccess) cudaGetLastError();
  return *err == cudaSuccess && status == cudaDriverEntryPointSuccess ? ptr : nullptr;
}

template <typename Fn>
void load(Fn* fn, const char* symbol) {
  cudaError_t err = cudaSuccess;
  // Version 12000: the entry point as it exists since CUDA 12.0.
  void* ptr = entryPoint(symbol, 12000, &err);
  if (ptr == nullptr) {
    throw CudaError(strCat("CUDA driver entry point ", symbol, " is unavailable (",
                           cudaGetErrorString(err), "); is an NVIDIA driver installed?"));
  }
  *fn = reinterpret_cast<Fn>(ptr);
}

/// An entry point that older drivers lack: null there.
template <typename Fn>
void loadOptional(Fn* fn, const char* symbol, int version) {
  cudaError_t err = cudaSuccess;
  *fn = reinterpret_cast<Fn>(entryPoint(symbol, version, &err));
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
