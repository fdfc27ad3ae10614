#include "dispatch/tuning_tables.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/errors.hpp"

namespace pyccl {

/// The shipped tables (name, JSON text), written by the build from src/pyccl/tuning_tables/*.json.
extern const std::vector<std::pair<std::string, std::string>>& shippedTuningTables();

namespace {

// A JSON value: just enough of JSON for tuning tables (objects, arrays, strings without \u escapes beyond
// ASCII, integers and other numbers, true, false, null).
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  bool integral = false;  ///< a number written without fraction or exponent, >= 0
  uint64_t integer = 0;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* find(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Json document() {
    Json v = value(0);
    skipSpace();
    if (i_ != s_.size()) fail("text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(strCat("tuning table ", source_, ": not a JSON tuning table (", what, " at offset ", i_,
                                 ")"));
  }
  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool take(char c) {
    skipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(strCat("expected '", c, "'"));
  }
  bool word(const char* w) {
    const size_t n = std::char_traits<char>::length(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > 16) fail("nesting too deep");
    skipSpace();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::Kind::kObject;
      if (take('}')) return v;
      do {
        skipSpace();
        std::string key = str();
        expect(':');
        v.object.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Json::Kind::kArray;
      if (take(']')) return v;
      do {
        v.array.push_back(value(depth + 1));
      } while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::kString;
      v.string = str();
    } else if (word("null")) {
      v.kind = Json::Kind::kNull;
    } else if (word("true") || word("false")) {
      v.kind = Json::Kind::kBool;
      v.boolean = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';
    } else {
      v.kind = Json::Kind::kNumber;
      const size_t start = i_;
      while (i_ < s_.size() && std::string_view("+-0123456789.eE").find(s_[i_]) != std::string_view::npos) ++i_;
      const std::string text = s_.substr(start, i_ - start);
      if (text.empty()) fail("unexpected character");
      char* end = nullptr;
      v.number = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size()) fail(strCat("bad number '", text, "'"));
      if (text.find_first_not_of("0123456789") == std::string::npos) {
        v.integral = true;
        v.integer = std::strtoull(text.c_str(), nullptr, 10);
      }
    }
    return v;
  }

  std::string str() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) break;
        const char e = s_[i_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {
            if (i_ + 4 > s_.size()) fail("bad \\u escape");
            const unsigned code = static_cast<unsigned>(std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16));
            i_ += 4;
            c = code < 0x80 ? static_cast<char>(code) : '?';  // table strings are ASCII
            break;
          }
          default: c = e;  // \" \\ \/
        }
      }
      out += c;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  const std::string& s_;
  const std::string& source_;
  size_t i_ = 0;
};

constexpr int kTableVersion = 1;

/// The collectives a table may hold: the selector's, and all_reduce_symmetric (whose algorithms are all_reduce's).
const char* const kTableCollectives[] = {"all_reduce", "all_gather",   "reduce_scatter",
                                         "all_to_all", "broadcast",    "all_reduce_symmetric"};

