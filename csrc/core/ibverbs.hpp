// rdma-core's libibverbs, loaded at run time with dlopen: pyccl builds and
// runs where rdma-core is absent, and reports it clearly where RDMA is asked for.
//
// The exported entry points are called through the table below (never linked,
// so the module imports without libibverbs); ibv_post_send and ibv_poll_cq are
// verbs.h's inline calls through the device context's ops and need no symbol.
// PYCCL_IBVERBS_LIBRARY names another library file to load (tests use it).
#pragma once

#include <string>
#include <vector>

#ifdef PYCCL_WITH_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace pyccl {

/// Names of the RDMA devices libibverbs sees (empty when there are none).
/// Throws UnsupportedError naming libibverbs.so.1 when it cannot be loaded.
std::vector<std::string> listRdmaDevices();

/// The error where libibverbs loads but lists no device.
inline constexpr const char* kNoRdmaDeviceMessage =
    "transport 'rdma': libibverbs found no RDMA device on this machine; use transport='socket'";

#ifdef PYCCL_WITH_IBVERBS
struct IbvApi {
  decltype(&::ibv_get_device_list) getDeviceList;
  decltype(&::ibv_free_device_list) freeDeviceList;
  decltype(&::ibv_get_device_name) getDeviceName;
  decltype(&::ibv_open_device) openDevice;
  decltype(&::ibv_close_device) closeDevice;
  // The exported ibv_query_port (verbs.h wraps it in a macro of the same name).
  int (*queryPort)(ibv_context*, uint8_t, ibv_port_attr*);
  decltype(&::ibv_query_gid) queryGid;
  decltype(&::ibv_alloc_pd) allocPd;
  decltype(&::ibv_dealloc_pd) deallocPd;
  // The exported ibv_reg_mr (verbs.h wraps it in a macro of the same name).
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int);
  decltype(&::ibv_reg_dmabuf_mr) regDmabufMr;  ///< null before rdma-core 34
  decltype(&::ibv_dereg_mr) deregMr;
  decltype(&::ibv_create_cq) createCq;
  decltype(&::ibv_destroy_cq) destroyCq;
  decltype(&::ibv_create_qp) createQp;
  decltype(&::ibv_modify_qp) modifyQp;
  decltype(&::ibv_destroy_qp) destroyQp;
  decltype(&::ibv_wc_status_str) wcStatusStr;
};

/// The loaded table. Throws UnsupportedError naming what is missing.
const IbvApi& ibverbs();
#endif

}  // namespace pyccl
