/// \file
/// FetchAhead: fills the block cache with what this process's next steps
/// will read, from the known schedule, before the step loader asks.
///
/// The sampler is deterministic: the reads of every future step are known.
/// A walker plans the steps after the last one the trainer consumed (the
/// same plan the step loader will make), turns their reads into blocks
/// (sidecar/cache/cached_source.h), notes each resident block's next use
/// (the cache evicts the block needed furthest ahead first) and queues each
/// missing block once, in the order the steps need them. Fetch threads take
/// the queue in order and fill the blocks in parallel, one request a block.
///
/// How far ahead: the bytes of the blocks fetched for the steps not yet
/// consumed stay within `lookahead_bytes` (blocks already resident cost
/// nothing), and at most `max_steps_ahead` steps are planned ahead. A step
/// the trainer passed frees its bytes; StartAt() starts over at another
/// step (a trainer that went back or a resized job).
///
/// A failed fill is counted and logged (at most once every 10 s) and left
/// to the step loader's read, which fetches the block itself and reports
/// the error with the step. While the cache's disk refuses blocks, nothing
/// is fetched ahead (the reads go to the source directly).
///
/// Thread safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "planner/shard_planner.h"
#include "sidecar/cache/cached_source.h"

namespace meshload::sidecar::cache {

struct FetchAheadOptions {
  /// Block bytes fetched for steps not yet consumed, at most.
  uint64_t lookahead_bytes = 1ull << 30;
  /// Fetch threads (requests in flight).
  int threads = 16;
  /// Steps planned ahead of the last consumed one, at most.
  int64_t max_steps_ahead = 1024;
};

/// A block of one object of the cached source.
struct BlockRef {
  uint32_t object = 0;
  uint64_t block = 0;
  bool operator<(const BlockRef& o) const { return object != o.object ? object < o.object : block < o.block; }
  bool operator==(const BlockRef& o) const { return object == o.object && block == o.block; }
};

class FetchAhead {
 public:
  /// `object_of_file[f]`: the cached source's object for dataset file `f`
  /// (-1: a file not read through it).
  FetchAhead(const planner::ShardPlanner& planner, planner::Loading loading, int64_t process, CachedSource& source,
             std::vector<int64_t> object_of_file, FetchAheadOptions options);
  ~FetchAhead();
  FetchAhead(const FetchAhead&) = delete;
  FetchAhead& operator=(const FetchAhead&) = delete;

  /// Starts the walker and the fetch threads at step `first`.
  void Start(int64_t first) MESHLOAD_EXCLUDES(mu_);
  /// The trainer consumed the steps up to `step`.
  void Passed(int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// Starts over at step `first` (what was queued for other steps is dropped).
  void StartAt(int64_t first) MESHLOAD_EXCLUDES(mu_);
  /// Stops the threads (after the fills in flight) and ends every
  /// WaitResident (kCancelled). The destructor calls it.
  void Stop() MESHLOAD_EXCLUDES(mu_);

  /// Waits until the blocks of steps [first, first + steps) are resident:
  /// OK, or kUnavailable when `timeout` passed first (saying how many
  /// blocks are still missing), or the error of a failed fill of one of
  /// them.
  Status WaitResident(int64_t first, int64_t steps, std::chrono::milliseconds timeout) MESHLOAD_EXCLUDES(mu_);

  /// The blocks step `step` reads, sorted, each once.
  std::vector<BlockRef> BlocksOf(int64_t step) const;

  /// Steps planned ahead of the last consumed one, and the bytes fetched for them.
  int64_t ahead_steps() const { return ahead_steps_.load(std::memory_order_relaxed); }
  uint64_t ahead_bytes() const { return ahead_bytes_.load(std::memory_order_relaxed); }
  uint64_t fill_errors() const { return fill_errors_.load(std::memory_order_relaxed); }

 private:
  struct Item {
    BlockRef ref;
    int64_t step;
    uint64_t generation;
  };
  struct StepBytes {
    int64_t step;
    uint64_t bytes;
  };
  void WalkerMain() MESHLOAD_EXCLUDES(mu_);
  void FetcherMain() MESHLOAD_EXCLUDES(mu_);
  uint64_t Key(const BlockRef& r) const { return (uint64_t{r.object} << 40) | r.block; }
  void Publish() MESHLOAD_REQUIRES(mu_);

  const planner::ShardPlanner& planner_;
  const planner::Loading loading_;
  const int64_t process_;
  CachedSource& source_;
  const std::vector<int64_t> object_of_file_;
  const FetchAheadOptions options_;

  mutable Mutex mu_;
  CondVar changed_;  // a step passed, a restart, a stop: the walker looks again
  CondVar work_;     // items queued, or stop
  CondVar filled_;   // a fill finished
  bool started_ MESHLOAD_GUARDED_BY(mu_) = false;
  bool stop_ MESHLOAD_GUARDED_BY(mu_) = false;
  uint64_t generation_ MESHLOAD_GUARDED_BY(mu_) = 0;
  int64_t passed_ MESHLOAD_GUARDED_BY(mu_) = -1;
  int64_t scanned_ MESHLOAD_GUARDED_BY(mu_) = -1;
  uint64_t bytes_ MESHLOAD_GUARDED_BY(mu_) = 0;
  std::deque<StepBytes> step_bytes_ MESHLOAD_GUARDED_BY(mu_);
  std::deque<Item> queue_ MESHLOAD_GUARDED_BY(mu_);
  std::unordered_set<uint64_t> queued_ MESHLOAD_GUARDED_BY(mu_);  // Key(): queued or being filled
  Status last_error_ MESHLOAD_GUARDED_BY(mu_);
  int64_t last_error_logged_ns_ MESHLOAD_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> ahead_steps_{0};
  std::atomic<uint64_t> ahead_bytes_{0};
  std::atomic<uint64_t> fill_errors_{0};
  std::vector<std::thread> threads_;
};

}  // namespace meshload::sidecar::cache
