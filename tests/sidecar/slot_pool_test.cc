#include "sidecar/staging/slot_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "sidecar/staging/host_memory.h"

namespace meshload::staging {
namespace {

using std::chrono::milliseconds;

TEST(SlotPool, TheProducerWaitsWhileTheTrainerHoldsEverySlot) {
  SlotPool pool(2);
  for (int64_t step = 0; step < 2; ++step) {
    auto s = pool.AcquireForFill(step, 0, milliseconds(10));
    ASSERT_TRUE(s);
    ASSERT_TRUE(pool.MarkReady(*s));
    ASSERT_TRUE(pool.Lease(step));
  }
  // Memory is bounded: no third slot appears.
  EXPECT_FALSE(pool.AcquireForFill(2, 0, milliseconds(50)));
  std::atomic<bool> got{false};
  std::thread producer([&] { got = pool.AcquireForFill(2, 0, milliseconds(2000)).has_value(); });
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(got);
  EXPECT_TRUE(pool.Release(0, 0));
  producer.join();
  EXPECT_TRUE(got);
}

TEST(SlotPool, ReleaseChecksSlotAndStep) {
  SlotPool pool(2);
  auto s = pool.AcquireForFill(5, 0, milliseconds(10));
  pool.MarkReady(*s);
  EXPECT_FALSE(pool.Release(*s, 5));  // ready, not leased
  ASSERT_TRUE(pool.Lease(5));
  EXPECT_FALSE(pool.Release(*s, 6));  // another step
  EXPECT_FALSE(pool.Release(7, 5));   // no such slot
  EXPECT_TRUE(pool.Release(*s, 5));
  EXPECT_FALSE(pool.Release(*s, 5));  // twice
}

TEST(SlotPool, ReclaimFreesEveryLeaseAndNothingElse) {
  SlotPool pool(3);
  for (int64_t step = 0; step < 3; ++step) {
    auto s = pool.AcquireForFill(step, 0, milliseconds(10));
    pool.MarkReady(*s);
  }
  pool.Lease(0);
  pool.Lease(1);
  EXPECT_EQ(pool.ReclaimLeases(), 2u);
  const SlotCounts c = pool.Counts();
  EXPECT_EQ(c.free, 2u);
  EXPECT_EQ(c.ready, 1u);
  EXPECT_EQ(c.leased, 0u);
}

TEST(SlotPool, ResetDropsReadySlotsAndStaleFills) {
  SlotPool pool(3);
  auto a = pool.AcquireForFill(0, 0, milliseconds(10));
  pool.MarkReady(*a);
  auto b = pool.AcquireForFill(1, 0, milliseconds(10));  // still filling
  const uint64_t gen = pool.Reset();
  EXPECT_EQ(gen, 1u);
  EXPECT_FALSE(pool.Lease(0));         // the ready slot is gone
  EXPECT_FALSE(pool.MarkReady(*b));    // a stale fill is freed, not published
  EXPECT_EQ(pool.Counts().free, 3u);
  EXPECT_FALSE(pool.AcquireForFill(9, 0, milliseconds(10)));  // old generation
  EXPECT_TRUE(pool.AcquireForFill(9, 1, milliseconds(10)));
}

TEST(SlotPool, ShutdownWakesTheProducer) {
  SlotPool pool(1);
  auto s = pool.AcquireForFill(0, 0, milliseconds(10));
  pool.MarkReady(*s);
  pool.Lease(0);
  std::thread t([&] { EXPECT_FALSE(pool.AcquireForFill(1, 0, milliseconds(10000))); });
  std::this_thread::sleep_for(milliseconds(20));
  pool.Shutdown();
  t.join();
}

TEST(SlotPool, ConcurrentProducerAndConsumerSeeEveryStepOnceInOrder) {
  SlotPool pool(3);
  constexpr int64_t kSteps = 2000;
  std::thread producer([&] {
    for (int64_t step = 0; step < kSteps; ++step) {
      std::optional<uint32_t> s;
      while (!(s = pool.AcquireForFill(step, 0, milliseconds(100)))) {
      }
      pool.MarkReady(*s);
    }
  });
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(pool.WaitReady(step, milliseconds(5000)));
    auto s = pool.Lease(step);
    ASSERT_TRUE(s);
    ASSERT_TRUE(pool.Release(*s, step));
  }
  producer.join();
}

TEST(HostSlotMemory, IsSealedAgainstShrinkingAndPageAligned) {
  auto m = HostSlotMemory::Create(3, 5000, "test-pool");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->slot_bytes() % 4096, 0u);
  EXPECT_EQ((*m)->pool_bytes(), 3 * (*m)->slot_bytes());
  (*m)->slot(2)[(*m)->slot_bytes() - 1] = 42;  // the last byte is writable
  EXPECT_NE(::ftruncate((*m)->fd(), 10), 0);   // F_SEAL_SHRINK
  EXPECT_FALSE(HostSlotMemory::Create(0, 10, "x").ok());
}

}  // namespace
}  // namespace meshload::staging
