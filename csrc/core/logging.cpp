#include "core/logging.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/errors.hpp"

namespace pyccl {
namespace {

LogLevel levelFromEnv() {
  const char* env = std::getenv("PYCCL_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kWarn;
  try {
    return parseLogLevel(env, "PYCCL_LOG_LEVEL");
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "[pyccl] %s; using WARN\n", e.what());
    return LogLevel::kWarn;
  }
}

std::atomic<int>& levelStorage() {
  static std::atomic<int> level{static_cast<int>(levelFromEnv())};
  return level;
}

thread_local int tlsRank = -1;

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kOff: return "OFF";
  }
  return "?";
}

}  // namespace

LogLevel logLevel() { return static_cast<LogLevel>(levelStorage().load(std::memory_order_relaxed)); }

void setLogLevel(LogLevel level) { levelStorage().store(static_cast<int>(level)); }

LogLevel parseLogLevel(const std::string& name, const char* arg) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (int i = 0; i <= static_cast<int>(LogLevel::kOff); ++i) {
    if (upper == levelName(static_cast<LogLevel>(i))) return static_cast<LogLevel>(i);
  }
  if (upper == "WARNING") return LogLevel::kWarn;
  PYCCL_CHECK_ARG(false, arg, "unknown log level '", name,
                  "' (expected TRACE, DEBUG, INFO, WARN, ERROR or OFF)");
  return LogLevel::kOff;  // unreachable
}

void setLogRank(int rank) { tlsRank = rank; }

void logLine(LogLevel level, const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (tlsRank >= 0) {
    std::fprintf(stderr, "[pyccl %d rank %d] %s %s:%d %s\n", static_cast<int>(getpid()), tlsRank,
                 levelName(level), base, line, message.c_str());
  } else {
    std::fprintf(stderr, "[pyccl %d] %s %s:%d %s\n", static_cast<int>(getpid()), levelName(level),
                 base, line, message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace pyccl
