// Communicator, at creation: ranks that share a GPU, and which peers this
// rank reaches by P2P (the driver's answer, then a real write-and-check probe).
#include "core/communicator.hpp"

#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"

#ifdef PYCCL_WITH_CUDA
#include "core/gpu_memory.hpp"
#include "core/p2p_probe.hpp"
#endif

namespace pyccl {
namespace {

constexpr uint64_t kProbeMagic = 0x7079636370327000ull;  // "pyccp2p\0"

uint64_t probeValue(int writer, int owner) {
  return kProbeMagic ^ (static_cast<uint64_t>(writer) << 32) ^ static_cast<uint64_t>(owner);
}

}  // namespace

void Communicator::checkGpusDistinct() {
  auto [p, q] = topology_.ranksSharingGpu();
  if (p < 0) return;
  const RankInfo& a = topology_.ranks[p];
  const RankInfo& b = topology_.ranks[q];
  // Every rank sees the same pair, so all of them stop here (or all go on).
  std::string what = strCat("ranks ", p, " and ", q, " are on the same GPU (", a.deviceUuid, ": cuda:", a.device,
                            " of rank ", p, ", cuda:", b.device, " of rank ", q, ", host ", a.hostname, ")");
  if (!sharedGpuAllowed()) {
    throw InvalidArgument(strCat(
        "invalid argument 'device': ", what,
        "; each rank needs its own GPU (call torch.cuda.set_device(local_rank) before creating the group). "
        "PYCCL_ALLOW_SHARED_GPU=1 lets ranks share a GPU for testing: the GPU then time-slices between "
        "their processes, and each collective takes milliseconds"));
  }
  if (rank_ == p) {
    PYCCL_LOG(Warn, "communicator '" << options_.name << "': " << what
                                      << "; allowed by PYCCL_ALLOW_SHARED_GPU=1, collectives take milliseconds");
  }
}

void Communicator::probePeers() {
  const int n = worldSize_;
  std::vector<bool> reached(n, false);  // reached[p]: this rank wrote into p's probe slot
  reached[rank_] = true;
  const size_t probeBytes = static_cast<size_t>(n) * sizeof(uint64_t);
  std::shared_ptr<void> probeAlloc = allocateShareable(probeBytes);
  void* probePtr = probeAlloc.get();
  RegisteredMemory probe = registerMemory(probePtr, probeBytes);
  auto descs = bootstrap_->allGather(probe.serialize());

  std::vector<RegisteredMemory> imports;
  std::vector<uint64_t*> targets;
  std::vector<uint64_t> values;
  std::vector<int> targetPeers;
  topology_.remoteAtomics.assign(n, hostMode());
  for (int p = 0; p < n; ++p) {
    if (p == rank_ || !topology_.sameNode[p]) continue;
    try {
#ifdef PYCCL_WITH_CUDA
      if (!hostMode()) {
        // The driver's "no" is final; its "yes" is checked by the probe below.
        int peerDev = -1;
        if (cudaDeviceGetByPCIBusId(&peerDev, topology_.ranks[p].pciBusId.c_str()) == cudaSuccess &&
            peerDev == device_) {
          topology_.remoteAtomics[p] = true;  // a peer on this GPU (PYCCL_ALLOW_SHARED_GPU)
        } else if (peerDev >= 0) {
          int can = 0;
          PYCCL_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, device_, peerDev));
          if (!can) {
            PYCCL_LOG(Info, "no P2P to rank " << p << ": the driver reports cuda:" << device_
                                              << " cannot access cuda:" << peerDev);
            continue;
          }
          int atomics = 0;
          PYCCL_CHECK_CUDA(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported,
                                                     device_, peerDev));
          topology_.remoteAtomics[p] = atomics != 0;
        }
        cudaGetLastError();
      }
#endif
      RegisteredMemory peerProbe = importMemory(descs[p]);
      auto* slot = static_cast<uint64_t*>(peerProbe.data()) + rank_;
      if (hostMode()) {
        atomicStoreRelease(slot, probeValue(rank_, p));
      } else {
        targets.push_back(slot);
        values.push_back(probeValue(rank_, p));
      }
      targetPeers.push_back(p);
      imports.push_back(std::move(peerProbe));
    } catch (const Error& e) {
      PYCCL_LOG(Info, "no P2P to rank " << p << ": " << e.what());
    }
  }
#ifdef PYCCL_WITH_CUDA
  if (!hostMode()) {
    try {
      probeWritePeers(device_, targets, values);
    } catch (const Error& e) {
      PYCCL_LOG(Warn, "P2P probe writes failed: " << e.what());
      targetPeers.clear();
    }
  }
#endif
  for (int p : targetPeers) reached[p] = true;
  bootstrap_->barrier();  // every probe write has completed

  std::vector<uint64_t> slots(n, 0);
  if (hostMode()) {
    for (int p = 0; p < n; ++p) slots[p] = atomicLoadAcquire(static_cast<uint64_t*>(probePtr) + p);
  } else {
    gpu::copyToHost(device_, slots.data(), probePtr, probeBytes);
  }
  // seen[p]: p's write arrived intact in this rank's memory.
  Bytes seen(n, 0);
  for (int p = 0; p < n; ++p) seen[p] = (p == rank_ || slots[p] == probeValue(p, rank_)) ? 1 : 0;
  for (int p = 0; p < n; ++p) {
    if (reached[p] != (seen[p] != 0) && topology_.sameNode[p]) {
      PYCCL_LOG(Info, "P2P with rank " << p << " is one-sided (wrote: " << reached[p]
                                       << ", received: " << static_cast<int>(seen[p]) << ")");
    }
  }
  auto allSeen = bootstrap_->allGather(seen);
  topology_.p2p.assign(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      topology_.p2p[i][j] = allSeen[i][j] != 0 && allSeen[j][i] != 0;
    }
  }
  for (auto& m : imports) m.release();
  probe.release();
  bootstrap_->barrier();  // nobody unmaps a probe page a peer still writes
}

}  // namespace pyccl
