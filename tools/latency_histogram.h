/// \file
/// A small log-bucketed latency histogram (8 buckets per doubling from 1 µs
/// to ~1 h) that processes can merge: the demo trainers send theirs to
/// `meshload run --local`, which reports percentiles over all of them.
///
/// Thread safety: not thread-safe; one per thread.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace meshload::tools {

class LatencyHistogram {
 public:
  static constexpr int kPerDoubling = 8;
  static constexpr int kBuckets = 32 * kPerDoubling;  // 1 µs · 2^32 ≈ 71 min

  void Record(double seconds) {
    const double us = seconds * 1e6;
    int b = us <= 1.0 ? 0 : static_cast<int>(std::log2(us) * kPerDoubling) + 1;
    if (b >= kBuckets) b = kBuckets - 1;
    ++counts_[static_cast<size_t>(b)];
    ++total_;
  }
  void Merge(const std::vector<uint64_t>& counts) {
    for (size_t i = 0; i < counts.size() && i < counts_.size(); ++i) {
      counts_[i] += counts[i];
      total_ += counts[i];
    }
  }
  uint64_t count() const { return total_; }
  /// The upper edge of the bucket holding quantile q (0..1), in seconds.
  double Quantile(double q) const {
    if (total_ == 0) return 0;
    const uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total_)));
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += counts_[static_cast<size_t>(b)];
      if (seen >= rank && seen > 0) return UpperEdge(b);
    }
    return UpperEdge(kBuckets - 1);
  }
  std::vector<uint64_t> counts() const { return {counts_.begin(), counts_.end()}; }

 private:
  static double UpperEdge(int b) { return b == 0 ? 1e-6 : std::exp2(static_cast<double>(b) / kPerDoubling) * 1e-6; }
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
};

}  // namespace meshload::tools
