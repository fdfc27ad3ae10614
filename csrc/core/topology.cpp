#include "core/topology.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "core/debug_options.hpp"
#include "core/errors.hpp"

namespace pyccl {
namespace {
constexpr uint32_t kRankInfoMagic = 0x50435249;  // "PCRI"
}

// Bumped whenever what ranks exchange at start-up changes shape.
constexpr uint32_t kWireVersion = 1;

Bytes RankInfo::serialize() const {
  ByteWriter w;
  w.put(kRankInfoMagic).put(kWireVersion);
  w.put(rank).put(worldSize).put(device).put(pid);
  w.putString(hostname).putString(nodeKey).putString(deviceUuid).putString(pciBusId);
  w.putString(fdServer);
  return w.take();
}

RankInfo RankInfo::deserialize(const Bytes& bytes) {
  ByteReader r(bytes, "rank info");
  if (r.get<uint32_t>() != kRankInfoMagic) {
    throw RemoteError("a peer published something that is not pyccl rank info under this "
                      "communicator's store keys (another program sharing the store prefix?)");
  }
  RankInfo info;
  info.version = r.get<uint32_t>();
  if (info.version != kWireVersion) {
    throw RemoteError(strCat("a peer runs pyccl with wire version ", info.version,
                             ", this process ", kWireVersion,
                             ": every rank must use the same pyccl"));
  }
  info.rank = r.get<int32_t>();
  info.worldSize = r.get<int32_t>();
  info.device = r.get<int32_t>();
  info.pid = r.get<int32_t>();
  info.hostname = r.getString();
  info.nodeKey = r.getString();
  info.deviceUuid = r.getString();
  info.pciBusId = r.getString();
  info.fdServer = r.getString();
  return info;
}

std::string localHostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string localNodeKey() {
  if (const char* id = std::getenv("PYCCL_NODE_ID"); id != nullptr && *id != '\0') {
    return strCat("node-id:", id);
  }
  std::string bootId;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, bootId);
  return strCat(localHostname(), "/", bootId);
}

int Topology::numRanksOnNode() const {
  int n = 0;
  for (bool same : sameNode) n += same ? 1 : 0;
  return n;
}

std::pair<int, int> Topology::ranksSharingGpu() const {
  // Node keys, not this rank's sameNode, so that every rank finds the same pair.
  for (size_t q = 1; q < ranks.size(); ++q) {
    for (size_t p = 0; p < q; ++p) {
      if (ranks[p].device >= 0 && !ranks[p].deviceUuid.empty() && ranks[p].nodeKey == ranks[q].nodeKey &&
          ranks[p].deviceUuid == ranks[q].deviceUuid) {
        return {static_cast<int>(p), static_cast<int>(q)};
      }
    }
  }
  return {-1, -1};
}

bool sharedGpuAllowed() { return debugOptions().allowSharedGpu; }

std::string Topology::describe(int rank) const {
  std::string out;
  for (size_t p = 0; p < ranks.size(); ++p) {
    out += strCat("rank ", p, ": host ", ranks[p].hostname,
                  ranks[p].device >= 0 ? strCat(" cuda:", ranks[p].device, " (", ranks[p].pciBusId, ")")
                                       : std::string(" host mode"),
                  static_cast<int>(p) == rank ? " [self]"
                  : !sameNode[p]              ? " [other node]"
                  : p2p[rank][p]              ? " [same node, p2p]"
                                              : " [same node, no p2p]",
                  "\n");
  }
  return out;
}

}  // namespace pyccl
