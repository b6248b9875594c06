#include "sidecar/exchange/step_table.h"

#include <algorithm>

#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange::internal {

StepTable::StepTable(int64_t first_step) : floor_(first_step) { begun_through_ = done_through_ = floor_ - 1; }

StepTable::Ticket StepTable::Begin(int64_t step) {
  const Ticket t = ++last_ticket_;
  steps_[t].step = step;
  steps_[t].generation = restarts_;
  Mark(step, begun_through_, begun_above_);
  return t;
}

StepState* StepTable::Find(Ticket t) {
  auto it = steps_.find(t);
  return it == steps_.end() ? nullptr : &it->second;
}

StepState& StepTable::at(Ticket t) {
  auto it = steps_.find(t);
  MESHLOAD_CHECK(it != steps_.end(), "exchange ticket " + std::to_string(t) + " is not open");
  return it->second;
}

void StepTable::Finish(Ticket t) {
  const StepState& st = at(t);
  if (st.generation == restarts_) Mark(st.step, done_through_, done_above_);
  steps_.erase(t);
}

void StepTable::Restart(int64_t step) {
  floor_ = step;
  ++restarts_;
  begun_through_ = done_through_ = step - 1;
  begun_above_.clear();
  done_above_.clear();
  for (auto& [t, st] : steps_) Skip(st);
}

void StepTable::Skip(StepState& st) {
  for (auto* v : {&st.in, &st.out}) {
    for (PartState& p : *v) {
      if (p.status == PartStatus::kWaiting) p.status = PartStatus::kSkipped;
    }
  }
}

void StepTable::Mark(int64_t step, int64_t& through, std::set<int64_t>& above) {
  if (step <= through) return;
  above.insert(step);
  while (!above.empty() && *above.begin() == through + 1) {
    through += 1;
    above.erase(above.begin());
  }
  while (above.size() > kHaveMemory) above.erase(above.begin());  // a gap that never fills: forget it
}

StepTable::Had StepTable::HadFrom(int64_t peer) const {
  Had had;
  had.floor = floor_;
  std::set<int64_t> waiting;
  for (const auto& [ticket, st] : steps_) {
    for (const PartState& p : st.in) {
      if (p.part.peer != peer) continue;
      if (p.status == PartStatus::kDone) {
        had.steps.insert(st.step);
      } else if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
        waiting.insert(st.step);
      }
    }
  }
  had.through = done_through_;
  if (!waiting.empty()) had.through = std::min(had.through, *waiting.begin() - 1);
  for (int64_t step : done_above_) {
    if (step > had.through) had.steps.insert(step);
  }
  for (int64_t step : waiting) had.steps.erase(step);
  return had;
}

std::set<int64_t> StepTable::HeldFor(int64_t peer) const {
  std::set<int64_t> held;
  for (const auto& [ticket, st] : steps_) {
    if (!st.sent && st.generation == restarts_) held.insert(st.step);
    for (const PartState& p : st.out) {
      if (p.part.peer == peer && (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy)) {
        held.insert(st.step);
      }
    }
  }
  return held;
}

}  // namespace meshload::sidecar::exchange::internal
