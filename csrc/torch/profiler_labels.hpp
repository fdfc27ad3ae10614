// Labels in the torch profiler for pyccl's calls: every call of a
// communicator (whichever entry point made it) opens a record_function named
// as its NVTX range, "pyccl all_reduce 1pa_ll bfloat16 1024 B #12"
// (core/call_history.hpp). Where no profiler runs, a call pays one check.
#pragma once

namespace pyccl {

/// Hands the core the torch profiler's labels; called once, when pyccl._C loads.
void installProfilerLabels();

}  // namespace pyccl
