// Metrics benchmark: what an update costs on the hot path (a counter
// increment, a gauge set, a histogram observation, a batch of observations),
// from one thread and from two threads on the same series, and what a scrape
// of a sidecar-sized registry costs.
//
// The ceiling, measured in the same run: a relaxed atomic add on a uint64_t,
// the least any shared counter can cost (machines are noisy: compare ratios).
//
//   build/tools/bench/metrics_bench [--quick]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/flags.h"
#include "common/metrics/metrics.h"

namespace meshload::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Best-of-`reps` nanoseconds per call of fn(i), over `n` calls on each of
// `threads` threads at once.
template <typename F>
double NanosPerCall(uint64_t n, int reps, int threads, F fn) {
  double best = 1e18;
  for (int r = 0; r < reps; ++r) {
    std::atomic<int> ready{0};
    std::vector<std::thread> pool;
    auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < threads) {
        }
        for (uint64_t i = 0; i < n; ++i) fn(i);
      });
    }
    for (auto& t : pool) t.join();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    best = std::min(best, ns / static_cast<double>(n));
  }
  return best;
}

void Row(const char* what, double ns, double ceiling) {
  std::printf("  %-44s %8.1f ns  (%.1fx the atomic add)\n", what, ns, ns / ceiling);
}

int Main(int argc, char** argv) {
  bool quick = false;
  FlagParser flags("metrics_bench", "usage: metrics_bench [--quick]\n");
  flags.Bool({"--quick"}, &quick);
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  const uint64_t n = quick ? 2'000'000 : 20'000'000;
  const int reps = quick ? 2 : 5;

  metrics::Registry registry;
  auto& counter = metrics::BuildCounter().Name("bench_reads_total").Help("Reads.").Register(registry).Add({});
  auto& gauge = metrics::BuildGauge().Name("bench_step").Help("Step.").Register(registry).Add({});
  auto& histogram = metrics::BuildHistogram()
                        .Name("bench_read_seconds")
                        .Help("Read latency.")
                        .Register(registry)
                        .Add({}, metrics::ExponentialBuckets(1e-6, 2, 24));
  std::atomic<uint64_t> atomic{0};
  std::vector<double> batch(64);
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = 1e-5 * static_cast<double>(i % 7 + 1);

  std::printf("meshload metrics benchmark%s (common/metrics on prometheus-cpp)\n\n", quick ? " (quick)" : "");
  for (int threads : {1, 2}) {
    std::printf("%d thread%s on one series:\n", threads, threads == 1 ? "" : "s");
    const double ceiling =
        NanosPerCall(n, reps, threads, [&](uint64_t) { atomic.fetch_add(1, std::memory_order_relaxed); });
    std::printf("  %-44s %8.1f ns  (the ceiling)\n", "atomic<uint64_t>::fetch_add (relaxed)", ceiling);
    Row("Counter::Increment(1)", NanosPerCall(n, reps, threads, [&](uint64_t) { counter.Increment(1); }), ceiling);
    Row("Gauge::Set(i)", NanosPerCall(n, reps, threads, [&](uint64_t i) { gauge.Set(static_cast<double>(i)); }),
        ceiling);
    Row("Histogram::Observe(v)",
        NanosPerCall(n, reps, threads, [&](uint64_t i) { histogram.Observe(1e-6 * static_cast<double>(i & 1023)); }),
        ceiling);
    const double per_batch = NanosPerCall(n / batch.size(), reps, threads,
                                          [&](uint64_t) { histogram.ObserveMany(batch.data(), batch.size()); });
    Row("Histogram::ObserveMany(64 values), per value", per_batch / static_cast<double>(batch.size()), ceiling);
    std::printf("\n");
  }

  // A scrape of a registry the size of a sidecar's (about 30 families, a
  // few series each, a dozen histograms of 24 buckets).
  metrics::Registry big;
  for (int f = 0; f < 18; ++f) {
    auto& fam =
        metrics::BuildCounter().Name("bench_counter_" + std::to_string(f) + "_total").Help("A counter.").Register(big);
    for (int s = 0; s < 4; ++s) fam.Add({{"source", "s" + std::to_string(s)}}).Increment(f * 10 + s);
  }
  for (int f = 0; f < 12; ++f) {
    auto& fam =
        metrics::BuildHistogram().Name("bench_histogram_" + std::to_string(f)).Help("A histogram.").Register(big);
    fam.Add({{"source", "file"}}, metrics::ExponentialBuckets(1e-6, 2, 24)).Observe(1e-3);
  }
  size_t bytes = 0;
  const double scrape_ns = NanosPerCall(quick ? 200 : 2000, reps, 1, [&](uint64_t) { bytes = big.Serialize().size(); });
  std::printf("a scrape of 30 families (12 histograms of 24 buckets): %.1f µs, %zu bytes\n", scrape_ns / 1e3, bytes);
  return 0;
}

}  // namespace
}  // namespace meshload::tools::bench

int main(int argc, char** argv) { return meshload::tools::bench::Main(argc, argv); }
