#include "engine/collective_options.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <optional>
#include <utility>

#include "core/errors.hpp"
#include "core/serialize.hpp"

namespace pyccl {
namespace {

/// Entries in increasing maxBytes (a last one of UINT64_MAX included), each passed to `check`.
template <typename Choice, typename Check>
void checkBySize(const std::vector<SizeChoice<Choice>>& table, const char* what, Check&& check) {
  for (size_t i = 0; i < table.size(); ++i) {
    PYCCL_CHECK_ARG(i == 0 || table[i].maxBytes > table[i - 1].maxBytes, what,
                    "entries must grow in max bytes (entry ", i, " has ", table[i].maxBytes, " after ",
                    table[i - 1].maxBytes, ")");
    check(table[i].choice, table[i].maxBytes);
  }
}

/// "16 MiB" for whole MiB of a byte option, else the number.
std::string limitText(const char* name, uint64_t v) {
  const std::string n = name;
  const bool bytes = n.size() > 6 && n.compare(n.size() - 6, 6, "_bytes") == 0;
  if (bytes && v >= (1u << 20) && v % (1u << 20) == 0) return strCat(v >> 20, " MiB");
  return strCat(v);
}

/// InvalidArgument naming the option unless lo <= value <= hi and value is a multiple of step.
void checkOption(const char* name, uint64_t value, uint64_t lo, uint64_t hi, uint64_t step) {
  if (value >= lo && value <= hi && value % step == 0) return;
  std::string rule = step > 1 ? strCat("a multiple of ", step) : "";
  const bool bounded = hi != UINT64_MAX && hi != UINT32_MAX;
  if (lo > 0 && bounded) {
    rule += strCat(rule.empty() ? "" : " ", "in [", limitText(name, lo), ", ", limitText(name, hi), "]");
  } else if (bounded) {
    rule += strCat(rule.empty() ? "" : ", ", "at most ", limitText(name, hi));
  } else if (lo > 0) {
    rule += strCat(rule.empty() ? "" : ", ", "at least ", limitText(name, lo));
  }
  throw InvalidArgument(strCat("invalid argument '", name, "': must be ", rule, ", got ", value));
}

}  // namespace

const std::vector<CollectiveOptionInfo>& collectiveOptionInfos() {
  static const std::vector<CollectiveOptionInfo> infos = {
#define PYCCL_OPTION_INFO(type, member, name, initial, unset, lo, hi, step, use)                              \
  CollectiveOptionInfo{name, OptionUse::use, std::optional<uint64_t>(unset), std::is_same_v<type, bool>,       \
                       [](const CollectiveOptions& o) { return static_cast<uint64_t>(o.member); },             \
                       [](CollectiveOptions& o, uint64_t v) {                                                   \
                         PYCCL_CHECK_ARG(v <= static_cast<uint64_t>(std::numeric_limits<type>::max()), name,  \
                                         "must be at most ", std::numeric_limits<type>::max(), ", got ", v);   \
                         o.member = static_cast<type>(v);                                                       \
                       }},
      PYCCL_COLLECTIVE_OPTIONS(PYCCL_OPTION_INFO)
#undef PYCCL_OPTION_INFO
  };
  return infos;
}

CollectiveOptions resolveCollectiveOptions(CollectiveOptions o, bool host, int world) {
  // 64: 5% faster than 32 at 512 KiB-1 MiB on 4 x H200, the same below (docs/performance.md#history).
  if (o.llBlocks == 0) o.llBlocks = host ? 2 : 64;
  if (o.hbBlocks == 0) o.hbBlocks = host ? 2 : 128;
  if (o.llMaxBytes == 0) o.llMaxBytes = host ? (64u << 10) : (1u << 20);
  if (o.hbPieceBytes == 0) o.hbPieceBytes = host ? (1u << 20) : (16u << 20);
  // GPUs: where 1PA LL, 2PA LL and 2PA HB cross over on 4 x H200 (docs/performance.md#history).
  // A smaller ll_max_bytes lowers the default with it (1PA LL takes no more than the LL region).
  if (o.llThresholdBytes == 0) {
    o.llThresholdBytes = host ? o.llMaxBytes / 2 : std::min<uint64_t>(128u << 10, o.llMaxBytes);
  }
  const bool ll2Default = o.ll2ThresholdBytes == 0;
  if (ll2Default) o.ll2ThresholdBytes = host ? o.llMaxBytes : (1u << 20);
  if (o.zeroCopyThresholdBytes == 0) o.zeroCopyThresholdBytes = o.ll2ThresholdBytes;
  // 2 x H200: 1PA HB beats 2PA LL and 2PA HB from 1 MiB to 8 MiB (docs/performance.md#history). With the 2PA
  // LL threshold at 1PA LL's, it takes over from 1PA LL.
  if (o.onePhaseHBMaxBytes == 0 && !host && world == 2) {
    o.onePhaseHBMaxBytes = 8u << 20;
    if (ll2Default) o.ll2ThresholdBytes = o.llThresholdBytes;
  }
  // Where the pushing 2PA HB overtakes zero-copy on 4 and 2 x H200 (docs/performance.md#history).
  if (o.zeroCopyMaxBytes == 0) o.zeroCopyMaxBytes = host ? UINT64_MAX : (8u << 20);
  // GPUs: two kernels above 128 KiB, where they beat the one-shot and the two-shot in a
  // tensor-parallel decode step on 4 x H200 (hidden 8192 bf16; 32 tokens and more); the one-shot
  // up to there (docs/performance.md#history).
  if (o.fusedTwoKernelMinBytes == 0) {
    o.fusedTwoKernelMinBytes = host ? o.llMaxBytes + 1 : (128u << 10) + 1;
  }
  if (o.fusedTwoShotBytes == 0) o.fusedTwoShotBytes = host ? o.llMaxBytes / 2 : (256u << 10);
  // GPUs: up to 64 lanes of 2 slots of 64 KiB, 8 MiB per source rank: a transfer's rate grows with the bytes
  // its lanes have in flight, and this matches NCCL's at 256 MiB on 2 x H200 (docs/performance.md#history).
  if (o.p2pBlocks == 0) o.p2pBlocks = host ? 2 : 64;
  if (o.p2pSliceBytes == 0) o.p2pSliceBytes = host ? (4u << 10) : (64u << 10);
  // GPUs: LL up to 256 KiB, where the exchanges' LL (which moves the same bytes over the same links) still beats
  // their HB on 4 x H200, on lanes of one packet per thread (docs/performance.md#history).
  if (o.p2pLLMaxBytes == CollectiveOptions::kP2PLLDefault) o.p2pLLMaxBytes = host ? 2048 : (256u << 10);
  if (o.p2pLLLaneBytes == 0) o.p2pLLLaneBytes = host ? 1024 : (o.p2pThreads - 1) * 8ull;
  for (int k = 0; k < 4; ++k) {
    uint64_t& threshold = o.exchangeLLThresholdBytes[k];
    const bool broadcast = k == static_cast<int>(ExchangeKind::kBroadcast);
    // Where LL stops beating HB on 4 x H200 (docs/performance.md#history).
    if (threshold == 0) threshold = host ? o.llMaxBytes / 2 : (broadcast ? (128u << 10) : (512u << 10));
  }
  // Each option by its row, then the rules between options.
#define PYCCL_OPTION_CHECK(type, member, name, initial, unset, lo, hi, step, use) \
  checkOption(name, static_cast<uint64_t>(o.member), lo, hi, step);
  PYCCL_COLLECTIVE_OPTIONS(PYCCL_OPTION_CHECK)
#undef PYCCL_OPTION_CHECK
  PYCCL_CHECK_ARG(o.fusedSegments <= o.llBlocks, "fused_segments", "must be at most ll_blocks (", o.llBlocks,
                  "), got ", o.fusedSegments);
  PYCCL_CHECK_ARG(o.llThresholdBytes <= o.llMaxBytes, "ll_threshold_bytes",
                  "must not exceed ll_max_bytes (", o.llMaxBytes, ")");
  for (auto [table, name] : {std::pair{&o.allReduceBySize, "all_reduce_by_size"},
                             std::pair{&o.allReduceSymmetricBySize, "all_reduce_symmetric_by_size"}}) {
    checkBySize(*table, name, [&](AllReduceAlgorithm a, uint64_t maxBytes) {
      PYCCL_CHECK_ARG(a != AllReduceAlgorithm::kOnePhaseLL || maxBytes <= o.llMaxBytes, name,
                      "takes 1pa_ll up to ", maxBytes, " bytes, past ll_max_bytes (", o.llMaxBytes, ")");
    });
  }
  for (const auto& table : o.exchangeBySize) {
    checkBySize(table, "exchange_by_size", [](Protocol, uint64_t) {});
  }
  return o;
}

namespace {

/// One option as the ranks compare it: the option's name, where in it (a table entry, an exchange), the value.
struct AgreedField {
  std::string option;
  std::string detail;
  uint64_t value;
  std::optional<uint64_t> unset = std::nullopt;  ///< the value that asks for the default (not exchanged)
  std::optional<std::string> text = std::nullopt;  ///< a setting's value (agreedSettings), in place of `value`
};

std::string shown(const AgreedField& field, uint64_t value) {
  if (field.unset && value == *field.unset) return strCat(value == UINT64_MAX ? "None" : "0", " (the default)");
  return strCat(value);
}

std::string shown(const std::string& text) { return text.empty() ? "it unset" : strCat("'", text, "'"); }

template <typename Choice>
void addTable(std::vector<AgreedField>& fields, const char* option, const std::string& part,
              const std::vector<SizeChoice<Choice>>& table) {
  fields.push_back({option, strCat(part, "entries"), table.size()});
  for (size_t i = 0; i < table.size(); ++i) {
    fields.push_back({option, strCat(part, "entry ", i, "'s max bytes"), table[i].maxBytes});
    fields.push_back({option, strCat(part, "entry ", i, "'s choice"), static_cast<uint64_t>(table[i].choice)});
  }
}

/// Every option that shapes the scratch or picks an algorithm, by its Python name.
std::vector<AgreedField> agreedFields(const CollectiveOptions& o) {
  std::vector<AgreedField> f;
  for (const CollectiveOptionInfo& info : collectiveOptionInfos()) {
    if (info.use != OptionUse::kLaunch) f.push_back({info.name, "", info.get(o), info.unset});
  }
  for (uint32_t k = 0; k < 4; ++k) {
    const auto kind = static_cast<ExchangeKind>(k);
    f.push_back({"exchange_ll_threshold_bytes", exchangeKindName(kind), o.exchangeLLThresholdBytes[k], 0});
    addTable(f, "exchange_by_size", strCat(exchangeKindName(kind), " "), o.exchangeBySize[k]);
  }
  addTable(f, "all_reduce_by_size", "", o.allReduceBySize);
  addTable(f, "all_reduce_symmetric_by_size", "", o.allReduceSymmetricBySize);
  for (const auto& [name, value] : o.agreedSettings) f.push_back({name, "", 0, std::nullopt, value});
  return f;
}

std::vector<AgreedField> readFields(const Bytes& bytes) {
  ByteReader r(bytes, "exchanged engine options");
  std::vector<AgreedField> fields;
  for (uint64_t i = 0, n = r.get<uint64_t>(); i < n; ++i) {  // a corrupt count fails at its first missing field
    AgreedField& field = fields.emplace_back();
    field.option = r.getString();
    field.detail = r.getString();
    if (r.get<uint8_t>() != 0) {
      field.text = r.getString();
    } else {
      field.value = r.get<uint64_t>();
    }
  }
  return fields;
}

}  // namespace

void agreeOnCollectiveOptions(Communicator& comm, const CollectiveOptions& given) {
  if (comm.worldSize() < 2) return;
  const std::vector<AgreedField> mine = agreedFields(given);
  ByteWriter w;
  w.put<uint64_t>(mine.size());
  for (const auto& field : mine) {
    w.putString(field.option).putString(field.detail).put<uint8_t>(field.text ? 1 : 0);
    field.text ? w.putString(*field.text) : w.put<uint64_t>(field.value);
  }
  const std::vector<Bytes> all = comm.allGather(w.take());
  // Every rank compares every rank with rank 0, in the same order: all raise the same error, or none does.
  const std::vector<AgreedField> first = readFields(all[0]);
  for (int p = 1; p < comm.worldSize(); ++p) {
    const std::vector<AgreedField> theirs = readFields(all[p]);
    for (size_t i = 0; i < first.size() || i < theirs.size(); ++i) {
      if (i >= first.size() || i >= theirs.size() || theirs[i].option != first[i].option ||
          theirs[i].detail != first[i].detail) {
        throw UnsupportedError(strCat("collective engine of communicator '", comm.name(), "': ranks 0 and ", p,
                                      " list different options or settings (different pyccl builds?)"));
      }
      if (first[i].text || theirs[i].text) {
        if (first[i].text == theirs[i].text) continue;
        throw InvalidArgument(strCat(first[i].option, " must be the same on every rank of communicator '",
                                     comm.name(), "' (rank 0 has ", shown(first[i].text.value_or("")), ", rank ", p,
                                     " has ", shown(theirs[i].text.value_or("")), ")"));
      }
      if (first[i].value == theirs[i].value) continue;
      // What marks the default is not exchanged: this rank's list has it where its names match rank 0's.
      AgreedField field = first[i];
      if (i < mine.size() && mine[i].option == field.option && mine[i].detail == field.detail) {
        field.unset = mine[i].unset;
      }
      const std::string where = field.detail.empty() ? "" : field.detail + ": ";
      throw InvalidArgument(strCat("invalid argument '", field.option, "': must be the same on every rank of ",
                                   "communicator '", comm.name(), "' (", where, "rank 0 has ",
                                   shown(field, first[i].value), ", rank ", p, " has ", shown(field, theirs[i].value),
                                   ")"));
    }
  }
}

}  // namespace pyccl
