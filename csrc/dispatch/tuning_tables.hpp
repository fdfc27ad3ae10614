// The tuning tables as the selector's entry points without Python read them
// (the NCCL-API library, csrc/nccl/): the tables shipped with the package,
// compiled in at build time from src/pyccl/tuning_tables/*.json, or the file
// PYCCL_TUNING_FILE names (read when a communicator is made). The format and
// its full check are pyccl.tuning's (docs/tuning.md, the published JSON
// Schema); this reader takes what the choice needs and refuses, naming the
// table, what it cannot use. A table is found as pyccl.tuning.load_table
// finds it: the one whose "gpu" is part of the device's name and whose world
// size matches, the call's dtype preferred.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/collective_options.hpp"
#include "dispatch/selector.hpp"

namespace pyccl {

/// One entry of a table, as written.
struct TuningTableEntry {
  std::optional<uint64_t> maxBytes;  ///< null: no limit (the last entry only)
  std::string algorithm;             ///< a kernel's name, "nccl", or "plan"
  std::string plan;                  ///< "plan": the library plan
  uint32_t instances = 0;
  uint32_t threads = 0;
  std::string kernel;  ///< "plan": the kernel that runs its sizes where the plan cannot ("" : none)
};

struct TuningTable {
  std::string source;  ///< the file, or "shipped <name>"
  std::string gpu;
  int world = 0;
  std::string dtype;
  /// By collective name (all_reduce ... broadcast, all_reduce_symmetric), in increasing maxBytes.
  std::map<std::string, std::vector<TuningTableEntry>> collectives;
};

/// Parses a table's JSON text; InvalidArgument naming `source` where it is not a table this reader can use.
TuningTable parseTuningTable(const std::string& json, const std::string& source);

/// The name of the shipped table for `gpuName` and `world` ranks, `dtype` preferred ("" for data movement of
/// any dtype): of those whose "gpu" is part of the device's name and whose world size matches, the last (by
/// name) of the dtype, else the first; nullopt where none matches. The one statement of that rule:
/// pyccl.tuning.load_table asks it too.
std::optional<std::string> shippedTableFor(const std::string& gpuName, int world, const std::string& dtype);

/// The table for `gpuName` and `world` ranks, `dtype` ("float32", "float16", "bfloat16"; "" for data movement
/// of any dtype) preferred: PYCCL_TUNING_FILE's ("none": no table), else a shipped one; nullopt where none
/// matches.
std::optional<TuningTable> tuningTableFor(const std::string& gpuName, int world, const std::string& dtype);

/// What a selector of `world` ranks on `gpuName` is made from: the tables of each dtype (plan entries give
/// their kernel: these entry points run no plans), the default NCCL thresholds, and whether ranks span nodes.
SelectorConfig selectorConfigFor(const std::string& gpuName, int world, bool acrossNodes);

/// A table's kernel entries per collective as (maxBytes, kernel), for an engine's own choice by size: plan
/// entries give their kernel; NCCL entries, and plan entries without one, are left out.
using KernelChoices = std::map<std::string, std::vector<std::pair<std::optional<uint64_t>, std::string>>>;
KernelChoices kernelChoicesOf(const std::optional<TuningTable>& table);
/// Sets `o`'s by-size choices (allReduceBySize, allReduceSymmetricBySize, exchangeBySize) from `choices`.
void applyKernelChoices(CollectiveOptions& o, const KernelChoices& choices);

}  // namespace pyccl
