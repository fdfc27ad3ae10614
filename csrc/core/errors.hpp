// Errors of the pyccl runtime. Each C++ exception type maps to one Python
// exception class (csrc/python/module.cpp), with the message intact.
#pragma once

#include <stdexcept>
#include <string>
#include <sstream>

namespace pyccl {

enum class ErrorCode : int {
  kInternal = 0,
  kInvalidArgument = 1,  ///< a bad argument; the message names it
  kTimeout = 2,          ///< a bounded wait ran out; the message names op and peer
  kAborted = 3,          ///< the communicator was aborted while waiting
  kClosed = 4,           ///< the communicator (or memory) was already destroyed
  kCuda = 5,             ///< a CUDA runtime or driver call failed
  kSystem = 6,           ///< a system call failed
  kUnsupported = 7,      ///< not available in this build or on this machine
  kRemote = 8,           ///< a peer reported an error or a mismatch
  kType = 9,             ///< an unsupported dtype (or dtype/op pair); the message names it
};

const char* errorCodeName(ErrorCode code);

/// Base of every pyccl exception.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

#define PYCCL_DEFINE_ERROR(Name, Code)                                   \
  class Name : public Error {                                            \
   public:                                                               \
    explicit Name(const std::string& message) : Error(Code, message) {}  \
  };

PYCCL_DEFINE_ERROR(InternalError, ErrorCode::kInternal)
PYCCL_DEFINE_ERROR(InvalidArgument, ErrorCode::kInvalidArgument)
PYCCL_DEFINE_ERROR(TimeoutError, ErrorCode::kTimeout)
PYCCL_DEFINE_ERROR(AbortedError, ErrorCode::kAborted)
PYCCL_DEFINE_ERROR(ClosedError, ErrorCode::kClosed)
PYCCL_DEFINE_ERROR(CudaError, ErrorCode::kCuda)
PYCCL_DEFINE_ERROR(SystemError, ErrorCode::kSystem)
PYCCL_DEFINE_ERROR(UnsupportedError, ErrorCode::kUnsupported)
PYCCL_DEFINE_ERROR(RemoteError, ErrorCode::kRemote)
PYCCL_DEFINE_ERROR(TypeError, ErrorCode::kType)
#undef PYCCL_DEFINE_ERROR

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  appendAll(os, rest...);
}
}  // namespace detail

/// Concatenates its arguments with operator<<.
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

/// Throws the exception class of `code` with `message`.
[[noreturn]] void throwError(ErrorCode code, const std::string& message);

/// Throws SystemError with strerror(errnum) appended.
[[noreturn]] void throwSystemError(const std::string& what, int errnum);

}  // namespace pyccl

/// Throws InvalidArgument naming `arg` unless `cond` holds.
#define PYCCL_CHECK_ARG(cond, arg, ...)                                       \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw ::pyccl::InvalidArgument(                                         \
          ::pyccl::strCat("invalid argument '", arg, "': ", __VA_ARGS__));    \
    }                                                                         \
  } while (0)

/// Throws InternalError unless `cond` holds (a bug in pyccl, not in the caller).
#define PYCCL_ASSERT(cond, ...)                                               \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw ::pyccl::InternalError(::pyccl::strCat(                           \
          "internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " ",    \
          ##__VA_ARGS__));                                                    \
    }                                                                         \
  } while (0)

/// Throws SystemError with errno when a POSIX call returns -1.
#define PYCCL_CHECK_SYS(call)                                                 \
  do {                                                                        \
    if ((call) == -1) ::pyccl::throwSystemError(#call, errno);               \
  } while (0)
