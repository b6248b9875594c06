// Prints the exposition of a registry shaped like the sidecar's, with values
// observed, for promtool_check.sh to lint. Every kind of family, label and
// number the sidecar exports should appear here, so that promtool sees what
// Prometheus will.
#include <cstdio>
#include <limits>

#include "common/metrics/metrics.h"

int main() {
  using namespace meshload::metrics;
  Registry registry;
  RegisterBuildInfo(registry, "0.1.0", "sidecar");

  auto& bytes = BuildCounter()
                    .Name("meshload_bytes_read_total")
                    .Help("Bytes read from storage, by source scheme.")
                    .Register(registry);
  bytes.Add({{"source", "file"}}).Increment(3221225472.0);
  bytes.Add({{"source", "https"}}).Increment(1048576);

  BuildCounter()
      .Name("meshload_samples_read_total")
      .Help("Samples decoded from storage.")
      .Register(registry)
      .Add({})
      .Increment(81920);
  BuildCounter()
      .Name("meshload_batches_staged_total")
      .Help("Batches written into a shared-memory slot for the trainer.")
      .Register(registry)
      .Add({})
      .Increment(640);
  BuildCounter()
      .Name("meshload_batches_consumed_total")
      .Help("Batches the trainer released back to the slot pool.")
      .Register(registry)
      .Add({})
      .Increment(638);

  BuildGauge()
      .Name("meshload_current_step")
      .Help("Training step whose batch is being staged.")
      .Register(registry)
      .Add({})
      .Set(640);
  Gauge& leased = BuildGauge()
                      .Name("meshload_slots_leased")
                      .Help("Shared-memory slots currently leased to the trainer.")
                      .Register(registry)
                      .Add({});
  registry.AddCollectHook([&leased] { leased.Set(2); });
  BuildGauge()
      .Name("meshload_last_plan_timestamp_seconds")
      .Help("Unix time the current plan was received.")
      .Register(registry)
      .Add({})
      .SetToCurrentTime();

  Histogram& wait = BuildHistogram()
                        .Name("meshload_trainer_wait_seconds")
                        .Help("Time the trainer waited for a batch; 0 when one was ready.")
                        .Register(registry)
                        .Add({}, ExponentialBuckets(0.0001, 4, 10));
  for (double v : {0.0, 0.00002, 0.0003, 0.0003, 0.012, 0.5, 30.0}) wait.Observe(v);

  auto& read_seconds = BuildHistogram()
                           .Name("meshload_storage_read_seconds")
                           .Help("Latency of one successful storage request, by source.")
                           .Register(registry);
  const BucketBoundaries read_buckets = ExponentialBuckets(0.0005, 2, 14);
  Histogram& file_reads = read_seconds.Add({{"source", "file"}}, read_buckets);
  Histogram& http_reads = read_seconds.Add({{"source", "https"}}, read_buckets);
  for (double v : {0.0004, 0.001, 0.002, 0.0021}) file_reads.Observe(v);
  for (double v : {0.02, 0.15, 1.7, 9.0}) http_reads.Observe(v);

  auto& retries = BuildCounter()
                      .Name("meshload_storage_retries_total")
                      .Help("Storage attempts that failed and were retried, by source and reason.")
                      .Register(registry);
  retries.Add({{"source", "https"}, {"reason", "http_5xx"}}).Increment(3);
  retries.Add({{"source", "https"}, {"reason", "timeout"}}).Increment(1);
  retries.Add({{"source", "https"}, {"reason", "connection"}});

  auto& errors =
      BuildCounter().Name("meshload_errors_total").Help("Requests that failed for good, by kind.").Register(registry);
  errors.Add({{"kind", "not_found"}}).Increment();
  errors.Add({{"kind", "data_loss"}});
  // Label values are free text: quotes, backslashes and newlines must survive.
  errors.Add({{"kind", "weird \"kind\" \\ with\nnewline"}}).Increment(2);

  // Special values must parse too.
  auto& special = BuildGauge()
                      .Name("meshload_sample_special_values")
                      .Help("Gauges holding +Inf, -Inf and NaN (written as prometheus-cpp writes them).")
                      .Register(registry);
  special.Add({{"value", "pos_inf"}}).Set(std::numeric_limits<double>::infinity());
  special.Add({{"value", "neg_inf"}}).Set(-std::numeric_limits<double>::infinity());
  special.Add({{"value", "nan"}}).Set(std::numeric_limits<double>::quiet_NaN());
  special.Add({{"value", "tiny"}}).Set(1.5e-9);

  std::string text = registry.Serialize();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
