/// \file
/// CachedSource: a remote dataset's objects read through the node-local
/// block cache (sidecar/cache/block_cache.h).
///
/// It stands in for the remote source (s3, http) of the dataset's objects:
/// a read copies from the blocks it covers, fetching a block that is not
/// resident (one request for the whole block, which the fetch-ahead usually
/// made already; sidecar/cache/fetch_ahead.h). A block the cache cannot
/// store (no room for one needed this late) is not fetched for one read:
/// the read asks the source for its own bytes, in one request with the
/// next reads of the batch in that block where the gaps between them cost
/// less than a request (Source::GapWorthReading), so bytes no step uses are
/// not fetched. While the cache's disk refuses blocks (BlockCache::storing()
/// false), reads go to the remote source for exactly their bytes, as
/// without a cache.
///
/// A file stored compressed (planner::StoredFile) is one block of its
/// decompressed bytes, filled by reading the stored object and
/// decompressing it.
///
/// Blocks: an object of at most `whole_object_bytes` is one block; a larger
/// one is cut into `block_bytes` blocks from its start, the last shorter;
/// or, under a Block or Window shuffle, at its sampler blocks' starts
/// (planner/fetch_plan.h, BlockMap).
///
/// Thread safety: AddObject() before the first read; then every method is
/// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "planner/dataset_index.h"
#include "planner/fetch_plan.h"
#include "sidecar/cache/block_cache.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::cache {

using planner::BlockGeometry;

/// What reads through the cache did (the cache's own counters are
/// BlockCache::counters()).
struct CachedSourceCounters {
  std::atomic<uint64_t> delivered_bytes{0};  // bytes reads copied out (the amplification's denominator)
  std::atomic<uint64_t> direct_bytes{0};     // bytes read from the source directly (blocks not stored)
};

class CachedSource final : public source::Source {
 public:
  CachedSource(source::Source& remote, BlockCache& cache, BlockGeometry geometry);

  /// Registers object `name` (the name reads give) of `size` bytes at
  /// `version` (an ETag; "" when the source has none), its blocks starting
  /// at `starts` (planner::BlockMap's; empty: cut by the geometry). Returns
  /// its index.
  size_t AddObject(const std::string& name, uint64_t size, const std::string& version,
                   std::vector<uint64_t> starts = {});

  /// Registers object `name` of `size` bytes that is stored compressed:
  /// the decompression of `stored_name` (the remote source's name for
  /// stored.path) at `version` (its ETag). One block, the whole file: a
  /// fill reads the stored object and decompresses it into the block. Its
  /// reads always go through the cache (when the disk refuses the block,
  /// from memory). Returns its index.
  size_t AddStoredObject(const std::string& name, uint64_t size, const std::string& stored_name,
                         const planner::StoredFile& stored, const std::string& version);

  Result<source::ObjectInfo> Stat(const std::string& uri) override;
  Result<std::vector<Listed>> List(const std::string& uri) override { return remote_.List(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override;
  /// A batch of one object's reads in file order: one lookup while they
  /// stay in one block.
  Status ReadMany(const std::string& uri, const ReadRequest* reads, size_t count, BeforeRead before,
                  void* context) override;
  /// Touches the first cache line of each range of a resident block.
  void Prefetch(const std::string& uri, const Range* ranges, size_t count) override;
  /// Reads from resident blocks are memory copies; only while the disk
  /// refuses blocks do reads wait on the network.
  bool LatencyBound() const override { return !cache_.storing(); }

  /// The fetch-ahead's side: block `block` of object `object` made
  /// resident for step `next_use` (fetched when it is not).
  Status Fill(size_t object, uint64_t block, int64_t next_use, bool* fetched = nullptr);

  size_t objects() const { return objects_.size(); }
  /// The object `name` is, or -1 when it was not added.
  int64_t IndexOf(const std::string& name) const;
  uint64_t ObjectSize(size_t object) const { return objects_[object].size; }
  BlockId IdOf(size_t object, uint64_t block) const { return {objects_[object].key, block}; }
  /// Block `block` of `object`: its first byte and its length.
  std::pair<uint64_t, uint64_t> BlockExtent(size_t object, uint64_t block) const;
  /// The blocks [first, last] that bytes [offset, offset + len) of
  /// `object` touch (len > 0).
  std::pair<uint64_t, uint64_t> BlocksOf(size_t object, uint64_t offset, uint64_t len) const;

  /// Counts fetched bytes by epoch from now on: a block fetched ahead for
  /// step t counts to epoch_of(t); a read's own fetch, and a direct read,
  /// to the epoch of the step the reading thread reads for
  /// (source::ReadingStep), else of the step last noted (NoteStep).
  /// So a second epoch's first blocks, fetched while the first epoch runs,
  /// count to the second. Before it is called, nothing is counted by epoch.
  void CountByEpoch(std::function<int64_t(int64_t step)> epoch_of);
  /// The calling thread reads for `step` from now on
  /// (source::SetReadingStep, which the step loader calls on each thread
  /// reading a step): its reads' blocks are needed by that step (for
  /// eviction), and their fetches count to its epoch. Also the step a
  /// fetch counts to when its thread says none.
  void NoteStep(int64_t step);
  /// (epoch, bytes fetched for it), the latest kEpochsKept epochs, in order.
  std::vector<std::pair<int64_t, uint64_t>> FetchedByEpoch() const MESHLOAD_EXCLUDES(epoch_mu_);
  static constexpr size_t kEpochsKept = 8;

  const BlockGeometry& geometry() const { return geometry_; }
  BlockCache& cache() const { return cache_; }
  source::Source& remote() const { return remote_; }
  const CachedSourceCounters& counters() const { return counters_; }

 private:
  struct Object {
    std::string name;
    uint64_t size = 0;
    uint64_t key = 0;
    std::vector<uint64_t> starts;               // empty: BlockGeometry's aligned blocks
    std::optional<planner::StoredFile> stored;  // set: the decompression of stored_name
    std::string stored_name;
  };
  Result<BlockCache::Block> Get(size_t object, uint64_t block, int64_t next_use, BlockCache::Want want, bool* fetched);
  // The block the last read of a batch used.
  struct Held {
    BlockCache::Block block;
    size_t object = 0;
    uint64_t start = 0;
  };
  // Copies bytes [offset, offset + len) of `object` into `iov` from its
  // blocks, starting with `held` when it covers them. A block that cannot
  // be stored is not fetched: the bytes come from the source, this read's
  // and, in the same request, those of the reads after it (`next`) that lie
  // in that block with gaps worth reading; returns how many of them it
  // served.
  Result<size_t> CopyOut(size_t object, uint64_t offset, const std::vector<iovec>& iov, uint64_t len, Held& held,
                         const ReadRequest* next, size_t next_count);

  // Adds `bytes` to the epoch of `step` (-1: the noted step).
  void CountFetch(int64_t step, uint64_t bytes) MESHLOAD_EXCLUDES(epoch_mu_);

  source::Source& remote_;
  BlockCache& cache_;
  std::function<int64_t(int64_t)> epoch_of_;  // set before reads start
  std::atomic<int64_t> noted_step_{0};
  mutable Mutex epoch_mu_;
  std::map<int64_t, uint64_t> fetched_by_epoch_ MESHLOAD_GUARDED_BY(epoch_mu_);
  const BlockGeometry geometry_;
  std::vector<Object> objects_;
  std::unordered_map<std::string, size_t> by_name_;
  mutable CachedSourceCounters counters_;
};

}  // namespace meshload::sidecar::cache
