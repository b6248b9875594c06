#include "sidecar/cache/cached_source.h"

#include <algorithm>
#include <cstring>

#include "sidecar/source/decoded_source.h"

namespace meshload::sidecar::cache {

CachedSource::CachedSource(source::Source& remote, BlockCache& cache, BlockGeometry geometry)
    : remote_(remote), cache_(cache), geometry_(geometry) {}

size_t CachedSource::AddObject(const std::string& name, uint64_t size, const std::string& version,
                               std::vector<uint64_t> starts) {
  auto [it, added] = by_name_.try_emplace(name, objects_.size());
  if (added) {
    // Sample-aligned blocks are a layout of their own: keyed apart from
    // the byte-aligned blocks of the same object.
    std::string key_version = version;
    if (!starts.empty()) key_version += "|layout:" + std::to_string(LayoutKey(starts));
    objects_.push_back({name, size, ObjectKey(name, size, key_version), std::move(starts), std::nullopt, {}});
  }
  return it->second;
}

size_t CachedSource::AddStoredObject(const std::string& name, uint64_t size, const std::string& stored_name,
                                     const planner::StoredFile& stored, const std::string& version) {
  auto [it, added] = by_name_.try_emplace(name, objects_.size());
  if (added) {
    // One block, the whole decompressed file; keyed by the stored object's
    // name, size, version and codec, so a rewritten or recompressed shard
    // never matches an old block.
    const std::string key_version =
        "stored:" + stored_name + "|" + std::to_string(stored.size) + "|" + stored.compression + "|" + version;
    objects_.push_back({name, size, ObjectKey(name, size, key_version), {0}, stored, stored_name});
  }
  return it->second;
}

Result<source::ObjectInfo> CachedSource::Stat(const std::string& uri) {
  const int64_t object = IndexOf(uri);
  if (object < 0 || !objects_[static_cast<size_t>(object)].stored) return remote_.Stat(uri);
  const Object& o = objects_[static_cast<size_t>(object)];
  MESHLOAD_ASSIGN_OR_RETURN(source::ObjectInfo info, remote_.Stat(o.stored_name));
  info.size = o.size;
  return info;
}

int64_t CachedSource::IndexOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::pair<uint64_t, uint64_t> CachedSource::BlockExtent(size_t object, uint64_t block) const {
  const Object& o = objects_[object];
  return planner::BlockExtentOf(geometry_, o.starts, o.size, block);
}

std::pair<uint64_t, uint64_t> CachedSource::BlocksOf(size_t object, uint64_t offset, uint64_t len) const {
  const Object& o = objects_[object];
  return {planner::BlockOfOffset(geometry_, o.starts, o.size, offset),
          planner::BlockOfOffset(geometry_, o.starts, o.size, offset + len - 1)};
}

Result<BlockCache::Block> CachedSource::Get(size_t object, uint64_t block, int64_t next_use, BlockCache::Want want,
                                            bool* fetched) {
  const Object& o = objects_[object];
  const std::pair<uint64_t, uint64_t> extent = BlockExtent(object, block);
  const uint64_t start = extent.first;
  bool got = false;
  // A file stored compressed is one block: the stored object read whole
  // and decompressed into it; what storage sent is its stored bytes.
  const uint64_t fetch_bytes = o.stored ? o.stored->size : extent.second;
  Result<BlockCache::Block> b = cache_.Get(
      {o.key, block}, extent.second,
      [&](uint64_t n, const BlockCache::Sink& sink) -> Status {
        if (o.stored) {
          // Decompressed whole, then handed on.
          std::vector<uint8_t> raw(static_cast<size_t>(n));
          MESHLOAD_RETURN_IF_ERROR(source::ReadStored(remote_, o.stored_name, *o.stored, raw.data(), n));
          return sink(0, raw.data(), raw.size());
        }
        return remote_.ReadTo(o.name, start, n, sink);
      },
      next_use, want, &got, fetch_bytes);
  if (got) {
    if (fetched) *fetched = true;
    CountFetch(next_use, fetch_bytes);
  }
  return b;
}

void CachedSource::NoteStep(int64_t step) {
  noted_step_.store(step, std::memory_order_relaxed);
  source::SetReadingStep(step);
}

void CachedSource::CountByEpoch(std::function<int64_t(int64_t)> epoch_of) { epoch_of_ = std::move(epoch_of); }

void CachedSource::CountFetch(int64_t step, uint64_t bytes) {
  if (!epoch_of_) return;
  if (step < 0) step = source::ReadingStep();
  const int64_t epoch = epoch_of_(step >= 0 ? step : noted_step_.load(std::memory_order_relaxed));
  MutexLock lock(epoch_mu_);
  fetched_by_epoch_[epoch] += bytes;
  while (fetched_by_epoch_.size() > kEpochsKept) fetched_by_epoch_.erase(fetched_by_epoch_.begin());
}

std::vector<std::pair<int64_t, uint64_t>> CachedSource::FetchedByEpoch() const {
  MutexLock lock(epoch_mu_);
  return {fetched_by_epoch_.begin(), fetched_by_epoch_.end()};
}

Status CachedSource::Fill(size_t object, uint64_t block, int64_t next_use, bool* fetched) {
  return Get(object, block, next_use, BlockCache::Want::kAhead, fetched).status();
}

namespace {

uint64_t BytesOf(const std::vector<iovec>& iov) {
  uint64_t n = 0;
  for (const iovec& v : iov) n += v.iov_len;
  return n;
}

// Copies `n` bytes from `src` into `iov` from buffer `vi`, byte `vdone` of
// it on, and moves them past the bytes copied.
void Scatter(const uint8_t* src, uint64_t n, const std::vector<iovec>& iov, size_t& vi, uint64_t& vdone) {
  while (n > 0) {
    const iovec& v = iov[vi];
    const uint64_t k = std::min<uint64_t>(v.iov_len - vdone, n);
    std::memcpy(static_cast<uint8_t*>(v.iov_base) + vdone, src, static_cast<size_t>(k));
    src += k;
    n -= k;
    vdone += k;
    if (vdone == v.iov_len) {
      ++vi;
      vdone = 0;
    }
  }
}

}  // namespace

Result<size_t> CachedSource::CopyOut(size_t object, uint64_t offset, const std::vector<iovec>& iov, uint64_t len,
                                     Held& held, const ReadRequest* next, size_t next_count) {
  const Object& o = objects_[object];
  if (offset + len > o.size) {
    return DataLoss("range [" + std::to_string(offset) + ", " + std::to_string(offset + len) + ") is past the end of " +
                        std::to_string(o.size) + " bytes",
                    source::RedactUri(o.name) + "@" + std::to_string(offset));
  }
  size_t vi = 0;       // the iovec being filled
  uint64_t vdone = 0;  // bytes of it filled
  uint64_t pos = offset;
  const uint64_t end = offset + len;
  size_t merged = 0;  // reads of `next` served here
  while (pos < end) {
    // The block held from the previous read serves this one too when it
    // covers it (a batch's reads are in file order): no lookup.
    if (!held.block || held.object != object || pos < held.start || pos >= held.start + held.block.size()) {
      const uint64_t b = planner::BlockOfOffset(geometry_, o.starts, o.size, pos);
      const auto [bstart, blen] = BlockExtent(object, b);
      // A compressed file's block is all there is of its bytes: held in
      // memory when it cannot be stored. Other blocks that cannot be
      // stored are not fetched for one read.
      MESHLOAD_ASSIGN_OR_RETURN(BlockCache::Block got,
                                Get(object, b, source::ReadingStep(),
                                    o.stored ? BlockCache::Want::kRead : BlockCache::Want::kReadOrNone, nullptr));
      if (!got) {
        // The bytes this read needs from the block, from the source in one
        // request with those of the next reads in the same block, as long
        // as the gap to each costs less than a request of its own.
        const uint64_t bend = bstart + blen;
        const uint64_t mine_end = std::min(end, bend);
        uint64_t span_end = mine_end;
        if (end <= bend) {
          const uint64_t worth = remote_.GapWorthReading();
          while (merged < next_count) {
            const ReadRequest& r = next[merged];
            const uint64_t rlen = BytesOf(*r.iov);
            if (rlen == 0 || r.offset < span_end || r.offset + rlen > bend || r.offset - span_end > worth) break;
            span_end = r.offset + rlen;
            ++merged;
          }
        }
        std::vector<uint8_t> bytes(static_cast<size_t>(span_end - pos));
        MESHLOAD_RETURN_IF_ERROR(remote_.Read(o.name, pos, bytes.data(), bytes.size()));
        counters_.direct_bytes += bytes.size();
        CountFetch(-1, bytes.size());
        Scatter(bytes.data(), mine_end - pos, iov, vi, vdone);
        for (size_t k = 0; k < merged; ++k) {
          size_t kvi = 0;
          uint64_t kdone = 0;
          Scatter(bytes.data() + (next[k].offset - pos), BytesOf(*next[k].iov), *next[k].iov, kvi, kdone);
        }
        pos = mine_end;
        continue;
      }
      held.block = std::move(got);
      held.object = object;
      held.start = bstart;
    }
    const uint64_t bend = std::min(end, held.start + held.block.size());
    Scatter(held.block.data() + (pos - held.start), bend - pos, iov, vi, vdone);
    pos = bend;
  }
  return merged;
}

Status CachedSource::ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) {
  const ReadRequest r{offset, &iov};
  return ReadMany(uri, &r, 1, nullptr, nullptr);
}

