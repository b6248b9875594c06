#include "sidecar/progress.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace meshload::sidecar {

using nlohmann::json;

void ConsumedWatermark::Reset(int64_t first) {
  MutexLock lock(mu_);
  watermark_ = first - 1;
  above_.clear();
}

void ConsumedWatermark::Consumed(int64_t step) {
  MutexLock lock(mu_);
  if (step <= watermark_) return;
  above_.insert(step);
  while (!above_.empty() && *above_.begin() == watermark_ + 1) {
    ++watermark_;
    above_.erase(above_.begin());
  }
}

int64_t ConsumedWatermark::step() const {
  MutexLock lock(mu_);
  return watermark_;
}

std::optional<double> BucketQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double q) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0 || bounds.empty()) return std::nullopt;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (static_cast<double>(below + counts[i]) >= rank) {
      if (i >= bounds.size()) return bounds.back();  // the +Inf bucket
      const double lo = i == 0 ? 0.0 : bounds[i - 1];
      const double hi = bounds[i];
      const double into = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
      return lo + (hi - lo) * std::clamp(into, 0.0, 1.0);
    }
    below += counts[i];
  }
  return bounds.back();
}

ProgressWindow::ProgressWindow(std::vector<double> read_bounds, ProgressOptions options)
    : read_bounds_(std::move(read_bounds)), options_(options) {}

void ProgressWindow::Add(ProgressSample s) {
  MutexLock lock(mu_);
  if (samples_.size() >= 2 && s.time_ns - samples_[samples_.size() - 2].time_ns < options_.interval.count()) {
    samples_.back() = std::move(s);
  } else {
    samples_.push_back(std::move(s));
  }
  // Keep the newest sample at or before the window's start as its first.
  const int64_t start = samples_.back().time_ns - options_.window.count();
  while (samples_.size() >= 2 && samples_[1].time_ns <= start) samples_.pop_front();
}

json ProgressWindow::Report() const {
  MutexLock lock(mu_);
  json out = {{"consumedStep", nullptr},
              {"resumeStep", nullptr},
              {"deliveredStep", nullptr},
              {"stagedAhead", nullptr},
              {"trainerConnected", false},
              {"windowSeconds", nullptr},
              {"trainerWaitFraction", nullptr},
              {"stepsPerSecond", nullptr},
              {"bytesPerSecond", nullptr},
              {"storageReadSeconds", {{"p50", nullptr}, {"p90", nullptr}, {"p99", nullptr}, {"requests", 0}}},
              {"stagingSecondsPerStep", nullptr},
              {"peerWaitFraction", nullptr},
              {"storageRetries", 0},
              {"errors", 0},
              {"errorsInWindow", nullptr}};
  if (samples_.empty()) return out;
  const ProgressSample& now = samples_.back();
  out["consumedStep"] = now.consumed_step;
  out["resumeStep"] = now.consumed_step + 1;
  out["deliveredStep"] = now.delivered_step;
  // Staged and not yet handed over: the steps the trainer can have at once.
  out["stagedAhead"] = std::max<int64_t>(0, now.next_staged_step - (now.delivered_step + 1));
  out["trainerConnected"] = now.trainer_connected;
  out["storageRetries"] = now.storage_retries;
  out["errors"] = now.errors;
  if (samples_.size() < 2) return out;
  const ProgressSample& then = samples_.front();
  const double seconds = static_cast<double>(now.time_ns - then.time_ns) / 1e9;
  if (seconds <= 0) return out;
  auto delta = [](auto a, auto b) { return a >= b ? a - b : decltype(a - b){0}; };
  out["windowSeconds"] = seconds;
  out["trainerWaitFraction"] =
      std::clamp(std::max(0.0, now.trainer_wait_seconds - then.trainer_wait_seconds) / seconds, 0.0, 1.0);
  out["stepsPerSecond"] = static_cast<double>(delta(now.batches_consumed, then.batches_consumed)) / seconds;
  out["bytesPerSecond"] = static_cast<double>(delta(now.bytes_read, then.bytes_read)) / seconds;
  out["errorsInWindow"] = delta(now.errors, then.errors);
  if (const uint64_t staged = delta(now.steps_staged, then.steps_staged); staged > 0) {
    const double staging = std::max(0.0, now.staging_seconds - then.staging_seconds);
    out["stagingSecondsPerStep"] = staging / static_cast<double>(staged);
    if (now.exchanges && staging > 0) {
      out["peerWaitFraction"] =
          std::clamp(std::max(0.0, now.peer_wait_seconds - then.peer_wait_seconds) / staging, 0.0, 1.0);
    }
  }
  // Per-bucket counts of the reads in the window, from the cumulative ones.
  std::vector<uint64_t> counts(now.read_latency_buckets.size(), 0);
  uint64_t previous = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t before = i < then.read_latency_buckets.size() ? then.read_latency_buckets[i] : 0;
    const uint64_t cumulative = delta(now.read_latency_buckets[i], before);
    counts[i] = delta(cumulative, previous);
    previous = std::max(previous, cumulative);
  }
  json& reads = out["storageReadSeconds"];
  reads["requests"] = previous;
  for (auto [name, q] : {std::pair{"p50", 0.5}, std::pair{"p90", 0.9}, std::pair{"p99", 0.99}}) {
    if (auto v = BucketQuantile(read_bounds_, counts, q)) reads[name] = *v;
  }
  return out;
}

}  // namespace meshload::sidecar
