// libpyccl_nccl.so: NCCL's C API (nccl_abi.h) on pyccl, for programs that
// reach collectives only through NCCL: nccl-tests, vLLM's and SGLang's
// pynccl, frameworks. docs/nccl.md is the user's page.
//
// A communicator here is a pyccl Communicator with its collective engine and
// its selector (dispatch/selector.hpp), made as the other entry points make
// theirs: the same tuning tables (dispatch/tuning_tables.hpp), the same
// environment (PYCCL_ALGO, PYCCL_NCCL_MIN_BYTES, PYCCL_TUNING_FILE), the same
// choice, with plans left out (they are made in Python). What pyccl has no
// algorithm for goes to the real NCCL, loaded at run time (PYCCL_NCCL_LIBRARY,
// else libnccl.so.2) and running on a communicator of its own made beside
// pyccl's: PreMulSum ops, Reduce, Gather and Scatter, the sizes the selector
// gives to NCCL, and every collective of ranks that span nodes. Without it
// those calls fail with ncclInvalidUsage. Calls that need NCCL's own
// communicator (its device API, ncclCommShrink) are refused on pyccl's, with
// a message that says so.
//
// The unique id names a store served by the process that made it
// (core/tcp_store.hpp), as NCCL's names its root's bootstrap socket;
// ncclCommInitAll's ranks, all in this process, share a store in memory.
//
// Groups: calls between ncclGroupStart and the outermost ncclGroupEnd are
// held and run there: first the communicators' inits, in parallel (one thread
// each, as they wait for each other); then each communicator's calls in
// order, sends and receives that follow each other merged into one launch
// (CollectiveEngine::sendRecv), and the calls handed to NCCL inside one NCCL
// group. On GPUs a call only enqueues work, so one thread runs them all; in
// host mode a call returns when it is done, so each communicator runs its
// calls on a thread of its own.
//
// Errors: every function returns NCCL's codes; the message (naming the
// argument, or the op, sequence number and peer of a failed wait) is logged
// and kept for ncclGetLastError.
#include "nccl/nccl_abi.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collective_context.hpp"
#include "engine/collective_engine.hpp"
#include "core/communicator.hpp"
#include "core/env_settings.hpp"
#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "core/tcp_store.hpp"
#include "dispatch/selector.hpp"
#include "dispatch/tuning_tables.hpp"

#define PYCCL_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

struct ncclComm;

namespace pyccl {
namespace {

constexpr uint64_t kCommMagic = 0x70796363'6c6e6363ull;  // "pycclncc"
constexpr char kIdMagic[8] = {'p', 'y', 'c', 'c', 'l', 'i', 'd', '1'};
/// The NCCL API level this library implements, reported where no real NCCL is loaded: 2.28.
constexpr int kApiVersion = 22800;

// ---------------------------------------------------------------------------------------------------------------
// The real NCCL.
// ---------------------------------------------------------------------------------------------------------------

struct RealNccl {
  std::string path;
  int version = 0;
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommSplit) commSplit = nullptr;
  decltype(&ncclCommFinalize) commFinalize = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&ncclCommCount) commCount = nullptr;
  decltype(&ncclCommCuDevice) commCuDevice = nullptr;
  decltype(&ncclCommUserRank) commUserRank = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclGetLastError) getLastError = nullptr;
  decltype(&ncclMemAlloc) memAlloc = nullptr;
  decltype(&ncclMemFree) memFree = nullptr;
  decltype(&ncclCommRegister) commRegister = nullptr;
  decltype(&ncclCommDeregister) commDeregister = nullptr;
  decltype(&ncclRedOpCreatePreMulSum) redOpCreatePreMulSum = nullptr;
  decltype(&ncclRedOpDestroy) redOpDestroy = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  // Newer NCCLs' calls: null where the loaded NCCL predates them.
  decltype(&ncclAlltoAll) alltoAll = nullptr;                          // 2.28
  decltype(&ncclGather) gather = nullptr;                              // 2.28
  decltype(&ncclScatter) scatter = nullptr;                            // 2.28
  decltype(&ncclCommShrink) commShrink = nullptr;                      // 2.27
  decltype(&ncclCommWindowRegister) commWindowRegister = nullptr;      // 2.27
  decltype(&ncclCommWindowDeregister) commWindowDeregister = nullptr;  // 2.27
  decltype(&ncclDevCommCreate) devCommCreate = nullptr;                // 2.28
  decltype(&ncclDevCommDestroy) devCommDestroy = nullptr;              // 2.28
  decltype(&ncclCommSuspend) commSuspend = nullptr;                    // 2.29
  decltype(&ncclCommResume) commResume = nullptr;                      // 2.29
};

/// Loads the real NCCL once: PYCCL_NCCL_LIBRARY ("none": none), else libnccl.so.2 (which a program linked
/// against NCCL, or torch, has usually loaded already). Null where there is none; never this library itself.
const RealNccl* realNccl() {
  static const RealNccl* loaded = []() -> const RealNccl* {
    const char* env = std::getenv("PYCCL_NCCL_LIBRARY");
    std::string path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    if (path == "none") return nullptr;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      if (env != nullptr && *env != '\0') {
        PYCCL_LOG(Warn, "NCCL API: PYCCL_NCCL_LIBRARY '" << path << "' cannot be loaded (" << dlerror()
                                                          << "); calls pyccl has no algorithm for will fail");
      } else {
        PYCCL_LOG(Info, "NCCL API: no libnccl.so.2 to hand calls to (" << dlerror() << ")");
      }
      return nullptr;
    }
    if (dlsym(handle, "ncclAllReduce") == reinterpret_cast<void*>(&ncclAllReduce)) {
      PYCCL_LOG(Warn, "NCCL API: '" << path << "' is this library itself; set PYCCL_NCCL_LIBRARY to the real "
                                       "NCCL to hand it the calls pyccl has no algorithm for");
      return nullptr;
    }
    auto* r = new RealNccl();  // kept for the life of the process, as the library stays loaded
    r->path = path;
    bool complete = true;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (fn == nullptr) complete = false;
    };
    load(r->getVersion, "ncclGetVersion");
    load(r->getUniqueId, "ncclGetUniqueId");
    load(r->commInitRank, "ncclCommInitRank");
    load(r->commSplit, "ncclCommSplit");
    load(r->commFinalize, "ncclCommFinalize");
    load(r->commDestroy, "ncclCommDestroy");
    load(r->commAbort, "ncclCommAbort");
    load(r->commGetAsyncError, "ncclCommGetAsyncError");
    load(r->commCount, "ncclCommCount");
    load(r->commCuDevice, "ncclCommCuDevice");
    load(r->commUserRank, "ncclCommUserRank");
    load(r->getErrorString, "ncclGetErrorString");
    load(r->getLastError, "ncclGetLastError");
    load(r->memAlloc, "ncclMemAlloc");
    load(r->memFree, "ncclMemFree");
    load(r->commRegister, "ncclCommRegister");
    load(r->commDeregister, "ncclCommDeregister");
    load(r->redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum");
    load(r->redOpDestroy, "ncclRedOpDestroy");
    load(r->allReduce, "ncclAllReduce");
    load(r->allGather, "ncclAllGather");
    load(r->reduceScatter, "ncclReduceScatter");
    load(r->broadcast, "ncclBroadcast");
    load(r->reduce, "ncclReduce");
    load(r->send, "ncclSend");
    load(r->recv, "ncclRecv");
    load(r->groupStart, "ncclGroupStart");
    load(r->groupEnd, "ncclGroupEnd");
    auto optional = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    };
    optional(r->alltoAll, "ncclAlltoAll");
    optional(r->gather, "ncclGather");
    optional(r->scatter, "ncclScatter");
    optional(r->commShrink, "ncclCommShrink");
    optional(r->commWindowRegister, "ncclCommWindowRegister");
    optional(r->commWindowDeregister, "ncclCommWindowDeregister");
    optional(r->devCommCreate, "ncclDevCommCreate");
    optional(r->devCommDestroy, "ncclDevCommDestroy");
    optional(r->commSuspend, "ncclCommSuspend");
    optional(r->commResume, "ncclCommResume");
    if (!complete || r->getVersion(&r->version) != ncclSuccess) {
      PYCCL_LOG(Warn, "NCCL API: '" << path << "' lacks NCCL 2.19's API; calls pyccl has no algorithm for will fail");
      delete r;
      return nullptr;
    }
    PYCCL_LOG(Info, "NCCL API: handing calls pyccl has no algorithm for to NCCL " << r->version << " (" << path
                                                                                   << ")");
    return r;
  }();
  return loaded;
}

