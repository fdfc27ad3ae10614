// The libibverbs side of the RDMA transport: device and port choice, memory
// registration (GPU memory as a dma-buf where the driver exports one, else
// through nvidia-peermem), and an RC queue pair taken to RTS. Built only
// against rdma-core's headers; every call goes through the dlopen'd table.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/env_settings.hpp"
#include "core/errors.hpp"
#include "core/ibverbs.hpp"
#include "core/logging.hpp"
#include "core/transport_rdma.hpp"
#ifdef PYCCL_WITH_CUDA
#include "core/cuda_driver.hpp"
#endif

namespace pyccl {

namespace {

constexpr uint32_t kQueueDepth = 256;
constexpr uint64_t kMaxMessageBytes = 1ull << 30;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

bool isIpv4MappedGid(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof(prefix)) == 0;
}

}  // namespace

class VerbsEndpoint {
 public:
  VerbsEndpoint(int device, char* data, uint64_t bytes, uint64_t* inbound) : api_(ibverbs()) {
    openPort();
    pd_ = api_.allocPd(context_);
    if (pd_ == nullptr) throwSystemError(strCat("ibv_alloc_pd on ", deviceName_), errno);
    dataMr_ = registerRegion(device, data, bytes, "the channel's memory");
    inboundMr_ = registerRegion(device, reinterpret_cast<char*>(inbound), sizeof(uint64_t), "the semaphore");
    cq_ = api_.createCq(context_, static_cast<int>(kQueueDepth * 2), nullptr, nullptr, 0);
    if (cq_ == nullptr) throwSystemError(strCat("ibv_create_cq on ", deviceName_), errno);
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = kQueueDepth;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = sizeof(uint64_t);
    qp_ = api_.createQp(pd_, &init);
    if (qp_ == nullptr) throwSystemError(strCat("ibv_create_qp on ", deviceName_), errno);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port_;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    modify(&attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    psn_ = std::random_device{}() & 0xffffff;
    data_ = data;
    dataSize_ = bytes;
    inbound_ = inbound;
  }

  ~VerbsEndpoint() {
    if (qp_ != nullptr) api_.destroyQp(qp_);
    if (cq_ != nullptr) api_.destroyCq(cq_);
    if (inboundMr_ != nullptr) api_.deregMr(inboundMr_);
    if (dataMr_ != nullptr) api_.deregMr(dataMr_);
    if (pd_ != nullptr) api_.deallocPd(pd_);
    if (context_ != nullptr) api_.closeDevice(context_);
  }

  VerbsEndpoint(const VerbsEndpoint&) = delete;
  VerbsEndpoint& operator=(const VerbsEndpoint&) = delete;

  RdmaEndpointInfo info() const {
    RdmaEndpointInfo i;
    i.qpn = qp_->qp_num;
    i.psn = psn_;
    i.lid = portAttr_.lid;
    i.port = port_;
    i.ethernet = portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0;
    i.mtu = portAttr_.active_mtu;
    std::memcpy(i.gid, gid_.raw, sizeof(i.gid));
    i.dataAddr = reinterpret_cast<uint64_t>(data_);
    i.dataSize = dataSize_;
    i.dataRkey = dataMr_->rkey;
    i.inboundAddr = reinterpret_cast<uint64_t>(inbound_);
    i.inboundRkey = inboundMr_->rkey;
    return i;
  }

  void connect(const RdmaEndpointInfo& remote, int peer) {
    if (remote.ethernet != (portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0)) {
      throw UnsupportedError(strCat("RDMA transport to rank ", peer, ": one side is RoCE and the other InfiniBand"));
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    const uint32_t localMtu = portAttr_.active_mtu;
    attr.path_mtu = static_cast<ibv_mtu>(remote.mtu < localMtu ? remote.mtu : localMtu);
    attr.dest_qp_num = remote.qpn;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.port_num = port_;
    attr.ah_attr.dlid = remote.lid;
    if (remote.ethernet != 0 || gidIndex_ >= 0) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, sizeof(remote.gid));
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex_ < 0 ? 0 : gidIndex_);
      attr.ah_attr.grh.hop_limit = 255;
    }
    modify(&attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR");
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = ibTimeout();
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = psn_;
    attr.max_rd_atomic = 1;
    modify(&attr,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
    remote_ = remote;
    PYCCL_LOG(Info, "RDMA channel to rank " << peer << " on " << deviceName_ << ":" << static_cast<int>(port_)
                                            << " (qp " << qp_->qp_num << " -> " << remote.qpn << ")");
  }

  void postWrite(uint64_t wrId, uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(data_) + srcOffset;
    sge.length = static_cast<uint32_t>(bytes);
    sge.lkey = dataMr_->lkey;
    post(wrId, &sge, remote_.dataAddr + dstOffset, remote_.dataRkey, IBV_SEND_SIGNALED);
  }

  void postSignal(uint64_t wrId, uint64_t value) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(&value);  // inline: copied when posted
    sge.length = sizeof(value);
    post(wrId, &sge, remote_.inboundAddr, remote_.inboundRkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  }

  int poll(RdmaCompletion* out, int max) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(cq_, max < 16 ? max : 16, wc);
    if (n < 0) throw SystemError(strCat("ibv_poll_cq on ", deviceName_, " failed"));
    for (int i = 0; i < n; ++i) {
      out[i].wrId = wc[i].wr_id;
      out[i].ok = wc[i].status == IBV_WC_SUCCESS;
      out[i].status = out[i].ok ? "" : api_.wcStatusStr(wc[i].status);
    }
    return n;
  }

