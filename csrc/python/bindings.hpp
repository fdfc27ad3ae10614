#pragma once

#include <torch/csrc/utils/pybind.h>

namespace pyccl {
void bindCommunicator(pybind11::module_& m);
void bindTensors(pybind11::module_& m);
void bindSelftest(pybind11::module_& m);
void bindCollectives(pybind11::module_& m);
void bindExecutor(pybind11::module_& m);
void bindBackend(pybind11::module_& m);
}  // namespace pyccl
