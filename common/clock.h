/// \file
/// Time a component reads and waits on, injectable so tests drive it.
///
/// A component that times something (a delay, a backoff, a lease, a
/// timeout) takes a `Clock*` in its options, reads the time with Now() and
/// waits with WaitUntil(cv, mu, deadline) instead of CondVar::WaitUntil.
/// Production passes nothing and gets Clock::Real(), the steady clock. A
/// test passes a SimulatedClock and moves time itself: a test of "X must
/// not happen within T" advances T and looks, in microseconds and without
/// a race, instead of sleeping T and hoping.
///
///   SimulatedClock clock;
///   WorkQueue q({.clock = &clock});
///   q.AddAfter("k", 5s);
///   clock.BlockUntilWaiters(1);          // the queue's delay thread waits on the clock
///   EXPECT_EQ(q.Len(), 0);               // not before its time
///   clock.Advance(5s);
///
/// (The pattern of Go's k8s.io/utils/clock/testing.FakeClock.)
///
/// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace meshload {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual time_point Now() const = 0;
  /// Waits on `cv` (with `mu` held, as CondVar::WaitUntil) until it is
  /// notified or this clock reaches `deadline`. False when the deadline
  /// passed; true may be spurious, as with any condition variable: callers
  /// wait in a loop on their condition.
  virtual bool WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) MESHLOAD_REQUIRES(mu) = 0;

  /// The steady clock: what every component uses unless a test gives it
  /// another. Never null, never destroyed.
  static Clock* Real();
};

/// A clock that moves only when Advance() is called. Its time starts at an
/// arbitrary point (not the epoch) and never goes back.
class SimulatedClock : public Clock {
 public:
  SimulatedClock();
  time_point Now() const override MESHLOAD_EXCLUDES(mu_);
  bool WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) override MESHLOAD_REQUIRES(mu) MESHLOAD_EXCLUDES(mu_);

  /// Moves time forward by `d` and wakes the waiters whose deadline it
  /// reached (the others wait on).
  void Advance(duration d) MESHLOAD_EXCLUDES(mu_);
  /// Returns once at least `n` threads wait on this clock, or after
  /// `real_timeout` of real time (false then): how a test knows that the
  /// threads under test have done what they do before time moves.
  bool BlockUntilWaiters(size_t n, std::chrono::milliseconds real_timeout = std::chrono::seconds(10))
      MESHLOAD_EXCLUDES(mu_);
  size_t waiters() const MESHLOAD_EXCLUDES(mu_);

 private:
  struct Waiter {
    CondVar* cv;
    Mutex* mu;
    time_point deadline;
    bool fired = false;  // Advance() reached the deadline (under mu_)
  };
  mutable Mutex mu_;
  CondVar waiters_changed_;
  time_point now_ MESHLOAD_GUARDED_BY(mu_);
  std::vector<Waiter*> waiting_ MESHLOAD_GUARDED_BY(mu_);
};

}  // namespace meshload
