#include "core/env_flags.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "core/errors.hpp"

namespace pyccl {

bool envFlag(const char* name, bool unset) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return unset;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  // PYCCL_DEBUG=INFO is what a user of NCCL_DEBUG would try first.
  const bool debug = std::string(name) == "PYCCL_DEBUG";
  throw InvalidArgument(strCat("invalid argument '", name, "': expected 1 or 0 (also true/false, yes/no, on/off), "
                               "got '", v, "'", debug ? "; log levels are PYCCL_LOG_LEVEL's" : ""));
}

void checkEnvFlags() {
  static const char* const kFlags[] = {"PYCCL_PDL", "PYCCL_PLAN_GENERIC_PACKETS", "PYCCL_RDMA_LOOPBACK",
                                       "PYCCL_ENABLE_NVLS", "PYCCL_PRELOAD_KERNELS", "PYCCL_ALLOW_SHARED_GPU",
                                       "PYCCL_DEBUG", "PYCCL_BLOCKING_WAIT"};
  for (const char* name : kFlags) (void)envFlag(name, false);
}

}  // namespace pyccl
