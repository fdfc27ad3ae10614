#include "core/host_memory.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace pyccl {
namespace {

std::mutex& tableMutex() {
  static std::mutex mu;
  return mu;
}

// base address -> allocation; weak so the table never keeps memory alive.
std::map<uintptr_t, std::weak_ptr<HostSharedMapping>>& table() {
  static auto* t = new std::map<uintptr_t, std::weak_ptr<HostSharedMapping>>();
  return *t;
}

size_t roundToPages(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

// An allocation that removes itself from the table when freed.
class OwnedHostSharedMapping : public HostSharedMapping {
 public:
  using HostSharedMapping::HostSharedMapping;
  ~OwnedHostSharedMapping() {
    std::lock_guard<std::mutex> lock(tableMutex());
    table().erase(reinterpret_cast<uintptr_t>(base()));
  }
};

}  // namespace

HostSharedMapping::~HostSharedMapping() {
  if (base_ != nullptr && ::munmap(base_, size_) != 0) {
    PYCCL_LOG(Error, "munmap of host shared memory failed: errno " << errno);
  }
}

std::shared_ptr<HostSharedMapping> allocateHostShared(size_t size) {
  PYCCL_CHECK_ARG(size > 0, "size", "must be > 0");
  const size_t bytes = roundToPages(size);
  UniqueFd fd(::memfd_create("pyccl-host", MFD_CLOEXEC));
  if (!fd) throwSystemError("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) throwSystemError("ftruncate", errno);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throwSystemError(strCat("mmap of ", bytes, " bytes"), errno);
  auto mapping = std::make_shared<OwnedHostSharedMapping>(base, bytes, std::move(fd));
  std::lock_guard<std::mutex> lock(tableMutex());
  table()[reinterpret_cast<uintptr_t>(base)] = mapping;
  return mapping;
}

std::shared_ptr<HostSharedMapping> findHostShared(const void* ptr, size_t size) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(tableMutex());
  auto& t = table();
  auto it = t.upper_bound(addr);
  if (it == t.begin()) return nullptr;
  --it;
  auto mapping = it->second.lock();
  if (!mapping) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(mapping->base());
  if (addr < base || addr + size > base + mapping->size()) return nullptr;
  return mapping;
}

std::shared_ptr<HostSharedMapping> mapHostShared(UniqueFd fd, size_t size) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) throwSystemError("fstat of received memfd", errno);
  if (static_cast<size_t>(st.st_size) < size) {
    throw RemoteError(strCat("received host memory of ", st.st_size, " bytes, expected at least ",
                             size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throwSystemError(strCat("mmap of imported ", size, " bytes"), errno);
  // The mapping keeps the memory alive; the fd is no longer needed.
  fd.reset();
  return std::make_shared<HostSharedMapping>(base, size, UniqueFd());
}

size_t numHostSharedAllocations() {
  std::lock_guard<std::mutex> lock(tableMutex());
  size_t live = 0;
  for (auto& [addr, weak] : table()) live += weak.expired() ? 0 : 1;
  return live;
}

}  // namespace pyccl
