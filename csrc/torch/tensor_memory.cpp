#include "torch/tensor_memory.hpp"

#include <numeric>

#include "core/errors.hpp"
#include "core/host_memory.hpp"
#ifdef PYCCL_WITH_CUDA
#include "core/gpu_memory.hpp"
#endif

namespace pyccl {

at::Tensor emptyShared(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device) {
  int64_t numel = 1;
  for (auto s : sizes) {
    PYCCL_CHECK_ARG(s >= 0, "size", "dimensions must be >= 0, got ", sizes);
    numel *= s;
  }
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  PYCCL_CHECK_ARG(bytes > 0, "size", "pyccl.empty needs at least one element, got ", sizes);
  auto options = at::TensorOptions().dtype(dtype).device(device);
  if (device.is_cpu()) {
    auto mapping = allocateHostShared(bytes);
    return at::from_blob(mapping->base(), sizes, [mapping](void*) mutable { mapping.reset(); },
                         options);
  }
#ifdef PYCCL_WITH_CUDA
  PYCCL_CHECK_ARG(device.is_cuda(), "device", "must be cpu or cuda, got ", device);
  auto alloc = std::make_shared<DeviceSharedAllocation>(device.index() < 0 ? 0 : device.index(), bytes);
  return at::from_blob(alloc->ptr(), sizes, [alloc](void*) mutable { alloc.reset(); },
                       options.device(at::Device(at::kCUDA, alloc->device())));
#else
  PYCCL_CHECK_ARG(false, "device", device, " needs a CUDA build of pyccl");
  return {};
#endif
}

std::pair<void*, size_t> tensorRange(const at::Tensor& tensor, const char* arg) {
  PYCCL_CHECK_ARG(tensor.defined(), arg, "is an undefined tensor");
  PYCCL_CHECK_ARG(tensor.numel() > 0, arg, "has no elements (size 0 cannot be registered)");
  PYCCL_CHECK_ARG(tensor.is_contiguous(), arg, "must be contiguous (strides ", tensor.strides(),
                  " for sizes ", tensor.sizes(), "); call .contiguous() first");
  return {tensor.data_ptr(), tensor.nbytes()};
}

at::Tensor tensorOf(const RegisteredMemory& memory, at::ScalarType dtype,
                    std::vector<int64_t> shape, int device) {
  const size_t elem = c10::elementSize(dtype);
  const uint64_t size = memory.size();
  if (shape.empty()) {
    PYCCL_CHECK_ARG(size % elem == 0, "dtype", "memory of ", size, " bytes is not a whole number of ",
                    dtype, " elements");
    shape.push_back(static_cast<int64_t>(size / elem));
  }
  const int64_t numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  PYCCL_CHECK_ARG(numel >= 0 && static_cast<uint64_t>(numel) * elem <= size, "shape", "needs ",
                  numel * static_cast<int64_t>(elem), " bytes but the memory has ", size);
  const at::Device where = device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, device);
  RegisteredMemory keep = memory;
  // A peer's memory mapped here reports the peer's GPU as its device; the
  // tensor lives on (and is used from) this communicator's device.
  return at::for_blob(memory.data(), shape)
      .deleter([keep](void*) mutable { keep = RegisteredMemory(); })
      .options(at::TensorOptions().dtype(dtype).device(where))
      .target_device(where)
      .make_tensor();
}

}  // namespace pyccl
