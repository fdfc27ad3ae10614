// What every op of the pyccl process group does around its body: pyccl's
// errors become the c10 errors torch raises as Python's TypeError, ValueError,
// NotImplementedError and DistBackendError; the one-tensor-per-rank check.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "core/errors.hpp"

namespace pyccl {

/// Runs `body`, turning pyccl's errors into the c10 errors torch maps to
/// Python's TypeError / ValueError / NotImplementedError / DistBackendError,
/// each message starting "pyccl <op>: ".
template <typename Body>
auto translated(const char* op, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const TypeError& e) {
    TORCH_CHECK_TYPE(false, "pyccl ", op, ": ", e.what());
  } catch (const InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, "pyccl ", op, ": ", e.what());
  } catch (const UnsupportedError& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "pyccl ", op, ": ", e.what());
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, strCat("pyccl ", op, ": ", e.what()));
  }
}

/// InvalidArgument naming `arg` unless `tensors` holds one tensor (one device per rank).
inline void checkOne(const std::vector<at::Tensor>& tensors, const char* arg) {
  PYCCL_CHECK_ARG(tensors.size() == 1, arg, "pyccl takes one tensor per process (one device per rank), got ",
                  tensors.size());
}

}  // namespace pyccl