 private:
  void openPort() {
    std::string wanted;
    int wantedPort = 0;
    if (const char* hca = std::getenv("PYCCL_IB_HCA"); hca != nullptr && *hca != '\0') {
      wanted = hca;
      if (auto colon = wanted.find(':'); colon != std::string::npos) {
        wantedPort = std::atoi(wanted.c_str() + colon + 1);
        wanted.resize(colon);
      }
    }
    int count = 0;
    ibv_device** list = api_.getDeviceList(&count);
    if (list == nullptr || count == 0) {
      if (list != nullptr) api_.freeDeviceList(list);
      throw UnsupportedError(kNoRdmaDeviceMessage);
    }
    std::string seen;
    for (int d = 0; d < count && context_ == nullptr; ++d) {
      const std::string name = api_.getDeviceName(list[d]);
      seen += (seen.empty() ? "" : ", ") + name;
      if (!wanted.empty() && name != wanted) continue;
      ibv_context* ctx = api_.openDevice(list[d]);
      if (ctx == nullptr) continue;
      for (int p = 1; p <= 2 && context_ == nullptr; ++p) {
        if (wantedPort != 0 && p != wantedPort) continue;
        ibv_port_attr attr{};
        if (api_.queryPort(ctx, static_cast<uint8_t>(p), &attr) == 0 && attr.state == IBV_PORT_ACTIVE) {
          context_ = ctx;
          port_ = static_cast<uint8_t>(p);
          portAttr_ = attr;
          deviceName_ = name;
        }
      }
      if (context_ == nullptr) api_.closeDevice(ctx);
    }
    api_.freeDeviceList(list);
    if (context_ == nullptr) {
      throw UnsupportedError(strCat("transport 'rdma': no active port on ",
                                    wanted.empty() ? std::string("any RDMA device") : "PYCCL_IB_HCA=" + wanted,
                                    " (devices: ", seen, ")"));
    }
    chooseGid();
  }

  void chooseGid() {
    gidIndex_ = ibGidIndex();
    if (gidIndex_ < 0 && portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET) {
      // RoCE: the last IPv4-mapped entry is RoCE v2 on common setups.
      for (int i = 0; i < portAttr_.gid_tbl_len && i < 16; ++i) {
        ibv_gid g{};
        if (api_.queryGid(context_, port_, i, &g) == 0 && isIpv4MappedGid(g)) gidIndex_ = i;
      }
      if (gidIndex_ < 0) gidIndex_ = 0;
    }
    if (gidIndex_ >= 0 && api_.queryGid(context_, port_, gidIndex_, &gid_) != 0) {
      throwSystemError(strCat("ibv_query_gid(", deviceName_, ", index ", gidIndex_, ")"), errno);
    }
  }

