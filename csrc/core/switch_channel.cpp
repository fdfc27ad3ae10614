#include "core/switch_channel.hpp"

#include "core/communicator.hpp"
#include "core/env_settings.hpp"
#include "core/errors.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/cuda_driver.hpp"
#include "core/fd_passing.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#endif

namespace pyccl {

bool nvlsEnabled() { return envFlag("PYCCL_ENABLE_NVLS", false); }

#ifdef PYCCL_WITH_CUDA
namespace {

struct MulticastApi {
  decltype(&::cuMulticastGetGranularity) getGranularity;
  decltype(&::cuMulticastCreate) create;
  decltype(&::cuMulticastAddDevice) addDevice;
  decltype(&::cuMulticastBindMem) bindMem;
  decltype(&::cuMulticastUnbind) unbind;
};

MulticastApi loadMulticastApi() {
  MulticastApi api{};
  auto load = [](const char* name, void** fn) {
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(name, fn, 12010, cudaEnableDefault, &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess || *fn == nullptr) {
      cudaGetLastError();
      throw UnsupportedError(strCat("SwitchChannel: the CUDA driver has no ", name));
    }
  };
  load("cuMulticastGetGranularity", reinterpret_cast<void**>(&api.getGranularity));
  load("cuMulticastCreate", reinterpret_cast<void**>(&api.create));
  load("cuMulticastAddDevice", reinterpret_cast<void**>(&api.addDevice));
  load("cuMulticastBindMem", reinterpret_cast<void**>(&api.bindMem));
  load("cuMulticastUnbind", reinterpret_cast<void**>(&api.unbind));
  return api;
}

class NvlsSwitchChannel : public SwitchChannel {
 public:
  NvlsSwitchChannel(Communicator& comm, const RegisteredMemory& local) : device_(comm.device()), local_(local) {
    const auto& d = driver();
    api_ = loadMulticastApi();
    gpu::DeviceGuard guard(device_);
    CUmulticastObjectProp prop{};
    prop.numDevices = static_cast<unsigned int>(comm.worldSize());
    prop.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.size = local.size();
    size_t gran = 0;
    PYCCL_CHECK_CU(api_.getGranularity(&gran, &prop, CU_MULTICAST_GRANULARITY_RECOMMENDED));
    PYCCL_CHECK_ARG(local.size() % gran == 0, "memory", "a SwitchChannel buffer must be a multiple of ",
                    gran, " bytes, got ", local.size());
    size_ = local.size();
    // Rank 0 creates the object and hands its fd to the others over its fd server.
    FdServer server;
    const uint64_t token = randomU64();
    uint64_t exportId = 0;
    if (comm.rank() == 0) {
      PYCCL_CHECK_CU(api_.create(&handle_, &prop));
      int fd = -1;
      PYCCL_CHECK_CU(d.memExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      UniqueFd owned(fd);
      exportId = server.publish({fd}, token);
    }
    ByteWriter w;
    w.putString(server.address()).put(exportId).put(token);
    auto all = comm.allGather(w.take());
    if (comm.rank() != 0) {
      ByteReader r(all[0], "multicast descriptor");
      const std::string address = r.getString();
      const auto id = r.get<uint64_t>();
      const auto tok = r.get<uint64_t>();
      auto fds = fetchFds(address, id, tok, comm.timeout());
      PYCCL_CHECK_CU(d.memImportFromShareableHandle(
          &handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fds.at(0).get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    }
    PYCCL_CHECK_CU(api_.addDevice(handle_, device_));
    comm.barrier();  // every device added before any memory is bound
    CUmemGenericAllocationHandle mem;
    PYCCL_CHECK_CU(d.memRetainAllocationHandle(&mem, local.data()));
    CUresult r = api_.bindMem(handle_, 0, mem, 0, size_, 0);
    d.memRelease(mem);
    PYCCL_CHECK_CU(r);
    bound_ = true;
    PYCCL_CHECK_CU(d.memAddressReserve(&multicast_, size_, gran, 0, 0));
    PYCCL_CHECK_CU(d.memMap(multicast_, size_, 0, handle_, 0));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    PYCCL_CHECK_CU(d.memSetAccess(multicast_, size_, &access, 1));
    comm.barrier();  // the fd server may go once everyone imported
  }

  ~NvlsSwitchChannel() override {
    const auto& d = driver();
    if (multicast_ != 0) {
      d.memUnmap(multicast_, size_);
      d.memAddressFree(multicast_, size_);
    }
    if (bound_) api_.unbind(handle_, device_, 0, size_);
    if (handle_ != 0) d.memRelease(handle_);
  }

  SwitchChannelDeviceHandle deviceHandle() const override {
    return {reinterpret_cast<char*>(multicast_), static_cast<char*>(local_.data())};
  }

 private:
  int device_;
  RegisteredMemory local_;
  MulticastApi api_{};
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr multicast_ = 0;
  size_t size_ = 0;
  bool bound_ = false;
};

}  // namespace
#endif

std::shared_ptr<SwitchChannel> createSwitchChannel(Communicator& comm, const RegisteredMemory& local) {
  if (!nvlsEnabled()) {
    throw UnsupportedError(
        "SwitchChannel (NVLink SHARP multicast) is off: set PYCCL_ENABLE_NVLS=1 to enable it, only on "
        "machines where multicast objects are known to be safe");
  }
  PYCCL_CHECK_ARG(!comm.hostMode(), "comm", "a SwitchChannel needs GPUs (not host mode)");
  PYCCL_CHECK_ARG(local.valid() && local.isLocal() && local.kind() == MemoryKind::kCuMem, "memory",
                  "must be cuMem memory registered by this rank (allocate it with pyccl.empty)");
#ifdef PYCCL_WITH_CUDA
  return std::make_shared<NvlsSwitchChannel>(comm, local);
#else
  throw UnsupportedError("SwitchChannel needs a CUDA build of pyccl");
#endif
}

}  // namespace pyccl
