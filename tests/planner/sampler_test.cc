#include "planner/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

namespace meshload::planner {
namespace {

ShuffleSpec Shuffle(ShuffleMode mode, uint64_t seed, int64_t block = 1024, int64_t window = 16) {
  ShuffleSpec s;
  s.mode = mode;
  s.seed = seed;
  s.block_size = block;
  s.window_blocks = window;
  return s;
}

std::vector<uint64_t> Materialize(const EpochPermutation& p) {
  std::vector<uint64_t> v(p.size());
  for (uint64_t i = 0; i < p.size(); ++i) v[i] = p.At(i);
  return v;
}

void ExpectBijection(const std::vector<uint64_t>& v, const std::string& what) {
  std::vector<bool> seen(v.size(), false);
  for (uint64_t x : v) {
    ASSERT_LT(x, v.size()) << what;
    ASSERT_FALSE(seen[x]) << what << ": value " << x << " appears twice";
    seen[x] = true;
  }
}

TEST(FeistelPermutation, IsABijectionForEverySizeUpTo600AndSomeLargeOnes) {
  std::vector<uint64_t> sizes;
  for (uint64_t n = 0; n <= 600; ++n) sizes.push_back(n);
  for (uint64_t n : {1023ull, 1024ull, 1025ull, 4097ull, 65537ull, 100000ull}) sizes.push_back(n);
  for (uint64_t n : sizes) {
    FeistelPermutation p(n, 0xC0FFEE + n);
    std::vector<uint64_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = p.Forward(i);
    ExpectBijection(v, "n=" + std::to_string(n));
  }
}

TEST(FeistelPermutation, InverseUndoesForward) {
  for (uint64_t n : {2ull, 3ull, 17ull, 1000ull, 1ull << 20, 10'000'000'000ull, (1ull << 62) + 12345}) {
    FeistelPermutation p(n, 99);
    std::mt19937_64 rng(n);
    for (int i = 0; i < 2000; ++i) {
      uint64_t x = rng() % n;
      uint64_t y = p.Forward(x);
      ASSERT_LT(y, n);
      ASSERT_EQ(p.Inverse(y), x) << "n=" << n;
    }
  }
}

TEST(EpochPermutation, GlobalAndBlockModesAreBijections) {
  for (uint64_t n : {1ull, 2ull, 7ull, 100ull, 1000ull, 4099ull}) {
    for (int64_t block : {1, 3, 64, 100, 5000}) {
      EpochPermutation g(Shuffle(ShuffleMode::kGlobal, 5), n, 2);
      ExpectBijection(Materialize(g), "global n=" + std::to_string(n));
      EpochPermutation b(Shuffle(ShuffleMode::kBlock, 5, block), n, 2);
      ExpectBijection(Materialize(b), "block n=" + std::to_string(n) + " bs=" + std::to_string(block));
    }
  }
}

TEST(EpochPermutation, NoneIsTheIdentity) {
  EpochPermutation p(Shuffle(ShuffleMode::kNone, 5), 1000, 7);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(p.At(i), i);
}

TEST(EpochPermutation, EpochsAndSeedsGiveDifferentOrders) {
  const uint64_t n = 10000;
  auto e0 = Materialize(EpochPermutation(Shuffle(ShuffleMode::kGlobal, 1), n, 0));
  auto e1 = Materialize(EpochPermutation(Shuffle(ShuffleMode::kGlobal, 1), n, 1));
  auto s2 = Materialize(EpochPermutation(Shuffle(ShuffleMode::kGlobal, 2), n, 0));
  size_t same_epoch = 0, same_seed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    same_epoch += e0[i] == e1[i];
    same_seed += e0[i] == s2[i];
  }
  // Two independent random permutations agree at ~1 position on average.
  EXPECT_LT(same_epoch, 10u);
  EXPECT_LT(same_seed, 10u);
  auto b0 = Materialize(EpochPermutation(Shuffle(ShuffleMode::kBlock, 1, 100), n, 0));
  auto b1 = Materialize(EpochPermutation(Shuffle(ShuffleMode::kBlock, 1, 100), n, 1));
  EXPECT_NE(b0, b1);
}

// Positions are spread evenly: over many seeds, sample x lands in each tenth
// of the epoch equally often. Pearson's chi-square over the (sample, decile)
// table of 100 samples x 10 deciles has 900 degrees of freedom under
// uniformity (mean 900, sd sqrt(1800) = 42.4). Tolerance: 1130 (mean + 5.4 sd;
// a false alarm has probability < 1e-6), and it must also not be suspiciously
// low (< 700), which would mean the order is not random at all.
TEST(EpochPermutation, PositionsAreSpreadEvenlyChiSquare) {
  const uint64_t n = 100;
  const int trials = 4000;
  for (ShuffleMode mode : {ShuffleMode::kGlobal}) {
    std::vector<std::vector<int>> counts(n, std::vector<int>(10, 0));
    for (int t = 0; t < trials; ++t) {
      EpochPermutation p(Shuffle(mode, static_cast<uint64_t>(t)), n, 0);
      for (uint64_t pos = 0; pos < n; ++pos) counts[p.At(pos)][pos / 10]++;
    }
    const double expected = trials / 10.0;
    double chi2 = 0;
    for (const auto& row : counts) {
      for (int c : row) chi2 += (c - expected) * (c - expected) / expected;
    }
    EXPECT_LT(chi2, 1130.0) << "positions are not uniform";
    EXPECT_GT(chi2, 700.0) << "positions are too regular to be random";
  }
}

// Neighbouring positions are unrelated: the Pearson correlation of π(i) and
// π(i+1) over an epoch of N = 20,000 is within 5/sqrt(N) = 0.035 of zero
// (5 standard errors) for every seed tried, also for N just above a power of
// two, where cycle walking does the most work.
TEST(EpochPermutation, NeighbouringPositionsAreUncorrelated) {
  for (uint64_t n : {20000ull, 16385ull}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      EpochPermutation p(Shuffle(ShuffleMode::kGlobal, seed), n, seed % 3);
      double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
      const double m = static_cast<double>(n - 1);
      for (uint64_t i = 0; i + 1 < n; ++i) {
        const double x = static_cast<double>(p.At(i)), y = static_cast<double>(p.At(i + 1));
        sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
      }
      const double cov = sxy / m - (sx / m) * (sy / m);
      const double r = cov / std::sqrt((sxx / m - (sx / m) * (sx / m)) * (syy / m - (sy / m) * (sy / m)));
      EXPECT_LT(std::abs(r), 5.0 / std::sqrt(static_cast<double>(n))) << "n=" << n << " seed=" << seed;
    }
  }
}

TEST(EpochPermutation, AtRangeEqualsAtForEveryMode) {
  for (ShuffleMode mode : {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock, ShuffleMode::kWindow}) {
    for (uint64_t n : {1ull, 5ull, 1000ull, 70001ull}) {
      EpochPermutation p(Shuffle(mode, 11, 37), n, 4);
      const uint64_t first = n / 3, count = n - first;
      std::vector<uint64_t> out(count);
      p.AtRange(first, count, out.data());
      for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], p.At(first + i)) << "n=" << n;
    }
  }
}

