// The choice of what runs one collective call: a kernel of the collective
// engine, a DSL plan through the plan interpreter, the NCCL the caller has
// (a torch group's, or the process group's delegate), or the collectives run
// across nodes. It is made here and nowhere else, for every entry point
// (pyccl.*, torch.ops.pyccl.*, the "pyccl" process group, NCCL's C API), in this order:
//
//   1. a forced algorithm: the call's own argument, else PYCCL_ALGO;
//   2. a plan registered with pyccl.register_algorithm (process-wide
//      registry below) for the collective, world size and byte range, whose
//      chunks divide the input; plans reduce float32, float16 and bfloat16
//      only, so a reduction of another dtype (kOther: float64, float8, the
//      integers, bool) takes no plan here or at step 4;
//   3. on ranks that span nodes (all-reduce, all-gather, reduce-scatter): NCCL
//      from its threshold where the caller has it (a kOther reduction at any
//      size: the collectives across nodes reduce the float dtypes only), else
//      across nodes;
//   4. the tuning table of the call's dtype (kernel, NCCL or library plan
//      entries; where a plan cannot take the call, its entry's fallback),
//      unless PYCCL_NCCL_MIN_BYTES turns tables off;
//   5. the defaults: NCCL from the collective's threshold where the caller
//      has it, else the engine's kernel by size (collective_options.cpp).
//
// Everything it reads is fixed when it is made (with the communicator's
// engine): PYCCL_ALGO and PYCCL_NCCL_MIN_BYTES are read then, as NCCL reads
// its environment at ncclCommInitRank, and the tables come in its config.
// The registry of plans is the one input that changes later, as users
// register and unregister plans.
//
// Every choice is counted by what it runs and where it came from (trace()),
// so tests and logs see what actually ran.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/allreduce.hpp"
#include "algorithms/exchange.hpp"

