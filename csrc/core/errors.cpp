#include "core/errors.hpp"

#include <cstring>

namespace pyccl {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kClosed: return "closed";
    case ErrorCode::kCuda: return "CUDA error";
    case ErrorCode::kSystem: return "system error";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kRemote: return "remote error";
    case ErrorCode::kType: return "type error";
  }
  return "unknown error";
}

void throwError(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgument(message);
    case ErrorCode::kTimeout: throw TimeoutError(message);
    case ErrorCode::kAborted: throw AbortedError(message);
    case ErrorCode::kClosed: throw ClosedError(message);
    case ErrorCode::kCuda: throw CudaError(message);
    case ErrorCode::kSystem: throw SystemError(message);
    case ErrorCode::kUnsupported: throw UnsupportedError(message);
    case ErrorCode::kRemote: throw RemoteError(message);
    case ErrorCode::kType: throw TypeError(message);
    case ErrorCode::kInternal: break;
  }
  throw InternalError(message);
}

void throwSystemError(const std::string& what, int errnum) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may not be buf.
  const char* msg = strerror_r(errnum, buf, sizeof(buf));
  throw SystemError(strCat(what, " failed: ", msg, " (errno ", errnum, ")"));
}

}  // namespace pyccl