  ibv_mr* registerRegion(int device, char* ptr, uint64_t bytes, const char* what) {
    ibv_mr* mr = nullptr;
#ifdef PYCCL_WITH_CUDA
    if (device >= 0 && api_.regDmabufMr != nullptr) {
      // The dma-buf of the allocation that holds [ptr, ptr + bytes).
      CUdeviceptr base = 0;
      size_t size = 0;
      PYCCL_CHECK_CU(driver().memGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)));
      int fd = -1;
      if (driver().memGetHandleForAddressRange(&fd, base, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
          CUDA_SUCCESS) {
        mr = api_.regDmabufMr(pd_, reinterpret_cast<uint64_t>(ptr) - base, bytes, reinterpret_cast<uint64_t>(ptr),
                              fd, kAccess);
        ::close(fd);
      }
    }
#endif
    if (mr == nullptr) mr = api_.regMr(pd_, ptr, bytes, kAccess);  // host memory, or GPU memory via nvidia-peermem
    if (mr == nullptr) {
      throwSystemError(strCat("registering ", what, " (", bytes, " bytes of ", device >= 0 ? "GPU" : "host",
                              " memory) with ", deviceName_, device >= 0 ? " (GPU memory needs dma-buf support or nvidia-peermem)" : ""),
                       errno);
    }
    return mr;
  }

  void modify(ibv_qp_attr* attr, int mask, const char* state) {
    if (int rc = api_.modifyQp(qp_, attr, mask); rc != 0) {
      throwSystemError(strCat("ibv_modify_qp to ", state, " on ", deviceName_), rc);
    }
  }

  void post(uint64_t wrId, ibv_sge* sge, uint64_t remoteAddr, uint32_t rkey, unsigned flags) {
    ibv_send_wr wr{};
    wr.wr_id = wrId;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = flags;
    wr.wr.rdma.remote_addr = remoteAddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) throwSystemError(strCat("ibv_post_send on ", deviceName_), rc);
  }

  const IbvApi& api_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* dataMr_ = nullptr;
  ibv_mr* inboundMr_ = nullptr;
  uint8_t port_ = 0;
  ibv_port_attr portAttr_{};
  int gidIndex_ = -1;
  ibv_gid gid_{};
  std::string deviceName_;
  uint32_t psn_ = 0;
  char* data_ = nullptr;
  uint64_t dataSize_ = 0;
  uint64_t* inbound_ = nullptr;
  RdmaEndpointInfo remote_;
};

namespace {

class VerbsQueuePair : public RdmaQueuePair {
 public:
  explicit VerbsQueuePair(std::shared_ptr<VerbsEndpoint> endpoint) : endpoint_(std::move(endpoint)) {}
  void postWrite(uint64_t wrId, uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes) override {
    endpoint_->postWrite(wrId, srcOffset, dstOffset, bytes);
  }
  void postSignal(uint64_t wrId, uint64_t value) override { endpoint_->postSignal(wrId, value); }
  int poll(RdmaCompletion* out, int max) override { return endpoint_->poll(out, max); }
  uint32_t depth() const override { return kQueueDepth; }
  uint64_t maxMessageBytes() const override { return kMaxMessageBytes; }

 private:
  std::shared_ptr<VerbsEndpoint> endpoint_;
};

}  // namespace

std::shared_ptr<VerbsEndpoint> openVerbsEndpoint(int device, char* data, uint64_t bytes, uint64_t* inbound) {
  return std::make_shared<VerbsEndpoint>(device, data, bytes, inbound);
}

RdmaEndpointInfo verbsEndpointInfo(const VerbsEndpoint& endpoint) { return endpoint.info(); }

std::unique_ptr<RdmaQueuePair> connectVerbsEndpoint(std::shared_ptr<VerbsEndpoint> endpoint,
                                                    const RdmaEndpointInfo& remote, int peer) {
  endpoint->connect(remote, peer);
  return std::make_unique<VerbsQueuePair>(std::move(endpoint));
}

}  // namespace pyccl
