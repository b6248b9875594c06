#include "sidecar/cache/cached_source.h"

#include <algorithm>
#include <cstring>

namespace meshload::sidecar::cache {

CachedSource::CachedSource(source::Source& remote, BlockCache& cache, BlockGeometry geometry)
    : remote_(remote), cache_(cache), geometry_(geometry) {}

size_t CachedSource::AddObject(const std::string& name, uint64_t size, const std::string& version) {
  auto [it, added] = by_name_.try_emplace(name, objects_.size());
  if (added) objects_.push_back({name, size, ObjectKey(name, size, version), geometry_.Unit(size)});
  return it->second;
}

int64_t CachedSource::IndexOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::pair<uint64_t, uint64_t> CachedSource::BlockExtent(size_t object, uint64_t block) const {
  const Object& o = objects_[object];
  const uint64_t start = block * o.unit;
  return {start, std::min(o.unit, o.size - start)};
}

std::pair<uint64_t, uint64_t> CachedSource::BlocksOf(size_t object, uint64_t offset, uint64_t len) const {
  const Object& o = objects_[object];
  return {offset / o.unit, (offset + len - 1) / o.unit};
}

Result<BlockCache::Block> CachedSource::Get(size_t object, uint64_t block, int64_t next_use, BlockCache::Want want,
                                            bool* fetched) {
  const Object& o = objects_[object];
  const auto [start, len] = BlockExtent(object, block);
  return cache_.Get(
      {o.key, block}, len,
      [&](uint8_t* dst, uint64_t n) { return remote_.Read(o.name, start, dst, n); }, next_use, want, fetched);
}

Status CachedSource::Fill(size_t object, uint64_t block, int64_t next_use, bool* fetched) {
  return Get(object, block, next_use, BlockCache::Want::kAhead, fetched).status();
}

Status CachedSource::ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) {
  uint64_t len = 0;
  for (const iovec& v : iov) len += v.iov_len;
  if (len == 0) return Status::Ok();
  const int64_t object = IndexOf(uri);
  if (object < 0 || !cache_.storing()) {
    // An object the dataset does not list (none, today), or a disk that
    // refuses blocks: the source, for exactly these bytes.
    counters_.direct_bytes += len;
    counters_.delivered_bytes += len;
    return remote_.ReadV(uri, offset, iov);
  }
  const Object& o = objects_[static_cast<size_t>(object)];
  if (offset + len > o.size) {
    return DataLoss("range [" + std::to_string(offset) + ", " + std::to_string(offset + len) + ") is past the end of " +
                        std::to_string(o.size) + " bytes",
                    source::RedactUri(uri) + "@" + std::to_string(offset));
  }
  size_t vi = 0;       // the iovec being filled
  uint64_t vdone = 0;  // bytes of it filled
  uint64_t pos = offset;
  const uint64_t end = offset + len;
  while (pos < end) {
    const uint64_t block = pos / o.unit;
    MESHLOAD_ASSIGN_OR_RETURN(BlockCache::Block b,
                              Get(static_cast<size_t>(object), block, -1, BlockCache::Want::kRead, nullptr));
    const uint64_t bstart = block * o.unit;
    const uint64_t bend = std::min(end, bstart + b.size());
    while (pos < bend) {
      const iovec& v = iov[vi];
      const uint64_t n = std::min<uint64_t>(v.iov_len - vdone, bend - pos);
      std::memcpy(static_cast<uint8_t*>(v.iov_base) + vdone, b.data() + (pos - bstart), static_cast<size_t>(n));
      pos += n;
      vdone += n;
      if (vdone == v.iov_len) {
        ++vi;
        vdone = 0;
      }
    }
  }
  counters_.delivered_bytes += len;
  return Status::Ok();
}

}  // namespace meshload::sidecar::cache