Status CachedSource::ReadMany(const std::string& uri, const ReadRequest* reads, size_t count, BeforeRead before,
                              void* context) {
  const int64_t object = IndexOf(uri);
  uint64_t delivered = 0;
  // An object the cache does not hold (a local file beside compressed
  // ones): the source's, uncounted.
  if (object < 0) return remote_.ReadMany(uri, reads, count, before, context);
  if (!cache_.storing() && !objects_[static_cast<size_t>(object)].stored) {
    // A disk that refuses blocks: the source, for exactly these bytes (a
    // compressed file has no such bytes there: its block is decompressed
    // and served from memory).
    for (size_t i = 0; i < count; ++i) delivered += BytesOf(*reads[i].iov);
    counters_.direct_bytes += delivered;
    CountFetch(-1, delivered);
    counters_.delivered_bytes += delivered;
    return remote_.ReadMany(uri, reads, count, before, context);
  }
  Held held;
  for (size_t i = 0; i < count; ++i) {
    if (before != nullptr) before(context, i);
    const uint64_t len = BytesOf(*reads[i].iov);
    if (len == 0) continue;
    MESHLOAD_ASSIGN_OR_RETURN(const size_t merged, CopyOut(static_cast<size_t>(object), reads[i].offset, *reads[i].iov,
                                                           len, held, reads + i + 1, count - i - 1));
    delivered += len;
    for (size_t k = 1; k <= merged; ++k) {
      if (before != nullptr) before(context, i + k);
      delivered += BytesOf(*reads[i + k].iov);
    }
    i += merged;
  }
  counters_.delivered_bytes += delivered;
  return Status::Ok();
}

void CachedSource::Prefetch(const std::string& uri, const Range* ranges, size_t count) {
  // Resident blocks only (a hint never fetches): the first cache line of
  // each range, so the copies that follow overlap their misses.
  const int64_t object = IndexOf(uri);
  if (object < 0) return;
  const Object& o = objects_[static_cast<size_t>(object)];
  Held held;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t pos = ranges[i].offset;
    if (ranges[i].length == 0 || pos >= o.size) continue;
    if (!held.block || pos < held.start || pos >= held.start + held.block.size()) {
      const uint64_t b = planner::BlockOfOffset(geometry_, o.starts, o.size, pos);
      auto found = cache_.Peek(IdOf(static_cast<size_t>(object), b));
      if (!found) continue;
      held.block = std::move(*found);
      held.start = BlockExtent(static_cast<size_t>(object), b).first;
    }
    __builtin_prefetch(held.block.data() + (pos - held.start));
  }
}

}  // namespace meshload::sidecar::cache
