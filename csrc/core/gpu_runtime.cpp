#include "core/gpu_runtime.hpp"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/logging.hpp"

namespace pyccl::gpu {

#ifdef PYCCL_WITH_CUDA

namespace {

cudaStream_t privateStream(int device) {
  static std::mutex mu;
  static std::vector<cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(streams.size()) <= device) streams.resize(device + 1, nullptr);
  if (streams[device] == nullptr) {
    DeviceGuard guard(device);
    PYCCL_CHECK_CUDA(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}

}  // namespace

bool built() { return true; }

int deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void checkDevice(int device, const char* arg) {
  const int count = deviceCount();
  PYCCL_CHECK_ARG(count > 0, arg, "cuda:", device, " requested but no CUDA device is visible");
  PYCCL_CHECK_ARG(device >= 0 && device < count, arg, "cuda:", device, " does not exist (",
                  count, " visible CUDA devices)");
}

DeviceGuard::DeviceGuard(int device) {
  PYCCL_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device) PYCCL_CHECK_CUDA(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

int currentDevice() {
  int device = -1;
  PYCCL_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

std::string deviceName(int device) {
  cudaDeviceProp prop{};
  PYCCL_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::string deviceUuid(int device) {
  cudaDeviceProp prop{};
  PYCCL_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::string hex;
  char buf[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
    hex += buf;
  }
  return hex;
}

std::string pciBusId(int device) {
  char buf[32] = {0};
  PYCCL_CHECK_CUDA(cudaDeviceGetPCIBusId(buf, sizeof(buf), device));
  return buf;
}

int computeCapability(int device) {
  int major = 0, minor = 0;
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PYCCL_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return 10 * major + minor;
}

void* allocPinnedMapped(size_t size) {
  void* ptr = nullptr;
  PYCCL_CHECK_CUDA(cudaHostAlloc(&ptr, size, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(ptr, 0, size);
  return ptr;
}

void freePinned(void* ptr) {
  if (ptr != nullptr && cudaFreeHost(ptr) != cudaSuccess) {
    cudaGetLastError();
    PYCCL_LOG(Error, "cudaFreeHost failed");
  }
}

void* devicePointerOf(void* pinnedHostPtr) {
  void* dev = nullptr;
  PYCCL_CHECK_CUDA(cudaHostGetDevicePointer(&dev, pinnedHostPtr, 0));
  return dev;
}

void* deviceMalloc(int device, size_t size) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  PYCCL_CHECK_CUDA(cudaMalloc(&ptr, size));
  PYCCL_CHECK_CUDA(cudaMemset(ptr, 0, size));
  PYCCL_CHECK_CUDA(cudaDeviceSynchronize());
  return ptr;
}

void deviceFree(int device, void* ptr) {
  if (ptr == nullptr) return;
  DeviceGuard guard(device);
  if (cudaFree(ptr) != cudaSuccess) {
    cudaGetLastError();
    PYCCL_LOG(Error, "cudaFree failed on cuda:" << device);
  }
}

void copyToHost(int device, void* dst, const void* src, size_t size) {
  DeviceGuard guard(device);
  cudaStream_t s = privateStream(device);
  PYCCL_CHECK_CUDA(cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, s));
  PYCCL_CHECK_CUDA(cudaStreamSynchronize(s));
}

void copyToDevice(int device, void* dst, const void* src, size_t size) {
  DeviceGuard guard(device);
  cudaStream_t s = privateStream(device);
  PYCCL_CHECK_CUDA(cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, s));
  PYCCL_CHECK_CUDA(cudaStreamSynchronize(s));
}

void raiseDeviceFlag(int device, uint32_t* flag, const uint32_t* value) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  PYCCL_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  try {
    copyToDevice(device, flag, value, sizeof(*value));
  } catch (...) {
    cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  PYCCL_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
}

void relaxCaptureModeOfThisThread() {
  // Best effort (it cannot fail short of a broken context, which the
  // thread's first copy then reports): no throw from a thread's start.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();
}

void enablePeerAccess(int device, int peer) {
  int can = 0;
  PYCCL_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, device, peer));
  if (!can) throw UnsupportedError(strCat("cuda:", device, " cannot access cuda:", peer, " by P2P"));
  DeviceGuard guard(device);
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  PYCCL_CHECK_CUDA(e);
}

bool isDevicePointer(const void* ptr, int* device) {
  if (deviceCount() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (attr.type != cudaMemoryTypeDevice) return false;
  if (device != nullptr) *device = attr.device;
  return true;
}

namespace {

/// Events without timing, reused: creating and destroying one per op would take
/// the driver's context lock twice on the path of every process-group op.
class EventPool {
 public:
  cudaEvent_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(free_.size()) > device && !free_[device].empty()) {
        cudaEvent_t e = free_[device].back();
        free_[device].pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    PYCCL_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void release(int device, cudaEvent_t e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(free_.size()) <= device) free_.resize(device + 1);
      if (free_[device].size() < kMaxFree) {
        free_[device].push_back(e);
        return;
      }
    }
    if (cudaEventDestroy(e) != cudaSuccess) cudaGetLastError();
  }

 private:
  static constexpr size_t kMaxFree = 1024;
  std::mutex mu_;
  std::vector<std::vector<cudaEvent_t>> free_;  ///< by device
};

EventPool& eventPool() {
  // Never destroyed: Work objects may release events during static destruction.
  static auto* pool = new EventPool();
  return *pool;
}

}  // namespace

StreamEvent::StreamEvent(int device, void* stream) : device_(device) {
  DeviceGuard guard(device);
  cudaEvent_t e = eventPool().acquire(device);
  event_ = e;
  const cudaError_t err = cudaEventRecord(e, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    eventPool().release(device, e);
    event_ = nullptr;
    PYCCL_CHECK_CUDA(err);
  }
}

StreamEvent::~StreamEvent() {
  if (event_ != nullptr) eventPool().release(device_, static_cast<cudaEvent_t>(event_));
}

bool StreamEvent::query() const {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  PYCCL_CHECK_CUDA(e);
  return true;
}

void StreamEvent::block(void* stream) const {
  DeviceGuard guard(device_);
  PYCCL_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0));
}

