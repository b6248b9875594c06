#include "sidecar/cache/block_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/logging.h"
#include "common/unique_fd.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace meshload::sidecar::cache {

namespace {

constexpr int kFormatVersion = 1;
constexpr char kFormatPrefix[] = "meshload-blocks-v";
constexpr char kMagic[8] = {'M', 'L', 'B', 'L', 'K', 'v', '1', '\n'};
// Leftovers of fills that died (a temporary file, a fill lock) are removed
// when the cache opens once they are this old (a live filler of a shared
// directory writes for seconds, not minutes).
constexpr int64_t kStaleFillSeconds = 600;

struct Trailer {
  char magic[8];
  uint64_t object;
  uint64_t index;
  uint64_t length;
  uint64_t reserved;
  uint64_t checksum;
};
static_assert(sizeof(Trailer) == BlockCache::kTrailerBytes);

uint64_t ChecksumSeed(const BlockId& id, uint64_t len) {
  return id.object ^ (id.index * 0x9E3779B97F4A7C15ull) ^ (len * 0xC2B2AE3D27D4EB4Full);
}

uint64_t Checksum(const uint8_t* data, uint64_t len, const BlockId& id) {
  return XXH3_64bits_withSeed(data, static_cast<size_t>(len), ChecksumSeed(id, len));
}

// "OOOOOOOOOOOOOOOO-III" back into an id; false for any other name.
bool ParseName(const char* name, BlockId* id) {
  if (std::strlen(name) < 18 || name[16] != '-') return false;
  for (int i = 0; i < 16; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  for (const char* p = name + 17; *p; ++p) {
    if (!std::isxdigit(static_cast<unsigned char>(*p))) return false;
  }
  id->object = std::strtoull(std::string(name, 16).c_str(), nullptr, 16);
  id->index = std::strtoull(name + 17, nullptr, 16);
  return true;
}

bool DiskFull(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

}  // namespace

struct BlockCache::Block::Bytes {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void* map = nullptr;
  size_t map_len = 0;
  std::vector<uint8_t> heap;
  Bytes() = default;
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes() {
    if (map != nullptr) ::munmap(map, map_len);
  }
};

const uint8_t* BlockCache::Block::data() const { return bytes_->data; }
uint64_t BlockCache::Block::size() const { return bytes_->size; }

uint64_t ObjectKey(std::string_view uri, uint64_t size, std::string_view version) {
  std::string key;
  key.reserve(uri.size() + version.size() + 1 + sizeof size);
  key.append(uri).push_back('\0');
  key.append(reinterpret_cast<const char*>(&size), sizeof size).append(version);
  return XXH3_64bits_withSeed(key.data(), key.size(), 0x6D6573686C6F6164ull);  // "meshload"
}

uint64_t LayoutKey(const std::vector<uint64_t>& starts) {
  return XXH3_64bits(starts.data(), starts.size() * sizeof(uint64_t));
}

size_t BlockIdHash::operator()(const BlockId& b) const noexcept {
  return static_cast<size_t>(b.object ^ (b.index * 0x9E3779B97F4A7C15ull));
}

BlockCache::BlockCache(BlockCacheOptions options)
    : options_(std::move(options)), clock_(options_.clock ? options_.clock : Clock::Real()) {}

BlockCache::~BlockCache() = default;

int64_t BlockCache::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->Now().time_since_epoch()).count();
}

std::optional<BlockCache::Block> BlockCache::Peek(const BlockId& id) const {
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.map) return std::nullopt;
  return Block(it->second.map);
}

Result<std::unique_ptr<BlockCache>> BlockCache::Open(BlockCacheOptions options) {
  if (options.dir.empty()) return InvalidArgument("no cache directory given", "cache dir");
  if (options.capacity_bytes == 0)
    return InvalidArgument("the cache's capacity must be above 0 bytes", "cache capacity");
  std::unique_ptr<BlockCache> c(new BlockCache(std::move(options)));
  MESHLOAD_RETURN_IF_ERROR(c->Init());
  return c;
}

std::string BlockCache::PathOf(const BlockId& id) const {
  char name[48];
  std::snprintf(name, sizeof name, "%02x/%016" PRIx64 "-%" PRIx64, static_cast<unsigned>(id.object >> 56), id.object,
                id.index);
  return root_ + "/" + name;
}

