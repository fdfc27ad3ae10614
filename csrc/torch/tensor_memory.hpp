// Tensors over pyccl memory: shareable allocations (pyccl.empty) and views of
// registered (possibly peer) memory, each keeping its memory alive.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "core/registered_memory.hpp"

namespace pyccl {

/// A tensor whose memory peers can map: memfd-backed host memory on cpu,
/// a cuMem allocation with a POSIX-fd handle on cuda.
at::Tensor emptyShared(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device);

/// (pointer, bytes) of a tensor to register. Throws InvalidArgument naming
/// `arg` for empty or non-contiguous tensors.
std::pair<void*, size_t> tensorRange(const at::Tensor& tensor, const char* arg);

/// A tensor viewing registered memory (local or a peer's mapping) on `device`.
at::Tensor tensorOf(const RegisteredMemory& memory, at::ScalarType dtype,
                    std::vector<int64_t> shape, int device);

}  // namespace pyccl
