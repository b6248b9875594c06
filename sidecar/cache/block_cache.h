/// \file
/// BlockCache: the node-local cache of a remote dataset's blocks.
///
/// A block is a byte range of one object (sidecar/cache/block_geometry.h):
/// a whole object up to a size, else an aligned range. The cache keeps
/// blocks as files in a directory (an emptyDir by default; a node's hostPath
/// shared by the sidecars of several jobs when the chart enables it), reads
/// them through a read-only mapping (what the page cache holds is the memory
/// tier: a block read twice is a memory copy), and bounds their bytes:
///
///   DIR/meshload-blocks-v1/HH/OOOOOOOOOOOOOOOO-III   the block's bytes, then
///                                                     a 48-byte trailer
///
/// with O the object's key (ObjectKey: its URI, size and version, so a
/// changed object never matches an old block), I the block's index in hex,
/// HH the key's first two hex digits. The trailer holds a magic, the
/// object key, the index, the length, and the XXH3-64 of everything before
/// it. A block is written to a temporary name and renamed (atomic); a
/// block that this process has not verified since it opened the file is
/// checked before it is served, and a corrupt or truncated one is removed
/// and fetched again, never served. The directory is the index: a
/// restarted sidecar (or another job's) finds the blocks there.
///
/// Eviction, when a new block would pass the capacity: first the blocks no
/// known step needs (another job's, or whose use has passed), least
/// recently used first; then this job's, the one needed furthest in the
/// future first (SetNextUse; the fetch-ahead knows the schedule). A block
/// being read stays mapped until its reader lets go, even when evicted.
///
/// Two fillers of one block, threads of one process or processes sharing a
/// directory, fetch it once: a thread waits for the other's fill; a process
/// takes a lock on DIR/.../NAME.fill (flock) and looks again before it
/// fetches. When the disk refuses a block (ENOSPC, EDQUOT, EFBIG, EIO),
/// the block is served from memory to the read that fetched it, the error
/// is counted and logged once, and storing() is false for a while: readers
/// then go to the source directly (sidecar/cache/cached_source.h).
///
/// A directory of an older format (meshload-blocks-vN, N < 1) is removed
/// when the cache opens; a newer one is left alone and logged.
///
/// Thread safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::cache {

/// The key of one version of an object: blocks of a key are that object's
/// bytes at that size and version (an ETag, or "" when the source has
/// none), nothing else.
uint64_t ObjectKey(std::string_view uri, uint64_t size, std::string_view version);
/// A key of an object's block layout (its blocks' starts), mixed into its
/// ObjectKey's version: blocks of another layout never match.
uint64_t LayoutKey(const std::vector<uint64_t>& starts);

struct BlockId {
  uint64_t object = 0;  // ObjectKey
  uint64_t index = 0;   // the block's number in its object
  bool operator==(const BlockId& o) const { return object == o.object && index == o.index; }
};
struct BlockIdHash {
  size_t operator()(const BlockId& b) const noexcept;
};

/// What the cache did, counted since it opened. Read from any thread.
struct BlockCacheCounters {
  std::atomic<uint64_t> hits{0};           // a read found its block resident
  std::atomic<uint64_t> misses{0};         // a read waited for its block (fetched, or filled by another)
  std::atomic<uint64_t> fetched_bytes{0};  // block bytes fetched from the source
  std::atomic<uint64_t> fetches{0};        // blocks fetched
  std::atomic<uint64_t> evicted_bytes{0};  // block bytes removed to make room
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> corrupt_blocks{0};  // blocks found corrupt or truncated on disk (fetched again)
  std::atomic<uint64_t> write_errors{0};    // blocks the disk refused (served from memory once)
  // Blocks served from files this process did not write (another sidecar
  // sharing the directory, or this pod before a restart), verified first.
  std::atomic<uint64_t> found_on_disk{0};
  // When the first fetch began and the latest one ended (steady clock, ns;
  // 0: none yet): fetched_bytes over their difference is the fetch rate of
  // a burst of fills.
  std::atomic<int64_t> first_fetch_ns{0};
  std::atomic<int64_t> last_fetch_ns{0};
};

