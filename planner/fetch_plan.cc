#include "planner/fetch_plan.h"

#include <cmath>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshload::planner {

uint64_t BlockOfOffset(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size, uint64_t offset) {
  if (starts.empty()) return offset / g.Unit(size);
  return static_cast<uint64_t>(std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin()) - 1;
}

std::pair<uint64_t, uint64_t> BlockExtentOf(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size,
                                            uint64_t block) {
  if (starts.empty()) {
    const uint64_t unit = g.Unit(size);
    const uint64_t start = block * unit;
    return {start, std::min(unit, size - start)};
  }
  const uint64_t end = block + 1 < starts.size() ? starts[block + 1] : size;
  return {starts[block], end - starts[block]};
}

uint64_t BlockCount(const BlockGeometry& g, const std::vector<uint64_t>& starts, uint64_t size) {
  return starts.empty() ? g.Blocks(size) : starts.size();
}

BlockMap::BlockMap(const ResolvedJob& job, const BlockGeometry& geometry) : geometry_(geometry) {
  const DatasetIndex& ds = job.dataset;
  for (const DatasetFile& f : ds.files()) sizes_.push_back(f.size);
  starts_.resize(sizes_.size());
  const ShuffleSpec& sh = job.spec.shuffle;
  if ((sh.mode == ShuffleMode::kBlock || sh.mode == ShuffleMode::kWindow) && ds.token_rows() == nullptr &&
      ds.indexed() && sh.block_size >= 1) {
    AlignToSamplerBlocks(job);
  }
  // A file stored compressed is one block: it is decompressed whole. A
  // Parquet file's blocks are its row groups: one is decoded whole.
  for (size_t f = 0; f < sizes_.size(); ++f) {
    const DatasetFile& file = ds.files()[f];
    if (file.stored) starts_[f] = {0};
    if (file.parquet && !file.parquet->row_groups.empty()) {
      starts_[f].clear();
      for (const ParquetFile::RowGroup& g : file.parquet->row_groups) {
        starts_[f].push_back(g.first_row * file.parquet->layout.bytes);
      }
    }
  }
}

void BlockMap::AlignToSamplerBlocks(const ResolvedJob& job) {
  const DatasetIndex& ds = job.dataset;
  const ShuffleSpec& sh = job.spec.shuffle;
  const BlockGeometry& geometry = geometry_;
  sample_aligned_ = true;
  const uint64_t b = static_cast<uint64_t>(sh.block_size);
  std::vector<DatasetIndex::Part> parts = ds.parts();
  if (parts.empty()) parts.push_back({"", 0, ds.num_samples()});
  std::vector<planner::Extent> extents;
  for (const DatasetIndex::Part& p : parts) {
    for (uint64_t local = 0; local < p.samples; local += b) {
      extents.clear();
      ds.AppendExtents(p.first + local, extents);
      if (!extents.empty()) starts_[extents.front().file].push_back(extents.front().offset);
    }
  }
  for (size_t f = 0; f < starts_.size(); ++f) {
    std::vector<uint64_t>& s = starts_[f];
    s.push_back(0);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    // Long sampler blocks (large samples, or a large blockSize) in pieces
    // of about block_bytes, so one block is never most of a cache.
    std::vector<uint64_t> cut;
    for (size_t i = 0; i < s.size(); ++i) {
      const uint64_t end = i + 1 < s.size() ? s[i + 1] : sizes_[f];
      const uint64_t len = end - s[i];
      const double pieces =
          std::max(1.0, std::round(static_cast<double>(len) / static_cast<double>(geometry.block_bytes)));
      const uint64_t n = len > geometry.block_bytes * 3 / 2 ? static_cast<uint64_t>(pieces) : 1;
      for (uint64_t k = 0; k < n; ++k) cut.push_back(s[i] + len * k / n);
    }
    s = std::move(cut);
  }
}

uint64_t BlockMap::Blocks(size_t f) const { return BlockCount(geometry_, starts_[f], sizes_[f]); }

uint64_t BlockMap::BlockOf(size_t f, uint64_t offset) const {
  return BlockOfOffset(geometry_, starts_[f], sizes_[f], offset);
}

std::pair<uint64_t, uint64_t> BlockMap::Extent(size_t f, uint64_t b) const {
  return BlockExtentOf(geometry_, starts_[f], sizes_[f], b);
}

