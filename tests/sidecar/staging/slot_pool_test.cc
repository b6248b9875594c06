#include "sidecar/staging/slot_pool.h"

#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>

#include <atomic>
#include <deque>
#include <vector>
#include <thread>

#include "sidecar/staging/host_memory.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace meshload::sidecar::staging {
namespace {

using meshload::testing::CurrentThreadId;
using namespace std::chrono_literals;

// Waits up to 10 s until thread `tid` (0 until it has started) sleeps in the
// kernel, or `done` is set; whether either happened.
bool WaitUntilAsleepOrDone(const std::atomic<pid_t>& tid, const std::atomic<bool>& done) {
  return meshload::testing::WaitFor([&] { return done || (tid != 0 && meshload::testing::ThreadIsAsleep(tid)); }, 10s);
}

TEST(SlotPool, TheProducerWaitsWhileTheTrainerHoldsEverySlot) {
  SimulatedClock clock;
  SlotPool pool(2, 0, &clock);
  for (int64_t step = 0; step < 2; ++step) {
    auto s = pool.AcquireForFill(step, 0, 10ms);
    ASSERT_TRUE(s);
    ASSERT_TRUE(pool.MarkReady(*s));
    ASSERT_TRUE(pool.Lease(step));
  }
  // Memory is bounded: no third slot appears in the whole timeout (the
  // simulated clock runs it out while the producer waits).
  std::optional<uint32_t> third = 0;
  std::thread timed([&] { third = pool.AcquireForFill(2, 0, 50ms); });
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  clock.Advance(50ms);
  timed.join();
  EXPECT_FALSE(third);
  std::atomic<bool> got{false};
  std::atomic<pid_t> tid{0};
  std::thread producer([&] {
    tid = CurrentThreadId();
    got = pool.AcquireForFill(2, 0, 2000ms).has_value();
  });
  // The producer waits in AcquireForFill (or, wrongly, got a slot).
  EXPECT_TRUE(WaitUntilAsleepOrDone(tid, got));
  EXPECT_FALSE(got);
  EXPECT_TRUE(pool.Release(0, 0));
  producer.join();
  EXPECT_TRUE(got);
}

TEST(SlotPool, ReleaseChecksSlotAndStep) {
  SlotPool pool(2);
  auto s = pool.AcquireForFill(5, 0, 10ms);
  pool.MarkReady(*s);
  EXPECT_FALSE(pool.Release(*s, 5));  // ready, not leased
  ASSERT_TRUE(pool.Lease(5));
  EXPECT_FALSE(pool.Release(*s, 6));  // another step
  EXPECT_FALSE(pool.Release(7, 5));   // no such slot
  EXPECT_TRUE(pool.Release(*s, 5));
  EXPECT_FALSE(pool.Release(*s, 5));  // twice
}

TEST(SlotPool, ReleasingLeasesFreesThemAndNothingElse) {
  SlotPool pool(3);
  std::vector<uint32_t> slot_of;
  for (int64_t step = 0; step < 3; ++step) {
    auto s = pool.AcquireForFill(step, 0, 10ms);
    pool.MarkReady(*s);
    slot_of.push_back(*s);
  }
  pool.Lease(0);
  pool.Lease(2);
  EXPECT_EQ(pool.Counts().leased, 2u);
  EXPECT_TRUE(pool.Release(slot_of[0], 0));
  EXPECT_TRUE(pool.Release(slot_of[2], 2));
  const SlotCounts c = pool.Counts();
  EXPECT_EQ(c.free, 2u);
  EXPECT_EQ(c.ready, 1u);
  EXPECT_EQ(c.leased, 0u);
}

TEST(SlotPool, ResetDropsReadySlotsAndStaleFills) {
  SlotPool pool(3);
  auto a = pool.AcquireForFill(0, 0, 10ms);
  pool.MarkReady(*a);
  auto b = pool.AcquireForFill(1, 0, 10ms);  // still filling
  const uint64_t gen = pool.Reset();
  EXPECT_EQ(gen, 1u);
  EXPECT_FALSE(pool.Lease(0));       // the ready slot is gone
  EXPECT_FALSE(pool.MarkReady(*b));  // a stale fill is freed, not published
  EXPECT_EQ(pool.Counts().free, 3u);
  EXPECT_FALSE(pool.AcquireForFill(9, 0, 10ms));  // old generation
  EXPECT_TRUE(pool.AcquireForFill(9, 1, 10ms));
}

TEST(SlotPool, ShutdownWakesTheProducer) {
  SlotPool pool(1);
  auto s = pool.AcquireForFill(0, 0, 10ms);
  pool.MarkReady(*s);
  pool.Lease(0);
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  std::thread t([&] {
    tid = CurrentThreadId();
    EXPECT_FALSE(pool.AcquireForFill(1, 0, 10000ms));
    returned = true;
  });
  // The producer waits in AcquireForFill (or, wrongly, is back already).
  EXPECT_TRUE(WaitUntilAsleepOrDone(tid, returned));
  pool.Shutdown();
  t.join();
}

TEST(SlotPool, ConcurrentProducerAndConsumerSeeEveryStepOnceInOrder) {
  SlotPool pool(3);
  constexpr int64_t kSteps = 2000;
  std::thread producer([&] {
    for (int64_t step = 0; step < kSteps; ++step) {
      std::optional<uint32_t> s;
      while (!(s = pool.AcquireForFill(step, 0, 100ms))) {
      }
      pool.MarkReady(*s);
    }
  });
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(pool.WaitReady(step, 5000ms));
    auto s = pool.Lease(step);
    ASSERT_TRUE(s);
    ASSERT_TRUE(pool.Release(*s, step));
  }
  producer.join();
}

