/// \file
/// Token-balanced shards (spec.batch.balance.mode: Tokens): which of a global
/// batch's samples each of its S shards gets, so that every shard (every
/// data-parallel rank) carries nearly the same number of tokens.
///
/// The global batch itself does not change: the same B samples, from the
/// sampler. Only their order does: shard s is still positions
/// [s·B/S, (s+1)·B/S) of the batch, B/S samples each, but the balanced order
/// deals the samples to shards by weight instead of by sampler position.
/// The deal is a pure function of (the batch in sampler order, the samples'
/// weights, S, the tolerance): every process computes the same one from what
/// it already has, for any number of processes, so resume and resize need
/// nothing stored. Two meshes with the same S deal alike; a resize that
/// changes S deals the same samples to its new shards.
///
/// The deal (docs/data-semantics.md, "Token-balanced shards"):
///   0. A batch whose sampler order is already within the tolerance keeps it.
///   1. Rounds: the samples by weight, heaviest first (ties: the earlier
///      sampler position first), S at a time; a round gives its heaviest
///      sample to the lightest shard, its next to the next lightest, and so
///      on (shard ties: the lower shard). Each shard takes one sample a
///      round, B/S in all.
///   2. Swaps: while the heaviest shard minus the lightest exceeds
///      tolerance × the mean shard, swap the pair of samples between those
///      two shards whose weight difference comes closest to half their gap;
///      when no swap between them narrows it, the same between the heaviest
///      and the next lighter shards in turn, then between the lightest and
///      the next heavier ones (a strictly smaller sum of squared loads each
///      time, so it ends), until no swap helps or a bound of 8·S + 64 swaps.
///   3. Inside a shard, its samples keep their sampler order.
///
/// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace meshload::planner {

/// The tokens of a batch's shards: the lightest, the heaviest and the mean.
struct ShardLoads {
  uint64_t min = 0;
  uint64_t max = 0;
  double mean = 0;
  /// (max − min) / mean; 0 for an empty batch.
  double Spread() const { return mean > 0 ? static_cast<double>(max - min) / mean : 0; }
};

/// What balancing one batch did.
struct BalanceOutcome {
  ShardLoads before;  // shards of the sampler order
  ShardLoads after;   // shards of the balanced order
  uint64_t swaps = 0;
  /// after.Spread() <= tolerance.
  bool within_tolerance = true;
};

/// The loads of the S shards of `weights` (weights[i]: the tokens of batch
/// position i; S divides weights.size()).
ShardLoads LoadsOfShards(const std::vector<uint64_t>& weights, int64_t shards);

/// Reorders `batch` (sample ids in sampler order) and `weights` (their
/// tokens, position by position) into the balanced order described above.
/// Preconditions: batch.size() == weights.size(), shards >= 1 and divides
/// it. With one shard, or a sampler order already within the tolerance,
/// nothing moves.
BalanceOutcome BalanceShards(std::vector<uint64_t>& batch, std::vector<uint64_t>& weights, int64_t shards,
                             double tolerance);

}  // namespace meshload::planner