// ---------------------------------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------------------------------

/// Thrown to return `result` with a message (arguments pyccl's own checks do not see).
struct NcclFailure : Error {
  NcclFailure(ncclResult_t r, const std::string& message) : Error(ErrorCode::kInvalidArgument, message), result(r) {}
  ncclResult_t result;
};

/// Throws the real NCCL's result, with its message, naming `what`, unless its call succeeded.
void checkReal(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const RealNccl* real = realNccl();
  std::string message = strCat(what, " failed in the real NCCL: ", real != nullptr ? real->getErrorString(r) : "",
                               " (", static_cast<int>(r), ")");
  const char* detail = real != nullptr ? real->getLastError(nullptr) : nullptr;
  if (detail != nullptr && *detail != '\0') message += strCat(": ", detail);
  throw NcclFailure(r, message);
}

thread_local std::string tlsLastError;

ncclResult_t resultOf(const Error& e) {
  if (const auto* f = dynamic_cast<const NcclFailure*>(&e)) return f->result;
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kType: return ncclInvalidArgument;
    case ErrorCode::kClosed:
    case ErrorCode::kUnsupported: return ncclInvalidUsage;
    case ErrorCode::kTimeout:
    case ErrorCode::kAborted:
    case ErrorCode::kRemote: return ncclRemoteError;
    case ErrorCode::kCuda: return ncclUnhandledCudaError;
    case ErrorCode::kSystem: return ncclSystemError;
    case ErrorCode::kInternal: return ncclInternalError;
  }
  return ncclInternalError;
}

// ---------------------------------------------------------------------------------------------------------------
// Dtypes and ops.
// ---------------------------------------------------------------------------------------------------------------

const uint32_t kDtypeBytes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

uint32_t dtypeBytes(ncclDataType_t t) {
  if (static_cast<int>(t) < 0 || t >= ncclNumTypes) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'datatype': ", static_cast<int>(t),
                                                  " is not an NCCL data type (0 to ", ncclNumTypes - 1, ")"));
  }
  return kDtypeBytes[t];
}

TableDtype tableDtypeOf(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return TableDtype::kFloat32;
    case ncclFloat16: return TableDtype::kFloat16;
    case ncclBfloat16: return TableDtype::kBFloat16;
    default: return TableDtype::kOther;
  }
}

/// The dtype pyccl's kernels reduce (every NCCL data type), or nullopt.
std::optional<DataType> reducedDtype(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return DataType::kInt8;
    case ncclUint8: return DataType::kUInt8;
    case ncclInt32: return DataType::kInt32;
    case ncclUint32: return DataType::kUInt32;
    case ncclInt64: return DataType::kInt64;
    case ncclUint64: return DataType::kUInt64;
    case ncclFloat16: return DataType::kFloat16;
    case ncclFloat32: return DataType::kFloat32;
    case ncclFloat64: return DataType::kFloat64;
    case ncclBfloat16: return DataType::kBFloat16;
    case ncclFloat8e4m3: return DataType::kFloat8E4M3;
    case ncclFloat8e5m2: return DataType::kFloat8E5M2;
    default: return std::nullopt;
  }
}

/// pyccl's op for a built-in NCCL op; nullopt for a PreMulSum op (made by the real NCCL: `real`, the
/// communicator has one); InvalidArgument for anything else.
std::optional<ReduceOp> reduceOpOf(ncclRedOp_t op, bool real) {
  switch (op) {
    case ncclSum: return ReduceOp::kSum;
    case ncclProd: return ReduceOp::kProd;
    case ncclMax: return ReduceOp::kMax;
    case ncclMin: return ReduceOp::kMin;
    case ncclAvg: return ReduceOp::kAvg;
    default: break;
  }
  if (static_cast<int>(op) >= ncclNumOps && real) return std::nullopt;
  throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'op': ", static_cast<int>(op),
                                                " is not a reduction op (ncclSum, ncclProd, ncclMax, ncclMin, "
                                                "ncclAvg, or one ncclRedOpCreatePreMulSum made)"));
}

}  // namespace
}  // namespace pyccl

using namespace pyccl;  // NOLINT: the exported functions below implement NCCL's names

// -----------------------------------------------------------------------------------------------------------------
// Communicators.
// -----------------------------------------------------------------------------------------------------------------

struct ncclComm {
  uint64_t magic = kCommMagic;
  int rank = 0;
  int nranks = 0;
  int device = -1;  ///< -1: host mode
  std::string name;
  std::string storeAddress;  ///< the unique id's store ("": ncclCommInitAll's, in this process)
  std::shared_ptr<Store> store;
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CollectiveEngine> engine;  ///< null where the ranks span nodes: every call goes to NCCL
  std::unique_ptr<Selector> selector;
  ncclComm_t real = nullptr;  ///< the real NCCL's communicator, where one is loaded
  bool ready = false;         ///< made (an init held in a group is not, until its ncclGroupEnd)
  bool suspended = false;     ///< between ncclCommSuspend and ncclCommResume: calls are refused
  int splits = 0;             ///< ncclCommSplit calls so far: the name of the next split's communicators
  std::mutex mu;
  std::string lastError;
  std::string described;
  std::map<std::string, uint64_t> forwarded;  ///< calls handed to NCCL without a choice, by name
};

