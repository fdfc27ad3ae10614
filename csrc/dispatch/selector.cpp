#include "dispatch/selector.hpp"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "engine/collective_engine.hpp"
#include "core/env_settings.hpp"
#include "core/errors.hpp"

namespace pyccl {
namespace {

constexpr const char* kCollectiveNames[kCollectives] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                        "broadcast"};
constexpr const char* kSourceNames[static_cast<int>(ChoiceSource::kCount)] = {
    "argument", "PYCCL_ALGO", "registered plan", "across nodes", "table", "default"};
constexpr uint64_t kNever = UINT64_MAX;

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool isAlgorithmOf(Collective c, const std::string& name) {
  const auto& names = algorithmsOf(c);
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// The entry of `entries` (increasing maxBytes) covering `bytes`, or null.
const RouteEntry* entryFor(const std::vector<RouteEntry>& entries, uint64_t bytes) {
  for (const RouteEntry& e : entries) {
    if (bytes <= e.maxBytes) return &e;
  }
  return nullptr;
}

Choice routed(Route route, std::string algorithm, ChoiceSource source) {
  Choice choice;
  choice.route = route;
  choice.algorithm = std::move(algorithm);
  choice.source = source;
  return choice;
}

/// The three collectives pyccl runs on ranks that span nodes (pyccl.across_nodes).
bool runsAcrossNodes(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kAllGather || c == Collective::kReduceScatter;
}

/// The process-wide registry of plans.
struct PlanRegistry {
  std::mutex mutex;
  std::vector<RegisteredPlan> plans;
  int nextId = 0;
  std::atomic<size_t> size{0};  ///< read without the lock: every call asks, and most processes register none
};

PlanRegistry& registry() {
  static auto* r = new PlanRegistry();  // never destroyed: calls may come during exit
  return *r;
}

/// PYCCL_ALGO, parsed: a comma-separated list of `collective=name` (that
/// collective takes it; the last such entry wins) and `name` (every collective
/// that has an algorithm of that name takes it, unless an entry of the first
/// kind names it; the first such entry wins). InvalidArgument naming the entry.
std::array<std::string, kCollectives> parseForced(const char* text) {
  std::array<std::string, kCollectives> named{}, bare{};
  if (text == nullptr) return named;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string entry = all.substr(start, end - start);
    start = end + 1;
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) continue;
    const size_t eq = entry.rfind('=');
    if (eq != std::string::npos) {
      const std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
      int c = 0;
      while (c < kCollectives && name != kCollectiveNames[c]) ++c;
      if (c == kCollectives) {
        throw InvalidArgument(strCat("invalid PYCCL_ALGO entry '", entry, "': '", name, "' is not a collective ",
                                     "(expected one of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast)"));
      }
      if (!isAlgorithmOf(static_cast<Collective>(c), value)) {
        throw InvalidArgument(strCat("invalid PYCCL_ALGO entry '", entry, "': ", name, " has ",
                                     joined(algorithmsOf(static_cast<Collective>(c)))));
      }
      named[c] = value;
      continue;
    }
    bool any = false;
    for (int c = 0; c < kCollectives; ++c) {
      if (!isAlgorithmOf(static_cast<Collective>(c), entry)) continue;
      any = true;
      if (bare[c].empty()) bare[c] = entry;
    }
    if (!any) throw InvalidArgument(strCat("invalid PYCCL_ALGO entry '", entry, "': not an algorithm of any collective"));
  }
  for (int c = 0; c < kCollectives; ++c) {
    if (named[c].empty()) named[c] = bare[c];
  }
  return named;
}

}  // namespace

const char* collectiveName(Collective c) { return kCollectiveNames[static_cast<int>(c)]; }

Collective parseCollective(const std::string& name, const char* what) {
  for (int c = 0; c < kCollectives; ++c) {
    if (name == kCollectiveNames[c]) return static_cast<Collective>(c);
  }
  throw InvalidArgument(strCat("invalid argument '", what, "': '", name, "' is not a collective (expected one of ",
                               "all_reduce, all_gather, reduce_scatter, all_to_all, broadcast)"));
}

const char* routeName(Route r) {
  switch (r) {
    case Route::kKernel: return "kernel";
    case Route::kPlan: return "plan";
    case Route::kNccl: return "nccl";
    case Route::kAcrossNodes: return "across_nodes";
  }
  return "?";
}

const char* choiceSourceName(ChoiceSource s) { return kSourceNames[static_cast<int>(s)]; }

