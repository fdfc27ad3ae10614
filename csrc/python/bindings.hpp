#pragma once

#include <torch/csrc/utils/pybind.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/collective_engine.hpp"
#include "core/errors.hpp"
#include "dispatch/selector.hpp"
#include "dispatch/tuning_tables.hpp"

namespace pyccl {

/// An all-reduce algorithm given by name (None or "": the engine's choice); `arg` names the argument in errors.
std::optional<AllReduceAlgorithm> allReduceAlgorithmArg(const std::optional<std::string>& name, const char* arg);

/// A selector's config from its Python description (pyccl.selection.selector_config).
SelectorConfig selectorConfigFrom(const pybind11::dict& d);
/// A choice's library plan as pyccl.registry.library_runner takes it ({plan, instances, threads, max_bytes});
/// None for any other choice. With the GIL held.
pybind11::object libraryEntryOf(const Choice& choice);

void bindCommunicator(pybind11::module_& m);
void bindTensors(pybind11::module_& m);
void bindSelftest(pybind11::module_& m);
void bindCollectives(pybind11::module_& m);
void bindExecutor(pybind11::module_& m);
void bindBackend(pybind11::module_& m);
void bindDispatch(pybind11::module_& m);

/// Sets the Python error of `e` (pyccl._C's class for its code, its message); with the GIL held.
void setPythonError(const Error& e);
}  // namespace pyccl
