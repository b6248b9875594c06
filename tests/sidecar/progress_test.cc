#include "sidecar/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <vector>

#include "sidecar/sidecar.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
constexpr int64_t kSecond = 1'000'000'000;

TEST(ConsumedWatermark, StartsBeforeTheFirstStepAndMovesOnlyOverContiguousSteps) {
  ConsumedWatermark w;
  w.Reset(10);
  EXPECT_EQ(w.step(), 9);
  w.Consumed(11);  // out of order: 10 is still held
  EXPECT_EQ(w.step(), 9);
  w.Consumed(12);
  w.Consumed(10);
  EXPECT_EQ(w.step(), 12);
  w.Consumed(5);  // below the watermark: ignored
  w.Consumed(12);
  EXPECT_EQ(w.step(), 12);
  w.Reset(3);  // a trainer that starts again from its own checkpoint
  EXPECT_EQ(w.step(), 2);
  w.Consumed(3);
  EXPECT_EQ(w.step(), 3);
}

TEST(BucketQuantile, InterpolatesInsideTheBucketLikeHistogramQuantile) {
  const std::vector<double> bounds = {0.001, 0.01, 0.1};
  // 10 below 1 ms, 80 in (1 ms, 10 ms], 10 in (10 ms, 100 ms], none above.
  const std::vector<uint64_t> counts = {10, 80, 10, 0};
  EXPECT_DOUBLE_EQ(*BucketQuantile(bounds, counts, 0.5), 0.001 + (0.01 - 0.001) * (40.0 / 80.0));
  EXPECT_DOUBLE_EQ(*BucketQuantile(bounds, counts, 0.05), 0.001 * 0.5);
  EXPECT_DOUBLE_EQ(*BucketQuantile(bounds, counts, 0.99), 0.01 + (0.1 - 0.01) * 0.9);
  EXPECT_FALSE(BucketQuantile(bounds, {0, 0, 0, 0}, 0.5).has_value());
  // Everything above the last bound: the last bound, as Prometheus says.
  EXPECT_DOUBLE_EQ(*BucketQuantile(bounds, {0, 0, 0, 7}, 0.5), 0.1);
}

ProgressSample Sample(int64_t t, int64_t consumed, uint64_t batches, double wait, uint64_t bytes,
                      std::vector<uint64_t> reads = {0, 0, 0, 0}, uint64_t errors = 0) {
  ProgressSample s;
  s.time_ns = t;
  s.consumed_step = consumed;
  s.delivered_step = consumed + 1;
  s.next_staged_step = consumed + 5;
  s.batches_consumed = batches;
  s.trainer_wait_seconds = wait;
  s.bytes_read = bytes;
  s.read_latency_buckets = std::move(reads);
  s.errors = errors;
  s.trainer_connected = true;
  return s;
}

TEST(ProgressWindow, OneSampleGivesTheStepsAndNoRates) {
  ProgressWindow w({0.001, 0.01, 0.1});
  json r = w.Report();
  EXPECT_TRUE(r["consumedStep"].is_null());
  EXPECT_TRUE(r["trainerWaitFraction"].is_null());
  w.Add(Sample(kSecond, 41, 42, 0.5, 1000));
  r = w.Report();
  EXPECT_EQ(r["consumedStep"], 41);
  EXPECT_EQ(r["resumeStep"], 42);
  EXPECT_EQ(r["deliveredStep"], 42);
  EXPECT_EQ(r["stagedAhead"], 3);  // 43, 44, 45 staged, 46 next
  EXPECT_EQ(r["trainerConnected"], true);
  EXPECT_TRUE(r["trainerWaitFraction"].is_null());
  EXPECT_TRUE(r["stepsPerSecond"].is_null());
  EXPECT_TRUE(r["storageReadSeconds"]["p50"].is_null());
}

