#include "core/kernel_loading.hpp"

#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "core/debug_options.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/cuda_driver.hpp"
#endif

namespace pyccl::gpu {

#ifdef PYCCL_WITH_CUDA

namespace {

bool preloadOff() { return !debugOptions().preloadKernels; }

}  // namespace

void loadKernelsOnce(int device, const char* set, const std::vector<const void*>& kernels) {
  static std::mutex mu;
  static std::set<std::pair<int, std::string>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded.count({device, set}) != 0 || preloadOff()) return;
  DeviceGuard guard(device);
  const auto& api = driver();
  for (const void* kernel : kernels) {
    // Querying attributes resolves the function in this context; cuFuncLoad
    // (CUDA 12.4+) then loads its code, which the query alone may leave for later.
    cudaFuncAttributes attributes{};
    PYCCL_CHECK_CUDA(cudaFuncGetAttributes(&attributes, kernel));
    if (api.funcLoad != nullptr) {
      cudaFunction_t function = nullptr;
      PYCCL_CHECK_CUDA(cudaGetFuncBySymbol(&function, kernel));
      PYCCL_CHECK_CU(api.funcLoad(reinterpret_cast<CUfunction>(function)));
    }
  }
  loaded.insert({device, set});
  PYCCL_LOG(Info, "loaded " << kernels.size() << " " << set << " kernels on cuda:" << device);
}

#else  // CPU-only build: no kernels

void loadKernelsOnce(int, const char*, const std::vector<const void*>&) {}

#endif

}  // namespace pyccl::gpu
