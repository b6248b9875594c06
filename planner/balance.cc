#include "planner/balance.h"

#include <algorithm>
#include <bit>
#include <set>
#include <utility>

#include "planner/dataset_index.h"

namespace meshload::planner {
namespace {

// Batch positions by weight, heaviest first; equal weights in sampler order.
std::vector<uint64_t> HeaviestFirst(const std::vector<uint64_t>& weights) {
  const uint64_t n = weights.size();
  const int pos_bits = n <= 1 ? 1 : std::bit_width(n - 1);
  const uint64_t heaviest = *std::max_element(weights.begin(), weights.end());
  std::vector<uint64_t> order(n);
  if (pos_bits < 64 && heaviest < (uint64_t{1} << (64 - pos_bits))) {
    // One radix sort of (weight, n−1−position) keys; read backwards, the
    // weights fall and equal weights come in rising position.
    std::vector<uint64_t> keys(n);
    for (uint64_t i = 0; i < n; ++i) keys[i] = (weights[i] << pos_bits) | (n - 1 - i);
    RadixSort(keys);
    const uint64_t mask = (uint64_t{1} << pos_bits) - 1;
    for (uint64_t i = 0; i < n; ++i) order[i] = n - 1 - (keys[n - 1 - i] & mask);
    return order;
  }
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint64_t a, uint64_t b) { return weights[a] != weights[b] ? weights[a] > weights[b] : a < b; });
  return order;
}

}  // namespace

ShardLoads LoadsOfShards(const std::vector<uint64_t>& weights, int64_t shards) {
  ShardLoads out;
  if (weights.empty() || shards < 1) return out;
  const size_t k = weights.size() / static_cast<size_t>(shards);
  uint64_t total = 0;
  out.min = UINT64_MAX;
  for (size_t s = 0; s < static_cast<size_t>(shards); ++s) {
    uint64_t load = 0;
    for (size_t i = s * k; i < (s + 1) * k; ++i) load += weights[i];
    total += load;
    out.min = std::min(out.min, load);
    out.max = std::max(out.max, load);
  }
  out.mean = static_cast<double>(total) / static_cast<double>(shards);
  return out;
}