Status BlockCache::Init() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) return InvalidArgument("cannot make the cache directory: " + ec.message(), options_.dir);
  // Other formats' directories: an older one is this cache's past, removed;
  // a newer one belongs to a newer sidecar sharing the directory, left alone.
  for (const auto& d : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = d.path().filename().string();
    if (name.rfind(kFormatPrefix, 0) != 0) continue;
    const int v = std::atoi(name.c_str() + sizeof(kFormatPrefix) - 1);
    if (v == kFormatVersion) continue;
    if (v < kFormatVersion) {
      std::error_code rm;
      const uintmax_t n = fs::remove_all(d.path(), rm);
      LogInfo("removed a block cache of an older format",
              {{"dir", d.path().string()}, {"files", static_cast<uint64_t>(n)}, {"error", rm ? rm.message() : ""}});
    } else {
      LogWarn("a block cache of a newer format shares the cache directory; its blocks are not counted",
              {{"dir", d.path().string()}});
    }
  }
  if (ec) return InvalidArgument("cannot list the cache directory: " + ec.message(), options_.dir);
  root_ = options_.dir + "/" + kFormatPrefix + std::to_string(kFormatVersion);
  fs::create_directories(root_, ec);
  if (ec) return InvalidArgument("cannot make the cache directory: " + ec.message(), root_);
  // Writable: a probe file, made and removed.
  const std::string probe = root_ + "/.probe." + std::to_string(::getpid());
  UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return InvalidArgument("the cache directory is not writable: " + std::string(std::strerror(errno)), root_);
  }
  ::unlink(probe.c_str());
  Rescan();
  MutexLock lock(mu_);
  MakeRoom(0, -1);
  return Status::Ok();
}

void BlockCache::Rescan() {
  struct Found {
    BlockId id;
    uint64_t bytes;
    int64_t age_s;
  };
  std::vector<Found> found;
  const int64_t now_wall =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  DIR* top = ::opendir(root_.c_str());
  if (top == nullptr) return;
  while (dirent* d = ::readdir(top)) {
    if (d->d_name[0] == '.' || std::strlen(d->d_name) != 2) continue;
    const std::string sub = root_ + "/" + d->d_name;
    DIR* dir = ::opendir(sub.c_str());
    if (dir == nullptr) continue;
    while (dirent* f = ::readdir(dir)) {
      if (f->d_name[0] == '.') continue;
      const std::string path = sub + "/" + f->d_name;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) continue;
      BlockId id;
      if (!ParseName(f->d_name, &id)) {
        // A fill's temporary file or lock left by a process that died.
        const bool leftover = std::strstr(f->d_name, ".tmp.") != nullptr || std::strstr(f->d_name, ".fill") != nullptr;
        if (leftover && now_wall - st.st_mtim.tv_sec > kStaleFillSeconds) ::unlink(path.c_str());
        continue;
      }
      found.push_back({id, static_cast<uint64_t>(st.st_size), std::max<int64_t>(0, now_wall - st.st_mtim.tv_sec)});
    }
    ::closedir(dir);
  }
  ::closedir(top);

  MutexLock lock(mu_);
  std::unordered_map<BlockId, bool, BlockIdHash> seen;
  for (const Found& f : found) {
    seen[f.id] = true;
    auto [it, added] = entries_.try_emplace(f.id);
    if (!added && (it->second.filling || it->second.disk_bytes > 0)) continue;  // known here (a placeholder is not)
    it->second.disk_bytes = f.bytes;
    it->second.last_use = -f.age_s;
    used_ += f.bytes;
  }
  // Entries whose files went (another process evicted them): a reader
  // keeps its mapping; the index forgets them.
  // (A block stored after the listing is not in it: its file is looked at.)
  for (auto it = entries_.begin(); it != entries_.end();) {
    struct stat st {};
    if (!it->second.filling && it->second.disk_bytes > 0 && !seen.count(it->first) &&
        ::stat(PathOf(it->first).c_str(), &st) != 0) {
      used_ -= it->second.disk_bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  next_rescan_ns_ = NowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.rescan_every).count();
}

