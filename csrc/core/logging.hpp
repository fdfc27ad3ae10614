// Logging for the runtime. The level comes from PYCCL_LOG_LEVEL
// (TRACE, DEBUG, INFO, WARN, ERROR, OFF; default WARN); lines go to stderr as
//   [pyccl <pid> rank <r>] LEVEL file:line message
#pragma once

#include <sstream>
#include <string>

namespace pyccl {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

/// The level in force (read from PYCCL_LOG_LEVEL once, or set by setLogLevel).
LogLevel logLevel();
void setLogLevel(LogLevel level);
/// Parses a level name (case-insensitive); throws InvalidArgument naming `arg`.
LogLevel parseLogLevel(const std::string& name, const char* arg);

/// Sets the rank that this thread's log lines carry (-1: none).
void setLogRank(int rank);

void logLine(LogLevel level, const char* file, int line, const std::string& message);

}  // namespace pyccl

#define PYCCL_LOG(LEVEL, ...)                                                   \
  do {                                                                          \
    if (::pyccl::LogLevel::k##LEVEL >= ::pyccl::logLevel()) {                   \
      std::ostringstream _pyccl_os;                                             \
      _pyccl_os << __VA_ARGS__;                                                 \
      ::pyccl::logLine(::pyccl::LogLevel::k##LEVEL, __FILE__, __LINE__,         \
                       _pyccl_os.str());                                        \
    }                                                                           \
  } while (0)
