/// \file
/// SlotPool: the life cycle of staging slots, independent of where their
/// memory lives (host memfd here, CUDA VMM allocations for GPU staging).
///
/// A slot holds one step's batch for this process. Its states:
///
///   kFree ──AcquireForFill──► kFilling ──MarkReady──► kReady ──Lease──► kLeased
///     ▲                          │ (stale generation)     │ (Reset)       │
///     └──────────────────────────┴────────────────────────┴───────Release┘
///
/// (The sidecar releases a lease on the trainer's RELEASE, or when it takes
/// it back: the trainer died, or left without holding that batch.)
///
/// The producer acquires free slots and blocks while none is free, so memory
/// is bounded by the number of slots (the job's `prefetch`): a slow trainer
/// slows the producer down, it never grows a queue. A *generation* number
/// lets the server re-plan from another step (a client reconnecting at step
/// t): Reset() bumps it, frees ready slots, and slots still being filled for
/// the old generation are freed when their producer finishes.
///
/// Several producers may fill slots at once (AcquireNextForFill): the pool
/// hands out consecutive steps in the order it hands out slots, so the
/// lowest step not yet staged always has a slot, whatever the trainer holds
/// (a producer holding step t+1 can never starve step t of a slot).
///
/// Thread safety: all methods are thread-safe (one mutex, mu_, never held
/// across I/O: producers fill slots outside the lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace meshload::sidecar::staging {

enum class SlotState { kFree, kFilling, kReady, kLeased };

struct SlotCounts {
  uint32_t free = 0, filling = 0, ready = 0, leased = 0;
};

class SlotPool {
 public:
  /// `clock`: what the timeouts are measured on (null: the steady clock).
  explicit SlotPool(uint32_t slots, int64_t first_step = 0, Clock* clock = nullptr);

  uint32_t size() const { return size_; }

  /// Waits until a slot is free and marks it kFilling for `step` of
  /// `generation`. Returns nullopt on Shutdown(), when `generation` is no
  /// longer current, or after `timeout` (so callers can report a stalled
  /// consumer and check for shutdown).
  std::optional<uint32_t> AcquireForFill(int64_t step, uint64_t generation, std::chrono::milliseconds timeout)
      MESHLOAD_EXCLUDES(mu_);

  /// Waits until a slot is free and marks it kFilling for the next step of
  /// the current generation (the cursor set by Reset(), or the constructor's
  /// first step), which it advances. Returns {slot, step}; nullopt as
  /// AcquireForFill does.
  struct Fill {
    uint32_t slot = 0;
    int64_t step = 0;
  };
  std::optional<Fill> AcquireNextForFill(uint64_t generation, std::chrono::milliseconds timeout) MESHLOAD_EXCLUDES(mu_);
  /// The step AcquireNextForFill hands out next.
  int64_t next_fill_step() const MESHLOAD_EXCLUDES(mu_);
  /// The lowest step of the current generation in a filling or ready slot
  /// (leased ones are the trainer's: a reconnecting trainer may still hold
  /// some); next_fill_step() when there is none.
  int64_t FirstPendingStep() const MESHLOAD_EXCLUDES(mu_);
  /// The lowest step of the current generation in a filling slot;
  /// next_fill_step() when there is none. Every step of the generation
  /// below it is staged (or was handed over): its reads are done.
  int64_t FirstFillingStep() const MESHLOAD_EXCLUDES(mu_);

  /// The fill of `slot` finished. Ready for leasing if its generation is
  /// still current, otherwise freed. Returns true when it became ready.
  bool MarkReady(uint32_t slot) MESHLOAD_EXCLUDES(mu_);
  /// The fill of `slot` failed: the slot is freed.
  void AbandonFill(uint32_t slot) MESHLOAD_EXCLUDES(mu_);

  /// Leases the ready slot holding `step`, if there is one.
  std::optional<uint32_t> Lease(int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// Returns a lease. False (and nothing changes) when `slot` is not leased
  /// or holds another step: a client bug or a stale RELEASE.
  bool Release(uint32_t slot, int64_t step) MESHLOAD_EXCLUDES(mu_);

  /// Starts a new generation: ready slots are freed, slots being filled will
  /// be freed when done. Returns the new generation. With `next_step`,
  /// AcquireNextForFill goes on from there.
  uint64_t Reset() MESHLOAD_EXCLUDES(mu_);
  uint64_t Reset(int64_t next_step) MESHLOAD_EXCLUDES(mu_);
  uint64_t generation() const MESHLOAD_EXCLUDES(mu_);

  /// Wakes every waiter; AcquireForFill returns nullopt from now on.
  void Shutdown() MESHLOAD_EXCLUDES(mu_);

  SlotCounts Counts() const MESHLOAD_EXCLUDES(mu_);
  /// The step held by a ready or leased slot (for tests and diagnostics).
  std::optional<int64_t> StepOf(uint32_t slot) const MESHLOAD_EXCLUDES(mu_);
  /// Waits until a slot for `step` is ready or `timeout` passes; true if one is.
  bool WaitReady(int64_t step, std::chrono::milliseconds timeout) const MESHLOAD_EXCLUDES(mu_);

 private:
  // A free slot once there is one, nullopt on shutdown, a new generation or
  // timeout.
  std::optional<uint32_t> WaitForFree(uint64_t generation, std::chrono::milliseconds timeout) MESHLOAD_REQUIRES(mu_);

  uint64_t ResetLocked(int64_t next_step) MESHLOAD_REQUIRES(mu_);

  struct Slot {
    SlotState state = SlotState::kFree;
    int64_t step = -1;
    uint64_t generation = 0;
  };
  mutable Mutex mu_;
  // Precise wake-ups: a freed slot wakes one producer, a ready slot wakes
  // WaitReady(); Reset() and Shutdown() wake everyone.
  mutable CondVar free_;
  mutable CondVar ready_;
  const uint32_t size_;  // slots_.size(), fixed: size() needs no lock
  Clock* const clock_;   // the timeouts' time
  std::vector<Slot> slots_ MESHLOAD_GUARDED_BY(mu_);
  uint64_t generation_ MESHLOAD_GUARDED_BY(mu_) = 0;
  int64_t next_fill_ MESHLOAD_GUARDED_BY(mu_) = 0;
  bool shutdown_ MESHLOAD_GUARDED_BY(mu_) = false;
};

}  // namespace meshload::sidecar::staging
