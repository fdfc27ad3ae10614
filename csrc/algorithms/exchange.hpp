// The exchanges of the collective engine (all-gather, all-to-all, broadcast,
// reduce-scatter), as the engine sees them: their kinds and protocols by
// name, one call's arguments, how much one HB round takes, and the launch on
// CPU threads (host mode) or on a stream. exchange.cu holds the algorithms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/collective_context.hpp"
#include "core/health.hpp"  // CallOp
#include "device/kernel_launch.hpp"

namespace pyccl {

enum class ExchangeKind : uint32_t { kAllGather = 0, kAllToAll = 1, kBroadcast = 2, kReduceScatter = 3 };

/// The protocol of an exchange: LL packets or HB rounds.
enum class Protocol : uint32_t { kLL = 0, kHB = 1 };

/// "ll" / "hb", as docs, `algorithm=`, PYCCL_ALGO and the tuning tables spell them, and back (InvalidArgument
/// naming `what`).
Protocol parseProtocol(const std::string& name, const char* what);
const char* protocolName(Protocol p);
/// "all_gather", "all_to_all", "broadcast", "reduce_scatter", and back (InvalidArgument naming `what`).
const char* exchangeKindName(ExchangeKind kind);
ExchangeKind parseExchangeKind(const std::string& name, const char* what);
/// The flight recorder's name of an exchange.
CallOp callOpOf(ExchangeKind kind);

/// One exchange call; byte offsets and sizes. chunkBytes is at most the
/// protocol's per-call chunk (llMaxBytes for LL, exchangeHBMaxChunk times the
/// rounds of a launch for HB).
struct ExchangeArgs {
  const char* input;
  uint64_t inStride;  ///< bytes from the chunk for rank q to the one for rank q + 1 (0: one chunk for all)
  char* output;
  uint64_t outStride;  ///< bytes from the chunk from rank q to the one from rank q + 1
  uint64_t chunkBytes;
  int root;  ///< broadcast only
};

struct ExchangeCall {
  ExchangeKind kind;
  Protocol protocol;
  ExchangeArgs args;  ///< chunkBytes within the protocol's per-call limit
  DataType dtype;     ///< reduce-scatter only
  ReduceOp op;        ///< reduce-scatter only
};

/// Bytes of chunk per HB round (a kernel runs as many rounds as its chunk needs).
PYCCL_HOST_DEVICE uint64_t exchangeHBMaxChunk(const CollectiveContext& c) {
  return static_cast<uint64_t>(c.hbBlocks) * c.hbSubBytes;
}

/// Runs one call on CPU threads and returns when it is done.
void exchangeHost(const CollectiveContext& context, const ExchangeCall& call);
#ifdef PYCCL_WITH_CUDA
/// Enqueues one call on `stream` (a cudaStream_t); capturable in CUDA graphs.
void exchangeDevice(const CollectiveContext& context, const ExchangeCall& call, void* stream,
                    const KernelLaunch& launch);
/// Appends the host stub of every kernel exchangeDevice may launch (core/kernel_loading.hpp).
void exchangeKernels(std::vector<const void*>* out);
#endif

}  // namespace pyccl
