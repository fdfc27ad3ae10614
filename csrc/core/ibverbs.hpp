// rdma-core's libibverbs, loaded at run time with dlopen: pyccl builds and
// runs where rdma-core is absent, and reports it clearly where RDMA is asked for.
#pragma once

#include <string>
#include <vector>

namespace pyccl {

/// Names of the RDMA devices libibverbs sees (empty when there are none).
/// Throws UnsupportedError naming libibverbs.so.1 when it cannot be loaded.
std::vector<std::string> listRdmaDevices();

}  // namespace pyccl