namespace pyccl {
namespace {

/// The real NCCL where `comm` is one of its communicators, not this library's (which carry kCommMagic): where
/// this library is preloaded it interposes NCCL's own calls of its API (ncclCommDestroy calls
/// ncclCommGetAsyncError), and those go back to it unchanged. Null for this library's communicators and null.
const RealNccl* foreignOwner(const ncclComm* comm) {
  if (comm == nullptr || comm->magic == kCommMagic) return nullptr;
  return realNccl();
}

struct IdContents {
  uint64_t nonce;
  std::string address;
};

IdContents readId(const ncclUniqueId& id) {
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0) {
    throw NcclFailure(ncclInvalidArgument, "invalid argument 'commId': not a unique id from this library's "
                                           "ncclGetUniqueId (an id from another NCCL cannot be used here)");
  }
  IdContents c;
  std::memcpy(&c.nonce, id.internal + 8, sizeof(c.nonce));
  const char* address = id.internal + 16;
  c.address.assign(address, strnlen(address, PYCCL_NCCL_UNIQUE_ID_BYTES - 16));
  return c;
}

uint64_t randomNonce() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

std::chrono::milliseconds commTimeout() {
  return std::chrono::seconds(envCount("PYCCL_NCCL_TIMEOUT_S", 600, 7 * 24 * 3600, "seconds"));
}

ncclComm* checkedComm(ncclComm_t comm, const char* arg = "comm") {
  if (comm == nullptr) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': NULL"));
  if (comm->magic != kCommMagic) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': not a communicator of this "
                                                  "library (destroyed, or made by another NCCL)"));
  }
  return comm;
}

/// A communicator calls may run on now (`suspended`: or one ncclCommSuspend suspended).
ncclComm* readyComm(ncclComm_t comm, bool suspended = false) {
  ncclComm* c = checkedComm(comm);
  if (!c->ready) {
    throw NcclFailure(ncclInvalidUsage, "invalid usage: the communicator's init is held in an open group; call "
                                        "ncclGroupEnd first");
  }
  if (c->suspended && !suspended) {
    throw NcclFailure(ncclInvalidUsage, "invalid usage: the communicator is suspended (ncclCommSuspend); call "
                                        "ncclCommResume first");
  }
  return c;
}

/// Makes `c`'s pyccl communicator, engine and selector, and the real NCCL's communicator beside them (unless `c`
/// has one already: a split's). Collective: every rank of `store`'s `name` calls it. On the caller's current CUDA
/// device (or in host mode without GPUs).
void makeComm(ncclComm* c, std::shared_ptr<Store> store, const std::string& name) {
  c->store = std::move(store);
  c->name = name;
  CommunicatorOptions opts;
  opts.name = name;
  opts.timeout = commTimeout();
  c->comm = std::make_shared<Communicator>(c->store, c->rank, c->nranks, c->device, opts);
  const bool reach = c->comm->firstUnreachablePeer() < 0 && c->nranks <= kMaxCollectiveRanks;
  const std::string gpu = c->device >= 0 ? gpu::deviceName(c->device) : "host";
  SelectorConfig config = selectorConfigFor(gpu, c->nranks, !reach);
  c->selector = std::make_unique<Selector>(std::move(config), engineDefaults(nullptr));
  const RealNccl* real = c->device >= 0 ? realNccl() : nullptr;
  if (reach) {
    CollectiveOptions o;
    applyKernelChoices(o, kernelChoicesOf(tuningTableFor(gpu, c->nranks, "bfloat16")));
    for (const auto& [key, value] : c->selector->settings()) o.agreedSettings[key] = value;
    const char* tuningFile = std::getenv("PYCCL_TUNING_FILE");
    o.agreedSettings["PYCCL_TUNING_FILE (environment)"] = tuningFile != nullptr ? tuningFile : "";
    o.agreedSettings["the real NCCL (PYCCL_NCCL_LIBRARY)"] = real != nullptr ? strCat(real->version) : "none";
    c->engine = std::make_shared<CollectiveEngine>(*c->comm, o);
    c->selector->setDefaultKernel(engineDefaults(c->engine));
  } else if (real == nullptr) {
    throw UnsupportedError(strCat("communicator '", name, "': ",
                                  c->nranks > kMaxCollectiveRanks
                                      ? strCat("pyccl's kernels take up to ", kMaxCollectiveRanks, " ranks")
                                      : strCat("rank ", c->comm->firstUnreachablePeer(), " is not reachable by P2P"),
                                  ", and no real NCCL is loaded to run the collectives (PYCCL_NCCL_LIBRARY)"));
  }
  if (real != nullptr && c->real == nullptr) {
    // Rank 0's NCCL id reaches the others through the store.
    const std::string key = strCat("pyccl-nccl/", name, "/real-id");
    ncclUniqueId id;
    if (c->rank == 0) {
      checkReal(real->getUniqueId(&id), "ncclGetUniqueId");
      c->store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::vector<uint8_t> bytes = c->store->get(key, opts.timeout);
      PYCCL_CHECK_ARG(bytes.size() == sizeof(id.internal), "store", "holds a real NCCL id of ", bytes.size(),
                      " bytes");
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
    gpu::DeviceGuard guard(c->device);
    checkReal(real->commInitRank(&c->real, c->nranks, id, c->rank), "ncclCommInitRank");
  }
  c->ready = true;
  PYCCL_LOG(Info, "NCCL API: communicator '" << name << "' rank " << c->rank << " of " << c->nranks << " on "
                                             << (c->device >= 0 ? strCat("cuda:", c->device) : std::string("host"))
                                             << (c->engine ? "" : " (every collective on NCCL)"));
}

// ---------------------------------------------------------------------------------------------------------------
// Groups.
// ---------------------------------------------------------------------------------------------------------------

/// A call held in a group: a collective (run) or a send or receive (transfer).
struct HeldCall {
  ncclComm* comm;
  bool isTransfer;
  CollectiveEngine::PeerTransfer transfer;
  void* stream;
  std::function<void()> run;
  bool forwarded;  ///< run calls the real NCCL
};

struct HeldInit {
  ncclComm* comm;
  std::function<void()> make;
};

struct GroupState {
  int depth = 0;
  std::vector<HeldInit> inits;
  std::vector<HeldCall> calls;
};
thread_local GroupState tlsGroup;

/// Runs one communicator's held calls in order (consecutive transfers on one stream in one launch).
void runCalls(const std::vector<HeldCall*>& calls) {
  for (size_t i = 0; i < calls.size();) {
    HeldCall& call = *calls[i];
    if (!call.isTransfer) {
      call.run();
      ++i;
      continue;
    }
    std::vector<CollectiveEngine::PeerTransfer> transfers;
    size_t j = i;
    for (; j < calls.size() && calls[j]->isTransfer && calls[j]->stream == call.stream; ++j) {
      transfers.push_back(calls[j]->transfer);
    }
    call.comm->engine->sendRecv(transfers, call.stream);
    i = j;
  }
}

/// Runs `work` once per item, on threads of their own where there are several; rethrows the first failure.
void runAll(size_t n, bool parallel, const std::function<void(size_t)>& work) {
  if (n == 1 || !parallel) {
    for (size_t i = 0; i < n; ++i) work(i);
    return;
  }
  std::vector<std::exception_ptr> failures(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        work(i);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
}

void endGroup() {
  GroupState held = std::move(tlsGroup);
  tlsGroup = GroupState{};
  runAll(held.inits.size(), true, [&](size_t i) { held.inits[i].make(); });
  // Each communicator's calls, in order.
  std::vector<ncclComm*> order;
  std::map<ncclComm*, std::vector<HeldCall*>> byComm;
  bool forwarded = false;
  bool hostMode = false;
  for (HeldCall& call : held.calls) {
    if (byComm.count(call.comm) == 0) order.push_back(call.comm);
    byComm[call.comm].push_back(&call);
    forwarded = forwarded || call.forwarded;
    hostMode = hostMode || call.comm->device < 0;
  }
  const RealNccl* real = forwarded ? realNccl() : nullptr;
  if (real != nullptr) checkReal(real->groupStart(), "ncclGroupStart");
  try {
    runAll(order.size(), hostMode, [&](size_t i) { runCalls(byComm[order[i]]); });
  } catch (...) {
    if (real != nullptr) real->groupEnd();
    throw;
  }
  if (real != nullptr) checkReal(real->groupEnd(), "ncclGroupEnd");
}

/// Runs `call` on `c` now, or holds it until the group ends.
void submit(ncclComm* c, void* stream, bool forwarded, std::function<void()> call) {
  if (tlsGroup.depth > 0) {
    tlsGroup.calls.push_back({c, false, {}, stream, std::move(call), forwarded});
    return;
  }
  call();
}

void submitTransfer(ncclComm* c, const CollectiveEngine::PeerTransfer& t, void* stream) {
  if (tlsGroup.depth > 0) {
    tlsGroup.calls.push_back({c, true, t, stream, {}, false});
    return;
  }
  c->engine->sendRecv({t}, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Calls.
// ---------------------------------------------------------------------------------------------------------------

const RealNccl& realFor(ncclComm* c, const std::string& what) {
  const RealNccl* real = realNccl();
  if (real == nullptr || c->real == nullptr) {
    throw NcclFailure(ncclInvalidUsage,
                      strCat(what, " needs the real NCCL, and none is loaded",
                             c->device < 0 ? " (host mode has none)" : " (set PYCCL_NCCL_LIBRARY to libnccl.so.2)"));
  }
  return *real;
}

void countForwarded(ncclComm* c, const std::string& what) {
  std::lock_guard<std::mutex> lock(c->mu);
  ++c->forwarded[what];
}

/// Refuses a null buffer of a non-empty call, and (PYCCL_NCCL_CHECK_POINTERS=1, as NCCL_CHECK_POINTERS) a buffer
/// that is not memory of the communicator's device.
void checkBuffer(const ncclComm* c, const void* p, uint64_t bytes, const char* arg) {
  if (bytes == 0) return;
  if (p == nullptr) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': NULL"));
  static const bool checkPointers =
      envFlag("PYCCL_NCCL_CHECK_POINTERS", false) || envFlag("NCCL_CHECK_POINTERS", false);
  if (!checkPointers) return;
  int device = -1;
  const bool onDevice = gpu::isDevicePointer(p, &device);
  if (c->device >= 0 && (!onDevice || device != c->device)) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': ", p, " is not memory of cuda:",
                                                  c->device, " (the communicator's device)"));
  }
  if (c->device < 0 && onDevice) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': ", p, " is CUDA memory, and the "
                                                  "communicator is in host mode"));
  }
}

