// The Autograd kernel of pyccl's torch custom ops (torch.ops.pyccl.*, whose
// schemas and CPU/CUDA kernels src/pyccl/ops.py registers). The ops have no
// derivative: a call on tensors that require grad runs and returns as usual,
// and a backward through its result raises, naming the op. Without a kernel
// at this key, torch's default fallback would only warn at backward and leave
// the gradient silently missing. This one is C++, so an eager call pays no
// Python for it (torch.library.custom_op's Python autograd layer cost more
// than the collective's own call on the host).
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(pyccl, Autograd, m) {
  for (const char* name : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                           "fused_all_reduce_rmsnorm"}) {
    m.impl(name, torch::autograd::autogradNotImplementedFallback());
  }
}