namespace pyccl {

/// The collectives the selector chooses for.
enum class Collective : int { kAllReduce = 0, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kCount };
constexpr int kCollectives = static_cast<int>(Collective::kCount);
/// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", and back (InvalidArgument naming `what`).
const char* collectiveName(Collective c);
Collective parseCollective(const std::string& name, const char* what);

/// What runs a call.
enum class Route : int { kKernel = 0, kPlan, kNccl, kAcrossNodes };
const char* routeName(Route r);

/// The names a call of `c` can be forced to (the argument, PYCCL_ALGO) and tuned to: its kernels, then "nccl".
const std::vector<std::string>& algorithmsOf(Collective c);

/// The dtypes tables are kept for; every other dtype (data movement) takes kOther's.
enum class TableDtype : int { kFloat32 = 0, kFloat16, kBFloat16, kOther, kCount };
constexpr int kTableDtypes = static_cast<int>(TableDtype::kCount);

/// One entry of a tuning table: messages of at most maxBytes take it.
struct RouteEntry {
  uint64_t maxBytes = UINT64_MAX;
  Route route = Route::kKernel;  ///< kKernel, kNccl or kPlan
  std::string algorithm;         ///< kKernel: the kernel's name; kPlan: the library plan's
  uint32_t instances = 0;        ///< kPlan: thread blocks per plan block
  uint32_t threads = 0;          ///< kPlan: threads per block
  uint64_t inputChunks = 1;      ///< kPlan: chunks its input splits into (the element count must divide)
  /// kPlan: what runs its sizes where the plan cannot (a caller without plans, an input of broken chunks): the
  /// fastest kernel the tuner measured there, or "nccl"; "" for the defaults'.
  std::string fallback;
};

/// Where no tuning table decides, NCCL runs a collective from this many bytes (of the whole buffer) for a caller
/// that has it, per collective (Collective order). The sizes follow where NCCL caught up with pyccl's kernels on
/// 8 x H200 NVLink, the largest world measured; at 2 and 4 ranks on H100 and H200 the kernels lead at every
/// all-reduce size, and those tables never pick NCCL for it (docs/performance.md).
std::array<uint64_t, kCollectives> defaultNcclMinBytes();

/// What a selector is made from, besides the environment.
struct SelectorConfig {
  int worldSize = 0;
  /// Per dtype and collective, a table's entries in increasing maxBytes; all_reduce_symmetric's (input and
  /// output in symmetric buffers, or captured on graph buffers) apart.
  std::array<std::array<std::vector<RouteEntry>, kCollectives>, kTableDtypes> tables;
  std::array<std::vector<RouteEntry>, kTableDtypes> allReduceSymmetric;
  /// Where no table entry decides: NCCL from this many bytes, for a caller that has it.
  std::array<uint64_t, kCollectives> ncclMinBytes{};
  /// The ranks span nodes (the engine's kernels cannot reach every peer).
  bool acrossNodes = false;
};

/// Where a choice came from (the order above).
enum class ChoiceSource : int { kArgument = 0, kEnvironment, kRegisteredPlan, kAcrossNodes, kTable, kDefault, kCount };
/// "argument", "PYCCL_ALGO", "registered plan", "across nodes", "table", "default".
const char* choiceSourceName(ChoiceSource s);

/// The kernel the engine's own by-size choice (collective_options.cpp) takes for `bytes` of `c`
/// (`symmetric`: an all-reduce with input and output in symmetric buffers).
using DefaultKernel = std::function<std::string(Collective c, uint64_t bytes, bool symmetric)>;

class CollectiveEngine;
/// Step 5's kernel: `engine`'s own choice by size ("" without an engine: no kernel can run the call).
DefaultKernel engineDefaults(std::shared_ptr<CollectiveEngine> engine);

/// One choice.
struct Choice {
  Route route = Route::kKernel;
  /// kKernel: the kernel (from the DefaultKernel at step 5; "" only where the selector has no engine);
  /// kNccl: "nccl"; kPlan: the library plan's name ("" for a registered plan).
  std::string algorithm;
  /// All-reduce, kKernel or kNccl: the choice for input and output in symmetric buffers or on graph buffers
  /// (a kernel or "nccl"; "" where the call forces an algorithm, which holds there too).
  std::string symmetricAlgorithm;
  int registeredPlan = -1;     ///< kPlan: the registered plan's id, or -1 for a table's library plan
  RouteEntry entry;            ///< kPlan from a table: its entry
  ChoiceSource source = ChoiceSource::kDefault;
};

/// A plan put into the choice by pyccl.register_algorithm.
struct RegisteredPlan {
  int id = -1;
  Collective collective = Collective::kAllReduce;
  uint64_t minBytes = 0;
  uint64_t maxBytes = 0;
  int worldSize = 0;
  uint64_t inputChunks = 1;  ///< the input's element count must divide into these
};

/// The process-wide registry of plans (pyccl.register_algorithm): returns the new plan's id.
int registerPlan(RegisteredPlan plan);
/// Takes a plan out of the choice; InvalidArgument if `id` is not registered.
void unregisterPlan(int id);

/// What the engine takes from a choice: a kernel choice's all-reduce algorithm, its algorithm for symmetric
/// buffers and graph buffers, and an exchange's protocol (nullopt where the choice is no kernel, or names none:
/// the engine's own choice by size).
std::optional<AllReduceAlgorithm> kernelOf(const Choice& choice);
std::optional<AllReduceAlgorithm> symmetricOf(const Choice& choice);
std::optional<Protocol> protocolOf(const Choice& choice);

/// Where a plan choice's runner is kept on a communicator (executor/plan_runners.hpp): pyccl.registry sets the
/// runner up under `key` at the plan's first use, for inputs of up to `inputLimit` bytes (0 for a registered
/// plan: its registration's max_bytes), and every entry point then runs that one. A table's library plan gets a
/// runner per entry, or per power of two of the call's bytes (from 64 KiB) where the entry has no limit. An empty
/// key where the choice is no plan.
struct PlanSlot {
  std::string key;
  uint64_t inputLimit = 0;
};
/// `bytes`: the call's, as select() takes them (an all-gather's whole output).
PlanSlot planSlotOf(const Choice& choice, Collective c, uint64_t bytes, int worldSize);

class Selector {
 public:
  /// Reads PYCCL_ALGO and PYCCL_NCCL_MIN_BYTES (InvalidArgument naming a bad value) and keeps `config`;
  /// `defaultKernel` resolves step 5's kernel.
  Selector(SelectorConfig config, DefaultKernel defaultKernel);

