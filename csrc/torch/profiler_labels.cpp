#include "torch/profiler_labels.hpp"

#include <ATen/record_function.h>

#include <memory>
#include <string>

#include "core/call_history.hpp"

namespace pyccl {
namespace {

/// A record_function and the name it shows, which must outlive it.
struct ProfilerLabel {
  std::string text;
  at::RecordFunction record{at::RecordScope::USER_SCOPE};
};

bool profilerActive() { return at::hasCallbacks(); }

void* beginProfilerLabel(const std::string& text) {
  auto label = std::make_unique<ProfilerLabel>();
  if (!label->record.isActive()) return nullptr;
  label->text = text;
  label->record.before(std::string_view(label->text));
  return label.release();
}

// Its record_function ends as it is destroyed.
void endProfilerLabel(void* label) { delete static_cast<ProfilerLabel*>(label); }

}  // namespace

void installProfilerLabels() { setLabelHooks(LabelHooks{&profilerActive, &beginProfilerLabel, &endProfilerLabel}); }

}  // namespace pyccl
