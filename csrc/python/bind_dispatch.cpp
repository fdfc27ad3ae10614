// Bindings of the selector (dispatch/selector.hpp): pyccl._C.Selector, the
// registry of plans, and the config a Python dict describes.
#include <torch/extension.h>

#include <algorithm>

#include "engine/collective_engine.hpp"
#include "dispatch/selector.hpp"
#include "python/bindings.hpp"

namespace py = pybind11;

namespace pyccl {
namespace {

TableDtype tableDtypeNamed(const std::string& name) {
  if (name == "float32") return TableDtype::kFloat32;
  if (name == "float16") return TableDtype::kFloat16;
  if (name == "bfloat16") return TableDtype::kBFloat16;
  if (name == "other") return TableDtype::kOther;
  throw InvalidArgument(strCat("invalid argument 'config': table dtype '", name,
                               "' (expected float32, float16, bfloat16 or other)"));
}

Route routeNamed(const std::string& name) {
  if (name == "kernel") return Route::kKernel;
  if (name == "nccl") return Route::kNccl;
  if (name == "plan") return Route::kPlan;
  throw InvalidArgument(strCat("invalid argument 'config': route '", name, "' (expected kernel, nccl or plan)"));
}

/// [(max_bytes or None, route, algorithm, instances, threads, input_chunks, fallback), ...]
std::vector<RouteEntry> entriesFrom(const py::handle& list, Collective c) {
  std::vector<RouteEntry> out;
  for (const py::handle item : list) {
    const auto t = item.cast<py::tuple>();
    PYCCL_CHECK_ARG(t.size() == 7, "config", "a table entry is (max_bytes, route, algorithm, instances, threads, "
                    "input_chunks, fallback)");
    RouteEntry e;
    e.maxBytes = t[0].is_none() ? UINT64_MAX : t[0].cast<uint64_t>();
    e.route = routeNamed(t[1].cast<std::string>());
    e.algorithm = t[2].cast<std::string>();
    e.instances = t[3].cast<uint32_t>();
    e.threads = t[4].cast<uint32_t>();
    e.inputChunks = t[5].cast<uint64_t>();
    e.fallback = t[6].is_none() ? std::string() : t[6].cast<std::string>();
    PYCCL_CHECK_ARG(e.inputChunks >= 1, "config", "a plan entry's input_chunks must be at least 1");
    const auto& names = algorithmsOf(c);
    PYCCL_CHECK_ARG(e.fallback.empty() || std::find(names.begin(), names.end(), e.fallback) != names.end(),
                    "config", "a plan entry's fallback '", e.fallback, "' is not an algorithm of ",
                    collectiveName(c));
    out.push_back(std::move(e));
  }
  return out;
}

/// A torch dtype, or the TableDtype's number (what pyccl.selection passes: no string per call).
TableDtype tableDtypeOf(const py::handle& dtype) {
  if (py::isinstance<py::int_>(dtype)) {
    const int n = dtype.cast<int>();
    PYCCL_CHECK_ARG(n >= 0 && n < kTableDtypes, "dtype", "table dtype ", n, " (expected 0 to ", kTableDtypes - 1, ")");
    return static_cast<TableDtype>(n);
  }
  const std::string name = py::str(dtype);
  if (name == "torch.float32") return TableDtype::kFloat32;
  if (name == "torch.float16") return TableDtype::kFloat16;
  if (name == "torch.bfloat16") return TableDtype::kBFloat16;
  return TableDtype::kOther;
}

}  // namespace

SelectorConfig selectorConfigFrom(const py::dict& d) {
  SelectorConfig c;
  c.worldSize = d["world"].cast<int>();
  c.acrossNodes = d.contains("across_nodes") && d["across_nodes"].cast<bool>();
  const auto mins = d["nccl_min_bytes"].cast<std::vector<uint64_t>>();
  PYCCL_CHECK_ARG(mins.size() == static_cast<size_t>(kCollectives), "config", "nccl_min_bytes needs ", kCollectives,
                  " sizes (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast)");
  std::copy(mins.begin(), mins.end(), c.ncclMinBytes.begin());
  if (d.contains("tables")) {
    for (const auto& [dtype, collectives] : d["tables"].cast<py::dict>()) {
      const int dt = static_cast<int>(tableDtypeNamed(dtype.cast<std::string>()));
      for (const auto& [name, entries] : collectives.cast<py::dict>()) {
        const std::string collective = name.cast<std::string>();
        if (collective == "all_reduce_symmetric") {
          c.allReduceSymmetric[dt] = entriesFrom(entries, Collective::kAllReduce);
        } else {
          const Collective parsed = parseCollective(collective, "config");
          c.tables[dt][static_cast<int>(parsed)] = entriesFrom(entries, parsed);
        }
      }
    }
  }
  return c;
}

py::object libraryEntryOf(const Choice& choice) {
  if (choice.route != Route::kPlan || choice.registeredPlan >= 0) return py::none();
  const RouteEntry& e = choice.entry;
  return py::dict(py::arg("plan") = e.algorithm, py::arg("instances") = e.instances, py::arg("threads") = e.threads,
                  py::arg("max_bytes") = e.maxBytes == UINT64_MAX ? py::object(py::none()) : py::int_(e.maxBytes));
}

void bindDispatch(py::module_& m) {
  py::class_<Selector, std::shared_ptr<Selector>>(m, "Selector",
                                                  "The choice of what runs each collective call (dispatch/selector.hpp).")
      .def(py::init([](const py::dict& config, std::shared_ptr<CollectiveEngine> engine) {
             return std::make_shared<Selector>(selectorConfigFrom(config), engineDefaults(std::move(engine)));
           }),
           py::arg("config"), py::arg("engine") = nullptr)
      .def(
          "select",
          [](const Selector& s, const std::string& collective, const py::handle& dtype, uint64_t nbytes,
             uint64_t count, const std::optional<std::string>& algorithm, bool nccl, bool plans) {
            const Collective c = parseCollective(collective, "collective");
            const Choice ch = s.select(c, tableDtypeOf(dtype), nbytes, count, algorithm.value_or(""), nccl, plans);
            const PlanSlot slot = planSlotOf(ch, c, nbytes, s.config().worldSize);
            return py::make_tuple(routeName(ch.route), ch.algorithm, ch.symmetricAlgorithm, ch.registeredPlan,
                                  libraryEntryOf(ch), choiceSourceName(ch.source),
                                  slot.key.empty() ? py::object(py::none())
                                                   : py::object(py::make_tuple(slot.key, slot.inputLimit)));
          },
          py::arg("collective"), py::arg("dtype"), py::arg("nbytes"), py::arg("count"), py::arg("algorithm"),
          py::arg("nccl"), py::arg("plans") = true,
          "(route, algorithm, symmetric algorithm, registered plan id, library plan entry or None, source, plan "
          "slot) of a call; the plan slot, (key, input byte limit) or None, is where the communicator keeps the "
          "plan's runner (executor/plan_runners.hpp).")
      .def("forced", [](const Selector& s, const std::string& c) { return s.forcedByEnvironment(parseCollective(c, "collective")); },
           py::arg("collective"), "PYCCL_ALGO's algorithm for the collective, as read when the selector was made.")
      .def("nccl_from",
           [](const Selector& s, const std::string& c, const py::handle& dtype) {
             return s.ncclFrom(parseCollective(c, "collective"), tableDtypeOf(dtype));
           },
           py::arg("collective"), py::arg("dtype"),
           "The size from which every call of the collective on the dtype goes to NCCL where the caller has it "
           "(2**64 - 1: none): PYCCL_NCCL_MIN_BYTES, else the table's, else NCCL_MIN_BYTES's.")
      .def("trace", &Selector::trace, "Choices made so far, per 'collective route algorithm (source)'.")
      .def("settings", &Selector::settings);
  m.def(
      "shipped_table_for",
      [](const std::string& gpu, int world, const std::optional<std::string>& dtype) {
        return shippedTableFor(gpu, world, dtype.value_or(""));
      },
      py::arg("gpu"), py::arg("world"), py::arg("dtype") = std::nullopt,
      "The file name of the shipped tuning table for the GPU (its name) and world size, the dtype preferred; None "
      "where none matches.");
  m.def(
      "kernel_choices_of",
      [](const std::string& tableJson, const std::string& source) {
        return kernelChoicesOf(parseTuningTable(tableJson, source));
      },
      py::arg("table_json"), py::arg("source"),
      "A tuning table's kernel entries per collective, as (max_bytes, kernel), for an engine's own choice by "
      "size: plan entries give their kernel; NCCL entries, and plan entries without one, are left out.");
  m.def("default_nccl_min_bytes", [] { return defaultNcclMinBytes(); },
        "The sizes from which NCCL runs each collective where no table decides (all_reduce, all_gather, "
        "reduce_scatter, all_to_all, broadcast).");
  m.def("algorithms_of", [](const std::string& c) { return algorithmsOf(parseCollective(c, "collective")); },
        py::arg("collective"), "The algorithms a collective can be forced or tuned to: its kernels, then nccl.");
  m.def(
      "register_plan",
      [](const std::string& collective, uint64_t minBytes, uint64_t maxBytes, int world, uint64_t chunks) {
        RegisteredPlan p;
        p.collective = parseCollective(collective, "collective");
        p.minBytes = minBytes;
        p.maxBytes = maxBytes;
        p.worldSize = world;
        p.inputChunks = chunks;
        return registerPlan(p);
      },
      py::arg("collective"), py::arg("min_bytes"), py::arg("max_bytes"), py::arg("world_size"), py::arg("input_chunks"),
      "Puts a plan into every selector's choice (pyccl.register_algorithm); returns its id.");
  m.def("unregister_plan", &unregisterPlan, py::arg("id"));
}

}  // namespace pyccl
