// Linked as a shared library at configure time: if the result defines
// ostream::_M_insert<long> itself, the compiler linked libstdc++ statically.
#include <sstream>
#include <string>

std::string pyccl_libstdcxx_probe(long x) {
  std::ostringstream os;
  os << x;
  return os.str();
}