Collective collectiveOfTableKey(const std::string& key) {
  return parseCollective(key == "all_reduce_symmetric" ? "all_reduce" : key, "collective");
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(strCat("PYCCL_TUNING_FILE '", path, "': cannot be read (", std::strerror(errno), ")"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

RouteEntry routeEntryOf(const TuningTableEntry& e) {
  RouteEntry r;
  r.maxBytes = e.maxBytes.value_or(UINT64_MAX);
  if (e.algorithm == "plan") {
    r.route = Route::kPlan;
    r.algorithm = e.plan;
    r.instances = e.instances;
    r.threads = e.threads;
    r.fallback = e.kernel;
  } else {
    r.route = e.algorithm == "nccl" ? Route::kNccl : Route::kKernel;
    r.algorithm = e.algorithm;
  }
  return r;
}

}  // namespace

TuningTable parseTuningTable(const std::string& json, const std::string& source) {
  const Json doc = JsonReader(json, source).document();
  auto bad = [&](const std::string& what) { return InvalidArgument(strCat("tuning table ", source, ": ", what)); };
  if (doc.kind != Json::Kind::kObject) throw bad("expected a JSON object");
  const Json* version = doc.find("version");
  if (version == nullptr || !version->integral || version->integer != kTableVersion) {
    throw bad(strCat("expected version ", kTableVersion));
  }
  TuningTable t;
  t.source = source;
  const Json* world = doc.find("world");
  const Json* gpu = doc.find("gpu");
  const Json* dtype = doc.find("dtype");
  if (world == nullptr || !world->integral || world->integer < 1 || world->integer > 1024) {
    throw bad("'world' must be a world size");
  }
  if (gpu == nullptr || gpu->kind != Json::Kind::kString) throw bad("'gpu' must be a string");
  t.world = static_cast<int>(world->integer);
  t.gpu = gpu->string;
  if (dtype != nullptr && dtype->kind == Json::Kind::kString) t.dtype = dtype->string;
  const Json* collectives = doc.find("collectives");
  if (collectives == nullptr) return t;
  if (collectives->kind != Json::Kind::kObject) throw bad("'collectives' must be an object");
  for (const auto& [name, entries] : collectives->object) {
    if (std::find(std::begin(kTableCollectives), std::end(kTableCollectives), name) == std::end(kTableCollectives)) {
      throw bad(strCat("unknown collective '", name, "'"));
    }
    if (entries.kind != Json::Kind::kArray) throw bad(strCat(name, " must be a list of entries"));
    const auto& algorithms = algorithmsOf(collectiveOfTableKey(name));
    auto known = [&](const std::string& a) {
      return std::find(algorithms.begin(), algorithms.end(), a) != algorithms.end();
    };
    std::vector<TuningTableEntry>& out = t.collectives[name];
    for (size_t i = 0; i < entries.array.size(); ++i) {
      const Json& e = entries.array[i];
      const std::string where = strCat(name, " entry ", i);
      if (e.kind != Json::Kind::kObject) throw bad(strCat(where, " must be an object"));
      TuningTableEntry entry;
      const Json* maxBytes = e.find("max_bytes");
      if (maxBytes != nullptr && maxBytes->kind != Json::Kind::kNull) {
        if (!maxBytes->integral) throw bad(strCat(where, ": max_bytes must be a byte count or null"));
        entry.maxBytes = maxBytes->integer;
      }
      if (!entry.maxBytes && i + 1 != entries.array.size()) {
        throw bad(strCat(where, ": only the last entry may have no max_bytes"));
      }
      if (entry.maxBytes && !out.empty() && out.back().maxBytes && *entry.maxBytes <= *out.back().maxBytes) {
        throw bad(strCat(name, " entries must grow in max_bytes"));
      }
      const Json* algorithm = e.find("algorithm");
      if (algorithm == nullptr || algorithm->kind != Json::Kind::kString) throw bad(strCat(where, " has no algorithm"));
      entry.algorithm = algorithm->string;
      if (entry.algorithm == "plan") {
        const Json* plan = e.find("plan");
        const Json* kernel = e.find("kernel");
        if (plan == nullptr || plan->kind != Json::Kind::kString) throw bad(strCat(where, " names no plan"));
        entry.plan = plan->string;
        if (const Json* n = e.find("instances"); n != nullptr && n->integral) entry.instances = n->integer;
        if (const Json* n = e.find("threads"); n != nullptr && n->integral) entry.threads = n->integer;
        if (kernel != nullptr && kernel->kind == Json::Kind::kString) {
          if (!known(kernel->string) || kernel->string == "nccl") {
            throw bad(strCat(where, " has kernel '", kernel->string, "'"));
          }
          entry.kernel = kernel->string;
        }
      } else if (!known(entry.algorithm)) {
        throw bad(strCat(where, " has algorithm '", entry.algorithm, "'"));
      }
      out.push_back(std::move(entry));
    }
  }
  return t;
}

std::optional<std::string> shippedTableFor(const std::string& gpuName, int world, const std::string& dtype) {
  std::optional<std::string> best;
  for (const auto& [name, json] : shippedTuningTables()) {  // in name order (CMake's glob sorts)
    const TuningTable t = parseTuningTable(json, strCat("shipped ", name));
    if (t.world != world || gpuName.find(t.gpu) == std::string::npos) continue;
    if (!best || (!dtype.empty() && t.dtype == dtype)) best = name;
  }
  return best;
}

std::optional<TuningTable> tuningTableFor(const std::string& gpuName, int world, const std::string& dtype) {
  const char* path = std::getenv("PYCCL_TUNING_FILE");
  if (path != nullptr && *path != '\0') {
    std::string p(path);
    std::string lower = p;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "none") return std::nullopt;
    return parseTuningTable(readFile(p), strCat("'", p, "' (PYCCL_TUNING_FILE)"));
  }
  const std::optional<std::string> name = shippedTableFor(gpuName, world, dtype);
  if (!name) return std::nullopt;
  for (const auto& [shipped, json] : shippedTuningTables()) {
    if (shipped == *name) return parseTuningTable(json, strCat("shipped ", shipped));
  }
  return std::nullopt;
}

SelectorConfig selectorConfigFor(const std::string& gpuName, int world, bool acrossNodes) {
  SelectorConfig c;
  c.worldSize = world;
  c.acrossNodes = acrossNodes;
  c.ncclMinBytes = defaultNcclMinBytes();
  const char* const dtypes[kTableDtypes] = {"float32", "float16", "bfloat16", ""};
  for (int d = 0; d < kTableDtypes; ++d) {
    const std::optional<TuningTable> table = tuningTableFor(gpuName, world, dtypes[d]);
    if (!table) continue;
    for (const auto& [name, entries] : table->collectives) {
      std::vector<RouteEntry>& out = name == "all_reduce_symmetric"
                                         ? c.allReduceSymmetric[d]
                                         : c.tables[d][static_cast<int>(collectiveOfTableKey(name))];
      for (const TuningTableEntry& e : entries) out.push_back(routeEntryOf(e));
    }
  }
  return c;
}

KernelChoices kernelChoicesOf(const std::optional<TuningTable>& table) {
  KernelChoices choices;
  if (!table) return choices;
  for (const auto& [name, entries] : table->collectives) {
    std::vector<std::pair<std::optional<uint64_t>, std::string>> kept;
    for (const TuningTableEntry& e : entries) {
      const std::string& kernel = e.algorithm == "plan" ? e.kernel : e.algorithm;
      if (!kernel.empty() && kernel != "nccl") kept.emplace_back(e.maxBytes, kernel);
    }
    if (!kept.empty()) choices[name] = std::move(kept);
  }
  return choices;
}

void applyKernelChoices(CollectiveOptions& o, const KernelChoices& choices) {
  for (const auto& [collective, entries] : choices) {
    auto maxBytes = [](const std::optional<uint64_t>& m) { return m ? *m : UINT64_MAX; };
    if (collective == "all_reduce" || collective == "all_reduce_symmetric") {
      const bool symmetric = collective == "all_reduce_symmetric";
      auto& table = symmetric ? o.allReduceSymmetricBySize : o.allReduceBySize;
      table.clear();
      for (const auto& [m, name] : entries) {
        table.push_back({maxBytes(m), parseAllReduceAlgorithm(name, symmetric ? "all_reduce_symmetric_by_size"
                                                                              : "all_reduce_by_size")});
      }
      continue;
    }
    auto& table = o.exchangeBySize[static_cast<int>(parseExchangeKind(collective, "exchange_by_size"))];
    table.clear();
    for (const auto& [m, name] : entries) table.push_back({maxBytes(m), parseProtocol(name, "exchange_by_size")});
  }
}

}  // namespace pyccl
