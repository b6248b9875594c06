#include "common/metrics/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace meshload::metrics {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 8;
constexpr int kPerThread = 100000;

template <typename Fn>
void RunConcurrently(Fn fn) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back([&fn, t] { fn(t); });
  for (auto& th : threads) th.join();
}

// ---- counters -------------------------------------------------------------

TEST(MetricsCounter, StartsAtZeroAndAddsIncrements) {
  Counter c;
  EXPECT_EQ(c.Value(), 0);
  c.Increment();
  c.Increment(2.5);
  c.Increment(0);
  EXPECT_EQ(c.Value(), 3.5);
}

TEST(MetricsCounter, IgnoresNegativeAndNaNIncrements) {
  Counter c;
  c.Increment(5);
  c.Increment(-1);
  c.Increment(-std::numeric_limits<double>::infinity());
  c.Increment(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(c.Value(), 5);
}

TEST(MetricsCounter, ConcurrentIncrementsAreAllCounted) {
  Counter c;
  RunConcurrently([&](int) {
    for (int i = 0; i < kPerThread; ++i) c.Increment(0.5);
  });
  EXPECT_EQ(c.Value(), kThreads * kPerThread * 0.5);
}

// ---- gauges ---------------------------------------------------------------

TEST(MetricsGauge, SetIncrementAndDecrementMoveTheValue) {
  Gauge g;
  EXPECT_EQ(g.Value(), 0);
  g.Set(10);
  g.Increment();
  g.Increment(4);
  g.Decrement();
  g.Decrement(20);
  EXPECT_EQ(g.Value(), -6);
}

TEST(MetricsGauge, SetToCurrentTimeStoresUnixSeconds) {
  using std::chrono::duration;
  using std::chrono::system_clock;
  double before = duration<double>(system_clock::now().time_since_epoch()).count();
  Gauge g;
  g.SetToCurrentTime();
  double after = duration<double>(system_clock::now().time_since_epoch()).count();
  EXPECT_GE(g.Value(), before);
  EXPECT_LE(g.Value(), after);
}

TEST(MetricsGauge, ConcurrentIncrementsAndDecrementsCancelOut) {
  Gauge g;
  g.Set(7);
  RunConcurrently([&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      if (t % 2) {
        g.Increment(2);
      } else {
        g.Decrement(2);
      }
    }
  });
  EXPECT_EQ(g.Value(), 7);
}

// ---- histograms -----------------------------------------------------------

TEST(MetricsHistogram, BucketUpperBoundsAreInclusive) {
  Histogram h({1, 2, 5});
  h.Observe(1);  // le="1"
  h.Observe(1.5);
  h.Observe(2);  // le="2"
  h.Observe(0);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2, 4, 4, 4}));
  EXPECT_EQ(h.Count(), 4u);
  EXPECT_EQ(h.Sum(), 4.5);
}

TEST(MetricsHistogram, ValuesAboveTheLastBoundLandOnlyInTheInfBucket) {
  Histogram h({1, 2});
  h.Observe(2.0000001);
  h.Observe(1e300);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{0, 0, 2}));
}