Result<std::shared_ptr<const BlockCache::Block::Bytes>> BlockCache::MapVerified(const BlockId& id, uint64_t len) const {
  const std::string path = PathOf(id);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFound("no such block", path);
    return IoErrorFromErrno("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return IoErrorFromErrno("fstat", path, errno);
  const uint64_t want = len + kTrailerBytes;
  if (static_cast<uint64_t>(st.st_size) != want) {
    return DataLoss("the block file has " + std::to_string(st.st_size) + " bytes, a block of " + std::to_string(len) +
                        " bytes takes " + std::to_string(want) + " (truncated or not a block)",
                    path);
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(want), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) return IoErrorFromErrno("mmap", path, errno);
  auto bytes = std::make_shared<Block::Bytes>();
  bytes->map = m;
  bytes->map_len = static_cast<size_t>(want);
  bytes->data = static_cast<const uint8_t*>(m);
  bytes->size = len;
  Trailer t;
  std::memcpy(&t, bytes->data + len, sizeof t);
  if (std::memcmp(t.magic, kMagic, sizeof kMagic) != 0) return DataLoss("the block's trailer is not one", path);
  if (t.object != id.object || t.index != id.index || t.length != len) {
    return DataLoss("the block's trailer names another block", path);
  }
  if (Checksum(bytes->data, len, id) != t.checksum) {
    return DataLoss("the block's checksum does not match its bytes", path);
  }
  return std::shared_ptr<const Block::Bytes>(std::move(bytes));
}

bool BlockCache::MakeRoom(uint64_t bytes, int64_t next_use) {
  const uint64_t cap = options_.capacity_bytes;
  if (used_ + bytes <= cap) return true;
  if (bytes > cap) return false;
  struct Candidate {
    BlockId id;
    bool known;
    int64_t key;  // unknown: last use (oldest first); known: next use (furthest first)
  };
  std::vector<Candidate> cands;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    const int64_t next = NextUse(e);
    if (!e.filling && e.disk_bytes == 0 && next < 0) {
      it = entries_.erase(it);  // a placeholder whose steps passed
      continue;
    }
    if (!e.filling && e.disk_bytes > 0) cands.push_back({it->first, next >= 0, next >= 0 ? next : e.last_use});
    ++it;
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.known != b.known) return !a.known;
    return a.known ? a.key > b.key : a.key < b.key;
  });
  // A block some step needs is not evicted for one needed later, by the
  // same step (both are needed now: the newcomer's bytes are read without
  // storing it), or by no known step: the newcomer is then not stored.
  const bool new_known = next_use >= 0 && next_use > passed_;
  for (const Candidate& c : cands) {
    if (used_ + bytes <= cap) break;
    if (c.known && (!new_known || c.key <= next_use)) break;
    Remove(c.id, /*evicted=*/true);
  }
  return used_ + bytes <= cap;
}

void BlockCache::Remove(const BlockId& id, bool evicted) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  ::unlink(PathOf(id).c_str());
  used_ -= it->second.disk_bytes;
  if (evicted) {
    counters_.evicted_bytes += it->second.disk_bytes >= kTrailerBytes ? it->second.disk_bytes - kTrailerBytes : 0;
    counters_.evictions += 1;
  }
  entries_.erase(it);
}

void BlockCache::DiskRefused(int err, const BlockId& id) {
  counters_.write_errors += 1;
  MutexLock lock(mu_);
  refused_until_ns_ =
      NowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.store_retry_after).count();
  if (!refusal_logged_) {
    refusal_logged_ = true;
    LogWarn(
        "the cache disk refused a block: reads go to the source directly for a while (logged once; "
        "meshload_cache_errors_total{kind=\"write\"} counts them)",
        {{"block", PathOf(id)},
         {"error", std::strerror(err)},
         {"disk_full", DiskFull(err)},
         {"retry_after_s", static_cast<int64_t>(options_.store_retry_after.count() / 1000)}});
  }
}

bool BlockCache::storing() const {
  MutexLock lock(mu_);
  return NowNs() >= refused_until_ns_;
}

