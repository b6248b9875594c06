/// \file
/// ShardPlanner: the pure function from (resolved job, step) to which device
/// holds which samples, who reads what from storage, and what moves between
/// processes. This is the contract of docs/data-semantics.md.
///
/// Step t of a job with N samples, global batch B and K = floor(N/B) steps
/// per epoch is epoch e = t div K, position j = t mod K; its global batch is
/// π_e(j·B + i) for i in [0, B). Shard s is global-batch positions
/// [s·B/S, (s+1)·B/S). Every device holds the shard of its index, whatever
/// the strategy. With spec.batch.balance Tokens the global batch's order is
/// the token-balanced deal of those B samples to the S shards (balance.h).
///
/// Strategies decide only *who reads* and *what is sent*. Internally each is
/// a set of read units (process, device or -1, global-batch position ranges)
/// and transfer units (from, to, position ranges); PlanStep materialises
/// them as sample ids, ComputeCost counts their bytes without materialising
/// them, so both agree by construction:
///
///   GlobalLoad/Load        every process reads [0, B)
///   GlobalLoad/Broadcast   process 0 reads [0, B), sends each process its shards
///   PerDevice/Load         every device reads its shard
///   PerDevice/Broadcast    devices of a shard's owner process read it; the
///                          owner sends it once to every other process holding it
///   PerProcess/Load        every process reads the union of its shards once
///   PerProcess/Broadcast   a process reads the shards it owns, sends each to
///                          the other processes holding it
///   LoadAndReshard         process p reads [p·B/P, (p+1)·B/P) and sends every
///                          position to each other process whose devices hold
///                          it (fanout does not change it: each position is
///                          read exactly once already)
///
/// A process receives a sample at most once per step, however many of its
/// devices need it; copies to its local replicas are local (not transfers).
///
/// Thread safety: immutable after construction (but for a small memo of
/// recent balanced or mixed batches, behind its own lock); const methods
/// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/balance.h"
#include "planner/dataset_index.h"
#include "planner/mesh.h"
#include "planner/mixture.h"
#include "planner/sampler.h"
#include "planner/spec.h"

namespace meshload::planner {

/// A validated spec with its mesh and dataset: everything a plan needs.
struct ResolvedJob {
  JobSpec spec;
  DeviceMesh mesh;
  DatasetIndex dataset;
  uint64_t samples = 0;          // N
  uint64_t global_batch = 0;     // B
  uint64_t steps_per_epoch = 0;  // K = floor(N / B)
};

struct ResolveOptions {
  /// The dataset size when the data is not reachable (the CLI's --samples);
  /// a virtual index of this many samples.
  std::optional<int64_t> samples;
  /// The index of the dataset's files, built from their facts by the
  /// storage sources (source::IndexDataset); used as is when set.
  std::optional<DatasetIndex> index;
};

/// Builds the mesh of a validated job and takes the dataset index from
/// `options` (the index, else --samples), else a virtual index of
/// spec.dataset.samples. The planner reads no storage: to index the files,
/// resolve through source::ResolveWithSources. Every problem (with the
/// dataset: its size, a missing sample count) goes to `diags`; the result is
/// an error when there is any.
Result<ResolvedJob> ResolveJob(const ValidJob& job, const ResolveOptions& options, Diagnostics& diags);

/// Who loads: the strategy and the fan-out.
struct Loading {
  Strategy strategy = Strategy::kPerProcess;
  Fanout fanout = Fanout::kLoad;
};

/// Global-batch positions [begin, end).
struct PositionRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const PositionRange&) const = default;
};

struct ReadUnit {
  int64_t process = 0;
  int64_t device = -1;  // the reading device under PerDevice, else -1
  std::vector<PositionRange> positions;
};

struct TransferUnit {
  int64_t from = 0;
  int64_t to = 0;
  std::vector<PositionRange> positions;
};

struct DevicePlan {
  int64_t device = 0;
  int64_t process = 0;
  int64_t shard = 0;
  std::vector<uint64_t> samples;  // global dataset indices, in shard order
};

struct ReadPlan {
  int64_t process = 0;
  int64_t device = -1;
  std::vector<uint64_t> samples;  // in global-batch order
  std::vector<Extent> ranges;     // coalesced, in file/offset order
  uint64_t bytes = 0;             // sum of the ranges' lengths
};

struct TransferPlan {
  int64_t from = 0;
  int64_t to = 0;
  std::vector<uint64_t> samples;  // in global-batch order
  uint64_t bytes = 0;             // samples × sampleBytes
};