TEST(ProgressWindow, RatesAreOverTheWindowFromItsOldestSample) {
  ProgressOptions o;
  o.window = std::chrono::seconds(10);
  o.interval = std::chrono::seconds(1);
  ProgressWindow w({0.001, 0.01, 0.1}, o);
  w.Add(Sample(0, 9, 10, 1.0, 0, {0, 0, 0, 0}, 1));
  w.Add(Sample(5 * kSecond, 19, 20, 2.0, 500, {5, 10, 10, 10}, 1));
  w.Add(Sample(10 * kSecond, 29, 30, 4.0, 1000, {10, 100, 100, 100}, 3));
  json r = w.Report();
  EXPECT_DOUBLE_EQ(r["windowSeconds"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(r["trainerWaitFraction"].get<double>(), 0.3);  // 3 s of 10 waiting
  EXPECT_DOUBLE_EQ(r["stepsPerSecond"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(r["bytesPerSecond"].get<double>(), 100.0);
  EXPECT_EQ(r["errors"], 3);
  EXPECT_EQ(r["errorsInWindow"], 2);
  EXPECT_EQ(r["storageReadSeconds"]["requests"], 100);
  EXPECT_DOUBLE_EQ(r["storageReadSeconds"]["p50"].get<double>(), 0.001 + 0.009 * (40.0 / 90.0));

  // 20 s later the first two samples fall out; the window starts at 10 s.
  w.Add(Sample(20 * kSecond, 49, 50, 4.0, 1000, {10, 100, 100, 100}, 3));
  r = w.Report();
  EXPECT_DOUBLE_EQ(r["windowSeconds"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(r["trainerWaitFraction"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(r["stepsPerSecond"].get<double>(), 2.0);
  EXPECT_EQ(r["storageReadSeconds"]["requests"], 0);
  EXPECT_TRUE(r["storageReadSeconds"]["p99"].is_null());
  EXPECT_EQ(r["errorsInWindow"], 0);
}

TEST(ProgressWindow, SamplesCloserThanTheIntervalReplaceTheNewestOnly) {
  ProgressOptions o;
  o.window = std::chrono::seconds(10);
  o.interval = std::chrono::seconds(1);
  ProgressWindow w({0.1}, o);
  w.Add(Sample(0, 0, 0, 0, 0, {0, 0}));
  for (int i = 1; i <= 100; ++i) w.Add(Sample(i * kSecond / 200, i, i, 0, 0, {0, 0}));  // 100 in half a second
  json r = w.Report();
  EXPECT_EQ(r["consumedStep"], 100);
  EXPECT_DOUBLE_EQ(r["windowSeconds"].get<double>(), 0.5);  // still measured from the first
  EXPECT_DOUBLE_EQ(r["stepsPerSecond"].get<double>(), 200.0);
}

TEST(ProgressWindow, AWaitFractionNeverExceedsOne) {
  ProgressWindow w({0.1});
  w.Add(Sample(0, 0, 0, 0, 0, {0, 0}));
  w.Add(Sample(2 * kSecond, 1, 1, 5.0, 0, {0, 0}));  // a wait that began before the window
  EXPECT_DOUBLE_EQ(w.Report()["trainerWaitFraction"].get<double>(), 1.0);
}

TEST(ProgressWindow, StagingTimePerStepAndTheShareOfItSpentWaitingOnPeers) {
  ProgressWindow w({0.1});
  ProgressSample a = Sample(0, 0, 0, 0, 0, {0, 0});
  a.staging_seconds = 1.0;
  a.steps_staged = 10;
  a.peer_wait_seconds = 0.5;
  ProgressSample b = Sample(4 * kSecond, 40, 40, 0, 0, {0, 0});
  b.staging_seconds = 9.0;  // 8 s for 40 steps
  b.steps_staged = 50;
  b.peer_wait_seconds = 6.5;  // 6 of those 8 s waiting on peers
  w.Add(a);
  w.Add(b);
  json r = w.Report();
  EXPECT_DOUBLE_EQ(r["stagingSecondsPerStep"].get<double>(), 0.2);
  EXPECT_TRUE(r["peerWaitFraction"].is_null()) << "a job without the exchange has no peer wait to report";

  ProgressWindow x({0.1});
  a.exchanges = b.exchanges = true;
  x.Add(a);
  x.Add(b);
  r = x.Report();
  EXPECT_DOUBLE_EQ(r["peerWaitFraction"].get<double>(), 0.75);

  // No step staged in the window: nothing to divide by, null.
  ProgressWindow idle({0.1});
  ProgressSample c = b;
  c.time_ns = 8 * kSecond;
  idle.Add(b);
  idle.Add(c);
  r = idle.Report();
  EXPECT_TRUE(r["stagingSecondsPerStep"].is_null());
  EXPECT_TRUE(r["peerWaitFraction"].is_null());
}

TEST(ResumeFile, TheRecordedStepHoldsWhileTheSpecsResumeStepIsTheOneItWasRecordedFor) {
  meshload::testing::TempDir dir;
  const std::string path = dir.path() + "/resume.json";
  auto none = ReadResumeFile(path, 0);
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value()) << "no file: spec.resume.step";
  std::ofstream(path) << R"({"step": 4120, "specStep": 0})"
                      << "\n";
  auto recorded = ReadResumeFile(path, 0);
  ASSERT_OK(recorded);
  EXPECT_EQ(recorded->value_or(-1), 4120);
  auto changed = ReadResumeFile(path, 500);
  ASSERT_OK(changed);
  EXPECT_FALSE(changed->has_value()) << "spec.resume.step changed since: the spec wins";
  for (const char* bad :
       {"4120", "{\"step\": -1, \"specStep\": 0}", "{\"step\": 3}", "{\"step\": \"x\", \"specStep\": 0}", "not json"}) {
    std::ofstream(path, std::ios::trunc) << bad;
    auto r = ReadResumeFile(path, 0);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().ToString(), HasSubstr(path));
  }
}

}  // namespace
}  // namespace meshload::sidecar