TEST(EpochPermutation, BlockModeKeepsRunsOfOneBlockTogether) {
  const uint64_t n = 10'000;
  const int64_t bs = 100;
  EpochPermutation p(Shuffle(ShuffleMode::kBlock, 3, bs), n, 0);
  // Every run of 100 positions starting at a multiple of 100 comes from one block.
  for (uint64_t start = 0; start < n; start += bs) {
    uint64_t block = p.At(start) / bs;
    for (uint64_t i = start; i < start + bs; ++i) ASSERT_EQ(p.At(i) / bs, block);
  }
  // ...and the blocks are not in their natural order.
  EXPECT_NE(p.At(0) / bs, 0u);
}

TEST(EpochPermutation, WindowModeIsABijectionForAnySizeBlockAndWindow) {
  for (uint64_t n : {1ull, 2ull, 37ull, 100ull, 999ull, 1000ull, 1001ull, 4096ull, 10007ull}) {
    for (int64_t block : {1, 7, 64, 100}) {
      for (int64_t window : {1, 2, 3, 16}) {
        for (uint64_t epoch : {0ull, 5ull}) {
          ExpectBijection(
              Materialize(EpochPermutation(Shuffle(ShuffleMode::kWindow, 9, block, window), n, epoch)),
              "n=" + std::to_string(n) + " block=" + std::to_string(block) + " window=" + std::to_string(window));
        }
      }
    }
  }
}

