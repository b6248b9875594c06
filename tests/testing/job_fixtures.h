// Helpers for planner tests: temp dirs, files, and random valid specs.
#pragma once

#include <cstdint>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "planner/shard_planner.h"
#include "planner/spec.h"
#include "tests/testing/temp_dir.h"

namespace meshload::testing {

/// A spec that passes ValidateJobSpec, with a random mesh (1–4 axes of size
/// 1–4, random devicesPerProcess), random batchAxes (any subset, any order),
/// a global batch divisible by the shards and (usually) by the processes, a
/// virtual dataset of 2–6 batches plus a remainder, and a random shuffle.
planner::JobSpec RandomSpec(std::mt19937_64& rng);

/// Resolves a spec whose dataset is virtual (spec.dataset.samples set).
planner::ShardPlanner MakePlanner(const planner::JobSpec& spec);

/// Document lengths (tokens) with a long tail, as language-model corpora
/// have: most between `typical`/4 and 2·`typical`, one in 16 up to
/// 16·`typical`.
std::vector<int32_t> RandomDocumentLengths(std::mt19937_64& rng, size_t count, int32_t typical);

/// `spec` (its mesh, batch, strategy and shuffle) over a MegatronIndexed
/// dataset of uint16 sequences of these lengths, indexed as if its .idx had
/// been read (spec.dataset's format, uri and samples are replaced).
planner::ShardPlanner MakeMegatronPlanner(planner::JobSpec spec, const std::vector<int32_t>& lengths);
/// The same, resolved: the job, or the error with its problems in `d`.
Result<planner::ResolvedJob> ResolveMegatron(planner::JobSpec spec, const std::vector<int32_t>& lengths,
                                             Diagnostics& d);

/// `spec` over a mixture (spec.mixture) of MegatronIndexed datasets of
/// uint16 sequences, dataset k's of lengths[k], with weights[k], each
/// indexed as if its .idx had been read.
planner::ShardPlanner MakeMegatronMixturePlanner(planner::JobSpec spec,
                                                 const std::vector<std::vector<int32_t>>& lengths,
                                                 const std::vector<double>& weights);

/// The ValidJob of a spec built in a test, or a test failure (and an abort:
/// a test that needs a valid job cannot go on without one).
planner::ValidJob MustValidate(const planner::JobSpec& spec);
/// The ValidJob of a manifest file a test wrote, the same way.
planner::ValidJob MustLoad(const std::string& path);

/// A minimal valid manifest (FixedRecord, 2 processes × 2 devices) to edit in tests.
std::string MinimalJobYaml();

}  // namespace meshload::testing