namespace {

// A least-recently-used store of blocks by their bytes: what a block that
// is not in it costs to fetch, summed.
class LruFetches {
 public:
  explicit LruFetches(uint64_t capacity) : capacity_(capacity) {}
  void Read(uint64_t key, uint64_t bytes, uint64_t fetched) {
    if (auto it = where_.find(key); it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    fetched_ += fetched;
    order_.push_front({key, bytes});
    where_[key] = order_.begin();
    held_ += bytes;
    // The block being read stays, even alone over the capacity.
    while (held_ > capacity_ && order_.size() > 1) {
      held_ -= order_.back().second;
      where_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  uint64_t fetched() const { return fetched_; }

 private:
  uint64_t capacity_;
  uint64_t held_ = 0;
  uint64_t fetched_ = 0;
  std::list<std::pair<uint64_t, uint64_t>> order_;  // most recent first
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, uint64_t>>::iterator> where_;
};

}  // namespace

FetchEstimate EstimateFetch(const ShardPlanner& planner, const Loading& loading, int64_t process,
                            const BlockGeometry& geometry, uint64_t epoch, uint64_t max_samples,
                            uint64_t capacity_bytes) {
  const ResolvedJob& job = planner.job();
  const DatasetIndex& ds = job.dataset;
  const BlockMap blocks(job, geometry);
  FetchEstimate out;
  for (const DatasetFile& f : ds.files()) out.dataset_bytes += f.size;
  struct Use {
    uint64_t first, last, bytes, fetched;
  };
  // (file << 40 | block) -> the steps of the epoch (from 0) that read it.
  std::unordered_map<uint64_t, Use> uses;
  std::vector<Extent> extents;
  LruFetches lru(capacity_bytes);
  uint64_t samples = 0;
  const uint64_t K = job.steps_per_epoch;
  for (uint64_t j = 0; j < K; ++j) {
    if (samples >= max_samples) {
      out.complete = false;
      break;
    }
    const StepPlan plan =
        planner.PlanStep(static_cast<int64_t>(epoch * K + j), loading, process, ShardPlanner::Detail::kSamples);
    for (const ReadPlan& r : plan.reads) {
      samples += r.samples.size();
      for (uint64_t id : r.samples) {
        extents.clear();
        ds.AppendExtents(id, extents);
        for (const Extent& e : extents) {
          if (e.length == 0) continue;
          out.read_bytes += e.length;
          const uint64_t last = blocks.BlockOf(e.file, e.offset + e.length - 1);
          for (uint64_t b = blocks.BlockOf(e.file, e.offset); b <= last; ++b) {
            auto [it, added] = uses.try_emplace((uint64_t{e.file} << 40) | b, Use{j, j, 0, 0});
            if (added) {
              // A compressed file is one block, fetched as its stored bytes;
              // a Parquet row group as its wanted column chunks.
              const DatasetFile& file = ds.files()[e.file];
              it->second.bytes = blocks.Extent(e.file, b).second;
              it->second.fetched = file.stored ? file.stored->size : it->second.bytes;
              if (file.parquet && b < file.parquet->row_groups.size()) {
                it->second.fetched = file.parquet->row_groups[b].chunk_bytes;
                it->second.bytes = file.parquet->row_groups[b].decoded_bytes;
              }
            }
            it->second.last = j;
            if (capacity_bytes > 0) lru.Read(it->first, it->second.bytes, it->second.fetched);
          }
        }
      }
    }
    out.steps += 1;
  }
  // The working set: the most block bytes between their first and last use
  // at any step (a sweep over the uses' starts and ends).
  std::vector<std::pair<uint64_t, int64_t>> events;
  events.reserve(uses.size() * 2);
  for (const auto& [key, u] : uses) {
    out.blocks += 1;
    out.block_bytes += u.bytes;
    out.fetched_bytes += u.fetched;
    events.push_back({u.first, static_cast<int64_t>(u.bytes)});
    events.push_back({u.last + 1, -static_cast<int64_t>(u.bytes)});
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // ends before starts at one step
  });
  int64_t live = 0, most = 0;
  for (const auto& [step, delta] : events) {
    live += delta;
    most = std::max(most, live);
  }
  out.working_set_bytes = static_cast<uint64_t>(most);
  out.capacity_fetched_bytes = capacity_bytes > 0 ? lru.fetched() : out.fetched_bytes;
  return out;
}

}  // namespace meshload::planner