BalanceOutcome BalanceShards(std::vector<uint64_t>& batch, std::vector<uint64_t>& weights, int64_t shards,
                             double tolerance) {
  BalanceOutcome out;
  out.before = LoadsOfShards(weights, shards);
  out.after = out.before;
  auto within = [&](uint64_t gap, double mean) { return static_cast<double>(gap) <= tolerance * mean; };
  if (shards <= 1 || batch.empty() || within(out.before.max - out.before.min, out.before.mean)) {
    out.within_tolerance = within(out.before.max - out.before.min, out.before.mean);
    return out;
  }
  const uint64_t n = batch.size();
  const size_t S = static_cast<size_t>(shards);
  const uint64_t k = n / S;

  // 1. Rounds of S samples, heaviest first: the round's heaviest goes to the
  // lightest shard, its next to the next lightest (shard ties: the lower).
  // The shards are ordered by one radix sort of (load, shard) keys a round
  // when the loads leave room for the shard's bits, else by std::sort.
  std::vector<uint64_t> load(S, 0);
  std::vector<uint64_t> members(n);  // shard s: members[s·k, (s+1)·k), batch positions
  const std::vector<uint64_t> order = HeaviestFirst(weights);
  const int shard_bits = std::bit_width(S - 1);
  uint64_t total = 0;
  for (uint64_t w : weights) total += w;
  const bool packed = shard_bits < 64 && (total >> (64 - shard_bits)) == 0;
  std::vector<uint64_t> by_load(S);
  for (uint64_t s = 0; s < S; ++s) by_load[s] = s;  // all empty: by shard
  for (uint64_t r = 0; r < k; ++r) {
    if (r > 0 && packed) {
      for (uint64_t s = 0; s < S; ++s) by_load[s] = (load[s] << shard_bits) | s;
      RadixSort(by_load);
      for (uint64_t& key : by_load) key &= (uint64_t{1} << shard_bits) - 1;
    } else if (r > 0) {
      std::sort(by_load.begin(), by_load.end(),
                [&](uint64_t a, uint64_t b) { return load[a] != load[b] ? load[a] < load[b] : a < b; });
    }
    for (uint64_t j = 0; j < S; ++j) {
      const uint64_t s = by_load[j];
      const uint64_t pos = order[r * S + j];
      load[s] += weights[pos];
      members[s * k + r] = pos;
    }
  }

  // 2. Swaps. The best swap between two shards `hi` (heavier) and `lo`
  // moves d = w_a − w_b (0 < d < gap) from hi to lo, best at d = gap/2:
  // minimise |2d − gap|; ties go to the lower positions. Any such swap
  // lowers the sum of squared loads and raises neither the heaviest load
  // nor lowers the lightest, so the loop ends.
  using Entry = std::pair<uint64_t, uint64_t>;  // (load, shard)
  std::set<Entry> shards_by_load;
  for (uint64_t s = 0; s < S; ++s) shards_by_load.emplace(load[s], s);
  const double mean = out.before.mean;
  const uint64_t max_swaps = 8 * S + 64;
  std::vector<uint64_t> light_sorted;
  struct Swap {
    uint64_t cost = UINT64_MAX, a = 0, b = 0;
  };
  auto best_swap = [&](uint64_t hi, uint64_t lo) {
    Swap best;
    const uint64_t gap = load[hi] - load[lo];
    // The light shard's members by weight (then position), to search.
    light_sorted.assign(members.begin() + static_cast<ptrdiff_t>(lo * k),
                        members.begin() + static_cast<ptrdiff_t>((lo + 1) * k));
    std::sort(light_sorted.begin(), light_sorted.end(),
              [&](uint64_t a, uint64_t b) { return weights[a] != weights[b] ? weights[a] < weights[b] : a < b; });
    for (uint64_t ia = hi * k; ia < (hi + 1) * k; ++ia) {
      const uint64_t a = members[ia];
      const uint64_t wa = weights[a];
      // The first light member with 2·w_b >= 2·w_a − gap, and the one before.
      auto it = std::lower_bound(light_sorted.begin(), light_sorted.end(), a,
                                 [&](uint64_t b, uint64_t) { return 2 * weights[b] + gap < 2 * wa; });
      for (auto c : {it, it == light_sorted.begin() ? light_sorted.end() : it - 1}) {
        if (c == light_sorted.end()) continue;
        const uint64_t wb = weights[*c];
        if (wb >= wa || wa - wb >= gap) continue;
        const uint64_t d2 = 2 * (wa - wb);
        const uint64_t cost = d2 > gap ? d2 - gap : gap - d2;
        if (cost < best.cost || (cost == best.cost && std::make_pair(a, *c) < std::make_pair(best.a, best.b))) {
          best = {cost, a, *c};
        }
      }
    }
    return best;
  };
  while (out.swaps < max_swaps) {
    const uint64_t lightest = shards_by_load.begin()->second;
    const uint64_t heaviest = shards_by_load.rbegin()->second;
    if (within(load[heaviest] - load[lightest], mean)) break;
    // The heaviest with the lightest; when no swap between them narrows
    // their gap, the heaviest with the next lighter shards in turn, then
    // the lightest with the next heavier ones.
    uint64_t hi = heaviest, lo = lightest;
    Swap swap = best_swap(hi, lo);
    for (auto it = std::next(shards_by_load.begin()); swap.cost == UINT64_MAX && it->second != heaviest; ++it) {
      if (it->first == load[heaviest]) break;
      lo = it->second;
      swap = best_swap(hi, lo);
    }
    for (auto it = std::next(shards_by_load.rbegin()); swap.cost == UINT64_MAX && it->second != lightest; ++it) {
      if (it->first == load[lightest]) break;
      hi = it->second;
      lo = lightest;
      swap = best_swap(hi, lo);
    }
    if (swap.cost == UINT64_MAX) break;  // no swap with either extreme narrows a gap
    const uint64_t d = weights[swap.a] - weights[swap.b];
    *std::find(members.begin() + static_cast<ptrdiff_t>(hi * k), members.begin() + static_cast<ptrdiff_t>((hi + 1) * k),
               swap.a) = swap.b;
    *std::find(members.begin() + static_cast<ptrdiff_t>(lo * k), members.begin() + static_cast<ptrdiff_t>((lo + 1) * k),
               swap.b) = swap.a;
    shards_by_load.erase({load[hi], hi});
    shards_by_load.erase({load[lo], lo});
    load[hi] -= d;
    load[lo] += d;
    shards_by_load.emplace(load[hi], hi);
    shards_by_load.emplace(load[lo], lo);
    ++out.swaps;
  }

  // 3. Each shard's samples in sampler order: walk the positions in order,
  // each to the next free place of its shard.
  std::vector<uint64_t> shard_of(n);
  for (uint64_t i = 0; i < n; ++i) shard_of[members[i]] = i / k;
  std::vector<uint64_t> next(S);
  for (uint64_t s = 0; s < S; ++s) next[s] = s * k;
  std::vector<uint64_t> new_batch(n), new_weights(n);
  for (uint64_t pos = 0; pos < n; ++pos) {
    const uint64_t at = next[shard_of[pos]]++;
    new_batch[at] = batch[pos];
    new_weights[at] = weights[pos];
  }
  batch.swap(new_batch);
  weights.swap(new_weights);
  out.after = LoadsOfShards(weights, shards);
  out.within_tolerance = within(out.after.max - out.after.min, out.after.mean);
  return out;
}

}  // namespace meshload::planner