/// Refuses send and receive buffers that overlap other than as the collective's in-place form.
void checkPlacement(const void* send, uint64_t sendBytes, const void* recv, uint64_t recvBytes,
                    const void* inPlaceSend, const char* form) {
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  if (sendBytes == 0 || recvBytes == 0 || s >= r + recvBytes || r >= s + sendBytes) return;
  if (send == inPlaceSend) return;
  throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'recvbuff': overlaps sendbuff other than in "
                                                "place (", form, ")"));
}

void checkCount(size_t count, const char* arg) {
  if (count > (uint64_t{1} << 48)) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument '", arg, "': ", count, " elements"));
  }
}

void checkRoot(const ncclComm* c, int root) {
  if (root < 0 || root >= c->nranks) {
    throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'root': ", root, " is not a rank (0 to ",
                                                  c->nranks - 1, ")"));
  }
}

/// The selector's choice for a call of `collective`, counted as what runs it: a kernel choice, or nullopt where
/// the call goes to NCCL. The selector itself hands NCCL its sizes; NCCL also takes what this library cannot
/// run on pyccl: PreMulSum ops and every call of ranks without an engine (makeComm made sure NCCL is there).
/// Without NCCL a PreMulSum op is refused here.
std::optional<Choice> choose(ncclComm* c, Collective collective, ncclDataType_t dtype, uint64_t bytes,
                             uint64_t count, bool premulSum) {
  const bool nccl = c->real != nullptr;
  if (premulSum && !nccl) {
    throw NcclFailure(ncclInvalidUsage, strCat("invalid argument 'op': pyccl's kernels reduce with sum, prod, max, "
                                               "min and avg; a PreMulSum op needs the real NCCL, and none is loaded",
                                               c->device < 0 ? " (host mode has none)" : " (PYCCL_NCCL_LIBRARY)"));
  }
  if (premulSum) {
    countForwarded(c, strCat(collectiveName(collective), " premul_sum"));
    return std::nullopt;
  }
  Choice choice = c->selector->select(collective, tableDtypeOf(dtype), bytes, count, "", nccl, /*plans=*/false,
                                      /*counted=*/false);
  if (choice.route != Route::kKernel || c->engine == nullptr) {
    choice.route = Route::kNccl;
    choice.algorithm = "nccl";
  }
  c->selector->count(collective, choice);
  if (choice.route == Route::kKernel) return choice;
  return std::nullopt;
}

/// Runs `body` as the exported function `what`: its result, the failure's code (message logged and kept).
template <typename Body>
ncclResult_t guarded(const char* what, ncclComm_t comm, Body&& body) {
  try {
    body();
    return ncclSuccess;
  } catch (const Error& e) {
    const ncclResult_t r = resultOf(e);
    tlsLastError = strCat(what, ": ", e.what());
    if (comm != nullptr && comm->magic == kCommMagic) {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->lastError = tlsLastError;
    }
    PYCCL_LOG(Warn, "NCCL API: " << tlsLastError);
    return r;
  } catch (const std::exception& e) {
    tlsLastError = strCat(what, ": ", e.what());
    PYCCL_LOG(Error, "NCCL API: " << tlsLastError);
    return ncclInternalError;
  }
}

/// The real NCCL's call `member` for `c`'s NCCL communicator (c->real): null where `c` has none, or where the
/// loaded NCCL predates the call.
template <typename Fn>
Fn realCallFor(const ncclComm* c, Fn RealNccl::*member) {
  return c->real != nullptr ? realNccl()->*member : nullptr;
}

