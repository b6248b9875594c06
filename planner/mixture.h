/// \file
/// Mixtures (spec.mixture): how many samples each dataset gives each global
/// batch, and which. docs/sampler.md "Mixtures" is the contract: a resumed
/// or resized job must see the same batches, so none of this may change
/// between releases.
///
/// Weights hold from a step on (each dataset's `weight` from step 0, its
/// `schedule` entries from theirs); the steps where any weight changes cut
/// the job into segments. In a segment with weights w_d:
///
///   - Quotas. q_d = B·R·w_d / Σw in units of 1/R of a sample (R = 1024),
///     rounded down, the B·R − Σ⌊q_d⌋ units left going one each to the
///     largest remainders (ties: the lower dataset), so Σ q_d = B·R exactly.
///     Dataset d gives b_d = q_d div R samples every step, plus an extra one
///     at some steps: f_d = q_d mod R of every R steps. r = Σ f_d / R extras
///     go out each step, at most one per dataset, so every count is
///     ⌊B·w_d/Σw⌋ or one more (to 1/R of a sample).
///   - Extras. At step n of the segment (n < R), the r datasets with the
///     largest n·f_d − R·E_d(n) + f_d (the extras owed after this step;
///     E_d(n) the extras given in steps [0, n); ties: the lower dataset;
///     only datasets with f_d > 0) get one. After R steps every dataset has
///     had exactly f_d, so the pattern repeats every R steps, and what
///     dataset d gave before step n of a segment is
///     n·b_d + (n div R)·f_d + E_d(n mod R): closed form, from a table of
///     R + 1 rows per segment.
///
/// Dataset d's samples come from its own endless stream: its epochs one
/// after another, epoch e being its sampler permutation π^d_e (the job's
/// shuffle with the seed Mix64(seed + d + 1)). A step takes each dataset's
/// next c_d samples of its stream; the batch is dataset 0's run, then
/// dataset 1's, ..., interleaved by a keyed permutation of [0, B) per step
/// so that every shard gets a mix.
///
/// Thread safety: immutable after construction; const methods thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/spec.h"

namespace meshload::planner {

class MixtureSchedule {
 public:
  static constexpr uint64_t kResolution = 1024;  // R
  /// The most steps at which the weights may change (each a table of
  /// (R + 1) × D extras).
  static constexpr size_t kMaxChanges = 256;

  /// The schedule of a validated spec.mixture for global batch `batch`.
  MixtureSchedule(const MixtureSpec& mixture, uint64_t batch);

  size_t datasets() const { return datasets_; }
  /// c_d(step): the samples of each dataset in the batch of `step`.
  std::vector<uint64_t> CountsAt(int64_t step) const;
  /// C_d(step): the samples each dataset gave steps [0, step).
  std::vector<uint64_t> ConsumedBefore(int64_t step) const;
  /// The normalised weights in force at `step` (each w_d / Σw).
  std::vector<double> WeightsAt(int64_t step) const;

 private:
  struct Segment {
    int64_t start = 0;
    std::vector<double> weights;     // normalised
    std::vector<uint64_t> base;      // b_d
    std::vector<uint64_t> fraction;  // f_d
    std::vector<uint16_t> extras;    // (R + 1) × D: E_d(n) at extras[n·D + d] (< R)
    std::vector<uint64_t> consumed;  // C_d(start)
  };
  const Segment& SegmentOf(int64_t step) const;
  // C_d(segment.start + n) for each d, added to `out`.
  void ConsumedIn(const Segment& s, uint64_t n, std::vector<uint64_t>& out) const;

  size_t datasets_ = 0;
  std::vector<Segment> segments_;  // by start, the first at 0
};

/// The seed of dataset d's own shuffle in a mixture (see the file comment).
uint64_t MixtureDatasetSeed(uint64_t seed, size_t dataset);
/// The key of step t's interleaving permutation of [0, B).
uint64_t MixtureInterleaveKey(uint64_t seed, int64_t step);

}  // namespace meshload::planner
