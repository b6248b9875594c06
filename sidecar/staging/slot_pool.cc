#include "sidecar/staging/slot_pool.h"

namespace meshload::staging {

SlotPool::SlotPool(uint32_t slots) : slots_(slots) {}

std::optional<uint32_t> SlotPool::AcquireForFill(int64_t step, uint64_t generation,
                                                 std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (shutdown_ || generation != generation_) return std::nullopt;
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].state == SlotState::kFree) {
        slots_[i] = {SlotState::kFilling, step, generation};
        changed_.notify_all();
        return i;
      }
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

bool SlotPool::MarkReady(uint32_t slot) {
  std::lock_guard lock(mu_);
  Slot& s = slots_.at(slot);
  if (s.state != SlotState::kFilling) return false;
  const bool current = s.generation == generation_ && !shutdown_;
  s.state = current ? SlotState::kReady : SlotState::kFree;
  if (!current) s.step = -1;
  changed_.notify_all();
  return current;
}

void SlotPool::AbandonFill(uint32_t slot) {
  std::lock_guard lock(mu_);
  Slot& s = slots_.at(slot);
  if (s.state == SlotState::kFilling) s = Slot{};
  changed_.notify_all();
}

std::optional<uint32_t> SlotPool::Lease(int64_t step) {
  std::lock_guard lock(mu_);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kReady && s.step == step && s.generation == generation_) {
      s.state = SlotState::kLeased;
      changed_.notify_all();
      return i;
    }
  }
  return std::nullopt;
}

bool SlotPool::Release(uint32_t slot, int64_t step) {
  std::lock_guard lock(mu_);
  if (slot >= slots_.size()) return false;
  Slot& s = slots_[slot];
  if (s.state != SlotState::kLeased || s.step != step) return false;
  s = Slot{};
  changed_.notify_all();
  return true;
}

uint32_t SlotPool::ReclaimLeases() {
  std::lock_guard lock(mu_);
  uint32_t n = 0;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kLeased) {
      s = Slot{};
      ++n;
    }
  }
  if (n) changed_.notify_all();
  return n;
}

uint64_t SlotPool::Reset() {
  std::lock_guard lock(mu_);
  ++generation_;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kReady) s = Slot{};
  }
  changed_.notify_all();
  return generation_;
}

uint64_t SlotPool::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

void SlotPool::Shutdown() {
  std::lock_guard lock(mu_);
  shutdown_ = true;
  changed_.notify_all();
}

SlotCounts SlotPool::Counts() const {
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
  const Slot& s = slots_.at(slot);
  if (s.state == SlotState::kReady || s.state == SlotState::kLeased) return s.step;
  return std::nullopt;
}

bool SlotPool::WaitReady(int64_t step, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    if (shutdown_) return true;
    for (const Slot& s : slots_) {
      if (s.state == SlotState::kReady && s.step == step && s.generation == generation_) return true;
    }
    return false;
  }) && !shutdown_;
}

}  // namespace meshload::staging