const std::vector<std::string>& algorithmsOf(Collective c) {
  // Each algorithm family's own names (algorithms/), then NCCL.
  static const std::vector<std::string> allReduce = [] {
    std::vector<std::string> names = allReduceAlgorithmNames();
    names.emplace_back("nccl");
    return names;
  }();
  static const std::vector<std::string> exchange = {protocolName(Protocol::kLL), protocolName(Protocol::kHB), "nccl"};
  return c == Collective::kAllReduce ? allReduce : exchange;
}

std::optional<AllReduceAlgorithm> kernelOf(const Choice& choice) {
  if (choice.route != Route::kKernel || choice.algorithm.empty()) return std::nullopt;
  return parseAllReduceAlgorithm(choice.algorithm, "algorithm");
}

std::optional<AllReduceAlgorithm> symmetricOf(const Choice& choice) {
  if (choice.symmetricAlgorithm.empty() || choice.symmetricAlgorithm == "nccl") return std::nullopt;
  return parseAllReduceAlgorithm(choice.symmetricAlgorithm, "algorithm");
}

std::optional<Protocol> protocolOf(const Choice& choice) {
  if (choice.route != Route::kKernel || choice.algorithm.empty()) return std::nullopt;
  return parseProtocol(choice.algorithm, "algorithm");
}

PlanSlot planSlotOf(const Choice& choice, Collective c, uint64_t bytes, int worldSize) {
  if (choice.route != Route::kPlan) return {};
  if (choice.registeredPlan >= 0) return {strCat("registered ", choice.registeredPlan), 0};
  const RouteEntry& e = choice.entry;
  uint64_t limit = e.maxBytes;
  if (limit == UINT64_MAX) {  // the next power of two from the call's bytes, at least 64 KiB
    limit = uint64_t{1} << 16;
    while (limit < bytes) limit <<= 1;
  }
  // The runner's bound is on its input; an all-gather's bytes count its whole output.
  const uint64_t world = static_cast<uint64_t>(std::max(worldSize, 1));
  const uint64_t inputLimit = c == Collective::kAllGather ? (limit + world - 1) / world : limit;
  return {strCat("library ", e.algorithm, " ", e.instances, " ", e.threads, " ", limit), inputLimit};
}

std::array<uint64_t, kCollectives> defaultNcclMinBytes() {
  // all_reduce, all_gather, reduce_scatter, all_to_all, broadcast
  return {16ull << 20, 64ull << 20, 32ull << 20, 64ull << 20, 4ull << 20};
}

DefaultKernel engineDefaults(std::shared_ptr<CollectiveEngine> engine) {
  return [engine = std::move(engine)](Collective c, uint64_t bytes, bool symmetric) -> std::string {
    if (engine == nullptr) return "";
    if (c == Collective::kAllReduce) return allReduceAlgorithmName(engine->select(bytes, symmetric));
    return protocolName(engine->selectExchange(parseExchangeKind(collectiveName(c), "collective"), bytes));
  };
}

int registerPlan(RegisteredPlan plan) {
  PYCCL_CHECK_ARG(plan.inputChunks >= 1, "plan", "must split its input into at least one chunk");
  PlanRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  plan.id = r.nextId++;
  r.plans.push_back(plan);
  r.size = r.plans.size();
  return plan.id;
}

void unregisterPlan(int id) {
  PlanRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = std::find_if(r.plans.begin(), r.plans.end(), [&](const RegisteredPlan& p) { return p.id == id; });
  PYCCL_CHECK_ARG(it != r.plans.end(), "entry", "not a registered algorithm");
  r.plans.erase(it);
  r.size = r.plans.size();
}

Selector::Selector(SelectorConfig config, DefaultKernel defaultKernel)
    : config_(std::move(config)), defaultKernel_(std::move(defaultKernel)) {
  forcedByEnv_ = parseForced(std::getenv("PYCCL_ALGO"));
  const char* min = std::getenv("PYCCL_NCCL_MIN_BYTES");
  ncclMinFromEnv_ = min != nullptr && *min != '\0';
  if (ncclMinFromEnv_) ncclMinEnv_ = envCount("PYCCL_NCCL_MIN_BYTES", 0, kNever - 1, "bytes");
}

std::map<std::string, std::string> Selector::settings() const {
  std::map<std::string, std::string> out;
  std::string forced;
  for (int c = 0; c < kCollectives; ++c) {
    if (!forcedByEnv_[c].empty()) forced += strCat(forced.empty() ? "" : ",", kCollectiveNames[c], "=", forcedByEnv_[c]);
  }
  out["PYCCL_ALGO (environment, as read)"] = forced;
  out["PYCCL_NCCL_MIN_BYTES (environment)"] = ncclMinFromEnv_ ? strCat(ncclMinEnv_) : "";
  for (int c = 0; c < kCollectives; ++c) {
    out[strCat("the NCCL threshold of ", kCollectiveNames[c],
               " (PYCCL_NCCL_MIN_BYTES, NCCL_MIN_BYTES or the tuning table)")] =
        strCat(ncclMinBytes(static_cast<Collective>(c)));
  }
  return out;
}