void StreamEvent::synchronize() const { PYCCL_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_))); }

bool isCapturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PYCCL_CHECK_CUDA(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

void synchronizeStream(int device, void* stream) {
  DeviceGuard guard(device);
  PYCCL_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

#else  // CPU-only build

namespace {
[[noreturn]] void noCuda(const char* what) {
  throw UnsupportedError(strCat(what, ": this build of pyccl has no CUDA support (it was built "
                                      "against a torch without CUDA, or without nvcc)"));
}
}  // namespace

bool built() { return false; }
int deviceCount() { return 0; }
void checkDevice(int device, const char* arg) {
  PYCCL_CHECK_ARG(false, arg, "cuda:", device,
                  " requested but this build of pyccl has no CUDA support");
}
DeviceGuard::DeviceGuard(int) { noCuda("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
int currentDevice() { noCuda("currentDevice"); }
std::string deviceName(int) { noCuda("deviceName"); }
std::string deviceUuid(int) { noCuda("deviceUuid"); }
std::string pciBusId(int) { noCuda("pciBusId"); }
int computeCapability(int) { noCuda("computeCapability"); }
void* allocPinnedMapped(size_t) { noCuda("allocPinnedMapped"); }
void freePinned(void*) {}
void* devicePointerOf(void*) { noCuda("devicePointerOf"); }
void* deviceMalloc(int, size_t) { noCuda("deviceMalloc"); }
void deviceFree(int, void*) {}
void copyToHost(int, void*, const void*, size_t) { noCuda("copyToHost"); }
void copyToDevice(int, void*, const void*, size_t) { noCuda("copyToDevice"); }
void raiseDeviceFlag(int, uint32_t*, const uint32_t*) { noCuda("raiseDeviceFlag"); }
void relaxCaptureModeOfThisThread() {}
void enablePeerAccess(int, int) { noCuda("enablePeerAccess"); }
bool isDevicePointer(const void*, int*) { return false; }
StreamEvent::StreamEvent(int, void*) : device_(-1) { noCuda("StreamEvent"); }
StreamEvent::~StreamEvent() = default;
bool StreamEvent::query() const { return true; }
void StreamEvent::block(void*) const {}
void StreamEvent::synchronize() const {}
bool isCapturing(void*) { return false; }
void synchronizeStream(int, void*) {}

#endif

}  // namespace pyccl::gpu