Result<BlockCache::Block> BlockCache::Get(const BlockId& id, uint64_t len, const Fetch& fetch, int64_t next_use,
                                          Want want, bool* fetched, uint64_t fetch_bytes) {
  if (fetched) *fetched = false;
  if (fetch_bytes == 0) fetch_bytes = len;
  const bool reading = want != Want::kAhead;  // kRead or kReadOrNone: counted, needed now
  bool waited = false;
  bool rescan = false;
  {
    MutexLock lock(mu_);
    for (;;) {
      auto it = entries_.find(id);
      if (it == entries_.end()) break;
      Entry& e = it->second;
      if (e.map) {
        if (e.map->size != len) {
          return Internal("block " + PathOf(id) + " has " + std::to_string(e.map->size) + " bytes, wanted " +
                          std::to_string(len));
        }
        e.last_use = ++uses_;
        if (next_use >= 0) AddUse(e, next_use);
        if (reading) (waited ? counters_.misses : counters_.hits) += 1;
        return Block(e.map);
      }
      if (e.filling) {
        // Another thread fetches it (a miss for this read too), or verifies
        // the file it found on disk (then a hit). Its filler may be waiting
        // for room for a later step: this step needs the block too.
        const int64_t mine = reading && next_use < 0 ? passed_ + 1 : next_use;
        if (mine >= 0) {
          AddUse(e, mine);
          room_changed_.NotifyAll();
        }
        waited = waited || e.disk_bytes == 0;
        filled_.Wait(mu_);
        continue;
      }
      if (e.disk_bytes == 0) break;  // a placeholder: fetched below, its noted uses kept
      // On disk, not verified by this process yet.
      e.filling = true;
      lock.Unlock();
      auto mapped = MapVerified(id, len);
      lock.Lock();
      it = entries_.find(id);  // a filling entry is never removed by others
      it->second.filling = false;
      filled_.NotifyAll();
      if (mapped.ok()) {
        counters_.found_on_disk += 1;
        it->second.map = std::move(*mapped);
        continue;  // served above
      }
      if (mapped.status().code() == StatusCode::kDataLoss) {
        counters_.corrupt_blocks += 1;
        LogWarn("a cached block is corrupt: removed, fetched again", {{"reason", mapped.status().ToString()}});
        Remove(id, /*evicted=*/false);
      } else {
        // Gone (another process evicted it) or unreadable: forget it.
        used_ -= it->second.disk_bytes;
        entries_.erase(it);
      }
    }
    // Not resident: this thread fills it. A read needs it now: as soon as
    // any step not passed.
    if (reading && next_use < 0) next_use = passed_ + 1;
    Entry& e = entries_[id];
    e.filling = true;
    if (next_use >= 0) AddUse(e, next_use);
    e.last_use = ++uses_;
    if (reading) counters_.misses += 1;
    rescan = NowNs() >= next_rescan_ns_;
  }
  if (rescan) Rescan();

  // Unfills the entry (keeping it when `bytes` is stored) and wakes waiters.
  auto finish = [&](std::shared_ptr<const Block::Bytes> bytes, uint64_t disk_bytes) {
    MutexLock lock(mu_);
    auto it = entries_.find(id);
    if (bytes && disk_bytes > 0) {
      it->second.filling = false;
      it->second.map = std::move(bytes);
      it->second.disk_bytes = disk_bytes;  // counted in used_ when room was made
    } else {
      entries_.erase(it);
    }
    filled_.NotifyAll();
  };

  // Another process sharing the directory may be filling it: its lock, then
  // a look at the disk, then (still holding the lock) the fetch.
  const std::string path = PathOf(id);
  const std::string lock_path = path + ".fill";
  ::mkdir(path.substr(0, path.rfind('/')).c_str(), 0755);
  UniqueFd lock_fd(::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
  if (lock_fd.valid()) {
    while (::flock(lock_fd.get(), LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  auto unlock_fill = [&] {
    if (lock_fd.valid()) {
      ::unlink(lock_path.c_str());
      lock_fd.Reset();  // closing releases the flock
    }
  };
  if (auto on_disk = MapVerified(id, len); on_disk.ok()) {
    counters_.found_on_disk += 1;
    unlock_fill();
    {
      MutexLock lock(mu_);
      used_ += len + kTrailerBytes;
    }
    Block b(*on_disk);
    finish(std::move(*on_disk), len + kTrailerBytes);
    return b;
  } else if (on_disk.status().code() == StatusCode::kDataLoss) {
    counters_.corrupt_blocks += 1;
    LogWarn("a cached block is corrupt: removed, fetched again", {{"reason", on_disk.status().ToString()}});
    ::unlink(path.c_str());
  }

  // Room first (the block's size is known before it is fetched), then the
  // fetch straight into its file.
  bool room = false;
  {
    MutexLock lock(mu_);
    if (NowNs() >= refused_until_ns_) {
      room = MakeRoom(len + kTrailerBytes, NeededAt(id, next_use));
      // A read for step t whose room is held by blocks that earlier steps
      // still need: those steps are being read now (the cache learns when
      // they pass, SetPassed, or when one of them asks for this block too).
      // Waiting for them, up to kRoomWait, stores the block; fetching it
      // now could not, and the next reads of it would fetch it again.
      const auto deadline = std::chrono::steady_clock::now() + kRoomWait;
      // (A block larger than the whole cache never finds room: no wait.)
      while (!room && reading && len + kTrailerBytes <= options_.capacity_bytes && NeededAt(id, next_use) >= 0 &&
             passed_ < NeededAt(id, next_use) - 1 && std::chrono::steady_clock::now() < deadline) {
        room_changed_.WaitUntil(mu_, deadline);
        room = MakeRoom(len + kTrailerBytes, NeededAt(id, next_use));
      }
      if (room) used_ += len + kTrailerBytes;  // reserved while it is filled
    }
  }
  if (room) {
    Filled f = FillFile(id, len, fetch);
    if (f.fetched) {
      if (fetched) *fetched = true;
      counters_.fetches += 1;
      counters_.fetched_bytes += fetch_bytes;
    } else if (f.received > 0) {
      // The disk stopped the fill: what arrived was fetched all the same
      // (a stored file's bytes were all read before they were decompressed).
      counters_.fetched_bytes += fetch_bytes == len ? f.received : fetch_bytes;
    }
    if (f.err == 0 && f.bytes) {
      unlock_fill();
      Block b(f.bytes);
      finish(std::move(f.bytes), len + kTrailerBytes);
      return b;
    }
    {
      MutexLock lock(mu_);
      used_ -= len + kTrailerBytes;
    }
    if (f.err != 0) DiskRefused(f.err, id);
    if (!f.status.ok() || f.bytes) {
      // The fetch failed, or it worked but the file could not be kept (the
      // bytes are in the unlinked file's mapping): either way, done.
      unlock_fill();
      finish(nullptr, 0);
      if (!f.status.ok()) return f.status;
      return Block(std::move(f.bytes));
    }
  }
  // Not stored (the disk refuses blocks, or no room for one needed this
  // late). Ahead of need, it is not fetched at all (the read that needs it
  // will); a read gets it from memory, or reads its own bytes elsewhere.
  if (want != Want::kRead) {
    unlock_fill();
    finish(nullptr, 0);
    return Block();
  }
  std::vector<uint8_t> buf(static_cast<size_t>(len));
  Status st = TimedFetch(fetch, len, [&](uint64_t at, const uint8_t* data, size_t n) {
    std::memcpy(buf.data() + at, data, n);
    return Status::Ok();
  });
  unlock_fill();
  finish(nullptr, 0);
  if (!st.ok()) return st;
  if (fetched) *fetched = true;
  counters_.fetches += 1;
  counters_.fetched_bytes += fetch_bytes;
  auto held = std::make_shared<Block::Bytes>();
  held->heap = std::move(buf);
  held->data = held->heap.data();
  held->size = len;
  return Block(std::move(held));
}

Status BlockCache::TimedFetch(const Fetch& fetch, uint64_t len, const Sink& sink) const {
  const auto now = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  int64_t zero = 0;
  counters_.first_fetch_ns.compare_exchange_strong(zero, now());
  Status st = fetch(len, [&](uint64_t at, const uint8_t* data, size_t n) -> Status {
    if (at > len || n > len - at) {
      return Internal("the source handed bytes " + std::to_string(at) + ".." + std::to_string(at + n) +
                      " of a block of " + std::to_string(len));
    }
    return sink(at, data, n);
  });
  const int64_t end = now();
  int64_t last = counters_.last_fetch_ns.load();
  while (last < end && !counters_.last_fetch_ns.compare_exchange_weak(last, end)) {
  }
  return st;
}

BlockCache::Filled BlockCache::FillFile(const BlockId& id, uint64_t len, const Fetch& fetch) const {
  Filled out;
  const uint64_t size = len + kTrailerBytes;
  const std::string path = PathOf(id);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    out.err = errno;
    return out;
  }
  // The disk's room is taken before the fetch (a full disk says so here,
  // not halfway through the block).
  int err = 0;
  while ((err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size))) == EINTR) {
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    out.err = err;
    return out;
  }
  // The bytes are written to the file as they arrive, a piece at a time,
  // and hashed on the way while they come in order. Not through a mapping
  // of the new file: that costs a page fault per 4 KiB (each page zeroed
  // first), several times the copy itself.
  const uint64_t seed = ChecksumSeed(id, len);
  XXH3_state_t hash;
  XXH3_64bits_reset_withSeed(&hash, seed);
  uint64_t hashed = 0;  // bytes [0, hashed) are in `hash`
  bool in_order = true;
  auto write_all = [&](const uint8_t* data, size_t n, uint64_t at) -> int {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd.get(), data, n, static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return w < 0 ? errno : EIO;
      data += w;
      n -= static_cast<size_t>(w);
      at += static_cast<uint64_t>(w);
    }
    return 0;
  };
  out.status = TimedFetch(fetch, len, [&](uint64_t at, const uint8_t* data, size_t n) -> Status {
    if (const int e = write_all(data, n, at); e != 0) {
      out.err = e;
      return Status(StatusCode::kIoError, std::string("writing a block to the cache: ") + std::strerror(e), tmp);
    }
    out.received = std::max(out.received, at + n);
    if (in_order && at == hashed) {
      XXH3_64bits_update(&hash, data, n);
      hashed += n;
    } else {
      in_order = false;  // a retry handed a range again: hashed from the file below
    }
    return Status::Ok();
  });
  if (out.err != 0) {
    // The disk stopped the fill: the fetch itself did not fail.
    out.status = Status::Ok();
    ::unlink(tmp.c_str());
    return out;
  }
  out.fetched = out.status.ok();
  if (!out.status.ok()) {
    ::unlink(tmp.c_str());
    return out;
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) {
    out.err = errno;
    ::unlink(tmp.c_str());
    return out;
  }
  auto bytes = std::make_shared<Block::Bytes>();
  bytes->map = m;
  bytes->map_len = static_cast<size_t>(size);
  bytes->data = static_cast<const uint8_t*>(m);
  bytes->size = len;
  Trailer t{};
  std::memcpy(t.magic, kMagic, sizeof kMagic);
  t.object = id.object;
  t.index = id.index;
  t.length = len;
  t.checksum = in_order && hashed == len ? XXH3_64bits_digest(&hash) : Checksum(bytes->data, len, id);
  if (const int e = write_all(reinterpret_cast<const uint8_t*>(&t), sizeof t, len); e != 0) {
    out.err = e;
  } else if (::close(fd.Release()) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    out.err = errno;
  }
  if (out.err != 0) ::unlink(tmp.c_str());
  // Served from the mapping even when the file could not be kept.
  out.bytes = std::move(bytes);
  return out;
}

