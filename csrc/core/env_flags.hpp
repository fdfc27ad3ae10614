// pyccl's on/off environment variables, read with one vocabulary: a value
// that is neither on nor off is an error naming the variable, never a
// silent default.
#pragma once

namespace pyccl {

/// The on/off variable `name`: unset or empty gives `unset`; 1, true, yes and
/// on (any case) give true; 0, false, no and off give false; anything else
/// raises InvalidArgument naming the variable.
bool envFlag(const char* name, bool unset);

/// Reads every on/off variable pyccl has, so that a bad value fails where a
/// communicator is made rather than at the first call that reads it.
void checkEnvFlags();

}  // namespace pyccl
