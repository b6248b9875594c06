#include "planner/mixture.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "common/status.h"
#include "planner/sampler.h"

namespace meshload::planner {
namespace {

constexpr uint64_t R = MixtureSchedule::kResolution;

// The weights as integers: a_d = round(w_d / Σw · 2^40), in IEEE double
// arithmetic (the same on every machine), then exact integer arithmetic.
std::vector<uint64_t> Parts(const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<uint64_t> out;
  for (double w : weights) out.push_back(static_cast<uint64_t>(std::llround(std::ldexp(w / total, 40))));
  return out;
}

// Quotas in units of 1/R summing to B·R exactly: ⌊B·R·a_d / A⌋, the units
// left one each to the largest remainders (ties: the lower dataset).
std::vector<uint64_t> Quotas(const std::vector<uint64_t>& parts, uint64_t batch) {
  using u128 = unsigned __int128;
  const size_t D = parts.size();
  u128 total = 0;
  for (uint64_t a : parts) total += a;
  std::vector<uint64_t> q(D);
  std::vector<u128> rem(D);
  uint64_t given = 0;
  for (size_t d = 0; d < D; ++d) {
    const u128 num = static_cast<u128>(batch) * R * parts[d];
    q[d] = static_cast<uint64_t>(num / total);
    rem[d] = num % total;
    given += q[d];
  }
  std::vector<size_t> order(D);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rem[a] > rem[b]; });
  for (size_t i = 0; given < batch * R; ++i, ++given) ++q[order[i]];  // fewer than D units are left
  return q;
}

}  // namespace

uint64_t MixtureDatasetSeed(uint64_t seed, size_t dataset) { return Mix64(seed + dataset + 1); }

uint64_t MixtureInterleaveKey(uint64_t seed, int64_t step) {
  return DeriveKey(seed, static_cast<uint64_t>(step), 0x4D49585455524Eull);  // "MIXTURN"
}

MixtureSchedule::MixtureSchedule(const MixtureSpec& mixture, uint64_t batch) : datasets_(mixture.datasets.size()) {
  const size_t D = datasets_;
  // The weights from each step where one changes.
  std::map<int64_t, std::vector<double>> at;
  std::vector<double> w(D);
  for (size_t d = 0; d < D; ++d) w[d] = mixture.datasets[d].weight;
  at[0] = w;
  for (size_t d = 0; d < D; ++d) {
    for (const MixtureWeight& e : mixture.datasets[d].schedule) at.emplace(e.step, std::vector<double>());
  }
  std::vector<size_t> next(D, 0);
  for (auto& [step, weights] : at) {
    for (size_t d = 0; d < D; ++d) {
      const auto& sched = mixture.datasets[d].schedule;
      while (next[d] < sched.size() && sched[next[d]].step <= step) w[d] = sched[next[d]++].weight;
    }
    weights = w;
  }
  std::vector<uint64_t> consumed(D, 0);
  for (const auto& [step, weights] : at) {
    if (!segments_.empty()) {
      const Segment& prev = segments_.back();
      consumed = prev.consumed;
      ConsumedIn(prev, static_cast<uint64_t>(step - prev.start), consumed);
    }
    Segment s;
    s.start = step;
    const std::vector<uint64_t> parts = Parts(weights);
    const double total = static_cast<double>(std::accumulate(parts.begin(), parts.end(), uint64_t{0}));
    for (uint64_t a : parts) s.weights.push_back(static_cast<double>(a) / total);
    const std::vector<uint64_t> q = Quotas(parts, batch);
    uint64_t units = 0;
    for (size_t d = 0; d < D; ++d) {
      s.base.push_back(q[d] / R);
      s.fraction.push_back(q[d] % R);
      units += q[d] % R;
    }
    const uint64_t r = units / R;  // extras a step
    s.extras.assign((R + 1) * D, 0);
    std::vector<size_t> candidates;
    for (size_t d = 0; d < D; ++d) {
      if (s.fraction[d] > 0) candidates.push_back(d);
    }
    for (uint64_t n = 0; n < R; ++n) {
      const uint16_t* e = &s.extras[n * D];
      uint16_t* e_next = &s.extras[(n + 1) * D];
      std::copy(e, e + D, e_next);
      // Owed after this step: (n + 1)·f_d − R·E_d(n).
      auto owed = [&](size_t d) {
        return static_cast<int64_t>((n + 1) * s.fraction[d]) - static_cast<int64_t>(R * e[d]);
      };
      std::partial_sort(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(r), candidates.end(),
                        [&](size_t a, size_t b) { return owed(a) != owed(b) ? owed(a) > owed(b) : a < b; });
      for (uint64_t i = 0; i < r; ++i) ++e_next[candidates[i]];
    }
    for (size_t d = 0; d < D; ++d) {
      MESHLOAD_CHECK(s.extras[R * D + d] == s.fraction[d], "a mixture's extras do not repeat every R steps");
    }
    s.consumed = consumed;
    segments_.push_back(std::move(s));
  }
}

const MixtureSchedule::Segment& MixtureSchedule::SegmentOf(int64_t step) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), step,
                             [](int64_t t, const Segment& s) { return t < s.start; });
  return *std::prev(it);
}

void MixtureSchedule::ConsumedIn(const Segment& s, uint64_t n, std::vector<uint64_t>& out) const {
  for (size_t d = 0; d < datasets_; ++d) {
    out[d] += n * s.base[d] + (n / R) * s.fraction[d] + s.extras[(n % R) * datasets_ + d];
  }
}

std::vector<uint64_t> MixtureSchedule::ConsumedBefore(int64_t step) const {
  const Segment& s = SegmentOf(step);
  std::vector<uint64_t> out = s.consumed;
  ConsumedIn(s, static_cast<uint64_t>(step - s.start), out);
  return out;
}

std::vector<uint64_t> MixtureSchedule::CountsAt(int64_t step) const {
  const Segment& s = SegmentOf(step);
  const uint64_t n = static_cast<uint64_t>(step - s.start) % R;
  std::vector<uint64_t> out(datasets_);
  for (size_t d = 0; d < datasets_; ++d) {
    out[d] = s.base[d] + s.extras[(n + 1) * datasets_ + d] - s.extras[n * datasets_ + d];
  }
  return out;
}

std::vector<double> MixtureSchedule::WeightsAt(int64_t step) const { return SegmentOf(step).weights; }

}  // namespace meshload::planner
