// Graph buffers: zero-copy all-reduces on plain tensors inside CUDA graphs.
//
// An all-reduce captured in a CUDA graph reads and writes the same addresses
// at every replay. So, as vLLM's custom all-reduce does, a call captured
// between begin() and finish() need not stage through scratch: its kernel
// reads every rank's input and writes every rank's output directly (the
// zero-copy body, algorithms/allreduce.cu), taking their addresses
// from a slot in device memory. While the graph is captured the peers'
// addresses are unknown; finish(), after the capture and on every rank,
// registers the captured tensors, exchanges them in one round trip, and
// writes each slot. The tensors' memory must then stay where it is while the
// graph may replay, as a graph's private memory pool keeps it.
//
// Every rank must capture the same calls in the same order (as with any
// collective), so that slot i means the same call everywhere; finish()
// refuses counts that differ. A replay before finish() finds null pointers,
// skips the call and breaks the communicator with an error that says so.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/allreduce.hpp"
#include "core/communicator.hpp"

namespace pyccl {

class GraphBuffers {
 public:
  /// Slots per page of device memory (128 bytes a slot: 4 MiB a page). Engines
  /// capture every batch size's graph in one block, a few thousand calls.
  static constexpr size_t kSlotsPerPage = 32768;

  explicit GraphBuffers(Communicator& comm) : comm_(comm) {}
  GraphBuffers(const GraphBuffers&) = delete;
  GraphBuffers& operator=(const GraphBuffers&) = delete;
  ~GraphBuffers() { release(); }

  /// Starts a capture's registration: calls captured from here until finish()
  /// may take slots. Allocates slot memory, so call it before the capture
  /// begins. InvalidArgument if one is already begun.
  void begin();
  /// Whether begin() was called and neither finish() nor abandon() since.
  bool active() const { return active_; }
  /// A slot for a captured call on [input, input + bytes) and [output,
  /// output + bytes), or null when this capture has used a page's worth (the
  /// call then takes the staged path; logged once per capture). Only while active().
  const SymmetricPointers* take(const void* input, void* output, uint64_t bytes);
  /// Collective, after the capture: registers every taken call's tensors and
  /// writes their slots; returns how many calls it registered. Every rank must
  /// have taken as many slots (else InvalidArgument on every rank).
  size_t finish();
  /// Ends a capture without registering (its graph must not be replayed).
  void abandon();
  /// Calls registered so far (for tests and logs).
  uint64_t registeredCalls() const { return registeredCalls_; }
  /// Unmaps and unregisters everything (idempotent).
  void release();

 private:
  struct Taken {
    SymmetricPointers* slot;
    const void* input;
    void* output;
    uint64_t bytes;
  };

  Communicator& comm_;
  bool active_ = false;
  bool warnedFull_ = false;
  std::vector<Taken> taken_;
  std::shared_ptr<void> page_;  ///< the page the current capture's slots come from
  size_t pageUsed_ = 0;
  std::vector<std::shared_ptr<void>> fullPages_;       ///< earlier pages, which earlier graphs read
  std::vector<ExchangedMemory> registrations_;         ///< every rank's captured tensors, held until release()
  uint64_t registeredCalls_ = 0;
};

}  // namespace pyccl
