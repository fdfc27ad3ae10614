#include "core/env_settings.hpp"

#include "core/call_history.hpp"
#include "core/debug_options.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "core/errors.hpp"

namespace pyccl {

namespace {

const char* setValue(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? nullptr : v;
}

}  // namespace

bool envFlag(const char* name, bool unset) {
  const char* v = setValue(name);
  if (v == nullptr) return unset;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  // PYCCL_DEBUG=INFO is what a user of NCCL_DEBUG would try first.
  const bool debug = std::string(name) == "PYCCL_DEBUG";
  throw InvalidArgument(strCat("invalid argument '", name, "': expected 1 or 0 (also true/false, yes/no, on/off), "
                               "got '", v, "'", debug ? "; log levels are PYCCL_LOG_LEVEL's" : ""));
}

uint64_t envCount(const char* name, uint64_t unset, uint64_t max, const char* unit) {
  const char* v = setValue(name);
  if (v == nullptr) return unset;
  // strtoull would take a sign, leading blanks and "0x"; digits alone are what the documentation promises.
  uint64_t n = 0;
  bool fits = true;
  const char* p = v;
  for (; std::isdigit(static_cast<unsigned char>(*p)); ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (digit > max || n > (max - digit) / 10) fits = false;
    if (fits) n = n * 10 + digit;
  }
  if (*p != '\0' || !fits) {
    throw InvalidArgument(
        strCat("invalid argument '", name, "': must be a whole number", *unit ? " of " : "", unit, " up to ", max,
               ", got '", v, "'"));
  }
  return n;
}

std::string envChoice(const char* name, std::initializer_list<const char*> choices) {
  const char* v = setValue(name);
  if (v == nullptr) return *choices.begin();
  std::string listed;
  size_t i = 0;
  for (const char* c : choices) {
    if (std::string(v) == c) return v;
    listed += strCat(i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", "), c);
    ++i;
  }
  throw InvalidArgument(strCat("invalid argument '", name, "': must be ", listed, ", got '", v, "'"));
}

uint64_t proxySpinMicroseconds(bool gpu) {
  // A GPU's proxy polls 10 ms: a kernel waiting on a put or signal must not wait for a sleeping proxy to wake.
  // Host mode's ranks share few cores, so its proxies sleep after 1 ms.
  return envCount("PYCCL_PROXY_SPIN_US", gpu ? 10'000 : 1'000, 60'000'000, "microseconds");
}

std::string planTransport() { return envChoice("PYCCL_PLAN_TRANSPORT", {"auto", "rdma", "socket"}); }

// Both go into narrow verbs fields: ibv_qp_attr::timeout has 5 bits, the GRH's sgid_index 8.
uint8_t ibTimeout() { return static_cast<uint8_t>(envCount("PYCCL_IB_TIMEOUT", 18, 31, "")); }

int ibGidIndex() {
  constexpr uint64_t kChoose = ~0ull;
  const uint64_t i = envCount("PYCCL_IB_GID_INDEX", kChoose, 255, "");
  return i == kChoose ? -1 : static_cast<int>(i);
}

void checkEnvironment() {
  static const char* const kFlags[] = {"PYCCL_PDL", "PYCCL_PLAN_GENERIC_PACKETS", "PYCCL_RDMA_LOOPBACK",
                                       "PYCCL_ENABLE_NVLS", "PYCCL_PRELOAD_KERNELS", "PYCCL_ALLOW_SHARED_GPU",
                                       "PYCCL_DEBUG", "PYCCL_BLOCKING_WAIT", "PYCCL_NVTX"};
  for (const char* name : kFlags) (void)envFlag(name, false);
  (void)proxySpinMicroseconds(true);
  (void)planTransport();
  (void)debugOptions();
  (void)ibTimeout();
  (void)ibGidIndex();
  (void)historySizeFromEnv();
}

}  // namespace pyccl