TEST(SlotPool, NextFillHandsOutConsecutiveStepsFromTheFirstAndFromEachReset) {
  SlotPool pool(3, /*first_step=*/10);
  EXPECT_EQ(pool.FirstPendingStep(), 10);
  auto a = pool.AcquireNextForFill(0, 10ms);
  auto b = pool.AcquireNextForFill(0, 10ms);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->step, 10);
  EXPECT_EQ(b->step, 11);
  EXPECT_EQ(pool.next_fill_step(), 12);
  EXPECT_EQ(pool.FirstPendingStep(), 10);  // step 10 is still being filled
  EXPECT_EQ(pool.FirstFillingStep(), 10);
  ASSERT_TRUE(pool.MarkReady(b->slot));
  EXPECT_EQ(pool.FirstPendingStep(), 10);
  EXPECT_EQ(pool.FirstFillingStep(), 10);
  ASSERT_TRUE(pool.MarkReady(a->slot));
  EXPECT_EQ(pool.FirstFillingStep(), 12);  // none filling: every step below the next fill is staged
  ASSERT_TRUE(pool.Lease(10));
  EXPECT_EQ(pool.FirstPendingStep(), 11);  // a leased step is the trainer's
  const uint64_t gen = pool.Reset(/*next_step=*/100);
  EXPECT_FALSE(pool.AcquireNextForFill(0, 10ms));  // the old generation is refused
  EXPECT_EQ(pool.FirstPendingStep(), 100);         // the lease is of the old generation
  auto c = pool.AcquireNextForFill(gen, 10ms);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step, 100);
}

TEST(SlotPool, SeveralProducersFillEveryStepOnceAndTheTrainerNeverStarves) {
  // The trainer holds up to slots-1 leases while it waits for the next step
  // (the worst a trainer may do). If a producer could take the last slot
  // for a later step than the lowest one missing, this would deadlock.
  constexpr uint32_t kSlots = 4;
  constexpr int64_t kSteps = 3000;
  SlotPool pool(kSlots);
  std::atomic<bool> stop{false};
  std::vector<std::atomic<int>> filled(kSteps);
  std::vector<std::thread> producers;
  for (int i = 0; i < 3; ++i) {
    producers.emplace_back([&, i] {
      while (!stop) {
        auto f = pool.AcquireNextForFill(0, 50ms);
        if (!f) continue;
        if (f->step < kSteps) filled[static_cast<size_t>(f->step)]++;
        if (i % 2) std::this_thread::yield();
        pool.MarkReady(f->slot);
      }
    });
  }
  std::deque<std::pair<uint32_t, int64_t>> held;
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(pool.WaitReady(step, 5000ms)) << "step " << step << " never staged";
    auto s = pool.Lease(step);
    ASSERT_TRUE(s);
    held.emplace_back(*s, step);
    if (held.size() == kSlots - 1) {
      ASSERT_TRUE(pool.Release(held.front().first, held.front().second));
      held.pop_front();
    }
  }
  stop = true;
  pool.Shutdown();
  for (auto& t : producers) t.join();
  for (int64_t step = 0; step < kSteps; ++step) EXPECT_EQ(filled[static_cast<size_t>(step)], 1) << step;
}

TEST(HostSlotMemory, IsSealedAgainstShrinkingAndPageAligned) {
  auto m = HostSlotMemory::Create(3, 5000, "test-pool");
  ASSERT_OK(m);
  EXPECT_EQ((*m)->slot_bytes() % 4096, 0u);
  EXPECT_EQ((*m)->pool_bytes(), 3 * (*m)->slot_bytes());
  (*m)->slot(2)[(*m)->slot_bytes() - 1] = 42;  // the last byte is writable
  EXPECT_NE(::ftruncate((*m)->fd(), 10), 0);   // F_SEAL_SHRINK
  EXPECT_FALSE(HostSlotMemory::Create(0, 10, "x").ok());
}

}  // namespace
}  // namespace meshload::sidecar::staging
