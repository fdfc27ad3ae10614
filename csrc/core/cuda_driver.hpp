// The few CUDA driver entry points pyccl needs, resolved at run time through
// cudaGetDriverEntryPointByVersion: the library never links libcuda, so it
// imports on machines without a GPU driver. CUDA builds only.
#pragma once

#include <cuda.h>

#include <string>

namespace pyccl {

struct DriverApi {
  decltype(&::cuGetErrorString) getErrorString;
  decltype(&::cuMemGetAddressRange) memGetAddressRange;
  decltype(&::cuMemRetainAllocationHandle) memRetainAllocationHandle;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) memGetAllocationPropertiesFromHandle;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle;
  decltype(&::cuMemCreate) memCreate;
  decltype(&::cuMemRelease) memRelease;
  decltype(&::cuMemAddressReserve) memAddressReserve;
  decltype(&::cuMemAddressFree) memAddressFree;
  decltype(&::cuMemMap) memMap;
  decltype(&::cuMemUnmap) memUnmap;
  decltype(&::cuMemSetAccess) memSetAccess;
  decltype(&::cuPointerGetAttribute) pointerGetAttribute;
  decltype(&::cuMemGetHandleForAddressRange) memGetHandleForAddressRange;  ///< dma-buf export (RDMA)
  decltype(&::cuFuncLoad) funcLoad;  ///< CUDA 12.4+; null with an older driver
};

/// The driver table, loaded on first use. Throws CudaError if the driver is missing.
const DriverApi& driver();

/// Message for a driver result code.
std::string driverErrorString(CUresult result);

}  // namespace pyccl

#define PYCCL_CHECK_CU(call)                                                        \
  do {                                                                              \
    CUresult _r = (call);                                                           \
    if (_r != CUDA_SUCCESS) {                                                       \
      throw ::pyccl::CudaError(::pyccl::strCat(#call, " failed: ",                  \
                                               ::pyccl::driverErrorString(_r)));     \
    }                                                                               \
  } while (0)
