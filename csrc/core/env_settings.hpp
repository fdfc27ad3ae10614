// pyccl's environment variables, each read with one rule for its kind: a
// value outside that rule is an error naming the variable, never a silent
// default or a number cut to fit.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace pyccl {

/// The on/off variable `name`: unset or empty gives `unset`; 1, true, yes and
/// on (any case) give true; 0, false, no and off give false; anything else
/// raises InvalidArgument naming the variable.
bool envFlag(const char* name, bool unset);

/// The whole-number variable `name` (decimal digits, nothing else): unset or
/// empty gives `unset`; anything else that is not a number up to `max` raises
/// InvalidArgument naming the variable and what it counts (`unit`, or "").
uint64_t envCount(const char* name, uint64_t unset, uint64_t max, const char* unit);

/// The variable `name` as one of `choices`: unset or empty gives the first;
/// anything else not among them raises InvalidArgument naming the variable
/// and the choices.
std::string envChoice(const char* name, std::initializer_list<const char*> choices);

/// The settings that are numbers or choices, each read by every user of it
/// through one of these (so its default and limits are written once):
/// PYCCL_PROXY_SPIN_US, in microseconds (`gpu`: a GPU's proxy, else host mode's).
uint64_t proxySpinMicroseconds(bool gpu);
/// PYCCL_PLAN_TRANSPORT: "auto", "rdma" or "socket".
std::string planTransport();
/// PYCCL_IB_TIMEOUT: the queue pair's local ACK timeout exponent (0-31).
uint8_t ibTimeout();
/// PYCCL_IB_GID_INDEX: the GID index (0-255), or -1 to choose one.
int ibGidIndex();

/// Reads every variable above, and the debug options (debug_options.hpp), so that a bad value fails where a communicator
/// is made rather than at the first call, proxy or transport that reads it
/// (or, for the RDMA ones, only on machines with a NIC).
void checkEnvironment();

}  // namespace pyccl