TEST(EpochPermutation, WindowModeDrawsEachWindowFromItsBlocksAndMixesThem) {
  // 100 blocks of 100 samples, windows of 4 blocks (400 positions).
  const uint64_t n = 10'000, bs = 100, w = 4;
  for (uint64_t epoch : {0ull, 1ull}) {
    EpochPermutation p(Shuffle(ShuffleMode::kWindow, 17, bs, w), n, epoch);
    std::set<uint64_t> all_blocks;
    for (uint64_t start = 0; start < n; start += bs * w) {
      std::set<uint64_t> blocks, first_quarter;
      for (uint64_t i = start; i < start + bs * w; ++i) {
        blocks.insert(p.At(i) / bs);
        if (i < start + bs) first_quarter.insert(p.At(i) / bs);
      }
      // A window's positions are its 4 blocks' samples, all of them ...
      ASSERT_EQ(blocks.size(), w) << "window at " << start;
      for (uint64_t b : blocks) ASSERT_TRUE(all_blocks.insert(b).second) << "block " << b << " in two windows";
      // ... mixed: its first 100 positions draw from every one of them.
      EXPECT_EQ(first_quarter.size(), w) << "window at " << start;
    }
    // The windows' blocks follow Block mode's block order (its first block).
    EpochPermutation block_mode(Shuffle(ShuffleMode::kBlock, 17, bs), n, epoch);
    std::set<uint64_t> first_window;
    for (uint64_t i = 0; i < bs * w; ++i) first_window.insert(p.At(i) / bs);
    EXPECT_TRUE(first_window.count(block_mode.At(0) / bs)) << "epoch " << epoch;
  }
}

TEST(EpochPermutation, BlockModePlacesTheShortBlockAnywhere) {
  // n = 1050, blocks of 100: 10 full blocks and one of 50. The short block
  // must be permuted like the others, not pinned to the end (where the
  // dropped remainder would always hit the same samples).
  std::set<uint64_t> first_positions;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    EpochPermutation p(Shuffle(ShuffleMode::kBlock, seed, 100), 1050, 0);
    for (uint64_t pos = 0; pos < 1050; ++pos) {
      if (p.At(pos) >= 1000) {
        first_positions.insert(pos);
        break;
      }
    }
  }
  EXPECT_GT(first_positions.size(), 8u);
}

TEST(EpochPermutation, HugeDatasetsNeedNoMemoryAndStayInRange) {
  const uint64_t n = 10'000'000'000ull;  // 10^10 samples
  EpochPermutation g(Shuffle(ShuffleMode::kGlobal, 77), n, 5);
  EpochPermutation b(Shuffle(ShuffleMode::kBlock, 77, 4096), n, 5);
  std::set<uint64_t> seen;
  for (uint64_t pos : {uint64_t{0}, uint64_t{1}, n / 2, n - 2, n - 1}) {
    ASSERT_LT(g.At(pos), n);
    ASSERT_LT(b.At(pos), n);
    seen.insert(g.At(pos));
  }
  EXPECT_EQ(seen.size(), 5u);
}

TEST(EpochPermutation, TheOrderIsAStableContract) {
  // These values are part of meshload's contract (docs/sampler.md): a job
  // resumed on a newer release must see the same batches. If this test
  // fails, the sampler changed the order; that needs a new sampler version,
  // not a new expectation.
  EpochPermutation p(Shuffle(ShuffleMode::kGlobal, 42), 1000, 0);
  std::vector<uint64_t> first;
  for (uint64_t i = 0; i < 8; ++i) first.push_back(p.At(i));
  EpochPermutation q(Shuffle(ShuffleMode::kBlock, 42, 16), 1000, 3);
  for (uint64_t i = 0; i < 4; ++i) first.push_back(q.At(i));
  std::string got;
  for (uint64_t v : first) got += std::to_string(v) + ",";
  EXPECT_EQ(got, "771,672,949,607,101,792,392,375,485,493,494,487,");
}

TEST(EpochPermutation, TheWindowOrderIsAStableContract) {
  // As above, for Window mode (docs/sampler.md): 1000 samples, blocks of 16,
  // windows of 4 blocks, epoch 3, then the window holding the short block.
  EpochPermutation w(Shuffle(ShuffleMode::kWindow, 42, 16, 4), 1000, 3);
  std::string got;
  for (uint64_t i = 0; i < 8; ++i) got += std::to_string(w.At(i)) + ",";
  for (uint64_t i = 960; i < 964; ++i) got += std::to_string(w.At(i)) + ",";
  EXPECT_EQ(got, "361,988,989,986,982,389,384,387,317,250,244,243,");
}

}  // namespace
}  // namespace meshload::planner
