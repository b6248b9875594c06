#include "common/clock.h"

#include <algorithm>

namespace meshload {
namespace {

class RealClock : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) override MESHLOAD_REQUIRES(mu) {
    return cv.WaitUntil(mu, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();  // never destroyed: threads may read it at exit
  return clock;
}

SimulatedClock::SimulatedClock() : now_(std::chrono::hours(24 * 365)) {}

Clock::time_point SimulatedClock::Now() const {
  MutexLock lock(mu_);
  return now_;
}

bool SimulatedClock::WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) {
  // The waiter is registered while the caller holds `mu`, and Advance()
  // takes `mu` before it notifies: a wake-up cannot fall between the
  // registration and the wait. The lock order is mu, then mu_; Advance
  // never holds both. Advance() takes a waiter whose deadline it reached
  // off the list itself, so a BlockUntilWaiters() after it counts only
  // the threads that waited again.
  Waiter w{&cv, &mu, deadline};
  {
    MutexLock lock(mu_);
    if (now_ >= deadline) return false;
    waiting_.push_back(&w);
    waiters_changed_.NotifyAll();
  }
  cv.Wait(mu);
  MutexLock lock(mu_);
  if (w.fired) return false;
  // Notified by its owner (or spuriously) before its deadline.
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &w));
  waiters_changed_.NotifyAll();
  return true;
}

void SimulatedClock::Advance(duration d) {
  std::vector<std::pair<CondVar*, Mutex*>> wake;
  {
    MutexLock lock(mu_);
    now_ += d;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if ((*it)->deadline > now_) {
        ++it;
        continue;
      }
      (*it)->fired = true;
      wake.emplace_back((*it)->cv, (*it)->mu);
      it = waiting_.erase(it);
    }
    waiters_changed_.NotifyAll();
  }
  for (const auto& [cv, mu] : wake) {
    // Holding the waiter's mutex: it is inside its wait (or woke already).
    MutexLock lock(*mu);
    cv->NotifyAll();
  }
}

bool SimulatedClock::BlockUntilWaiters(size_t n, std::chrono::milliseconds real_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + real_timeout;
  MutexLock lock(mu_);
  while (waiting_.size() < n) {
    if (!waiters_changed_.WaitUntil(mu_, deadline)) return waiting_.size() >= n;
  }
  return true;
}

size_t SimulatedClock::waiters() const {
  MutexLock lock(mu_);
  return waiting_.size();
}

}  // namespace meshload