Choice Selector::select(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, const std::string& forced,
                        bool nccl, bool plans, bool counted) const {
  Choice choice = choose(c, dtype, bytes, count, forced, nccl, plans);
  if (counted) record(c, choice);
  return choice;
}

uint64_t Selector::ncclFrom(Collective c, TableDtype dtype) const {
  if (ncclMinFromEnv_) return ncclMinEnv_;
  const std::vector<RouteEntry>& entries = config_.tables[static_cast<int>(dtype)][static_cast<int>(c)];
  if (entries.empty()) return config_.ncclMinBytes[static_cast<int>(c)];
  size_t first = entries.size();  // the first of the entries that end the table with NCCL
  while (first > 0 && entries[first - 1].route == Route::kNccl) --first;
  if (first == entries.size()) return UINT64_MAX;
  return first == 0 ? 0 : entries[first - 1].maxBytes + 1;
}

Choice Selector::named(const std::string& name, bool nccl, ChoiceSource source) const {
  if (name != "nccl") return routed(Route::kKernel, name, source);
  PYCCL_CHECK_ARG(nccl, "algorithm", "'nccl' needs a CUDA tensor and a torch group with an NCCL backend (or the "
                  "process group's NCCL delegate)", source == ChoiceSource::kEnvironment ? " (from PYCCL_ALGO)" : "");
  return routed(Route::kNccl, name, source);
}

Choice Selector::byDefault(Collective c, uint64_t bytes, bool nccl) const {
  if (nccl && bytes >= ncclMinBytes(c)) return routed(Route::kNccl, "nccl", ChoiceSource::kDefault);
  return routed(Route::kKernel, defaultKernel_(c, bytes, false), ChoiceSource::kDefault);
}

Choice Selector::choose(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, const std::string& forced,
                        bool nccl, bool plans) const {
  const int ci = static_cast<int>(c);
  // 1. Forced: the argument, else PYCCL_ALGO. It holds for symmetric buffers too.
  if (!forced.empty()) {
    PYCCL_CHECK_ARG(isAlgorithmOf(c, forced), "algorithm", "'", forced, "' is not an algorithm of ",
                    kCollectiveNames[ci], " (expected one of ", joined(algorithmsOf(c)), ")");
    return named(forced, nccl, ChoiceSource::kArgument);
  }
  if (!forcedByEnv_[ci].empty()) return named(forcedByEnv_[ci], nccl, ChoiceSource::kEnvironment);
  // Plans reduce only the float dtypes the tables are kept for: a reduction of any other (float64, float8, the
  // integers, bool) takes no plan, registered or in a table.
  const bool otherReduction =
      dtype == TableDtype::kOther && (c == Collective::kAllReduce || c == Collective::kReduceScatter);
  if (otherReduction) plans = false;
  // 2. A registered plan.
  PlanRegistry& r = registry();
  if (plans && r.size.load(std::memory_order_relaxed) != 0) {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const RegisteredPlan& p : r.plans) {
      if (p.collective == c && p.worldSize == config_.worldSize && p.minBytes <= bytes && bytes <= p.maxBytes &&
          count % p.inputChunks == 0) {
        Choice choice = routed(Route::kPlan, "", ChoiceSource::kRegisteredPlan);
        choice.registeredPlan = p.id;
        return choice;
      }
    }
  }
  // 3. Across nodes: NCCL from its threshold, else pyccl.across_nodes (which reduces the float dtypes only: the
  // others go to NCCL where the caller has it, else there to be refused).
  if (config_.acrossNodes && runsAcrossNodes(c)) {
    if (nccl && (bytes >= ncclMinBytes(c) || otherReduction)) {
      return routed(Route::kNccl, "nccl", ChoiceSource::kAcrossNodes);
    }
    return routed(Route::kAcrossNodes, "", ChoiceSource::kAcrossNodes);
  }
  // 4 and 5.
  Choice choice = byTableOrDefault(c, dtype, bytes, count, nccl, plans);
  if (c == Collective::kAllReduce && choice.route != Route::kPlan) {
    choice.symmetricAlgorithm = symmetricChoice(dtype, bytes, nccl);
  }
  return choice;
}