  /// The choice for a call of `c` on `count` elements of `dtype` (`bytes`: the whole buffer, as nccl-tests
  /// counts it), forced to `forced` where not empty (InvalidArgument naming 'algorithm' unless one of
  /// algorithmsOf(c)). `nccl`: the caller can hand the call to NCCL (else a forced "nccl" is refused, and
  /// NCCL entries give way to the defaults). `plans`: plans may take it (false: a plan could not be set up,
  /// so the choice without plans). Counted in trace() where `counted` (false: the caller runs only some
  /// choices itself and hands the others to an entry point that asks again, and counts).
  Choice select(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, const std::string& forced,
                bool nccl, bool plans = true, bool counted = true) const;
  /// Counts `choice`, made by select(..., counted = false), in trace().
  void count(Collective c, const Choice& choice) const { record(c, choice); }

  /// Step 5's kernel from here on: a lane's engine is made after its selector, whose settings it checks
  /// across ranks. Call it before the first select().
  void setDefaultKernel(DefaultKernel defaultKernel) { defaultKernel_ = std::move(defaultKernel); }

  /// NCCL from this many bytes of `c` where no table entry decides: PYCCL_NCCL_MIN_BYTES, else the config's.
  uint64_t ncclMinBytes(Collective c) const {
    return ncclMinFromEnv_ ? ncclMinEnv_ : config_.ncclMinBytes[static_cast<int>(c)];
  }

  /// The size from which every call of `c` on `dtype` goes to NCCL for a caller that has it (UINT64_MAX: no
  /// size does), forced algorithms and plans aside: PYCCL_NCCL_MIN_BYTES; else where the dtype's table hands
  /// every larger size to NCCL; else ncclMinBytes(c). What pyccl.integrations' engines route to pyccl below.
  uint64_t ncclFrom(Collective c, TableDtype dtype) const;

  /// PYCCL_ALGO's algorithm for `c`, or "".
  const std::string& forcedByEnvironment(Collective c) const { return forcedByEnv_[static_cast<int>(c)]; }
  /// What the environment and the tables set, for the ranks' agreement (the same on every rank, else they wait
  /// on each other: a rank that hands a size to NCCL while another runs a kernel would wait forever).
  std::map<std::string, std::string> settings() const;
  const SelectorConfig& config() const { return config_; }

  /// How many choices were made so far, per "collective route algorithm (source)", e.g.
  /// "all_reduce kernel 2pa_hb (table)" or "all_gather plan registered (registered plan)".
  std::map<std::string, uint64_t> trace() const;

 private:
  Choice choose(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, const std::string& forced,
                bool nccl, bool plans) const;
  /// The kernel or NCCL choice `name` (one of the collective's algorithms) from `source`.
  Choice named(const std::string& name, bool nccl, ChoiceSource source) const;
  /// The default kernel for `bytes` of `c`, or NCCL from ncclMinBytes(c) where the caller has it.
  Choice byDefault(Collective c, uint64_t bytes, bool nccl) const;
  /// Steps 4 and 5: the table's entry (a library plan only where `plans` and its chunks divide `count`), else
  /// the defaults.
  Choice byTableOrDefault(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, bool nccl,
                          bool plans) const;
  /// An all-reduce's choice for symmetric buffers and graph buffers.
  std::string symmetricChoice(TableDtype dtype, uint64_t bytes, bool nccl) const;
  void record(Collective c, const Choice& choice) const;

  SelectorConfig config_;
  DefaultKernel defaultKernel_;
  std::array<std::string, kCollectives> forcedByEnv_;
  bool ncclMinFromEnv_ = false;  ///< PYCCL_NCCL_MIN_BYTES set: one threshold for all, tables off
  uint64_t ncclMinEnv_ = 0;
  /// Counts by [collective][route][algorithm index (algorithmsOf; kTracedAlgorithms - 1: a plan)][source].
  static constexpr int kTracedAlgorithms = 8;
  mutable std::array<std::atomic<uint64_t>, kCollectives * 4 * kTracedAlgorithms *
                                               static_cast<int>(ChoiceSource::kCount)> counts_{};
};

}  // namespace pyccl