struct BlockCacheOptions {
  /// The directory (created if missing; a subdirectory of the format's
  /// name holds the blocks).
  std::string dir;
  /// The blocks on disk, this process's and those it finds, at most this
  /// many bytes (trailers included).
  uint64_t capacity_bytes = 16ull << 30;
  /// After the disk refused a block, storing() is false for this long.
  std::chrono::milliseconds store_retry_after{30000};
  /// Blocks written by others (a shared directory) are looked for this often.
  std::chrono::milliseconds rescan_every{30000};
  Clock* clock = nullptr;  // Clock::Real() when null
};

class BlockCache {
 public:
  /// Opens (or makes) the cache in options.dir: reads what is there
  /// (nothing is verified until it is used), removes the directories of an
  /// older format and the temporary files of fills that died, and evicts
  /// down to the capacity. kInvalidArgument naming the directory when it
  /// cannot be made or written.
  static Result<std::unique_ptr<BlockCache>> Open(BlockCacheOptions options);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  /// A block's bytes, valid while the Block (or a copy) lives: mapped from
  /// its file, or held in memory when the disk refused it.
  class Block {
   public:
    Block() = default;
    const uint8_t* data() const;
    uint64_t size() const;
    explicit operator bool() const { return bytes_ != nullptr; }

   private:
    friend class BlockCache;
    struct Bytes;
    explicit Block(std::shared_ptr<const Bytes> b) : bytes_(std::move(b)) {}
    std::shared_ptr<const Bytes> bytes_;
  };

  /// Takes `n` bytes of a block at position `at`.
  using Sink = source::Source::Sink;
  /// Fetches the `len` bytes of a block and hands them to `sink` in pieces
  /// (source::Source::ReadTo); errors name the object and offset (the
  /// source's), a sink's error is returned as is.
  using Fetch = std::function<Status(uint64_t len, const Sink& sink)>;
  /// Who asks: a read (counted as a hit or a miss) or the fetch-ahead.
  /// kReadOrNone is a read that, when its block cannot be stored, gets an
  /// empty Block without a fetch: the reader then asks the source for the
  /// bytes it needs, not for the whole block.
  enum class Want { kRead, kReadOrNone, kAhead };

  /// Block `id` of `len` bytes, verified: resident, or found on disk, or
  /// fetched by `fetch` (once however many ask at once) and stored. When it
  /// cannot be stored (no room for a block needed this late, or a disk
  /// that refuses blocks), kRead gets it from memory, and kReadOrNone and
  /// kAhead get an empty Block without fetching it.
  /// `next_use`: the step that needs it (for eviction), -1 unknown.
  /// `fetched`, when given, is set to whether this call fetched it.
  /// `fetch_bytes`: what `fetch` reads from the source, counted as fetched
  /// (a compressed file's stored bytes); 0: `len`.
  Result<Block> Get(const BlockId& id, uint64_t len, const Fetch& fetch, int64_t next_use, Want want,
                    bool* fetched = nullptr, uint64_t fetch_bytes = 0) MESHLOAD_EXCLUDES(mu_);

  /// Block `id` when it is resident and verified by this process, without
  /// counting a read (prefetch hints); nullopt otherwise.
  std::optional<Block> Peek(const BlockId& id) const MESHLOAD_EXCLUDES(mu_);