Choice Selector::byTableOrDefault(Collective c, TableDtype dtype, uint64_t bytes, uint64_t count, bool nccl,
                                  bool plans) const {
  const RouteEntry* e =
      ncclMinFromEnv_ ? nullptr : entryFor(config_.tables[static_cast<int>(dtype)][static_cast<int>(c)], bytes);
  if (e == nullptr) return byDefault(c, bytes, nccl);
  if (e->route == Route::kPlan && plans && count % e->inputChunks == 0) {
    // A library plan takes only inputs it splits into whole chunks.
    Choice choice = routed(Route::kPlan, e->algorithm, ChoiceSource::kTable);
    choice.entry = *e;
    return choice;
  }
  if (e->route == Route::kKernel) return routed(Route::kKernel, e->algorithm, ChoiceSource::kTable);
  if (e->route == Route::kNccl && nccl) return routed(Route::kNccl, "nccl", ChoiceSource::kTable);
  if (e->route == Route::kPlan && !e->fallback.empty()) {
    // The kernel measured fastest at the plan's sizes, from the call's own dtype's table.
    if (e->fallback != "nccl") return routed(Route::kKernel, e->fallback, ChoiceSource::kTable);
    if (nccl) return routed(Route::kNccl, "nccl", ChoiceSource::kTable);
  }
  // A table's NCCL entry where the caller has none, or a plan that cannot take it: the defaults' kernel.
  return routed(Route::kKernel, defaultKernel_(c, bytes, false), ChoiceSource::kDefault);
}

std::string Selector::symmetricChoice(TableDtype dtype, uint64_t bytes, bool nccl) const {
  // The table's all_reduce_symmetric entries (tables on); NCCL from PYCCL_NCCL_MIN_BYTES (tables off); else
  // the engine's zero-copy threshold and kernels.
  std::string chosen;
  if (!ncclMinFromEnv_) {
    const RouteEntry* e = entryFor(config_.allReduceSymmetric[static_cast<int>(dtype)], bytes);
    if (e != nullptr) chosen = e->route == Route::kNccl ? "nccl" : e->algorithm;
  } else if (nccl && bytes >= ncclMinEnv_) {
    chosen = "nccl";
  }
  if (chosen.empty()) chosen = defaultKernel_(Collective::kAllReduce, bytes, true);
  if (chosen == "nccl" && !nccl) chosen = "2pa_hb";
  return chosen;
}

void Selector::record(Collective c, const Choice& choice) const {
  int algo = kTracedAlgorithms - 1;  // a plan
  if (choice.route == Route::kKernel || choice.route == Route::kNccl) {
    const auto& names = algorithmsOf(c);
    algo = static_cast<int>(std::find(names.begin(), names.end(), choice.algorithm) - names.begin());
    if (algo >= kTracedAlgorithms - 1) algo = kTracedAlgorithms - 1;
  } else if (choice.route == Route::kAcrossNodes) {
    algo = kTracedAlgorithms - 2;
  }
  const size_t i = ((static_cast<size_t>(c) * 4 + static_cast<size_t>(choice.route)) * kTracedAlgorithms + algo) *
                       static_cast<size_t>(ChoiceSource::kCount) +
                   static_cast<size_t>(choice.source);
  counts_[i].fetch_add(1, std::memory_order_relaxed);
}

std::map<std::string, uint64_t> Selector::trace() const {
  std::map<std::string, uint64_t> out;
  for (int c = 0; c < kCollectives; ++c) {
    const auto& names = algorithmsOf(static_cast<Collective>(c));
    for (int r = 0; r < 4; ++r) {
      for (int a = 0; a < kTracedAlgorithms; ++a) {
        for (int s = 0; s < static_cast<int>(ChoiceSource::kCount); ++s) {
          const size_t i = ((static_cast<size_t>(c) * 4 + r) * kTracedAlgorithms + a) *
                               static_cast<size_t>(ChoiceSource::kCount) + s;
          const uint64_t n = counts_[i].load(std::memory_order_relaxed);
          if (n == 0) continue;
          std::string algo = a < static_cast<int>(names.size()) ? names[a] : "";
          const auto route = static_cast<Route>(r);
          if (route == Route::kPlan) algo = s == static_cast<int>(ChoiceSource::kRegisteredPlan) ? "registered" : "library";
          std::string key = strCat(kCollectiveNames[c], " ", routeName(route));
          if (!algo.empty()) key += " " + algo;
          out[strCat(key, " (", kSourceNames[s], ")")] = n;
        }
      }
    }
  }
  return out;
}

}  // namespace pyccl