struct StepPlan {
  int64_t step = 0;
  uint64_t epoch = 0;
  uint64_t step_in_epoch = 0;
  std::vector<DevicePlan> devices;
  std::vector<ReadPlan> reads;
  std::vector<TransferPlan> transfers;
  uint64_t bytes_read = 0;
  uint64_t bytes_transferred = 0;
};

struct ProcessCost {
  uint64_t bytes_read = 0;
  uint64_t read_ranges = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

struct StepCost {
  uint64_t bytes_read = 0;         // all processes
  uint64_t read_ranges = 0;        // all processes (storage requests)
  uint64_t bytes_transferred = 0;  // all transfers
  std::vector<ProcessCost> per_process;
};

class ShardPlanner {
 public:
  explicit ShardPlanner(ResolvedJob job);

  const ResolvedJob& job() const { return job_; }
  /// The job's own strategy and fan-out.
  Loading DefaultLoading() const { return {job_.spec.strategy, job_.spec.replication.fanout}; }
  /// Empty when `loading` can run this job; otherwise why not (LoadAndReshard
  /// needs B mod P = 0).
  std::string Unsupported(const Loading& loading) const;

  uint64_t EpochOf(int64_t step) const { return static_cast<uint64_t>(step) / job_.steps_per_epoch; }
  /// The global batch of `step`: B sample ids, in the order that deals them
  /// to shards (the sampler's; with spec.batch.balance Tokens, balanced).
  std::vector<uint64_t> GlobalBatch(int64_t step) const;
  /// The global batch of `step` in the sampler's order (a mixture's:
  /// mixture.h).
  std::vector<uint64_t> SamplerBatch(int64_t step) const;
  /// The job's mixture schedule; null without spec.mixture.
  const MixtureSchedule* mixture() const { return mixture_.get(); }

  /// Whether this job's batches are token-balanced (balance.h).
  enum class Balancing {
    kOff,           // spec.batch.balance.mode None
    kApplied,       // Tokens, over the sizes the dataset's index gives
    kSizesUnknown,  // Tokens, but the index was not read (a virtual dataset): not applied
  };
  Balancing BalanceState() const;
  /// The shards' tokens of `step` before and after balancing (after =
  /// before, and within_tolerance false, when balancing is not applied).
  /// Tokens are a sample's elements: MegatronIndexed tokens, record bytes.
  BalanceOutcome Balance(int64_t step) const;
  /// The tokens of each of `samples` (see Balance).
  std::vector<uint64_t> TokensOf(const std::vector<uint64_t>& samples) const;

  /// What PlanStep computes of each read: the samples always; with kFull
  /// also its coalesced file ranges and bytes (and the plan's bytes_read).
  /// The sidecar, which builds its own reads from the samples, asks for
  /// kSamples: the ranges cost as much as planning the step.
  enum class Detail { kFull, kSamples };

  /// The plan of `step`; with `process`, only that process's devices and
  /// reads and the transfers from or to it (computing only what it needs).
  StepPlan PlanStep(int64_t step, const Loading& loading, std::optional<int64_t> process = std::nullopt,
                    Detail detail = Detail::kFull) const;

  /// The bytes of `step` under `loading`, for every process, without
  /// materialising sample lists (fast enough for a 16k-device mesh).
  StepCost ComputeCost(int64_t step, const Loading& loading) const;

  /// The read units of process `p` (see the file comment).
  std::vector<ReadUnit> ReadUnits(int64_t p, const Loading& loading) const;
  /// Transfers into process `q` and out of process `p`.
  std::vector<TransferUnit> TransfersTo(int64_t q, const Loading& loading) const;
  std::vector<TransferUnit> TransfersFrom(int64_t p, const Loading& loading) const;

 private:
  PositionRange ShardRange(int64_t s) const;
  PositionRange BlockRange(int64_t p) const;
  std::vector<PositionRange> ShardRanges(const std::vector<int64_t>& shards) const;

  ResolvedJob job_;
  uint64_t shard_size_ = 0;  // B / S
  bool balanced_ = false;    // BalanceState() == kApplied
  // The last few balanced or mixed global batches: a sidecar plans a step
  // more than once (its reads, each part it serves a peer, its counters),
  // and these cost more than the rest of a process's plan. Shared by
  // copies of this planner.
  struct BatchMemo;
  std::shared_ptr<BatchMemo> memo_;
  std::shared_ptr<const MixtureSchedule> mixture_;
  std::vector<uint64_t> MixtureBatch(int64_t step) const;
  uint64_t token_bytes_ = 1;  // bytes per token (MegatronIndexed: the dtype's; else 1)
};

/// Parses `A:B` (half-open), `A:` is rejected, `N` means N:N+1.
Result<std::pair<int64_t, int64_t>> ParseStepRange(std::string_view text);

}  // namespace meshload::planner