  /// Whether block `id` is resident (in the index, verified or not).
  bool Contains(const BlockId& id) const MESHLOAD_EXCLUDES(mu_);
  /// Notes that step `step` reads block `id` (resident, or being filled).
  /// Returns whether it is resident.
  bool SetNextUse(const BlockId& id, int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// The steps up to `step` are done: a use at or before it is no longer a
  /// reason to keep a block.
  void SetPassed(int64_t step) MESHLOAD_EXCLUDES(mu_);

  /// False while the disk refuses blocks (see the file comment).
  bool storing() const MESHLOAD_EXCLUDES(mu_);
  /// Bytes of the blocks in the index (on disk), trailers included.
  uint64_t resident_bytes() const MESHLOAD_EXCLUDES(mu_);
  uint64_t resident_blocks() const MESHLOAD_EXCLUDES(mu_);
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  /// The directory holding the blocks (DIR/meshload-blocks-v1).
  const std::string& root() const { return root_; }
  const BlockCacheCounters& counters() const { return counters_; }

  /// The file of block `id` (for tests and tools).
  std::string PathOf(const BlockId& id) const;
  /// The trailer's size: a block of `len` bytes takes len + kTrailerBytes on disk.
  static constexpr uint64_t kTrailerBytes = 48;

 private:
  // An entry with no bytes on disk and no filler is a placeholder: the
  // steps that will read a block not fetched yet (SetNextUse).
  struct Entry {
    uint64_t disk_bytes = 0;                  // file size, trailer included
    std::shared_ptr<const Block::Bytes> map;  // verified and mapped (null: on disk, not verified here)
    bool filling = false;                     // a thread of this process is filling or verifying it
    // The steps known to read it (ascending; those passed are dropped as
    // they are met): its next use is the first; none, no known step.
    std::vector<int64_t> uses;
    // The order of last uses (least recently used first): this process's
    // uses count up from 1; a file found on disk has its age in seconds,
    // negated (older first, before any use here).
    int64_t last_use = 0;
  };

  explicit BlockCache(BlockCacheOptions options);
  Status Init();
  // Adds the block files under root_ that the index lacks, drops entries
  // whose files are gone (another process evicted them).
  void Rescan() MESHLOAD_EXCLUDES(mu_);
  // Maps and verifies the file of `id`; kDataLoss when it is corrupt or
  // truncated, kNotFound when it is gone.
  Result<std::shared_ptr<const Block::Bytes>> MapVerified(const BlockId& id, uint64_t len) const;
  // Fetches block `id` into a new file (the disk's room taken first, the
  // bytes written as they arrive, the trailer after them, then mapped and
  // renamed into place). `err`: the disk's errno, 0 when it kept the
  // block; `status`: the fetch's (OK when the disk stopped it); `bytes`:
  // the mapped block when it was kept; `received`: the bytes that arrived.
  struct Filled {
    int err = 0;
    Status status;
    bool fetched = false;
    uint64_t received = 0;
    std::shared_ptr<const Block::Bytes> bytes;
  };
  Filled FillFile(const BlockId& id, uint64_t len, const Fetch& fetch) const;
  // `fetch`, with the fetch span counters kept.
  Status TimedFetch(const Fetch& fetch, uint64_t len, const Sink& sink) const;
  // Removes blocks until `bytes` more fit, for a block that step
  // `next_use` needs (-1: none known): the blocks no known step needs first
  // (least recently used first), then those needed furthest ahead, never
  // one needed before `next_use`. False when that leaves too little room.
  bool MakeRoom(uint64_t bytes, int64_t next_use) MESHLOAD_REQUIRES(mu_);
  void Remove(const BlockId& id, bool evicted) MESHLOAD_REQUIRES(mu_);
  // The first step after the passed ones that reads `e` (-1: none known),
  // dropping the passed ones.
  int64_t NextUse(Entry& e) const MESHLOAD_REQUIRES(mu_);
  // The earliest step that needs block `id`: its earliest noted use, or
  // `next_use` when that comes first (or none is noted).
  int64_t NeededAt(const BlockId& id, int64_t next_use) MESHLOAD_REQUIRES(mu_);
  // Notes that step `step` reads `e` (at most kMaxUses are kept, the
  // nearest).
  void AddUse(Entry& e, int64_t step) const MESHLOAD_REQUIRES(mu_);
  static constexpr size_t kMaxUses = 64;
  void DiskRefused(int err, const BlockId& id) MESHLOAD_EXCLUDES(mu_);
  int64_t NowNs() const;

  const BlockCacheOptions options_;
  std::string root_;
  Clock* clock_;
  mutable BlockCacheCounters counters_;

  mutable Mutex mu_;
  CondVar filled_;        // an entry's `filling` went false
  CondVar room_changed_;  // passed_ grew, or a step asked for a block being filled
  // The longest a read waits for earlier steps to pass and leave it room.
  static constexpr std::chrono::milliseconds kRoomWait{2000};
  std::unordered_map<BlockId, Entry, BlockIdHash> entries_ MESHLOAD_GUARDED_BY(mu_);
  uint64_t used_ MESHLOAD_GUARDED_BY(mu_) = 0;  // Σ disk_bytes of entries_
  int64_t passed_ MESHLOAD_GUARDED_BY(mu_) = -1;
  int64_t uses_ MESHLOAD_GUARDED_BY(mu_) = 0;  // last_use's counter
  int64_t refused_until_ns_ MESHLOAD_GUARDED_BY(mu_) = 0;
  bool refusal_logged_ MESHLOAD_GUARDED_BY(mu_) = false;
  int64_t next_rescan_ns_ MESHLOAD_GUARDED_BY(mu_) = 0;
};

}  // namespace meshload::sidecar::cache
