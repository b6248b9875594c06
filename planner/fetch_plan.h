/// \file
/// What reading a remote dataset through the node-local block cache costs:
/// how objects are cut into blocks, and, for one process under a job's
/// shuffle, the bytes an epoch fetches and the cache it needs
/// (docs/operations.md, "Object storage: blocks, cache and shuffle").
///
/// A block is a whole object of at most `whole_object_bytes`, else an
/// aligned `block_bytes` range of it (the last shorter). Under a shuffle
/// that reads blocks of samples (Block, Window), a block is instead the
/// bytes of one sampler block in one object (cut into pieces of about
/// `block_bytes` when it is larger), so the window a step draws from is
/// whole blocks and no block is shared by two windows (BlockMap). With a cache that
/// holds every block from the first to the last step of the epoch that
/// reads it (the working set), each block is fetched once per epoch, and
/// not at all in later epochs when the cache holds the whole dataset.
/// Without one, reads go to the source for their own bytes.
///
/// Thread safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "planner/shard_planner.h"

namespace meshload::planner {

/// How objects are cut into blocks.
struct BlockGeometry {
  uint64_t block_bytes = 8ull << 20;
  uint64_t whole_object_bytes = 16ull << 20;
  /// The bytes of each block of an object of `size` bytes but the last.
  uint64_t Unit(uint64_t size) const { return size <= whole_object_bytes ? std::max<uint64_t>(size, 1) : block_bytes; }
  uint64_t Blocks(uint64_t size) const { return size == 0 ? 0 : (size + Unit(size) - 1) / Unit(size); }
};

/// Where the blocks of each dataset file start. Byte-aligned (BlockGeometry)
/// unless the job's shuffle is Block or Window over samples laid out in
/// file order (not rows of tokens): then each file's blocks start at the
/// first byte of each sampler block's samples in it (a mixture's, per
/// dataset), a block longer than 1.5 × block_bytes cut into round(length /
/// block_bytes) equal pieces, and the file's first block at 0. A file
/// stored compressed (DatasetFile::stored) is one block whatever its size:
/// it is decompressed whole. A Parquet file's blocks are its row groups
/// (a row's read decodes its whole group), each fetched as its wanted
/// column chunks and held as their decompressed bytes.
class BlockMap {
 public:
  BlockMap(const ResolvedJob& job, const BlockGeometry& geometry);
  /// Sample-aligned starts of file `f` (empty: byte-aligned by geometry()).
  const std::vector<uint64_t>& starts(size_t f) const { return starts_[f]; }
  bool sample_aligned() const { return sample_aligned_; }
  uint64_t Blocks(size_t f) const;
  /// The block of file `f` holding byte `offset`.
  uint64_t BlockOf(size_t f, uint64_t offset) const;
  /// Block `b` of file `f`: its first byte and its length.
  std::pair<uint64_t, uint64_t> Extent(size_t f, uint64_t b) const;
  const BlockGeometry& geometry() const { return geometry_; }

 private:
  void AlignToSamplerBlocks(const ResolvedJob& job);
  BlockGeometry geometry_;
  std::vector<uint64_t> sizes_;
  std::vector<std::vector<uint64_t>> starts_;
  bool sample_aligned_ = false;
};

/// The same, for one object of `size` bytes with these block starts (empty:
/// byte-aligned by `g`); BlockMap and the cache's reader share them.
uint64_t BlockOfOffset(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size, uint64_t offset);
std::pair<uint64_t, uint64_t> BlockExtentOf(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size,
                                            uint64_t block);
uint64_t BlockCount(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size);

/// One epoch of one process's reads, block by block.
struct FetchEstimate {
  uint64_t steps = 0;                   // steps looked at (the epoch's, or its first ones when `complete` is false)
  bool complete = true;                 // the whole epoch was looked at
  uint64_t read_bytes = 0;              // the bytes the steps read (what a process reads without a cache)
  uint64_t blocks = 0;                  // distinct blocks the steps read from
  uint64_t block_bytes = 0;             // their bytes in the cache
  uint64_t fetched_bytes = 0;           // what storage sends for them (a compressed file: its stored bytes): what an
                                        // epoch fetches with a cache of working_set_bytes
  uint64_t working_set_bytes = 0;       // the most block bytes in use at once (first to last read in the epoch)
  uint64_t capacity_fetched_bytes = 0;  // what storage sends with a least-recently-used cache of the capacity
                                        // given, the epoch's reads in plan order (fetched_bytes when none is)
  uint64_t dataset_bytes = 0;           // every file's bytes
  /// Bytes fetched per byte read in an epoch with a cache of the working set.
  double Amplification() const {
    return read_bytes ? static_cast<double>(fetched_bytes) / static_cast<double>(read_bytes) : 0;
  }
};

/// Epoch `epoch` of process `process`'s reads under `loading`, looked at
/// up to `max_samples` samples read (then `complete` is false and the
/// figures are those of the steps looked at); with `capacity_bytes`, also
/// what a least-recently-used cache of that many block bytes fetches.
FetchEstimate EstimateFetch(const ShardPlanner& planner, const Loading& loading, int64_t process,
                            const BlockGeometry& geometry, uint64_t epoch = 0, uint64_t max_samples = 1ull << 20,
                            uint64_t capacity_bytes = 0);

}  // namespace meshload::planner
