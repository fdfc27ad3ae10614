#include "core/ibverbs.hpp"

#include <dlfcn.h>

#include <mutex>

#include "core/errors.hpp"

namespace pyccl {
namespace {

// The few entry points used for discovery; their C signatures, with opaque types.
struct IbvDevice;
using GetDeviceList = IbvDevice** (*)(int*);
using FreeDeviceList = void (*)(IbvDevice**);
using GetDeviceName = const char* (*)(IbvDevice*);

struct IbvLibrary {
  void* handle = nullptr;
  GetDeviceList getDeviceList = nullptr;
  FreeDeviceList freeDeviceList = nullptr;
  GetDeviceName getDeviceName = nullptr;
  std::string error;
};

const IbvLibrary& library() {
  static IbvLibrary lib;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libibverbs.so.1", "libibverbs.so"}) {
      lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib.handle != nullptr) break;
    }
    if (lib.handle == nullptr) {
      const char* why = dlerror();
      lib.error = strCat("libibverbs.so.1 could not be loaded (", why ? why : "not found",
                         "); install rdma-core (Debian: libibverbs1) for the RDMA transport");
      return;
    }
    lib.getDeviceList = reinterpret_cast<GetDeviceList>(dlsym(lib.handle, "ibv_get_device_list"));
    lib.freeDeviceList = reinterpret_cast<FreeDeviceList>(dlsym(lib.handle, "ibv_free_device_list"));
    lib.getDeviceName = reinterpret_cast<GetDeviceName>(dlsym(lib.handle, "ibv_get_device_name"));
    if (!lib.getDeviceList || !lib.freeDeviceList || !lib.getDeviceName) {
      lib.error = "libibverbs.so.1 lacks ibv_get_device_list/ibv_free_device_list/ibv_get_device_name";
    }
  });
  return lib;
}

}  // namespace

std::vector<std::string> listRdmaDevices() {
  const IbvLibrary& lib = library();
  if (!lib.error.empty()) throw UnsupportedError(lib.error);
  int count = 0;
  IbvDevice** list = lib.getDeviceList(&count);
  std::vector<std::string> names;
  if (list == nullptr) return names;  // no devices (or no kernel support): errno says which
  for (int i = 0; i < count; ++i) names.emplace_back(lib.getDeviceName(list[i]));
  lib.freeDeviceList(list);
  return names;
}

}  // namespace pyccl
