// The work queue's guarantees: collapsing, one worker per key, per-key
// exponential backoff, delayed adds, shutdown.

#include "controller/runtime/workqueue.h"

#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/testing/wait.h"

namespace meshload::controller::runtime {
namespace {

using meshload::testing::CurrentThreadId;
using meshload::testing::ThreadIsAsleep;
using meshload::testing::WaitFor;
using namespace std::chrono_literals;

TEST(WorkQueue, RepeatedAddsCollapseIntoOneItem) {
  WorkQueue q;
  for (int i = 0; i < 10; ++i) q.Add("ns/a");
  q.Add("ns/b");
  EXPECT_EQ(q.Len(), 2u);
  std::string k;
  ASSERT_TRUE(q.Get(&k));
  EXPECT_EQ(k, "ns/a");
  ASSERT_TRUE(q.Get(&k));
  EXPECT_EQ(k, "ns/b");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueue, AKeyAddedWhileProcessingIsHeldBackUntilDone) {
  WorkQueue q;
  q.Add("k");
  std::string k;
  ASSERT_TRUE(q.Get(&k));
  q.Add("k");
  q.Add("k");
  EXPECT_EQ(q.Len(), 0u) << "a key being processed must not be handed out again";
  q.Done("k");
  EXPECT_EQ(q.Len(), 1u) << "Done re-queues a key that was added meanwhile, once";
  ASSERT_TRUE(q.Get(&k));
  q.Done("k");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueue, NoKeyIsEverProcessedByTwoWorkersAtOnce) {
  WorkQueue q;
  std::mutex mu;
  std::set<std::string> active;
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 8; ++w) {
    workers.emplace_back([&] {
      std::string k;
      while (q.Get(&k)) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!active.insert(k).second) overlap = true;
        }
        std::this_thread::sleep_for(100us);  // holds the key a while: a second worker would overlap
        {
          std::lock_guard<std::mutex> lock(mu);
          active.erase(k);
        }
        processed.fetch_add(1);
        q.Done(k);
      }
    });
  }
  for (int i = 0; i < 5000; ++i) q.Add("key-" + std::to_string(i % 7));
  // Worked off: nothing queued, and no worker in the middle of a key.
  const bool drained = WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return q.Len() == 0 && active.empty();
      },
      10s, 1ms);
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_TRUE(drained) << "the workers did not work the queue off within 10 s";
  EXPECT_FALSE(overlap.load());
  EXPECT_GE(processed.load(), 7);
  EXPECT_LT(processed.load(), 5000) << "adds should have collapsed";
}

TEST(WorkQueue, BackoffStartsAt5msDoublesAndCapsAt1000s) {
  WorkQueue q;
  EXPECT_EQ(q.NextBackoff("k"), 5ms);
  std::vector<int64_t> seen;
  for (int i = 0; i < 30; ++i) {
    seen.push_back(q.NextBackoff("k").count());
    q.AddRateLimited("k");
  }
  EXPECT_EQ(seen[0], 5);
  EXPECT_EQ(seen[1], 10);
  EXPECT_EQ(seen[2], 20);
  EXPECT_EQ(seen[10], 5 * 1024);
  EXPECT_EQ(seen[17], 655360);
  EXPECT_EQ(seen[18], 1000000) << "capped at 1000 s";
  EXPECT_EQ(seen[29], 1000000);
  EXPECT_EQ(q.NumRequeues("k"), 30);
  EXPECT_EQ(q.NextBackoff("other"), 5ms) << "backoff is per key";
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
  EXPECT_EQ(q.NextBackoff("k"), 5ms) << "Forget resets the backoff";
}

TEST(WorkQueue, RateLimitedAddArrivesAfterItsBackoff) {
  SimulatedClock clock;
  WorkQueue q({.base_delay = 40ms, .max_delay = 1000s, .clock = &clock});
  q.AddRateLimited("k");
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.DelayedLen(), 1u);
  ASSERT_TRUE(clock.BlockUntilWaiters(1)) << "the delay thread never waited for the backoff";
  clock.Advance(39ms);
  EXPECT_EQ(clock.waiters(), 1u) << "39 ms on, the delay thread still waits";
  EXPECT_EQ(q.Len(), 0u) << "not before its backoff";
  clock.Advance(1ms);
  std::string k;
  ASSERT_TRUE(q.Get(&k));
  EXPECT_EQ(k, "k");
  EXPECT_EQ(q.DelayedLen(), 0u);
}

TEST(WorkQueue, AddAfterKeepsTheEarliestTimeForAKey) {
  SimulatedClock clock;
  WorkQueue q({.clock = &clock});
  q.AddAfter("k", 10s);
  q.AddAfter("k", 20ms);
  q.AddAfter("k", 5s);
  EXPECT_EQ(q.DelayedLen(), 1u);
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  clock.Advance(19ms);
  EXPECT_EQ(clock.waiters(), 1u);
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(1ms);
  std::string k;
  ASSERT_TRUE(q.Get(&k)) << "the earliest time, 20 ms, is kept";
  EXPECT_EQ(q.DelayedLen(), 0u);
}

TEST(WorkQueue, ADelayedKeyWaitsOnTheClockNotTheWall) {
  SimulatedClock clock;
  WorkQueue q({.clock = &clock});
  q.AddAfter("k", 1h);
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(1h);
  std::string k;
  ASSERT_TRUE(q.Get(&k)) << "an hour passes in no time";
}

TEST(WorkQueue, ShutDownWakesBlockedGetters) {
  WorkQueue q;
  std::atomic<int> returned{0};
  std::atomic<pid_t> tids[3]{};
  std::atomic<bool> left[3]{};
  std::vector<std::thread> t;
  for (int i = 0; i < 3; ++i) {
    t.emplace_back([&, i] {
      tids[i] = CurrentThreadId();
      std::string k;
      if (!q.Get(&k)) returned.fetch_add(1);
      left[i] = true;
    });
  }
  // Every getter blocked in Get (or, wrongly, back from it already).
  EXPECT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < 3; ++i) {
          if (!left[i] && (tids[i] == 0 || !ThreadIsAsleep(tids[i]))) return false;
        }
        return true;
      },
      10s))
      << "the getters never blocked in Get";
  q.ShutDown();
  for (auto& th : t) th.join();
  EXPECT_EQ(returned.load(), 3);
  q.Add("late");
  EXPECT_EQ(q.Len(), 0u) << "adds after shutdown are dropped";
}

}  // namespace
}  // namespace meshload::controller::runtime
