// The TCP socket transport of PortChannels, for peers without load/store
// access (other nodes without RDMA, or one machine split into "nodes" with
// PYCCL_NODE_ID). One connection per channel pair:
//   - the proxy thread sends PUT (header + payload) and SIGNAL messages, in
//     order, so a signal always follows the data of earlier puts;
//   - a receiver thread per channel writes incoming payloads into this rank's
//     registered memory and then bumps this rank's semaphore for SIGNALs (or,
//     for a signal naming a counter, that counter of this rank's table: the
//     plan interpreter's signals across nodes share one connection per peer).
// GPU memory is staged through host memory on both sides: by the proxy and
// the receiver with CUDA copies, or (host staging) by the kernels themselves.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "channels/device_common.hpp"
#include "channels/inbox_device.hpp"
#include "core/fd_passing.hpp"
#include "core/proxy.hpp"

namespace pyccl {

class Communicator;

/// Listening side of a channel's connection, created before addresses are exchanged.
class SocketListener {
 public:
  SocketListener();
  /// "ip:port" peers should connect to. The ip is PYCCL_SOCKET_ADDR if set,
  /// 127.0.0.1 for a peer on this node, else this host's first non-loopback IPv4.
  std::string address(bool peerOnSameNode) const;
  /// Accepts one connection, waiting up to `timeout`.
  UniqueFd accept(std::chrono::milliseconds timeout);

 private:
  UniqueFd fd_;
  int port_ = 0;
};

/// Writes all of `data` to the stream socket `fd` (no SIGPIPE); false where the connection failed.
bool sendAll(int fd, const void* data, size_t size);
/// Reads exactly `size` bytes; false on EOF or error (the caller tells which from errno).
bool recvAll(int fd, void* data, size_t size);

/// Connects to "ip:port", retrying until `timeout`.
UniqueFd connectTo(const std::string& address, std::chrono::milliseconds timeout);

struct SocketChannelConfig {
  int device;               ///< -1: host memory
  char* local;              ///< this rank's registered memory (source of puts, target of the peer's)
  uint64_t localSize;
  uint64_t remoteSize;      ///< the peer's registered size (puts are checked against it)
  uint64_t* localInbound;   ///< this rank's semaphore inbound counter (host or device memory); may be null
                            ///< where only counters are signalled
  AbortState abort;         ///< raised if the connection fails
  int peer;
  uint64_t* counters = nullptr;  ///< this rank's counter table for signalCounter (host or device memory)
  uint64_t numCounters = 0;
  /// Host staging (the plan interpreter across nodes; channels/inbox_device.hpp):
  /// puts send from `sendFrom` and land in `receiveInto` (host memory in the
  /// layout of `local`), each landed put is recorded in the peer's inbox
  /// ring, and `counters` is host memory. Neither side makes a CUDA call.
  const char* sendFrom = nullptr;
  char* receiveInto = nullptr;
  ReceivedPut* records = nullptr;       ///< this peer's ring of kInboxRecords
  uint64_t* published = nullptr;        ///< records written (release, after the record)
  const uint64_t* consumed = nullptr;   ///< records the kernel applied (room in the ring)
};

/// The channel: the proxy calls put/signal/flush; the receiver thread runs
/// until the connection closes. Takes ownership of the connected socket.
std::unique_ptr<ProxyChannel> makeSocketChannel(UniqueFd connection, SocketChannelConfig config);

}  // namespace pyccl