/// The real NCCL's `fn` on one of its own communicators, where the loaded NCCL has that call (`name`).
template <typename Fn, typename... Args>
ncclResult_t forwardOptional(Fn fn, const char* name, Args... args) {
  if (fn != nullptr) return fn(args...);
  tlsLastError = strCat(name, ": the loaded NCCL (", realNccl()->version, ") does not have this call");
  PYCCL_LOG(Warn, "NCCL API: " << tlsLastError);
  return ncclInvalidUsage;
}

}  // namespace
}  // namespace pyccl

// -----------------------------------------------------------------------------------------------------------------
// The exported API.
// -----------------------------------------------------------------------------------------------------------------

PYCCL_NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  return guarded("ncclGetVersion", nullptr, [&] {
    if (version == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'version': NULL");
    const RealNccl* real = realNccl();
    *version = real != nullptr ? real->version : kApiVersion;
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded("ncclGetUniqueId", nullptr, [&] {
    if (uniqueId == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'uniqueId': NULL");
    // The store lives as long as the process, as NCCL's bootstrap root serves until its ranks have met.
    static std::mutex mu;
    static auto* servers = new std::vector<std::unique_ptr<StoreServer>>();
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mu);
      servers->push_back(std::make_unique<StoreServer>());
      address = servers->back()->address();
    }
    PYCCL_CHECK_ARG(address.size() < PYCCL_NCCL_UNIQUE_ID_BYTES - 16, "uniqueId", "address '", address,
                    "' does not fit");
    std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
    std::memcpy(uniqueId->internal, kIdMagic, sizeof(kIdMagic));
    const uint64_t nonce = randomNonce();
    std::memcpy(uniqueId->internal + 8, &nonce, sizeof(nonce));
    std::memcpy(uniqueId->internal + 16, address.data(), address.size());
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                      ncclConfig_t* config) {
  return guarded("ncclCommInitRank", nullptr, [&] {
    if (comm == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'comm': NULL");
    *comm = nullptr;
    if (nranks < 1) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'nranks': ", nranks));
    if (rank < 0 || rank >= nranks) {
      throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'rank': ", rank, " (nranks ", nranks, ")"));
    }
    (void)config;  // blocking or not, this library's init returns when the communicator is made
    const IdContents id = readId(commId);
    auto c = std::make_unique<ncclComm>();
    c->rank = rank;
    c->nranks = nranks;
    c->device = gpu::deviceCount() > 0 ? gpu::currentDevice() : -1;
    ncclComm* raw = c.get();
    const std::string name = strCat("nccl-", std::hex, id.nonce);
    auto make = [raw, id, name] {
      gpu::OptionalDeviceGuard onDevice(raw->device);
      raw->storeAddress = id.address;
      makeComm(raw, std::make_shared<TcpStore>(id.address, commTimeout()), name);
    };
    if (tlsGroup.depth > 0) {
      tlsGroup.inits.push_back({raw, make});
    } else {
      make();
    }
    *comm = c.release();
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                        ncclUniqueId* commIds, ncclConfig_t* config) {
  const ncclResult_t r = guarded("ncclCommInitRankScalable", nullptr, [&] {
    if (newcomm != nullptr) *newcomm = nullptr;
    if (nId < 1) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'nId': ", nId));
    if (commIds == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'commIds': NULL");
  });
  if (r != ncclSuccess) return r;
  // NCCL spreads a large job's bootstrap over several roots; every rank is given the same ids, and one store is
  // enough for pyccl's ranks to meet: the first id's.
  return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", nullptr, [&] {
    if (comms == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'comms': NULL");
    if (ndev < 1) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'ndev': ", ndev));
    const int visible = gpu::deviceCount();
    if (visible == 0) {
      throw NcclFailure(ncclInvalidUsage, "ncclCommInitAll needs GPUs (host mode runs one process per rank, with "
                                          "ncclGetUniqueId and ncclCommInitRank)");
    }
    std::vector<std::unique_ptr<ncclComm>> made;
    for (int i = 0; i < ndev; ++i) {
      const int device = devlist != nullptr ? devlist[i] : i;
      if (device < 0 || device >= visible) {
        throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'devlist': entry ", i, " is ", device,
                                                      " (", visible, " GPUs visible)"));
      }
      made.push_back(std::make_unique<ncclComm>());
      made.back()->rank = i;
      made.back()->nranks = ndev;
      made.back()->device = device;
    }
    auto store = std::make_shared<MemoryStore>();
    const std::string name = strCat("nccl-all-", std::hex, randomNonce());
    runAll(made.size(), true, [&](size_t i) {
      gpu::DeviceGuard onDevice(made[i]->device);
      makeComm(made[i].get(), store, name);
    });
    for (int i = 0; i < ndev; ++i) comms[i] = made[i].release();
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                             ncclConfig_t* config) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commSplit(comm, color, key, newcomm, config);
  return guarded("ncclCommSplit", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (newcomm == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'newcomm': NULL");
    if (color < NCCL_SPLIT_NOCOLOR) throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'color': ", color));
    *newcomm = nullptr;
    (void)config;
    // Every rank's (color, key) through the parent's bootstrap; new ranks by key, then parent rank.
    ByteWriter w;
    w.put<int32_t>(color).put<int32_t>(key);
    const std::vector<Bytes> all = c->comm->allGather(w.take());
    std::vector<std::pair<std::pair<int32_t, int>, int>> members;  // ((key, parent rank), parent rank)
    for (int q = 0; q < c->nranks; ++q) {
      ByteReader r(all[q], "split");
      const int32_t qColor = r.get<int32_t>();
      const int32_t qKey = r.get<int32_t>();
      if (qColor == color && color != NCCL_SPLIT_NOCOLOR) members.push_back({{qKey, q}, q});
    }
    const int split = c->splits++;
    ncclComm_t realSplit = nullptr;
    if (c->real != nullptr) {
      const RealNccl* real = realNccl();
      gpu::DeviceGuard guard(c->device);
      checkReal(real->commSplit(c->real, color, key, &realSplit, nullptr), "ncclCommSplit");
    }
    if (color == NCCL_SPLIT_NOCOLOR) return;
    std::sort(members.begin(), members.end());
    auto n = std::make_unique<ncclComm>();
    n->nranks = static_cast<int>(members.size());
    for (int i = 0; i < n->nranks; ++i) {
      if (members[i].second == c->rank) n->rank = i;
    }
    n->device = c->device;
    n->real = realSplit;
    gpu::OptionalDeviceGuard onDevice(n->device);
    n->storeAddress = c->storeAddress;
    // A connection of its own to the id's store (one connection serves one call at a time).
    std::shared_ptr<Store> store = c->store;
    if (!c->storeAddress.empty()) store = std::make_shared<TcpStore>(c->storeAddress, commTimeout());
    makeComm(n.get(), std::move(store), strCat(c->name, "/split", split, "-color", color));
    *newcomm = n.release();
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                              ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->commShrink, "ncclCommShrink", comm, excludeRanksList, excludeRanksCount, newcomm,
                           config, shrinkFlags);
  }
  return guarded("ncclCommShrink", comm, [&] {
    checkedComm(comm);
    if (newcomm != nullptr) *newcomm = nullptr;
    // The excluded ranks take no part in a shrink, and a pyccl communicator is made by all of its ranks.
    throw NcclFailure(ncclInvalidUsage, "ncclCommShrink is not supported on this library's communicators: make "
                                        "the smaller communicator with ncclCommSplit, called by every rank (the "
                                        "excluded ones with NCCL_SPLIT_NOCOLOR)");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->commSuspend, "ncclCommSuspend", comm, flags);
  }
  return guarded("ncclCommSuspend", comm, [&] {
    ncclComm* c = readyComm(comm, /*suspended=*/true);
    if (c->suspended) return;
    const auto suspend = realCallFor(c, &RealNccl::commSuspend);
    if (suspend != nullptr) checkReal(suspend(c->real, flags), "ncclCommSuspend");
    c->suspended = true;
    static std::once_flag warned;
    std::call_once(warned, [&] {
      PYCCL_LOG(Warn, "NCCL API: ncclCommSuspend: pyccl's communicators keep their buffers while suspended ("
                          << (suspend != nullptr ? "the real NCCL's communicator releases its own"
                                                 : "and the loaded NCCL cannot release its own")
                          << "); their calls are refused until ncclCommResume");
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return forwardOptional(real->commResume, "ncclCommResume", comm);
  return guarded("ncclCommResume", comm, [&] {
    ncclComm* c = readyComm(comm, /*suspended=*/true);
    if (!c->suspended) return;
    if (const auto resume = realCallFor(c, &RealNccl::commResume)) checkReal(resume(c->real), "ncclCommResume");
    c->suspended = false;
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commFinalize(comm);
  return guarded("ncclCommFinalize", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (c->real != nullptr) checkReal(realNccl()->commFinalize(c->real), "ncclCommFinalize");
  });
}

namespace {

/// Destroys `comm` (abort: raise its abort flag first, so waits give up at once).
ncclResult_t release(ncclComm_t comm, bool abort, const char* what) {
  ncclResult_t realResult = ncclSuccess;
  const ncclResult_t r = guarded(what, comm, [&] {
    ncclComm* c = checkedComm(comm);
    if (abort && c->comm) c->comm->abort();
    if (c->real != nullptr) {
      const RealNccl* real = realNccl();
      realResult = abort ? real->commAbort(c->real) : real->commDestroy(c->real);
      c->real = nullptr;
    }
    if (c->engine) c->engine->close();
    if (c->comm) c->comm->close();
    c->magic = 0;
    delete c;
  });
  return r != ncclSuccess ? r : realResult;
}

}  // namespace

PYCCL_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commDestroy(comm);
  return release(comm, false, "ncclCommDestroy");
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commAbort(comm);
  return release(comm, true, "ncclCommAbort");
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commGetAsyncError(comm, asyncError);
  return guarded("ncclCommGetAsyncError", comm, [&] {
    ncclComm* c = checkedComm(comm);
    if (asyncError == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'asyncError': NULL");
    *asyncError = ncclSuccess;
    if (!c->ready) return;
    try {
      c->comm->checkUsable("ncclCommGetAsyncError");
    } catch (const Error& e) {
      *asyncError = resultOf(e);
      std::lock_guard<std::mutex> lock(c->mu);
      c->lastError = e.what();
      return;
    }
    if (c->real != nullptr) checkReal(realNccl()->commGetAsyncError(c->real, asyncError), "ncclCommGetAsyncError");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commCount(comm, count);
  return guarded("ncclCommCount", comm, [&] {
    const ncclComm* c = checkedComm(comm);
    if (count == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'count': NULL");
    *count = c->nranks;
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commCuDevice(comm, device);
  return guarded("ncclCommCuDevice", comm, [&] {
    const ncclComm* c = checkedComm(comm);
    if (device == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'device': NULL");
    *device = c->device;
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commUserRank(comm, rank);
  return guarded("ncclCommUserRank", comm, [&] {
    const ncclComm* c = checkedComm(comm);
    if (rank == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'rank': NULL");
    *rank = c->rank;
  });
}

PYCCL_NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with PYCCL_LOG_LEVEL=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with PYCCL_LOG_LEVEL=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the pyccl developers";
    case ncclInvalidArgument: return "invalid argument (run with PYCCL_LOG_LEVEL=INFO for details)";
    case ncclInvalidUsage: return "invalid usage (run with PYCCL_LOG_LEVEL=INFO for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

PYCCL_NCCL_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return real->getLastError(comm);
  if (comm != nullptr && comm->magic == kCommMagic) {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->lastError.empty()) return comm->lastError.c_str();
  }
  return tlsLastError.c_str();
}

PYCCL_NCCL_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", nullptr, [&] {
    if (ptr == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'ptr': NULL");
    const RealNccl* real = realNccl();
    if (real != nullptr) {
      checkReal(real->memAlloc(ptr, size), "ncclMemAlloc");
      return;
    }
    if (gpu::deviceCount() == 0) throw NcclFailure(ncclInvalidUsage, "ncclMemAlloc needs a GPU");
    *ptr = gpu::deviceMalloc(gpu::currentDevice(), size);
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  return guarded("ncclMemFree", nullptr, [&] {
    const RealNccl* real = realNccl();
    if (real != nullptr) {
      checkReal(real->memFree(ptr), "ncclMemFree");
      return;
    }
    if (ptr != nullptr) gpu::deviceFree(gpu::currentDevice(), ptr);
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commRegister(comm, buff, size, handle);
  return guarded("ncclCommRegister", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (handle == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'handle': NULL");
    checkBuffer(c, buff, size, "buff");
    // pyccl's kernels stage plain buffers through their own registered scratch: only NCCL needs to know.
    if (c->real != nullptr) {
      checkReal(realNccl()->commRegister(c->real, buff, size, handle), "ncclCommRegister");
    } else {
      *handle = buff;
    }
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (const RealNccl* real = foreignOwner(comm)) return real->commDeregister(comm, handle);
  return guarded("ncclCommDeregister", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (c->real != nullptr) checkReal(realNccl()->commDeregister(c->real, handle), "ncclCommDeregister");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                      int winFlags) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->commWindowRegister, "ncclCommWindowRegister", comm, buff, size, win, winFlags);
  }
  return guarded("ncclCommWindowRegister", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (win == nullptr) throw NcclFailure(ncclInvalidArgument, "invalid argument 'win': NULL");
    checkBuffer(c, buff, size, "buff");
    // As ncclCommRegister: pyccl's kernels stage plain buffers through their own registered scratch, so the
    // window is the real NCCL's, for the calls it runs; without one, the handle is the buffer.
    if (const auto reg = realCallFor(c, &RealNccl::commWindowRegister)) {
      checkReal(reg(c->real, buff, size, win, winFlags), "ncclCommWindowRegister");
    } else {
      *win = reinterpret_cast<ncclWindow_t>(buff);
    }
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->commWindowDeregister, "ncclCommWindowDeregister", comm, win);
  }
  return guarded("ncclCommWindowDeregister", comm, [&] {
    ncclComm* c = readyComm(comm);
    if (const auto dereg = realCallFor(c, &RealNccl::commWindowDeregister)) {
      checkReal(dereg(c->real, win), "ncclCommWindowDeregister");
    }
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t* reqs,
                                                 ncclDevComm_t* outDevComm) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->devCommCreate, "ncclDevCommCreate", comm, reqs, outDevComm);
  }
  return guarded("ncclDevCommCreate", comm, [&] {
    checkedComm(comm);
    throw NcclFailure(ncclInvalidUsage, "ncclDevCommCreate: NCCL's device API needs the real NCCL's "
                                        "communicator, and this library's communicators are pyccl's (run the "
                                        "program without libpyccl_nccl.so to use it)");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t* devComm) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->devCommDestroy, "ncclDevCommDestroy", comm, devComm);
  }
  return guarded("ncclDevCommDestroy", comm, [&] {
    checkedComm(comm);
    throw NcclFailure(ncclInvalidUsage, "ncclDevCommDestroy: this library's communicators make no device "
                                        "communicators (ncclDevCommCreate)");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                        ncclScalarResidence_t residence, ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->redOpCreatePreMulSum(op, scalar, datatype, residence, comm);
  }
  return guarded("ncclRedOpCreatePreMulSum", comm, [&] {
    ncclComm* c = readyComm(comm);
    const RealNccl& real = realFor(c, "ncclRedOpCreatePreMulSum");
    checkReal(real.redOpCreatePreMulSum(op, scalar, datatype, residence, c->real), "ncclRedOpCreatePreMulSum");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (const RealNccl* real = foreignOwner(comm)) return real->redOpDestroy(op, comm);
  return guarded("ncclRedOpDestroy", comm, [&] {
    ncclComm* c = readyComm(comm);
    const RealNccl& real = realFor(c, "ncclRedOpDestroy");
    checkReal(real.redOpDestroy(op, c->real), "ncclRedOpDestroy");
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  return guarded("ncclAllReduce", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    const uint64_t bytes = count * dtypeBytes(datatype);
    const std::optional<ReduceOp> reduceOp = reduceOpOf(op, c->real != nullptr);
    checkBuffer(c, sendbuff, bytes, "sendbuff");
    checkBuffer(c, recvbuff, bytes, "recvbuff");
    checkPlacement(sendbuff, bytes, recvbuff, bytes, recvbuff, "sendbuff == recvbuff");
    const std::optional<Choice> choice = choose(c, Collective::kAllReduce, datatype, bytes, count, !reduceOp);
    if (!choice) {
      submit(c, stream, true, [=] {
        checkReal(realNccl()->allReduce(sendbuff, recvbuff, count, datatype, op, c->real, stream), "ncclAllReduce");
      });
      return;
    }
    const DataType dtype = *reducedDtype(datatype);
    const auto algorithm = kernelOf(*choice);
    const auto symmetric = symmetricOf(*choice);
    submit(c, stream, false, [=] {
      c->engine->allReduce(sendbuff, recvbuff, count, dtype, *reduceOp, algorithm, stream, symmetric);
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             ncclDataType_t datatype, ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->allGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  }
  return guarded("ncclAllGather", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(sendcount, "sendcount");
    const uint64_t chunk = sendcount * dtypeBytes(datatype);
    checkBuffer(c, sendbuff, chunk, "sendbuff");
    checkBuffer(c, recvbuff, chunk * c->nranks, "recvbuff");
    checkPlacement(sendbuff, chunk, recvbuff, chunk * c->nranks, static_cast<char*>(recvbuff) + c->rank * chunk,
                   "sendbuff == recvbuff + rank * sendcount");
    const std::optional<Choice> choice =
        choose(c, Collective::kAllGather, datatype, chunk * c->nranks, sendcount, false);
    if (!choice) {
      submit(c, stream, true, [=] {
        checkReal(realNccl()->allGather(sendbuff, recvbuff, sendcount, datatype, c->real, stream), "ncclAllGather");
      });
      return;
    }
    const auto protocol = protocolOf(*choice);
    submit(c, stream, false, [=] {
      c->engine->exchange(ExchangeKind::kAllGather, sendbuff, 0, recvbuff, chunk, chunk, 0, DataType::kFloat32,
                          ReduceOp::kSum, protocol, stream);
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->reduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  }
  return guarded("ncclReduceScatter", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(recvcount, "recvcount");
    const uint64_t chunk = recvcount * dtypeBytes(datatype);
    const std::optional<ReduceOp> reduceOp = reduceOpOf(op, c->real != nullptr);
    checkBuffer(c, sendbuff, chunk * c->nranks, "sendbuff");
    checkBuffer(c, recvbuff, chunk, "recvbuff");
    checkPlacement(sendbuff, chunk * c->nranks, recvbuff, chunk,
                   static_cast<const char*>(recvbuff) - c->rank * chunk, "recvbuff == sendbuff + rank * recvcount");
    const std::optional<Choice> choice = choose(c, Collective::kReduceScatter, datatype, chunk * c->nranks,
                                                recvcount * c->nranks, !reduceOp);
    if (!choice) {
      submit(c, stream, true, [=] {
        checkReal(realNccl()->reduceScatter(sendbuff, recvbuff, recvcount, datatype, op, c->real, stream),
                  "ncclReduceScatter");
      });
      return;
    }
    const DataType dtype = *reducedDtype(datatype);
    const auto protocol = protocolOf(*choice);
    submit(c, stream, false, [=] {
      c->engine->exchange(ExchangeKind::kReduceScatter, sendbuff, chunk, recvbuff, 0, chunk, 0, dtype, *reduceOp,
                          protocol, stream);
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return guarded("ncclBroadcast", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    checkRoot(c, root);
    const uint64_t bytes = count * dtypeBytes(datatype);
    if (c->rank == root) checkBuffer(c, sendbuff, bytes, "sendbuff");
    checkBuffer(c, recvbuff, bytes, "recvbuff");
    if (c->rank == root) checkPlacement(sendbuff, bytes, recvbuff, bytes, recvbuff, "sendbuff == recvbuff");
    const std::optional<Choice> choice = choose(c, Collective::kBroadcast, datatype, bytes, count, false);
    if (!choice) {
      submit(c, stream, true, [=] {
        checkReal(realNccl()->broadcast(sendbuff, recvbuff, count, datatype, root, c->real, stream), "ncclBroadcast");
      });
      return;
    }
    const auto protocol = protocolOf(*choice);
    // Only the root's input is read; the others pass their output, as NCCL lets them pass anything.
    const void* input = c->rank == root ? sendbuff : recvbuff;
    submit(c, stream, false, [=] {
      c->engine->exchange(ExchangeKind::kBroadcast, input, 0, recvbuff, 0, bytes, root, DataType::kFloat32,
                          ReduceOp::kSum, protocol, stream);
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                         ncclComm_t comm, pycclNcclStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, int root, ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return real->reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  }
  return guarded("ncclReduce", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    checkRoot(c, root);
    const uint64_t bytes = count * dtypeBytes(datatype);
    checkBuffer(c, sendbuff, bytes, "sendbuff");
    if (c->rank == root) checkBuffer(c, recvbuff, bytes, "recvbuff");
    reduceOpOf(op, c->real != nullptr);
    const RealNccl& real = realFor(c, "ncclReduce (pyccl has no rooted reduction)");
    countForwarded(c, "reduce");
    submit(c, stream, true, [=, &real] {
      checkReal(real.reduce(sendbuff, recvbuff, count, datatype, op, root, c->real, stream), "ncclReduce");
    });
  });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->alltoAll, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, comm, stream);
  }
  return guarded("ncclAlltoAll", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    const uint64_t chunk = count * dtypeBytes(datatype);
    const uint64_t total = chunk * c->nranks;
    checkBuffer(c, sendbuff, total, "sendbuff");
    checkBuffer(c, recvbuff, total, "recvbuff");
    checkPlacement(sendbuff, total, recvbuff, total, recvbuff, "sendbuff == recvbuff");
    const std::optional<Choice> choice = choose(c, Collective::kAllToAll, datatype, total, count, false);
    if (!choice) {
      const RealNccl* real = realNccl();
      submit(c, stream, true, [=] {
        if (real->alltoAll != nullptr) {
          checkReal(real->alltoAll(sendbuff, recvbuff, count, datatype, c->real, stream), "ncclAlltoAll");
          return;
        }
        // An NCCL before 2.28: a send and a receive per peer, in one group.
        checkReal(real->groupStart(), "ncclGroupStart");
        for (int q = 0; q < c->nranks; ++q) {
          checkReal(real->send(static_cast<const char*>(sendbuff) + q * chunk, count, datatype, q, c->real, stream),
                    "ncclSend");
          checkReal(real->recv(static_cast<char*>(recvbuff) + q * chunk, count, datatype, q, c->real, stream),
                    "ncclRecv");
        }
        checkReal(real->groupEnd(), "ncclGroupEnd");
      });
      return;
    }
    const auto protocol = protocolOf(*choice);
    submit(c, stream, false, [=] {
      c->engine->exchange(ExchangeKind::kAllToAll, sendbuff, chunk, recvbuff, chunk, chunk, 0, DataType::kFloat32,
                          ReduceOp::kSum, protocol, stream);
    });
  });
}

namespace {

/// ncclGather and ncclScatter: pyccl has no rooted exchange; the real NCCL runs them.
ncclResult_t rooted(bool gather, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, pycclNcclStream_t stream) {
  const char* what = gather ? "ncclGather" : "ncclScatter";
  return guarded(what, comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    checkRoot(c, root);
    const uint64_t bytes = count * dtypeBytes(datatype);
    const bool wholeIn = !gather && c->rank == root;
    const bool wholeOut = gather && c->rank == root;
    checkBuffer(c, sendbuff, wholeIn ? bytes * c->nranks : bytes, "sendbuff");
    checkBuffer(c, recvbuff, wholeOut ? bytes * c->nranks : bytes, "recvbuff");
    const RealNccl& real = realFor(c, strCat(what, " (pyccl has no rooted exchange)"));
    auto fn = gather ? real.gather : real.scatter;
    if (fn == nullptr) {
      throw NcclFailure(ncclInvalidUsage, strCat(what, ": the loaded NCCL (", real.version, ") does not have it"));
    }
    countForwarded(c, gather ? "gather" : "scatter");
    submit(c, stream, true, [=] { checkReal(fn(sendbuff, recvbuff, count, datatype, root, c->real, stream), what); });
  });
}

}  // namespace

PYCCL_NCCL_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->gather, "ncclGather", sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return rooted(true, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           int root, ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) {
    return forwardOptional(real->scatter, "ncclScatter", sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return rooted(false, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

namespace {

ncclResult_t transfer(bool send, void* buff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      pycclNcclStream_t stream) {
  return guarded(send ? "ncclSend" : "ncclRecv", comm, [&] {
    ncclComm* c = readyComm(comm);
    checkCount(count, "count");
    const uint64_t bytes = count * dtypeBytes(datatype);
    if (peer < 0 || peer >= c->nranks || peer == c->rank) {
      throw NcclFailure(ncclInvalidArgument, strCat("invalid argument 'peer': ", peer, " (another rank, 0 to ",
                                                    c->nranks - 1, ", is needed; this is rank ", c->rank, ")"));
    }
    checkBuffer(c, buff, bytes, send ? "sendbuff" : "recvbuff");
    if (c->engine == nullptr) {
      const RealNccl& real = realFor(c, "sends and receives across nodes");
      countForwarded(c, send ? "send" : "recv");
      submit(c, stream, true, [=, &real] {
        checkReal(send ? real.send(buff, count, datatype, peer, c->real, stream)
                       : real.recv(buff, count, datatype, peer, c->real, stream),
                  send ? "ncclSend" : "ncclRecv");
      });
      return;
    }
    submitTransfer(c, {send, peer, buff, bytes}, stream);
  });
}

}  // namespace

PYCCL_NCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) return real->send(sendbuff, count, datatype, peer, comm, stream);
  return transfer(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, pycclNcclStream_t stream) {
  if (const RealNccl* real = foreignOwner(comm)) return real->recv(recvbuff, count, datatype, peer, comm, stream);
  return transfer(false, recvbuff, count, datatype, peer, comm, stream);
}

PYCCL_NCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  ++tlsGroup.depth;
  return ncclSuccess;
}

PYCCL_NCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (tlsGroup.depth == 0) {
    tlsLastError = "ncclGroupEnd: no group is open (ncclGroupStart first)";
    PYCCL_LOG(Warn, "NCCL API: " << tlsLastError);
    return ncclInvalidUsage;
  }
  if (--tlsGroup.depth > 0) return ncclSuccess;
  return guarded("ncclGroupEnd", nullptr, [] { endGroup(); });
}

PYCCL_NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return guarded("ncclGroupSimulateEnd", nullptr, [] {
    throw NcclFailure(ncclInvalidUsage, tlsGroup.depth == 0
                                            ? "no group is open (ncclGroupStart first)"
                                            : "this library does not simulate groups; the group stays open (end "
                                              "it with ncclGroupEnd)");
  });
}

PYCCL_NCCL_EXPORT const char* pycclNcclDescribe(ncclComm_t comm) {
  if (comm == nullptr || comm->magic != kCommMagic) return "";
  std::map<std::string, uint64_t> lines;
  if (comm->selector) lines = comm->selector->trace();
  std::lock_guard<std::mutex> lock(comm->mu);
  for (const auto& [what, n] : comm->forwarded) lines[strCat(what, " forwarded")] += n;
  comm->described.clear();
  for (const auto& [what, n] : lines) comm->described += strCat(what, "=", n, "\n");
  return comm->described.c_str();
}