TEST(MetricsHistogram, NaNLandsInTheInfBucketAndMakesTheSumNaN) {
  Histogram h({1});
  h.Observe(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(std::isnan(h.Sum()));
}

TEST(MetricsHistogram, TrailingInfBoundIsDroppedAsImplicit) {
  Histogram h({0.5, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(h.Boundaries(), (BucketBoundaries{0.5}));
  EXPECT_EQ(h.CumulativeCounts().size(), 2u);
}

TEST(MetricsHistogram, ConcurrentObservationsAreAllCounted) {
  Histogram h({1, 10});
  RunConcurrently([&](int t) {
    for (int i = 0; i < kPerThread; ++i) h.Observe(t % 2 ? 0.5 : 5);
  });
  EXPECT_EQ(h.CumulativeCounts(),
            (std::vector<uint64_t>{kThreads / 2 * kPerThread, kThreads * kPerThread, kThreads * kPerThread}));
  EXPECT_EQ(h.Sum(), kThreads / 2 * kPerThread * (0.5 + 5));
}

TEST(MetricsHistogram, ObserveManyCountsLikeObservingEachValue) {
  // Runs in one bucket, bucket changes back and forth, NaN and +Inf.
  const std::vector<double> values = {0.5, 0.7, 3, 3, 0.1, 20, 20, 20, 2, 1, 1e300, 0.5};
  Histogram many({1, 2, 5});
  Histogram each({1, 2, 5});
  many.ObserveMany(values.data(), values.size());
  for (double v : values) each.Observe(v);
  EXPECT_EQ(many.CumulativeCounts(), each.CumulativeCounts());
  EXPECT_EQ(many.CumulativeCounts(), (std::vector<uint64_t>{5, 6, 8, 12}));
  EXPECT_DOUBLE_EQ(many.Sum(), each.Sum());

  many.ObserveMany(values.data(), 0);  // nothing
  EXPECT_EQ(many.Count(), 12u);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  many.ObserveMany(&nan, 1);
  EXPECT_EQ(many.CumulativeCounts(), (std::vector<uint64_t>{5, 6, 8, 13}));
  EXPECT_TRUE(std::isnan(many.Sum()));
}

TEST(MetricsHistogram, ConcurrentBatchesAreAllCounted) {
  Histogram h({1, 10});
  RunConcurrently([&](int t) {
    std::vector<double> batch(50, t % 2 ? 0.5 : 5);
    batch[7] = 100;  // a bucket change inside the batch
    for (int i = 0; i < kPerThread / 50; ++i) h.ObserveMany(batch.data(), batch.size());
  });
  const uint64_t batches = kThreads * (kPerThread / 50), n = batches * 50;
  EXPECT_EQ(h.CumulativeCounts().back(), n);
  EXPECT_EQ(h.CumulativeCounts()[0], batches / 2 * 49);
  EXPECT_EQ(h.CumulativeCounts()[1], n - batches);
}

TEST(MetricsHistogram, ExponentialBucketsMultiplyAndPrintCleanly) {
  EXPECT_EQ(ExponentialBuckets(0.005, 2, 4), (BucketBoundaries{0.005, 0.01, 0.02, 0.04}));
  // 0.001 * 10 * 10 is 0.10000000000000002 in doubles; the helper rounds it.
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 4), (BucketBoundaries{0.001, 0.01, 0.1, 1}));
}

TEST(MetricsHistogram, LinearBucketsStepAndPrintCleanly) {
  EXPECT_EQ(LinearBuckets(0.1, 0.1, 3), (BucketBoundaries{0.1, 0.2, 0.3}));
  EXPECT_EQ(LinearBuckets(-1, 2, 3), (BucketBoundaries{-1, 1, 3}));
}

// ---- registry -------------------------------------------------------------

TEST(MetricsRegistry, AddWithTheSameLabelsReturnsTheSameSeries) {
  Registry r;
  auto& family = BuildCounter().Name("x_total").Help("h").Register(r);
  Counter& a = family.Add({{"source", "file"}, {"kind", "data"}});
  Counter& b = family.Add({{"kind", "data"}, {"source", "file"}});
  Counter& other = family.Add({{"source", "http"}, {"kind", "data"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
}

TEST(MetricsRegistry, RegisteringTheSameFamilyAgainReturnsIt) {
  Registry r;
  auto& first = BuildGauge().Name("g").Help("h").Labels({{"pod", "p"}}).Register(r);
  auto& second = BuildGauge().Name("g").Help("h").Labels({{"pod", "p"}}).Register(r);
  EXPECT_EQ(&first, &second);
}

TEST(MetricsRegistry, SeriesReferencesStayValidAsMoreAreAdded) {
  Registry r;
  auto& family = BuildCounter().Name("x_total").Help("h").Register(r);
  Counter& first = family.Add({{"i", "0"}});
  for (int i = 1; i < 1000; ++i) family.Add({{"i", std::to_string(i)}}).Increment();
  first.Increment(3);
  EXPECT_EQ(&family.Add({{"i", "0"}}), &first);
  EXPECT_EQ(first.Value(), 3);
}

TEST(MetricsRegistry, ConcurrentAddOfTheSameLabelsCreatesOneSeries) {
  Registry r;
  auto& family = BuildCounter().Name("x_total").Help("h").Register(r);
  RunConcurrently([&](int) {
    for (int i = 0; i < 1000; ++i) family.Add({{"source", "file"}}).Increment();
  });
  EXPECT_EQ(family.Add({{"source", "file"}}).Value(), kThreads * 1000);
  EXPECT_EQ(r.Serialize(),
            "# HELP x_total h\n# TYPE x_total counter\n"
            "x_total{source=\"file\"} 8000\n");
}

TEST(MetricsRegistry, BuildInfoIsAGaugeOfOneLabelledWithVersionAndComponent) {
  Registry r;
  Gauge& g = RegisterBuildInfo(r, "0.1.0", "sidecar");
  EXPECT_EQ(g.Value(), 1);
  EXPECT_THAT(r.Serialize(), HasSubstr("# TYPE meshload_build_info gauge\n"
                                       "meshload_build_info{component=\"sidecar\",version=\"0.1.0\"} 1\n"));
}

TEST(MetricsRegistry, BuildInfoForTwoComponentsSharesOneFamily) {
  Registry r;
  RegisterBuildInfo(r, "0.1.0", "sidecar");
  RegisterBuildInfo(r, "0.1.0", "controller");
  std::string text = r.Serialize();
  EXPECT_THAT(text, HasSubstr("{component=\"controller\",version=\"0.1.0\"} 1\n"
                              "meshload_build_info{component=\"sidecar\",version=\"0.1.0\"} 1\n"));
}

// ---- serialization --------------------------------------------------------

TEST(MetricsSerialize, SmallRegistryMatchesGoldenText) {
  Registry r;
  auto& bytes = BuildCounter().Name("meshload_bytes_read_total").Help("Bytes read from storage.").Register(r);
  bytes.Add({{"source", "http"}}).Increment(2048);
  bytes.Add({{"source", "file"}}).Increment(1048576);
  BuildGauge().Name("meshload_current_step").Help("Step being served.").Register(r).Add({}).Set(42);
  auto& wait =
      BuildHistogram().Name("meshload_trainer_wait_seconds").Help("Time a trainer waited for a batch.").Register(r);
  Histogram& h = wait.Add({}, {0.25, 1, 2.5});
  for (double v : {0.25, 0.5, 0.5, 3.0}) h.Observe(v);

  // prometheus-cpp's TextSerializer (a histogram's count and sum before its
  // buckets), over families sorted by name and series by label set.
  EXPECT_EQ(r.Serialize(),
            "# HELP meshload_bytes_read_total Bytes read from storage.\n"
            "# TYPE meshload_bytes_read_total counter\n"
            "meshload_bytes_read_total{source=\"file\"} 1048576\n"
            "meshload_bytes_read_total{source=\"http\"} 2048\n"
            "# HELP meshload_current_step Step being served.\n"
            "# TYPE meshload_current_step gauge\n"
            "meshload_current_step 42\n"
            "# HELP meshload_trainer_wait_seconds Time a trainer waited for a batch.\n"
            "# TYPE meshload_trainer_wait_seconds histogram\n"
            "meshload_trainer_wait_seconds_count 4\n"
            "meshload_trainer_wait_seconds_sum 4.25\n"
            "meshload_trainer_wait_seconds_bucket{le=\"0.25\"} 1\n"
            "meshload_trainer_wait_seconds_bucket{le=\"1\"} 3\n"
            "meshload_trainer_wait_seconds_bucket{le=\"2.5\"} 3\n"
            "meshload_trainer_wait_seconds_bucket{le=\"+Inf\"} 4\n");
}

TEST(MetricsSerialize, EmptyRegistryIsEmptyText) {
  Registry r;
  EXPECT_EQ(r.Serialize(), "");
}

TEST(MetricsSerialize, FamiliesWithoutSeriesAreLeftOut) {
  Registry r;
  BuildCounter().Name("a_total").Help("h").Register(r);
  BuildGauge().Name("b").Help("h").Register(r).Add({}).Set(1);
  EXPECT_EQ(r.Serialize(), "# HELP b h\n# TYPE b gauge\nb 1\n");
}

TEST(MetricsSerialize, FamiliesSortByNameAndSeriesByLabelSet) {
  Registry r;
  auto& z = BuildGauge().Name("zeta").Help("z").Register(r);
  auto& a = BuildGauge().Name("alpha").Help("a").Register(r);
  z.Add({{"k", "b"}}).Set(2);
  z.Add({{"k", "a"}, {"j", "z"}}).Set(3);
  z.Add({{"k", "a"}}).Set(1);
  a.Add({}).Set(0);
  EXPECT_EQ(r.Serialize(),
            "# HELP alpha a\n# TYPE alpha gauge\nalpha 0\n"
            "# HELP zeta z\n# TYPE zeta gauge\n"
            "zeta{j=\"z\",k=\"a\"} 3\n"
            "zeta{k=\"a\"} 1\n"
            "zeta{k=\"b\"} 2\n");
}

TEST(MetricsSerialize, LabelValuesEscapeBackslashQuoteAndNewline) {
  Registry r;
  BuildGauge().Name("g").Help("h").Register(r).Add({{"path", "C:\\d \"x\"\nend"}}).Set(1);
  EXPECT_EQ(r.Serialize(), "# HELP g h\n# TYPE g gauge\ng{path=\"C:\\\\d \\\"x\\\"\\nend\"} 1\n");
}

TEST(MetricsSerialize, HelpKeepsQuotes) {
  Registry r;
  BuildGauge().Name("g").Help("a \"b\" c").Register(r).Add({}).Set(1);
  EXPECT_EQ(r.Serialize(), "# HELP g a \"b\" c\n# TYPE g gauge\ng 1\n");
}

TEST(MetricsSerialize, ConstantLabelsJoinSeriesLabelsInNameOrder) {
  Registry r;
  auto& family = BuildCounter().Name("c_total").Help("h").Labels({{"job", "j1"}}).Register(r);
  family.Add({{"a", "1"}}).Increment();
  family.Add({{"z", "2"}}).Increment(2);
  EXPECT_EQ(r.Serialize(),
            "# HELP c_total h\n# TYPE c_total counter\n"
            "c_total{a=\"1\",job=\"j1\"} 1\n"
            "c_total{job=\"j1\",z=\"2\"} 2\n");
}

TEST(MetricsSerialize, HistogramBucketsAreCumulativeWithLeLastAndInfBucketEqualToCount) {
  Registry r;
  auto& family = BuildHistogram().Name("read_seconds").Help("h").Labels({{"pod", "p"}}).Register(r);
  Histogram& h = family.Add({{"source", "file"}}, ExponentialBuckets(0.001, 10, 3));
  for (double v : {0.0005, 0.002, 0.002, 0.05, 7.0}) h.Observe(v);
  EXPECT_EQ(r.Serialize(),
            "# HELP read_seconds h\n# TYPE read_seconds histogram\n"
            "read_seconds_count{pod=\"p\",source=\"file\"} 5\n"
            "read_seconds_sum{pod=\"p\",source=\"file\"} 7.0545\n"
            "read_seconds_bucket{pod=\"p\",source=\"file\",le=\"0.001\"} 1\n"
            "read_seconds_bucket{pod=\"p\",source=\"file\",le=\"0.01\"} 3\n"
            "read_seconds_bucket{pod=\"p\",source=\"file\",le=\"0.1\"} 4\n"
            "read_seconds_bucket{pod=\"p\",source=\"file\",le=\"+Inf\"} 5\n");
}

TEST(MetricsSerialize, SpecialValuesPrintAsInfAndNan) {
  Registry r;
  auto& family = BuildGauge().Name("g").Help("h").Register(r);
  family.Add({{"v", "a"}}).Set(std::numeric_limits<double>::infinity());
  family.Add({{"v", "b"}}).Set(-std::numeric_limits<double>::infinity());
  family.Add({{"v", "c"}}).Set(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(r.Serialize(),
            "# HELP g h\n# TYPE g gauge\n"
            "g{v=\"a\"} +Inf\ng{v=\"b\"} -Inf\ng{v=\"c\"} Nan\n");
}

// Numbers as prometheus-cpp writes them: up to 16 significant digits without
// trailing zeros, so integral values print without an exponent and bucket
// bounds as written (what PromQL selectors on `le` match).
TEST(MetricsSerialize, NumbersPrintAsTheLibraryWritesThem) {
  const std::vector<std::pair<double, std::string>> cases = {{0, "0"},
                                                             {1, "1"},
                                                             {-42, "-42"},
                                                             {1048576, "1048576"},
                                                             {1e15, "1000000000000000"},
                                                             {0.005, "0.005"},
                                                             {2.5, "2.5"},
                                                             {0.1 + 0.2, "0.3"},
                                                             {123456.789, "123456.789"},
                                                             {0.0005, "0.0005"},
                                                             {0.0001, "0.0001"},
                                                             {0.00005, "5e-05"},
                                                             {1.5e-7, "1.5e-07"},
                                                             {1e21, "1e+21"}};
  for (const auto& [v, text] : cases) {
    Registry r;
    BuildGauge().Name("g").Help("h").Register(r).Add({}).Set(v);
    EXPECT_EQ(r.Serialize(), "# HELP g h\n# TYPE g gauge\ng " + text + "\n") << v;
  }
  Registry r;
  BuildHistogram().Name("h").Help("h").Register(r).Add({}, ExponentialBuckets(0.0005, 10, 3)).Observe(1);
  EXPECT_THAT(r.Serialize(), HasSubstr("h_bucket{le=\"0.0005\"} 0\nh_bucket{le=\"0.005\"} 0\n"));
}

// ---- collect hooks --------------------------------------------------------

TEST(MetricsCollectHook, HooksRunBeforeEachSerialization) {
  Registry r;
  Gauge& leased = BuildGauge().Name("meshload_slots_leased").Help("h").Register(r).Add({});
  int slots = 3;
  int runs = 0;
  r.AddCollectHook([&] {
    ++runs;
    leased.Set(slots);
  });
  EXPECT_EQ(runs, 0);
  EXPECT_THAT(r.Serialize(), HasSubstr("meshload_slots_leased 3\n"));
  slots = 5;
  EXPECT_THAT(r.Serialize(), HasSubstr("meshload_slots_leased 5\n"));
  EXPECT_EQ(runs, 2);
}

TEST(MetricsCollectHook, HooksRunInTheOrderAdded) {
  Registry r;
  std::string order;
  r.AddCollectHook([&] { order += 'a'; });
  r.AddCollectHook([&] { order += 'b'; });
  (void)r.Serialize();
  EXPECT_EQ(order, "ab");
}

TEST(MetricsCollectHook, HookMayRegisterFamiliesAndAddSeries) {
  Registry r;
  r.AddCollectHook([&] { BuildGauge().Name("late").Help("h").Register(r).Add({{"k", "v"}}).Set(9); });
  EXPECT_EQ(r.Serialize(), "# HELP late h\n# TYPE late gauge\nlate{k=\"v\"} 9\n");
}

TEST(MetricsCollectHook, ConcurrentSerializationsNeverRunHooksConcurrently) {
  Registry r;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  r.AddCollectHook([&] {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // a hook that takes a while: room to overlap
    inside.fetch_sub(1);
  });
  RunConcurrently([&](int) {
    for (int i = 0; i < 20; ++i) (void)r.Serialize();
  });
  EXPECT_EQ(overlaps.load(), 0);
}

// ---- names ----------------------------------------------------------------

TEST(MetricsNames, ValidatorsFollowThePrometheusCharsets) {
  for (const char* name : {"meshload_bytes_read_total", "_x:y_1"}) EXPECT_TRUE(IsValidMetricName(name)) << name;
  for (const char* name : {"", "1x", "a-b", "a b"}) EXPECT_FALSE(IsValidMetricName(name)) << name;
  for (const char* name : {"source", "_x1"}) EXPECT_TRUE(IsValidLabelName(name)) << name;
  // "le" and "quantile" belong to histograms and summaries; "__" names to Prometheus.
  for (const char* name : {"a:b", "1a", "__name__", "le", "quantile"}) EXPECT_FALSE(IsValidLabelName(name)) << name;
}

// Death tests fork; "threadsafe" re-executes the binary so that threads left
// by earlier tests cannot deadlock the child.
class MetricsNamesDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(MetricsNamesDeathTest, InvalidMetricNameAborts) {
  Registry r;
  EXPECT_DEATH(BuildGauge().Name("bad-name").Help("h").Register(r), "invalid metric name \"bad-name\"");
  EXPECT_DEATH(BuildGauge().Name("").Help("h").Register(r), "invalid metric name");
}

TEST_F(MetricsNamesDeathTest, CounterWithoutTotalSuffixAborts) {
  Registry r;
  EXPECT_DEATH(BuildCounter().Name("meshload_bytes_read").Help("h").Register(r),
               "counter \"meshload_bytes_read\" must end in \"_total\"");
}

TEST_F(MetricsNamesDeathTest, GaugeOrHistogramWithAReservedSuffixAborts) {
  Registry r;
  EXPECT_DEATH(BuildGauge().Name("slots_total").Help("h").Register(r),
               "gauge \"slots_total\" must not end in \"_total\"");
  EXPECT_DEATH(BuildGauge().Name("x_count").Help("h").Register(r), "must not end in \"_count\"");
  EXPECT_DEATH(BuildHistogram().Name("x_bucket").Help("h").Register(r),
               "histogram \"x_bucket\" must not end in \"_bucket\"");
  EXPECT_DEATH(BuildHistogram().Name("x_sum").Help("h").Register(r), "must not end in \"_sum\"");
}

TEST_F(MetricsNamesDeathTest, EmptyHelpAborts) {
  Registry r;
  EXPECT_DEATH(BuildGauge().Name("g").Register(r), "metric \"g\" has no help text");
}

TEST_F(MetricsNamesDeathTest, HelpWithABackslashOrNewlineAborts) {
  // prometheus-cpp 1.0 writes HELP lines as they are: either would make the
  // exposition unreadable.
  Registry r;
  EXPECT_DEATH(BuildGauge().Name("g").Help("a\nb").Register(r), "holds a backslash or a newline");
  EXPECT_DEATH(BuildGauge().Name("g").Help("a \\ b").Register(r), "holds a backslash or a newline");
}

TEST_F(MetricsNamesDeathTest, SameNameWithAnotherTypeAborts) {
  Registry r;
  BuildGauge().Name("x").Help("h").Register(r);
  EXPECT_DEATH(BuildHistogram().Name("x").Help("h").Register(r),
               "metric \"x\" is already registered as a gauge; cannot register it as a histogram");
}

TEST_F(MetricsNamesDeathTest, SameNameWithOtherHelpOrConstantLabelsAborts) {
  Registry r;
  BuildGauge().Name("x").Help("h").Register(r);
  EXPECT_DEATH(BuildGauge().Name("x").Help("other").Register(r), "already registered with another");
  EXPECT_DEATH(BuildGauge().Name("x").Help("h").Labels({{"a", "b"}}).Register(r), "already registered with another");
}

TEST_F(MetricsNamesDeathTest, InvalidLabelNameAborts) {
  Registry r;
  auto& family = BuildGauge().Name("g").Help("h").Register(r);
  EXPECT_DEATH(family.Add({{"bad-label", "v"}}), "invalid label \"bad-label\" of metric \"g\": must match");
  EXPECT_DEATH(family.Add({{"", "v"}}), "invalid label \"\"");
  EXPECT_DEATH(BuildGauge().Name("g2").Help("h").Labels({{"1x", "v"}}).Register(r), "invalid label \"1x\"");
}

TEST_F(MetricsNamesDeathTest, DoubleUnderscoreLabelAborts) {
  Registry r;
  auto& family = BuildCounter().Name("c_total").Help("h").Register(r);
  EXPECT_DEATH(family.Add({{"__name__", "v"}}), "reserved for Prometheus");
}

TEST_F(MetricsNamesDeathTest, LeAndQuantileLabelsAbort) {
  Registry r;
  auto& hist = BuildHistogram().Name("h").Help("h").Register(r);
  EXPECT_DEATH(hist.Add({{"le", "1"}}, {1}), "invalid label \"le\" of metric \"h\"");
  EXPECT_DEATH(BuildHistogram().Name("h2").Help("h").Labels({{"le", "1"}}).Register(r), "invalid label \"le\"");
  auto& gauge = BuildGauge().Name("g").Help("h").Register(r);
  EXPECT_DEATH(gauge.Add({{"quantile", "0.5"}}), "reserved for histogram and summary");
}

TEST_F(MetricsNamesDeathTest, SeriesLabelRepeatingAConstantLabelAborts) {
  Registry r;
  auto& family = BuildGauge().Name("g").Help("h").Labels({{"pod", "p"}}).Register(r);
  EXPECT_DEATH(family.Add({{"pod", "q"}}), "already a constant label");
}

TEST_F(MetricsNamesDeathTest, HistogramSeriesWithOtherBucketsAborts) {
  Registry r;
  auto& family = BuildHistogram().Name("h").Help("h").Register(r);
  family.Add({{"k", "v"}}, {1, 2});
  EXPECT_EQ(&family.Add({{"k", "v"}}, {1, 2, std::numeric_limits<double>::infinity()}),
            &family.Add({{"k", "v"}}, {1, 2}));
  EXPECT_DEATH(family.Add({{"k", "v"}}, {1, 3}), "already exists with other bucket bounds");
}

TEST_F(MetricsNamesDeathTest, UnsortedOrNonFiniteBucketsAbort) {
  EXPECT_DEATH(Histogram({1, 1}), "strictly increasing");
  EXPECT_DEATH(Histogram({2, 1}), "strictly increasing");
  EXPECT_DEATH(Histogram({std::numeric_limits<double>::quiet_NaN()}), "must be finite");
  EXPECT_DEATH(Histogram({-std::numeric_limits<double>::infinity(), 1}), "must be finite");
  EXPECT_DEATH(ExponentialBuckets(0, 2, 3), "needs start > 0");
  EXPECT_DEATH(LinearBuckets(0, 0, 3), "width > 0");
}

}  // namespace
}  // namespace meshload::metrics
