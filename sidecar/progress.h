/// \file
/// A sidecar's progress over a sliding window: what `GET /progress` on the
/// metrics port serves (docs/operations.md#progress), and what the
/// controller reads into the DataLoadJob's status.
///
/// The sidecar takes a ProgressSample of its counters at most every
/// `interval` (on each /progress request and from its watchdog), keeps those
/// of the last `window`, and a report compares the newest with the oldest
/// kept: the trainer's wait as a fraction of that time, storage read latency
/// percentiles from the histogram buckets' growth, bytes and steps per
/// second, errors. With fewer than two samples, or none in the window, the
/// rates are null, never guessed.
///
/// The consumed step is a watermark: the trainer has finished with every
/// step from the first one served up to it (ConsumedWatermark), so a job
/// resumed after it loses no batch even when a trainer releases out of
/// order.
///
/// Thread safety: ProgressWindow and ConsumedWatermark are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace meshload::sidecar {

/// The counters a progress report is computed from, at one instant.
struct ProgressSample {
  int64_t time_ns = 0;           // CLOCK_MONOTONIC
  int64_t consumed_step = -1;    // ConsumedWatermark::step(); -1 before the first
  int64_t delivered_step = -1;   // the last step handed to the trainer; -1 before the first
  int64_t next_staged_step = 0;  // the next step the producers will stage
  uint64_t batches_consumed = 0;
  double trainer_wait_seconds = 0;  // sum of the trainer's waits
  uint64_t trainer_waits = 0;
  /// Storage read latency: cumulative counts per bucket (all sources
  /// together), for the bounds given to ProgressWindow.
  std::vector<uint64_t> read_latency_buckets;
  uint64_t bytes_read = 0;
  /// Staging: seconds spent loading steps (reads, gathers, the exchange and
  /// the device copy), the steps loaded, and of those seconds the ones a
  /// step waited on other processes' sidecars after its own reads.
  double staging_seconds = 0;
  uint64_t steps_staged = 0;
  double peer_wait_seconds = 0;
  bool exchanges = false;  // the job exchanges samples with peers
  uint64_t storage_retries = 0;
  uint64_t errors = 0;
  bool trainer_connected = false;
};

/// The steps the trainer finished with, as a contiguous watermark.
class ConsumedWatermark {
 public:
  /// Steps before `first` count as consumed (a sidecar started at step N
  /// reports N - 1 until the trainer finishes step N).
  void Reset(int64_t first) MESHLOAD_EXCLUDES(mu_);
  /// The trainer released `step`. Steps below the watermark are ignored.
  void Consumed(int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// The highest step such that it and every step before it (from the
  /// Reset() step) were consumed; Reset() step - 1 when none was.
  int64_t step() const MESHLOAD_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  int64_t watermark_ MESHLOAD_GUARDED_BY(mu_) = -1;
  std::set<int64_t> above_ MESHLOAD_GUARDED_BY(mu_);  // consumed steps above watermark_ + 1
};

struct ProgressOptions {
  std::chrono::nanoseconds window = std::chrono::seconds(15);
  /// Samples closer together than this are not kept (the newest replaces
  /// the last), so a burst of requests costs nothing.
  std::chrono::nanoseconds interval = std::chrono::seconds(1);
};

class ProgressWindow {
 public:
  /// `read_bounds`: the upper bounds of the storage read latency buckets
  /// (seconds, increasing; +Inf implied after the last).
  ProgressWindow(std::vector<double> read_bounds, ProgressOptions options = {});

  /// Keeps `s` (see ProgressOptions::interval) and drops samples older than
  /// the window, keeping the newest one before it as the window's start.
  void Add(ProgressSample s) MESHLOAD_EXCLUDES(mu_);

  /// The report over the kept samples (the newest last):
  ///   {"consumedStep", "resumeStep", "deliveredStep", "stagedAhead",
  ///    "trainerConnected", "windowSeconds", "trainerWaitFraction",
  ///    "stepsPerSecond", "bytesPerSecond", "storageReadSeconds": {"p50",
  ///    "p90", "p99", "requests"}, "stagingSecondsPerStep",
  ///    "peerWaitFraction", "storageRetries", "errors", "errorsInWindow"}
  /// Rates are null without two samples; percentiles are null without reads
  /// in the window; stagingSecondsPerStep is null without a step staged in
  /// the window, and peerWaitFraction (the share of the staging time spent
  /// waiting on peers' sidecars) also when the job exchanges nothing. resumeStep = consumedStep + 1: where a restarted
  /// job picks up. The caller adds who it is (job, process).
  nlohmann::json Report() const MESHLOAD_EXCLUDES(mu_);

 private:
  const std::vector<double> read_bounds_;
  const ProgressOptions options_;
  mutable Mutex mu_;
  std::deque<ProgressSample> samples_ MESHLOAD_GUARDED_BY(mu_);  // oldest first
};

/// The latency below which fraction `q` of the counted observations fall,
/// interpolated linearly inside the bucket (as Prometheus'
/// histogram_quantile does); `counts` are per-bucket (not cumulative), one
/// more than `bounds` (the +Inf bucket, reported as the last bound).
/// nullopt when nothing was counted.
std::optional<double> BucketQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double q);

}  // namespace meshload::sidecar
