#include "core/ibverbs.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/errors.hpp"

namespace pyccl {
namespace {

// Discovery needs three entry points; the data path (PYCCL_WITH_IBVERBS) the rest.
struct IbvDevice;
using GetDeviceList = IbvDevice** (*)(int*);
using FreeDeviceList = void (*)(IbvDevice**);
using GetDeviceName = const char* (*)(IbvDevice*);

struct Library {
  void* handle = nullptr;
  std::string name;
  std::string error;
};

const Library& library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* forced = std::getenv("PYCCL_IBVERBS_LIBRARY");
    std::vector<std::string> names;
    if (forced != nullptr && *forced != '\0') {
      names = {forced};
    } else {
      names = {"libibverbs.so.1", "libibverbs.so"};
    }
    std::string why;
    for (const auto& name : names) {
      lib.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle != nullptr) {
        lib.name = name;
        return;
      }
      const char* e = dlerror();
      why = e != nullptr ? e : "not found";
    }
    lib.error = strCat(names.front(), " could not be loaded (", why,
                       "); install rdma-core (Debian: libibverbs1) for the RDMA transport");
  });
  return lib;
}

template <typename Fn>
void resolve(const Library& lib, Fn* fn, const char* symbol, bool required, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib.handle, symbol));
  if (*fn == nullptr && required) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

}  // namespace

std::vector<std::string> listRdmaDevices() {
  const Library& lib = library();
  if (!lib.error.empty()) throw UnsupportedError(lib.error);
  GetDeviceList getDeviceList = nullptr;
  FreeDeviceList freeDeviceList = nullptr;
  GetDeviceName getDeviceName = nullptr;
  std::string missing;
  resolve(lib, &getDeviceList, "ibv_get_device_list", true, &missing);
  resolve(lib, &freeDeviceList, "ibv_free_device_list", true, &missing);
  resolve(lib, &getDeviceName, "ibv_get_device_name", true, &missing);
  if (!missing.empty()) throw UnsupportedError(strCat(lib.name, " lacks ", missing));
  int count = 0;
  IbvDevice** list = getDeviceList(&count);
  std::vector<std::string> names;
  if (list == nullptr) return names;  // no devices (or no kernel support): errno says which
  for (int i = 0; i < count; ++i) names.emplace_back(getDeviceName(list[i]));
  freeDeviceList(list);
  return names;
}

#ifdef PYCCL_WITH_IBVERBS
const IbvApi& ibverbs() {
  static IbvApi api{};
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const Library& lib = library();
    if (!lib.error.empty()) {
      error = lib.error;
      return;
    }
    std::string missing;
    resolve(lib, &api.getDeviceList, "ibv_get_device_list", true, &missing);
    resolve(lib, &api.freeDeviceList, "ibv_free_device_list", true, &missing);
    resolve(lib, &api.getDeviceName, "ibv_get_device_name", true, &missing);
    resolve(lib, &api.openDevice, "ibv_open_device", true, &missing);
    resolve(lib, &api.closeDevice, "ibv_close_device", true, &missing);
    resolve(lib, &api.queryPort, "ibv_query_port", true, &missing);
    resolve(lib, &api.queryGid, "ibv_query_gid", true, &missing);
    resolve(lib, &api.allocPd, "ibv_alloc_pd", true, &missing);
    resolve(lib, &api.deallocPd, "ibv_dealloc_pd", true, &missing);
    resolve(lib, &api.regMr, "ibv_reg_mr", true, &missing);
    resolve(lib, &api.regDmabufMr, "ibv_reg_dmabuf_mr", false, &missing);
    resolve(lib, &api.deregMr, "ibv_dereg_mr", true, &missing);
    resolve(lib, &api.createCq, "ibv_create_cq", true, &missing);
    resolve(lib, &api.destroyCq, "ibv_destroy_cq", true, &missing);
    resolve(lib, &api.createQp, "ibv_create_qp", true, &missing);
    resolve(lib, &api.modifyQp, "ibv_modify_qp", true, &missing);
    resolve(lib, &api.destroyQp, "ibv_destroy_qp", true, &missing);
    resolve(lib, &api.wcStatusStr, "ibv_wc_status_str", true, &missing);
    if (!missing.empty()) error = strCat(lib.name, " lacks ", missing, " (rdma-core too old?)");
  });
  if (!error.empty()) throw UnsupportedError(error);
  return api;
}
#endif

}  // namespace pyccl
