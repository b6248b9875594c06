// The simulated clock tests drive time with (common/clock.h): a waiter
// wakes when time reaches its deadline and not before, a notify still
// wakes it, and BlockUntilWaiters tells a test when threads wait.
#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace meshload {
namespace {

using namespace std::chrono_literals;

struct Sleeper {
  Mutex mu;
  CondVar cv;
  bool poked MESHLOAD_GUARDED_BY(mu) = false;
  std::atomic<int> result{-1};  // -1 waiting, 0 deadline, 1 poked

  void Run(Clock& clock, Clock::duration d) {
    MutexLock lock(mu);
    const auto deadline = clock.Now() + d;
    while (!poked) {
      if (!clock.WaitUntil(cv, mu, deadline)) break;
    }
    result = poked ? 1 : 0;
  }
  void Poke() {
    MutexLock lock(mu);
    poked = true;
    cv.NotifyAll();
  }
};

TEST(SimulatedClock, AWaiterWakesWhenTimeReachesItsDeadlineAndNotBefore) {
  SimulatedClock clock;
  const auto t0 = clock.Now();
  Sleeper s;
  std::thread t([&] { s.Run(clock, 10s); });
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  clock.Advance(9s);
  EXPECT_EQ(clock.waiters(), 1u);
  EXPECT_EQ(s.result.load(), -1);
  clock.Advance(1s);
  t.join();
  EXPECT_EQ(s.result.load(), 0);
  EXPECT_EQ(clock.Now() - t0, 10s);
  EXPECT_EQ(clock.waiters(), 0u);
}

TEST(SimulatedClock, ANotifyStillWakesAWaiterBeforeItsDeadline) {
  SimulatedClock clock;
  Sleeper s;
  std::thread t([&] { s.Run(clock, 1h); });
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  s.Poke();
  t.join();
  EXPECT_EQ(s.result.load(), 1);
  EXPECT_EQ(clock.waiters(), 0u);
}

TEST(SimulatedClock, APastDeadlineDoesNotWaitAndBlockUntilWaitersTimesOut) {
  SimulatedClock clock;
  Mutex mu;
  CondVar cv;
  {
    MutexLock lock(mu);
    EXPECT_FALSE(clock.WaitUntil(cv, mu, clock.Now()));
  }
  EXPECT_FALSE(clock.BlockUntilWaiters(1, 20ms));
}

TEST(RealClock, WaitsOnTheSteadyClock) {
  Clock* real = Clock::Real();
  Mutex mu;
  CondVar cv;
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(mu);
  EXPECT_FALSE(real->WaitUntil(cv, mu, real->Now() + 5ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 5ms);
}

}  // namespace
}  // namespace meshload
