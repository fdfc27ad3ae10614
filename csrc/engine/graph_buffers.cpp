#include "engine/graph_buffers.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "core/errors.hpp"
#include "core/gpu_runtime.hpp"
#include "core/logging.hpp"
#include "core/serialize.hpp"

namespace pyccl {

void GraphBuffers::begin() {
  if (active_) {
    throw InvalidArgument("graph_capture: this communicator is already in a graph_capture block; they do not nest");
  }
  // A fresh page unless the current one has room for a large capture: slots
  // stay where the graphs captured them, so a full page is kept, not reused.
  if (page_ == nullptr || pageUsed_ > kSlotsPerPage / 2) {
    if (page_ != nullptr) fullPages_.push_back(std::move(page_));
    page_ = comm_.allocateLocal(kSlotsPerPage * sizeof(SymmetricPointers));  // zeroed: "not registered"
    pageUsed_ = 0;
  }
  taken_.clear();
  warnedFull_ = false;
  active_ = true;
}

const SymmetricPointers* GraphBuffers::take(const void* input, void* output, uint64_t bytes) {
  if (!active_) return nullptr;
  if (pageUsed_ == kSlotsPerPage) {
    if (!warnedFull_) {
      PYCCL_LOG(Warn, "graph buffers: this capture took " << taken_.size()
                                                          << " slots, all there are; later calls stage as usual");
      warnedFull_ = true;
    }
    return nullptr;
  }
  auto* slot = static_cast<SymmetricPointers*>(page_.get()) + pageUsed_++;
  taken_.push_back({slot, input, output, bytes});
  return slot;
}

size_t GraphBuffers::finish() {
  if (!active_) throw InvalidArgument("graph_capture: this communicator is not in a graph_capture block");
  active_ = false;
  std::vector<Taken> taken = std::move(taken_);
  taken_.clear();

  // Registrations 2k and 2k + 1 are call k's input and output on every rank, so
  // that exchangeMemories pairs them across ranks whatever the ranks' addresses
  // (deduplicating by address would not: one rank's allocator may reuse an
  // address where another's does not). An in-place call's output is its input.
  // A failure here must not leave the peers waiting in the exchange: every
  // rank first reports how it went.
  std::vector<RegisteredMemory> locals;
  std::string failure;
  try {
    for (const auto& t : taken) {
      locals.push_back(comm_.registerMemory(const_cast<void*>(t.input), t.bytes));
      locals.push_back(t.output == t.input ? locals.back() : comm_.registerMemory(t.output, t.bytes));
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  ByteWriter w;
  w.put<uint64_t>(taken.size());
  w.putString(failure);
  const auto reports = comm_.allGather(w.take());
  std::string counts;
  std::string failures;
  bool same = true;
  for (int q = 0; q < comm_.worldSize(); ++q) {
    ByteReader r(reports[q], "graph buffer reports");
    const auto n = r.get<uint64_t>();
    const std::string why = r.getString();
    same = same && n == taken.size();
    counts += strCat(q == 0 ? "" : ", ", "rank ", q, ": ", n);
    if (!why.empty()) failures += strCat(failures.empty() ? "" : "; ", "rank ", q, ": ", why);
  }
  auto releaseLocals = [&] {
    for (auto& m : locals) m.release();
  };
  if (!failures.empty()) {
    releaseLocals();
    throw UnsupportedError(strCat("graph_capture: the captured all-reduces' tensors could not be registered (",
                                  failures, "); the graph must not be replayed"));
  }
  if (!same) {
    releaseLocals();
    throw InvalidArgument(strCat("graph_capture: every rank must capture the same all-reduces, in the same "
                                 "order; the ranks captured different numbers on graph buffers (",
                                 counts, "); the graph must not be replayed"));
  }
  if (taken.empty()) return 0;

  auto exchanged = comm_.exchangeMemories(locals, "graph_capture");
  std::vector<SymmetricPointers> pointers(taken.size());
  for (size_t k = 0; k < taken.size(); ++k) {
    for (int q = 0; q < comm_.worldSize(); ++q) {
      const auto& in = exchanged[2 * k][q];
      const auto& out = exchanged[2 * k + 1][q];
      if (!in || !out) {
        throw UnsupportedError(strCat("graph_capture: rank ", q, " cannot be reached by P2P"));
      }
      pointers[k].inputs[q] = static_cast<const char*>(in->data());
      pointers[k].outputs[q] = static_cast<char*>(out->data());
    }
  }
  for (size_t i = 0; i < locals.size(); ++i) registrations_.push_back({locals[i], std::move(exchanged[i])});
  // One capture's slots are consecutive in one page.
  void* first = taken.front().slot;
  const size_t bytes = pointers.size() * sizeof(SymmetricPointers);
  if (comm_.hostMode()) {
    std::memcpy(first, pointers.data(), bytes);
  } else {
    gpu::copyToDevice(comm_.device(), first, pointers.data(), bytes);
  }
  registeredCalls_ += taken.size();
  PYCCL_LOG(Info, "graph buffers: " << taken.size() << " captured all-reduces registered (" << locals.size()
                                    << " tensors)");
  return taken.size();
}

void GraphBuffers::abandon() {
  active_ = false;
  taken_.clear();
}

void GraphBuffers::release() {
  active_ = false;
  taken_.clear();
  for (auto& r : registrations_) r.release();
  registrations_.clear();
  page_.reset();
  fullPages_.clear();
}

}  // namespace pyccl
