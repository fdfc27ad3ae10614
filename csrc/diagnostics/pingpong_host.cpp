#include "diagnostics/pingpong.hpp"

namespace pyccl {

PingPongResult runPingPongHost(const PingPongArgs& args) {
  PingPongResult result{};
  runPingPong(args, &result);
  return result;
}

}  // namespace pyccl
