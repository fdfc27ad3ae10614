// What each rank tells the others at start-up, and what the communicator
// learns from it: which peers share this node, and which of them this rank can
// reach by loads and stores (P2P), as established by a real probe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/serialize.hpp"

namespace pyccl {

struct RankInfo {
  int32_t rank = -1;
  int32_t worldSize = 0;
  int32_t device = -1;  ///< CUDA device ordinal, -1 in host mode
  int32_t pid = 0;
  std::string hostname;
  std::string nodeKey;  ///< equal on ranks of one node
  std::string deviceUuid;
  std::string pciBusId;
  std::string fdServer;
  uint32_t version = 0;

  Bytes serialize() const;
  static RankInfo deserialize(const Bytes& bytes);
};

/// This machine's node key: PYCCL_NODE_ID if set, else hostname + boot id.
std::string localNodeKey();
std::string localHostname();

struct Topology {
  std::vector<RankInfo> ranks;
  /// sameNode[p]: rank p runs on this rank's node.
  std::vector<bool> sameNode;
  /// p2p[i][j]: ranks i and j both succeeded in writing into each other's memory.
  std::vector<std::vector<bool>> p2p;
  /// remoteAtomics[p]: this rank's stores to p's memory may be atomic
  /// read-modify-writes (host mode, or NVLink with native P2P atomics).
  std::vector<bool> remoteAtomics;

  int numRanksOnNode() const;
  std::string describe(int rank) const;
  /// The first two ranks of one node on the same GPU (by UUID), as
  /// {lower, higher}; {-1, -1} if every rank of each node has its own GPU.
  /// Needs `ranks` filled.
  std::pair<int, int> ranksSharingGpu() const;
};

/// Whether PYCCL_ALLOW_SHARED_GPU=1 lets ranks of one node share a GPU.
bool sharedGpuAllowed();

}  // namespace pyccl