bool BlockCache::Contains(const BlockId& id) const {
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.disk_bytes > 0 && !it->second.filling;
}

bool BlockCache::SetNextUse(const BlockId& id, int64_t step) {
  MutexLock lock(mu_);
  if (step <= passed_) {
    auto it = entries_.find(id);
    return it != entries_.end() && it->second.disk_bytes > 0 && !it->second.filling;
  }
  // A block not there yet gets a placeholder with the step: its uses are
  // known the moment it is stored, whoever fetches it.
  Entry& e = entries_[id];
  AddUse(e, step);
  return e.disk_bytes > 0 && !e.filling;
}

int64_t BlockCache::NeededAt(const BlockId& id, int64_t next_use) {
  // The block is needed as soon as its earliest known use: another step's
  // (the fetch-ahead noted it, or a read waits for it) may come first.
  auto it = entries_.find(id);
  const int64_t earliest = it == entries_.end() ? -1 : NextUse(it->second);
  return earliest >= 0 && (next_use < 0 || earliest < next_use) ? earliest : next_use;
}

int64_t BlockCache::NextUse(Entry& e) const {
  size_t passed = 0;
  while (passed < e.uses.size() && e.uses[passed] <= passed_) ++passed;
  if (passed > 0) e.uses.erase(e.uses.begin(), e.uses.begin() + static_cast<ptrdiff_t>(passed));
  return e.uses.empty() ? -1 : e.uses.front();
}

void BlockCache::AddUse(Entry& e, int64_t step) const {
  if (step <= passed_) return;
  auto at = std::lower_bound(e.uses.begin(), e.uses.end(), step);
  if (at != e.uses.end() && *at == step) return;
  e.uses.insert(at, step);
  if (e.uses.size() > kMaxUses) e.uses.pop_back();
}

void BlockCache::SetPassed(int64_t step) {
  {
    MutexLock lock(mu_);
    if (step <= passed_) return;
    passed_ = step;
  }
  room_changed_.NotifyAll();
}

uint64_t BlockCache::resident_bytes() const {
  MutexLock lock(mu_);
  return used_;
}

uint64_t BlockCache::resident_blocks() const {
  MutexLock lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, e] : entries_) n += e.disk_bytes > 0 ? 1 : 0;
  return n;
}

}  // namespace meshload::sidecar::cache
