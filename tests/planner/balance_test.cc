// Token-balanced shards (planner/balance.h): the deal itself, and the shard
// planner's batches with spec.batch.balance Tokens over variable-size data.

#include "planner/balance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "planner/shard_planner.h"
#include "tests/testing/job_fixtures.h"

namespace meshload::planner {
namespace {

using testing::MakeMegatronPlanner;
using testing::RandomDocumentLengths;

// A batch whose id at position i is 1000 + i, so a dealt order shows where
// each sample came from.
struct Batch {
  std::vector<uint64_t> ids;
  std::vector<uint64_t> weights;
};

Batch MakeBatch(const std::vector<uint64_t>& weights) {
  Batch b;
  b.weights = weights;
  for (size_t i = 0; i < weights.size(); ++i) b.ids.push_back(1000 + i);
  return b;
}

std::vector<uint64_t> LongTail(std::mt19937_64& rng, size_t n, int32_t typical) {
  std::vector<uint64_t> out;
  for (int32_t w : RandomDocumentLengths(rng, n, typical)) out.push_back(static_cast<uint64_t>(w));
  return out;
}

TEST(BalanceShards, AKnownDeal) {
  // Sampler shards {10, 10} and {1, 1}: 20 against 2. Largest first gives
  // the two 10s to shards 0 and 1, then a 1 to each.
  Batch b = MakeBatch({10, 10, 1, 1});
  BalanceOutcome o = BalanceShards(b.ids, b.weights, 2, 0.0);
  EXPECT_EQ(b.ids, (std::vector<uint64_t>{1000, 1002, 1001, 1003}));
  EXPECT_EQ(b.weights, (std::vector<uint64_t>{10, 1, 10, 1}));
  EXPECT_EQ(o.before.min, 2u);
  EXPECT_EQ(o.before.max, 20u);
  EXPECT_EQ(o.after.min, 11u);
  EXPECT_EQ(o.after.max, 11u);
  EXPECT_DOUBLE_EQ(o.after.mean, 11.0);
  EXPECT_TRUE(o.within_tolerance);
}

TEST(BalanceShards, SwapsFinishWhatLargestFirstLeaves) {
  // Largest first, 3 a shard: 12, 8, 5 (25) against 10, 10, 1 (21). Moving
  // half the gap is swapping the 12 for a 10: 23 and 23.
  Batch b = MakeBatch({12, 10, 10, 8, 5, 1});
  BalanceOutcome o = BalanceShards(b.ids, b.weights, 2, 0.0);
  EXPECT_EQ(o.swaps, 1u);
  EXPECT_EQ(o.after.min, 23u);
  EXPECT_EQ(o.after.max, 23u);
  EXPECT_EQ(b.ids, (std::vector<uint64_t>{1001, 1003, 1004, 1000, 1002, 1005}));
  EXPECT_TRUE(o.within_tolerance);
}

TEST(BalanceShards, AnOrderAlreadyWithinTheToleranceIsKept) {
  Batch b = MakeBatch({5, 5, 5, 5, 5, 5});
  const std::vector<uint64_t> ids = b.ids;
  BalanceOutcome o = BalanceShards(b.ids, b.weights, 3, 0.0);
  EXPECT_EQ(b.ids, ids);
  EXPECT_EQ(o.swaps, 0u);
  // 10% apart, tolerance 10%: kept too.
  Batch c = MakeBatch({50, 50, 45, 50});
  const std::vector<uint64_t> cids = c.ids;
  EXPECT_TRUE(BalanceShards(c.ids, c.weights, 2, 0.1).within_tolerance);
  EXPECT_EQ(c.ids, cids);
  // One shard: nothing to deal.
  Batch d = MakeBatch({1, 100, 3});
  BalanceShards(d.ids, d.weights, 1, 0.0);
  EXPECT_EQ(d.ids, (std::vector<uint64_t>{1000, 1001, 1002}));
}

TEST(BalanceShards, ASampleLongerThanAShardsShareIsReportedNotHidden) {
  Batch b = MakeBatch({1000, 1, 1, 1, 1, 1, 1, 1});
  BalanceOutcome o = BalanceShards(b.ids, b.weights, 4, 0.05);
  EXPECT_FALSE(o.within_tolerance);
  EXPECT_EQ(o.after.max, 1001u);  // the long one with the shortest beside it
  EXPECT_EQ(o.after.min, 2u);
  EXPECT_LE(o.after.Spread(), o.before.Spread());
}

// Over many random batches: the same samples, B/S per shard, each shard in
// sampler order, never less even than before, within the tolerance when
// shards hold enough samples, and the same deal every time.
TEST(BalanceShards, RandomBatchesKeepTheirSamplesAndMeetTheTolerance) {
  std::mt19937_64 rng(11);
  int within = 0, total = 0;
  for (int round = 0; round < 300; ++round) {
    const int64_t S = int64_t{1} << (rng() % 7);             // 1..64 shards
    const int64_t k = 1 + static_cast<int64_t>(rng() % 48);  // samples per shard
    Batch b = MakeBatch(LongTail(rng, static_cast<size_t>(S * k), 1 + static_cast<int32_t>(rng() % 4000)));
    const Batch original = b;
    const double tolerance = (rng() % 2) ? 0.01 : 0.05;
    BalanceOutcome o = BalanceShards(b.ids, b.weights, S, tolerance);

    std::multiset<std::pair<uint64_t, uint64_t>> was, is;
    for (size_t i = 0; i < b.ids.size(); ++i) {
      was.emplace(original.ids[i], original.weights[i]);
      is.emplace(b.ids[i], b.weights[i]);
    }
    ASSERT_EQ(was, is) << "round " << round;
    for (int64_t s = 0; s < S; ++s) {
      ASSERT_TRUE(std::is_sorted(b.ids.begin() + s * k, b.ids.begin() + (s + 1) * k)) << "shard " << s;
    }
    const ShardLoads after = LoadsOfShards(b.weights, S);
    ASSERT_EQ(after.min, o.after.min);
    ASSERT_EQ(after.max, o.after.max);
    ASSERT_LE(o.after.max - o.after.min, o.before.max - o.before.min) << "round " << round;
    ASSERT_EQ(o.within_tolerance, static_cast<double>(after.max - after.min) <= tolerance * after.mean);
    if (k >= 16) {
      ++total;
      within += o.within_tolerance;
    }
    Batch again = original;
    BalanceShards(again.ids, again.weights, S, tolerance);
    ASSERT_EQ(again.ids, b.ids) << "round " << round << ": the deal is not deterministic";
  }
  // With 16 or more samples a shard, long tails included, the deal meets
  // the tolerance (a shard's share is then far above any one sample).
  EXPECT_EQ(within, total);
  EXPECT_GT(total, 50);
}

// A plain reference: longest processing time first (each sample, heaviest
// first, to the lightest shard with room), then the best pairwise swap of
// all pairs of shards while one narrows the spread. Returns the spread.
double ReferenceSpread(const std::vector<uint64_t>& weights, int64_t S) {
  const size_t k = weights.size() / static_cast<size_t>(S);
  std::vector<uint64_t> order(weights.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return weights[a] > weights[b]; });
  std::vector<std::vector<uint64_t>> shard(static_cast<size_t>(S));
  std::vector<uint64_t> load(static_cast<size_t>(S), 0);
  for (uint64_t i : order) {
    size_t best = SIZE_MAX;
    for (size_t s = 0; s < shard.size(); ++s) {
      if (shard[s].size() < k && (best == SIZE_MAX || load[s] < load[best])) best = s;
    }
    shard[best].push_back(weights[i]);
    load[best] += weights[i];
  }
  auto spread = [&] {
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    double total = 0;
    for (uint64_t l : load) total += static_cast<double>(l);
    return static_cast<double>(*hi - *lo) / (total / static_cast<double>(S));
  };
  for (int iter = 0; iter < 1000; ++iter) {
    const double now = spread();
    double best = now;
    size_t bi = 0, bj = 0, ba = 0, bb = 0;
    for (size_t i = 0; i < shard.size(); ++i) {
      for (size_t j = i + 1; j < shard.size(); ++j) {
        for (size_t a = 0; a < k; ++a) {
          for (size_t b = 0; b < k; ++b) {
            const int64_t d = static_cast<int64_t>(shard[i][a]) - static_cast<int64_t>(shard[j][b]);
            load[i] -= d;
            load[j] += d;
            const double after = spread();
            load[i] += d;
            load[j] -= d;
            if (after < best) {
              best = after;
              bi = i, bj = j, ba = a, bb = b;
            }
          }
        }
      }
    }
    if (best >= now) break;
    const int64_t d = static_cast<int64_t>(shard[bi][ba]) - static_cast<int64_t>(shard[bj][bb]);
    std::swap(shard[bi][ba], shard[bj][bb]);
    load[bi] -= d;
    load[bj] += d;
  }
  return spread();
}

// Where a plain deal with pairwise swaps reaches the tolerance, the deal
// does too: 16 shards of 4 long-tailed documents at tolerance 0.02 (the
// case a user found: before, the swaps stopped when no swap between the
// heaviest and the lightest shard narrowed their gap, and 499 of 500 steps
// missed a tolerance 52 of them could meet).
TEST(BalanceShards, MeetsTheToleranceWhereverAPlainDealWithPairwiseSwapsDoes) {
  std::mt19937_64 rng(14);
  int reachable = 0, met = 0;
  for (int step = 0; step < 500; ++step) {
    Batch b = MakeBatch(LongTail(rng, 64, 1000));
    const double reference = ReferenceSpread(b.weights, 16);
    BalanceOutcome o = BalanceShards(b.ids, b.weights, 16, 0.02);
    if (reference <= 0.02) {
      ++reachable;
      EXPECT_TRUE(o.within_tolerance) << "step " << step << ": spread " << o.after.Spread() << " after " << o.swaps
                                      << " swaps; the reference reaches " << reference;
    }
    met += o.within_tolerance;
  }
  EXPECT_GT(reachable, 5);
  EXPECT_GE(met, reachable);
}

JobSpec MeshSpecOf(int64_t processes, int64_t devices_per_process, int64_t batch, Strategy strategy) {
  JobSpec spec;
  spec.mesh.processes = processes;
  spec.mesh.devices_per_process = devices_per_process;
  spec.mesh.axes = {{"data", processes * devices_per_process}};
  spec.batch.global_batch_size = batch;
  spec.batch.balance.mode = BalanceMode::kTokens;
  spec.batch.balance.tolerance = 0.02;
  spec.strategy = strategy;
  spec.shuffle.seed = 7;
  return spec;
}

// The balanced global batch is the sampler's batch, dealt: the same samples
// on 4, 8 and 16 processes, each mesh's shards within the tolerance, and a
// resumed job (a new planner at a later step) deals the same way.
TEST(ShardPlannerBalance, SameSamplesOnEveryMeshAndEveryShardWithinTheTolerance) {
  std::mt19937_64 rng(12);
  const std::vector<int32_t> lengths = RandomDocumentLengths(rng, 20000, 600);
  const int64_t B = 1024;
  std::map<int64_t, std::vector<std::vector<uint64_t>>> batches;
  for (int64_t P : {4, 8, 16}) {
    ShardPlanner planner = MakeMegatronPlanner(MeshSpecOf(P, 2, B, Strategy::kPerProcess), lengths);
    ASSERT_EQ(planner.BalanceState(), ShardPlanner::Balancing::kApplied);
    JobSpec resumed_spec = MeshSpecOf(P, 2, B, Strategy::kPerProcess);
    resumed_spec.resume.step = 15;
    ShardPlanner resumed = MakeMegatronPlanner(resumed_spec, lengths);
    for (int64_t step : {0, 1, 15, 19, 20, 37}) {  // K = 19: epochs 0, 1 and 1
      std::vector<uint64_t> batch = planner.GlobalBatch(step);
      std::vector<uint64_t> sampler = planner.SamplerBatch(step);
      ASSERT_EQ(resumed.GlobalBatch(step), batch) << "P=" << P << " step " << step;
      std::vector<uint64_t> tokens = planner.TokensOf(batch);
      const ShardLoads loads = LoadsOfShards(tokens, planner.job().mesh.shards());
      EXPECT_LE(static_cast<double>(loads.max - loads.min), 0.02 * loads.mean) << "P=" << P << " step " << step;
      const BalanceOutcome o = planner.Balance(step);
      EXPECT_EQ(o.after.max, loads.max);
      EXPECT_GT(o.before.Spread(), 0.02) << "the sampler's order was balanced already: the test proves nothing";
      std::sort(batch.begin(), batch.end());
      std::sort(sampler.begin(), sampler.end());
      ASSERT_EQ(batch, sampler);
      batches[step].push_back(batch);
    }
  }
  for (const auto& [step, sets] : batches) {
    for (const auto& s : sets) ASSERT_EQ(s, sets.front()) << "step " << step << " differs between meshes";
  }
}

// Every strategy and fan-out gives every device the same balanced shard,
// a one-process plan agrees with the whole mesh's, and what a process reads
// and receives holds what its devices need.
TEST(ShardPlannerBalance, EveryStrategyDealsTheSameShards) {
  std::mt19937_64 rng(13);
  const std::vector<int32_t> lengths = RandomDocumentLengths(rng, 3000, 300);
  for (int round = 0; round < 40; ++round) {
    JobSpec spec = testing::RandomSpec(rng);
    spec.batch.balance.mode = BalanceMode::kTokens;
    spec.batch.balance.tolerance = 0.0;
    ShardPlanner planner = MakeMegatronPlanner(spec, lengths);
    const int64_t step = static_cast<int64_t>(rng() % 30);
    std::vector<DevicePlan> reference;
    for (Strategy s : kAllStrategies) {
      for (Fanout f : kAllFanouts) {
        const Loading l{s, f};
        if (!planner.Unsupported(l).empty()) continue;
        StepPlan whole = planner.PlanStep(step, l);
        if (reference.empty()) reference = whole.devices;
        for (size_t d = 0; d < reference.size(); ++d) ASSERT_EQ(whole.devices[d].samples, reference[d].samples);
        for (int64_t p = 0; p < planner.job().mesh.processes(); ++p) {
          StepPlan one = planner.PlanStep(step, l, p, ShardPlanner::Detail::kSamples);
          std::multiset<uint64_t> have, need;
          for (const auto& r : one.reads) have.insert(r.samples.begin(), r.samples.end());
          for (const auto& t : one.transfers) {
            if (t.to == p) have.insert(t.samples.begin(), t.samples.end());
          }
          for (const auto& d : one.devices) {
            ASSERT_EQ(d.samples, reference[static_cast<size_t>(d.device)].samples);
            for (uint64_t id : d.samples) {
              ASSERT_TRUE(have.count(id)) << "process " << p << " device " << d.device << " lacks sample " << id;
            }
          }
        }
      }
    }
    // The shards concatenate to the global batch.
    std::map<int64_t, std::vector<uint64_t>> by_shard;
    for (const auto& d : reference) by_shard.emplace(d.shard, d.samples);
    std::vector<uint64_t> concat;
    for (const auto& [s, samples] : by_shard) concat.insert(concat.end(), samples.begin(), samples.end());
    ASSERT_EQ(concat, planner.GlobalBatch(step));
  }
}

// The planner keeps the last few dealt batches for the steps a sidecar plans
// again; threads asking at once get the same batches as one thread alone.
TEST(ShardPlannerBalance, DealtBatchesAreTheSameFromManyThreads) {
  std::mt19937_64 rng(15);
  const std::vector<int32_t> lengths = RandomDocumentLengths(rng, 5000, 200);
  ShardPlanner planner = MakeMegatronPlanner(MeshSpecOf(4, 2, 64, Strategy::kPerProcess), lengths);
  const ShardPlanner fresh = MakeMegatronPlanner(MeshSpecOf(4, 2, 64, Strategy::kPerProcess), lengths);
  std::vector<std::vector<uint64_t>> expected;
  for (int64_t step = 0; step < 40; ++step) expected.push_back(fresh.GlobalBatch(step));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (int64_t step = 0; step < 40; ++step) {
          const int64_t s = (step * (t + 1) + round) % 40;
          if (planner.GlobalBatch(s) != expected[static_cast<size_t>(s)]) ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ShardPlannerBalance, AnEpochStillHoldsEverySampleOnce) {
  std::mt19937_64 rng(14);
  const std::vector<int32_t> lengths = RandomDocumentLengths(rng, 1000, 100);
  ShardPlanner planner = MakeMegatronPlanner(MeshSpecOf(4, 2, 40, Strategy::kPerProcess), lengths);
  std::set<uint64_t> seen;
  for (int64_t step = 0; step < 25; ++step) {
    for (uint64_t id : planner.GlobalBatch(step)) ASSERT_TRUE(seen.insert(id).second) << "sample " << id;
  }
  EXPECT_EQ(seen.size(), 1000u);
}

// A virtual dataset (the plan with --samples) knows no sizes: the order is
// the sampler's, and the planner says balancing was not applied.
TEST(ShardPlannerBalance, WithoutTheIndexNothingIsDealt) {
  JobSpec spec = MeshSpecOf(2, 2, 16, Strategy::kPerProcess);
  spec.dataset.format = DatasetFormat::kMegatronIndexed;
  spec.dataset.uri = "s3://bucket/corpus";
  spec.dataset.samples = 100;
  ShardPlanner planner = testing::MakePlanner(spec);
  EXPECT_EQ(planner.BalanceState(), ShardPlanner::Balancing::kSizesUnknown);
  EXPECT_EQ(planner.GlobalBatch(3), planner.SamplerBatch(3));
  JobSpec off = spec;
  off.batch.balance.mode = BalanceMode::kNone;
  EXPECT_EQ(testing::MakePlanner(off).BalanceState(), ShardPlanner::Balancing::kOff);
}

}  // namespace
}  // namespace meshload::planner
