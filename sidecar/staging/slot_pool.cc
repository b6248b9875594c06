#include "sidecar/staging/slot_pool.h"

#include <algorithm>
#include <string>

#include "common/status.h"

namespace meshload::sidecar::staging {

SlotPool::SlotPool(uint32_t slots, int64_t first_step, Clock* clock)
    : size_(slots), clock_(clock != nullptr ? clock : Clock::Real()), slots_(slots), next_fill_(first_step) {}

std::optional<uint32_t> SlotPool::WaitForFree(uint64_t generation, std::chrono::milliseconds timeout) {
  const auto deadline = clock_->Now() + timeout;
  while (true) {
    if (shutdown_ || generation != generation_) return std::nullopt;
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].state == SlotState::kFree) return i;
    }
    if (!clock_->WaitUntil(free_, mu_, deadline)) return std::nullopt;
  }
}

std::optional<uint32_t> SlotPool::AcquireForFill(int64_t step, uint64_t generation, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  auto slot = WaitForFree(generation, timeout);
  if (slot) slots_[*slot] = {SlotState::kFilling, step, generation};
  return slot;
}

std::optional<SlotPool::Fill> SlotPool::AcquireNextForFill(uint64_t generation, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  auto slot = WaitForFree(generation, timeout);
  if (!slot) return std::nullopt;
  slots_[*slot] = {SlotState::kFilling, next_fill_, generation};
  return Fill{*slot, next_fill_++};
}

int64_t SlotPool::next_fill_step() const {
  MutexLock lock(mu_);
  return next_fill_;
}

int64_t SlotPool::FirstPendingStep() const {
  MutexLock lock(mu_);
  int64_t first = next_fill_;
  for (const Slot& s : slots_) {
    if ((s.state == SlotState::kFilling || s.state == SlotState::kReady) && s.generation == generation_) {
      first = std::min(first, s.step);
    }
  }
  return first;
}

int64_t SlotPool::FirstFillingStep() const {
  MutexLock lock(mu_);
  int64_t first = next_fill_;
  for (const Slot& s : slots_) {
    if (s.state == SlotState::kFilling && s.generation == generation_) first = std::min(first, s.step);
  }
  return first;
}

bool SlotPool::MarkReady(uint32_t slot) {
  MutexLock lock(mu_);
  MESHLOAD_CHECK(slot < slots_.size(), "slot " + std::to_string(slot) + " is not one of the pool's");
  Slot& s = slots_[slot];
  if (s.state != SlotState::kFilling) return false;
  const bool current = s.generation == generation_ && !shutdown_;
  s.state = current ? SlotState::kReady : SlotState::kFree;
  if (!current) s.step = -1;
  if (current) {
    ready_.NotifyAll();
  } else {
    free_.NotifyOne();
  }
  return current;
}

void SlotPool::AbandonFill(uint32_t slot) {
  MutexLock lock(mu_);
  MESHLOAD_CHECK(slot < slots_.size(), "slot " + std::to_string(slot) + " is not one of the pool's");
  Slot& s = slots_[slot];
  if (s.state == SlotState::kFilling) s = Slot{};
  free_.NotifyOne();
}

std::optional<uint32_t> SlotPool::Lease(int64_t step) {
  MutexLock lock(mu_);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kReady && s.step == step && s.generation == generation_) {
      s.state = SlotState::kLeased;  // frees nothing and readies nothing: no waiter to wake
      return i;
    }
  }
  return std::nullopt;
}

bool SlotPool::Release(uint32_t slot, int64_t step) {
  MutexLock lock(mu_);
  if (slot >= slots_.size()) return false;
  Slot& s = slots_[slot];
  if (s.state != SlotState::kLeased || s.step != step) return false;
  s = Slot{};
  free_.NotifyOne();  // one slot: one producer (a broadcast would wake them all for it)
  return true;
}

uint64_t SlotPool::Reset(int64_t next_step) {
  MutexLock lock(mu_);
  return ResetLocked(next_step);
}

uint64_t SlotPool::Reset() {
  MutexLock lock(mu_);
  return ResetLocked(next_fill_);
}

uint64_t SlotPool::ResetLocked(int64_t next_step) {
  next_fill_ = next_step;
  ++generation_;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kReady) s = Slot{};
  }
  free_.NotifyAll();  // producers of the old generation return
  ready_.NotifyAll();
  return generation_;
}

uint64_t SlotPool::generation() const {
  MutexLock lock(mu_);
  return generation_;
}

void SlotPool::Shutdown() {
  MutexLock lock(mu_);
  shutdown_ = true;
  free_.NotifyAll();
  ready_.NotifyAll();
}

SlotCounts SlotPool::Counts() const {
  MutexLock lock(mu_);
  SlotCounts c;
  for (const Slot& s : slots_) {
    switch (s.state) {
      case SlotState::kFree: ++c.free; break;
      case SlotState::kFilling: ++c.filling; break;
      case SlotState::kReady: ++c.ready; break;
      case SlotState::kLeased: ++c.leased; break;
    }
  }
  return c;
}

std::optional<int64_t> SlotPool::StepOf(uint32_t slot) const {
  MutexLock lock(mu_);
  MESHLOAD_CHECK(slot < slots_.size(), "slot " + std::to_string(slot) + " is not one of the pool's");
  const Slot& s = slots_[slot];
  if (s.state == SlotState::kReady || s.state == SlotState::kLeased) return s.step;
  return std::nullopt;
}

bool SlotPool::WaitReady(int64_t step, std::chrono::milliseconds timeout) const {
  MutexLock lock(mu_);
  const auto deadline = clock_->Now() + timeout;
  auto done = [&]() MESHLOAD_REQUIRES(mu_) {
    if (shutdown_) return true;
    for (const Slot& s : slots_) {
      if (s.state == SlotState::kReady && s.step == step && s.generation == generation_) return true;
    }
    return false;
  };
  // As wait_for with a predicate: true once done(), else done() at the
  // deadline.
  while (!done()) {
    if (!clock_->WaitUntil(ready_, mu_, deadline)) return done() && !shutdown_;
  }
  return !shutdown_;
}

}  // namespace meshload::sidecar::staging
