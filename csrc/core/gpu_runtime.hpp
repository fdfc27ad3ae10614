// The CUDA runtime calls the core makes, behind one header that compiles in
// CPU-only builds too (where every call that needs a GPU throws UnsupportedError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include <cuda_runtime.h>
#define PYCCL_CHECK_CUDA(call)                                                      \
  do {                                                                              \
    cudaError_t _e = (call);                                                        \
    if (_e != cudaSuccess) {                                                        \
      cudaGetLastError();                                                           \
      throw ::pyccl::CudaError(::pyccl::strCat(#call, " failed: ",                  \
                                               cudaGetErrorName(_e), ": ",          \
                                               cudaGetErrorString(_e)));            \
    }                                                                               \
  } while (0)
#endif

namespace pyccl::gpu {

/// Whether this build of pyccl includes CUDA.
bool built();
/// Number of visible CUDA devices; 0 without a CUDA build, driver or device.
int deviceCount();
/// Throws InvalidArgument naming `arg` unless `device` is a visible CUDA device.
void checkDevice(int device, const char* arg);

/// Makes `device` current for its scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// A DeviceGuard for `device` where it is a CUDA device (>= 0); nothing for
/// host mode (-1). Every call that enqueues work for a communicator holds one:
/// the default stream's handle (0) names the current device's stream, so a
/// launch on it from a thread whose current device is another GPU would run
/// there, unordered with the caller's work.
class OptionalDeviceGuard {
 public:
  explicit OptionalDeviceGuard(int device) {
    if (device >= 0) guard_.emplace(device);
  }

 private:
  std::optional<DeviceGuard> guard_;
};

/// The calling thread's current CUDA device (cudaGetDevice), and a device's name ("NVIDIA H200").
int currentDevice();
std::string deviceName(int device);
/// The device's UUID as 32 hex digits, and its PCI bus id ("0000:18:00.0").
std::string deviceUuid(int device);
std::string pciBusId(int device);
/// The device's compute capability as 10 * major + minor (90 for H100 and H200).
int computeCapability(int device);

/// Host memory, page-locked and mapped into the device's address space
/// (zero-initialized). The device pointer of it comes from devicePointerOf.
void* allocPinnedMapped(size_t size);
void freePinned(void* ptr);
void* devicePointerOf(void* pinnedHostPtr);

/// Device memory through cudaMalloc (so it is exportable with cudaIpc*), zeroed.
void* deviceMalloc(int device, size_t size);
void deviceFree(int device, void* ptr);

/// Synchronous copies on a private non-blocking stream of `device`, so a host
/// thread can read or write device memory while kernels run on other streams.
void copyToHost(int device, void* dst, const void* src, size_t size);
void copyToDevice(int device, void* dst, const void* src, size_t size);
/// Copies the pinned host word `value` into the device word `flag` as
/// copyToDevice does (a DMA on the private stream), in relaxed capture mode:
/// a kernel spinning on the GPU, or a graph captured by another thread, does
/// not hold it up.
void raiseDeviceFlag(int device, uint32_t* flag, const uint32_t* value);
/// For a helper thread (proxy, socket receiver) that copies while the
/// application may capture a CUDA graph in another thread: its copies go to
/// a private stream and are never part of a capture, so it opts out of the
/// global capture mode's refusal of them. Call once, at the thread's start; never throws.
void relaxCaptureModeOfThisThread();

/// Lets kernels on `device` reach `peer`'s memory by address (cudaDeviceEnablePeerAccess; already enabled is
/// fine). UnsupportedError where the two GPUs have no P2P path.
void enablePeerAccess(int device, int peer);

/// Whether `ptr` is device memory (false for host or unknown pointers).
bool isDevicePointer(const void* ptr, int* device);

/// A CUDA event without timing, recorded on a stream (a cudaStream_t):
/// query() and block() let a host thread or another stream follow the work
/// enqueued before it.
class StreamEvent {
 public:
  /// Records on `stream` of `device`.
  StreamEvent(int device, void* stream);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  /// Whether the work before the record has completed (no waiting).
  bool query() const;
  /// Makes `stream` wait for it (the host does not wait).
  void block(void* stream) const;
  /// Waits on the host until it has completed.
  void synchronize() const;

 private:
  int device_;
  void* event_ = nullptr;
};

/// Whether a CUDA graph is being captured on `stream`.
bool isCapturing(void* stream);
/// Waits on the host for the work enqueued so far on `stream`.
void synchronizeStream(int device, void* stream);

}  // namespace pyccl::gpu
