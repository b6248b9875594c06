// The block cache of remote datasets (sidecar/cache/): blocks stored,
// verified and found again after a restart; corrupt and truncated blocks
// fetched again, never served; eviction by next use, then least recent use;
// one fetch for concurrent fillers, threads or processes; a full disk
// (a real tmpfs) served from memory and the reads sent to the source; other
// formats' directories; reads through the cache equal to the source's; the
// fetch-ahead filling what the schedule reads, within its lookahead; and the
// step loader reading every byte of a job through it, the second epoch
// without a single fetch.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "formats/mds.h"
#include "planner/fetch_plan.h"
#include "sidecar/cache/block_cache.h"
#include "sidecar/cache/cached_source.h"
#include "sidecar/cache/fetch_ahead.h"
#include "sidecar/source/dataset_facts.h"
#include "sidecar/source/decoded_source.h"
#include "sidecar/step_loader.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "tools/synthetic_dataset.h"

namespace meshload::sidecar::cache {
namespace {

using meshload::testing::TempDir;
using ::testing::HasSubstr;

std::vector<uint8_t> Pattern(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

// A fetch that hands `bytes` to the cache in pieces of `piece` bytes and
// counts its calls; with `again`, it hands the first half a second time
// after the whole (what a retried request of a streaming source may do).
struct CountingFetch {
  std::vector<uint8_t> bytes;
  std::atomic<int> calls{0};
  std::chrono::milliseconds delay{0};
  size_t piece = 7001;
  bool again = false;
  BlockCache::Fetch Get() {
    return [this](uint64_t len, const BlockCache::Sink& sink) -> Status {
      calls += 1;
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      if (len != bytes.size()) return Internal("wrong length");
      auto hand = [&](uint64_t from, uint64_t to) -> Status {
        for (uint64_t at = from; at < to; at += piece) {
          MESHLOAD_RETURN_IF_ERROR(sink(at, bytes.data() + at, std::min<uint64_t>(piece, to - at)));
        }
        return Status::Ok();
      };
      MESHLOAD_RETURN_IF_ERROR(hand(0, len));
      return again ? hand(0, len / 2) : Status::Ok();
    };
  }
};

std::unique_ptr<BlockCache> MustOpen(const std::string& dir, uint64_t capacity) {
  BlockCacheOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  auto c = BlockCache::Open(o);
  EXPECT_OK(c);
  return std::move(*c);
}

std::vector<uint8_t> BytesOf(const BlockCache::Block& b) { return {b.data(), b.data() + b.size()}; }

TEST(BlockCache, StoresABlockOnceAndFindsItAgainAfterARestart) {
  TempDir dir;
  CountingFetch f;
  f.bytes = Pattern(100000, 1);
  const BlockId id{ObjectKey("s3://b/k", 1 << 20, "\"etag\""), 3};
  {
    auto cache = MustOpen(dir.path(), 1 << 20);
    bool fetched = false;
    auto b = cache->Get(id, f.bytes.size(), f.Get(), 5, BlockCache::Want::kRead, &fetched);
    ASSERT_OK(b);
    EXPECT_TRUE(fetched);
    EXPECT_EQ(BytesOf(*b), f.bytes);
    auto again = cache->Get(id, f.bytes.size(), f.Get(), 5, BlockCache::Want::kRead, &fetched);
    ASSERT_OK(again);
    EXPECT_FALSE(fetched);
    EXPECT_EQ(f.calls.load(), 1);
    EXPECT_EQ(cache->counters().hits.load(), 1u);
    EXPECT_EQ(cache->counters().misses.load(), 1u);
    EXPECT_EQ(cache->counters().fetched_bytes.load(), f.bytes.size());
    EXPECT_EQ(cache->resident_bytes(), f.bytes.size() + BlockCache::kTrailerBytes);
    EXPECT_TRUE(std::filesystem::exists(cache->PathOf(id)));
  }
  // A restarted sidecar: the directory is the index.
  auto cache = MustOpen(dir.path(), 1 << 20);
  EXPECT_EQ(cache->resident_blocks(), 1u);
  EXPECT_TRUE(cache->Contains(id));
  auto b = cache->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
  ASSERT_OK(b);
  EXPECT_EQ(BytesOf(*b), f.bytes);
  EXPECT_EQ(f.calls.load(), 1) << "found on disk, not fetched";
  EXPECT_EQ(cache->counters().hits.load(), 1u);
}

TEST(BlockCache, ABlockHandedInPiecesAndPartlyAgainIsStoredWholeAndVerified) {
  TempDir dir;
  CountingFetch f;
  f.bytes = Pattern(300000, 4);
  f.piece = 65536;
  f.again = true;  // a retried request's bytes, handed a second time
  const BlockId id{ObjectKey("s3://b/k", 300000, ""), 0};
  {
    auto cache = MustOpen(dir.path(), 1 << 20);
    auto b = cache->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
    ASSERT_OK(b);
    EXPECT_EQ(BytesOf(*b), f.bytes);
  }
  // Another process verifies the file (its trailer's checksum) before it serves it.
  auto cache = MustOpen(dir.path(), 1 << 20);
  auto b = cache->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
  ASSERT_OK(b);
  EXPECT_EQ(BytesOf(*b), f.bytes);
  EXPECT_EQ(f.calls.load(), 1);
  EXPECT_EQ(cache->counters().found_on_disk.load(), 1u);
  EXPECT_EQ(cache->counters().corrupt_blocks.load(), 0u);
}

TEST(BlockCache, AFetchHandingBytesPastItsBlockFailsAndStoresNothing) {
  TempDir dir;
  auto cache = MustOpen(dir.path(), 1 << 20);
  const BlockId id{ObjectKey("s3://b/k", 1000, ""), 0};
  const std::vector<uint8_t> bytes(2000, 7);
  auto b = cache->Get(
      id, 1000, [&](uint64_t, const BlockCache::Sink& sink) { return sink(500, bytes.data(), 600); }, 0,
      BlockCache::Want::kRead);
  EXPECT_THAT(b.status(), meshload::testing::StatusIs(StatusCode::kInternal, HasSubstr("bytes 500..1100")));
  EXPECT_FALSE(cache->Contains(id));
  EXPECT_EQ(cache->resident_bytes(), 0u);
}

TEST(BlockCache, AChangedObjectNeverMatchesItsOldBlocks) {
  EXPECT_NE(ObjectKey("s3://b/k", 100, "\"a\""), ObjectKey("s3://b/k", 100, "\"b\""));
  EXPECT_NE(ObjectKey("s3://b/k", 100, ""), ObjectKey("s3://b/k", 101, ""));
  EXPECT_NE(ObjectKey("s3://b/k1", 100, ""), ObjectKey("s3://b/k", 1100, ""));
  EXPECT_EQ(ObjectKey("s3://b/k", 100, "\"a\""), ObjectKey("s3://b/k", 100, "\"a\""));
}

// Damages the block file of `id` with `damage` between two runs of a cache
// and checks that the next one fetches it again and serves the fetched bytes.
void ExpectRefetchedAfter(const std::function<void(const std::string&)>& damage, const char* what) {
  TempDir dir;
  CountingFetch f;
  f.bytes = Pattern(50000, 2);
  const BlockId id{ObjectKey("s3://b/k", 50000, ""), 0};
  std::string path;
  {
    auto cache = MustOpen(dir.path(), 1 << 20);
    ASSERT_OK(cache->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead));
    path = cache->PathOf(id);
  }
  damage(path);
  auto cache = MustOpen(dir.path(), 1 << 20);
  auto b = cache->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
  ASSERT_OK(b);
  EXPECT_EQ(BytesOf(*b), f.bytes) << what;
  EXPECT_EQ(f.calls.load(), 2) << what << ": fetched again";
  EXPECT_EQ(cache->counters().corrupt_blocks.load(), 1u) << what;
  // The block on disk is whole again.
  auto fresh = MustOpen(dir.path(), 1 << 20);
  ASSERT_OK(fresh->Get(id, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead));
  EXPECT_EQ(f.calls.load(), 2) << what;
  EXPECT_EQ(fresh->counters().corrupt_blocks.load(), 0u) << what;
}

TEST(BlockCache, ACorruptBlockIsFetchedAgainNeverServed) {
  ExpectRefetchedAfter(
      [](const std::string& path) {
        std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(1234);
        char c = 0;
        io.read(&c, 1);
        io.seekp(1234);
        c = static_cast<char>(c ^ 0x40);
        io.write(&c, 1);
      },
      "a flipped bit");
  ExpectRefetchedAfter([](const std::string& path) { ASSERT_EQ(::truncate(path.c_str(), 20000), 0); },
                       "a truncated block");
  ExpectRefetchedAfter(
      [](const std::string& path) {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << "not a block";
      },
      "another file under the block's name");
}

TEST(BlockCache, EvictsBlocksNoStepNeedsFirstThenTheOneNeededFurthestAhead) {
  TempDir dir;
  const uint64_t len = 10000, disk = len + BlockCache::kTrailerBytes;
  auto cache = MustOpen(dir.path(), 4 * disk);
  CountingFetch f;
  f.bytes = Pattern(len, 3);
  auto id = [](uint64_t i) { return BlockId{42, i}; };
  // Next uses: 0 at step 10, 1 at 30, 2 at 20, 3 at 12; then 4 for step 15
  // evicts block 1 (step 30, furthest ahead).
  const int64_t uses[] = {10, 30, 20, 12};
  for (uint64_t i = 0; i < 4; ++i) ASSERT_OK(cache->Get(id(i), len, f.Get(), uses[i], BlockCache::Want::kAhead));
  ASSERT_OK(cache->Get(id(4), len, f.Get(), 15, BlockCache::Want::kAhead));
  EXPECT_FALSE(cache->Contains(id(1)));
  EXPECT_TRUE(cache->Contains(id(0)) && cache->Contains(id(2)) && cache->Contains(id(3)) && cache->Contains(id(4)));
  EXPECT_EQ(cache->counters().evicted_bytes.load(), len);
  // Steps up to 12 are done: blocks 0 and 3 are needed by no known step,
  // and go first, the least recently used first (0).
  cache->SetPassed(12);
  ASSERT_OK(cache->Get(id(5), len, f.Get(), 40, BlockCache::Want::kAhead));
  EXPECT_FALSE(cache->Contains(id(0)));
  EXPECT_TRUE(cache->Contains(id(3)));
  // A block needed later than every resident one is not stored at all:
  // ahead of need it is not even fetched (block 7, step 50; the furthest
  // resident, 40), and a read gets it from memory.
  ASSERT_OK(cache->Get(id(6), len, f.Get(), 13, BlockCache::Want::kAhead));  // evicts 3 (no known use)
  EXPECT_FALSE(cache->Contains(id(3)));
  const int calls = f.calls.load();
  auto late = cache->Get(id(7), len, f.Get(), 50, BlockCache::Want::kAhead);
  ASSERT_OK(late);
  EXPECT_FALSE(*late);
  EXPECT_EQ(f.calls.load(), calls) << "not fetched";
  auto read = cache->Get(id(7), len, f.Get(), 50, BlockCache::Want::kRead);
  ASSERT_OK(read);
  EXPECT_EQ(BytesOf(*read), f.bytes);
  EXPECT_FALSE(cache->Contains(id(7)));
  EXPECT_LE(cache->resident_bytes(), 4 * disk);
}

// A read for step t whose room is held by blocks an earlier step still
// needs (a step being read by another thread) waits for that step to pass
// and then stores its block, rather than fetching it unstored (and again
// for every later read of it).
TEST(BlockCache, AReadWaitsForEarlierStepsToPassAndStoresItsBlock) {
  TempDir dir;
  const uint64_t len = 10000, disk = len + BlockCache::kTrailerBytes;
  auto cache = MustOpen(dir.path(), 2 * disk);
  CountingFetch f;
  f.bytes = Pattern(len, 5);
  auto id = [](uint64_t i) { return BlockId{43, i}; };
  cache->SetPassed(9);
  ASSERT_OK(cache->Get(id(0), len, f.Get(), 10, BlockCache::Want::kAhead));
  ASSERT_OK(cache->Get(id(1), len, f.Get(), 10, BlockCache::Want::kAhead));
  std::thread last_of_window([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cache->SetPassed(10);  // step 10's reads are done
  });
  auto read = cache->Get(id(2), len, f.Get(), 11, BlockCache::Want::kRead);
  last_of_window.join();
  ASSERT_OK(read);
  EXPECT_EQ(BytesOf(*read), f.bytes);
  EXPECT_TRUE(cache->Contains(id(2))) << "stored once step 10 passed";
  EXPECT_EQ(f.calls.load(), 3);
  auto again = cache->Get(id(2), len, f.Get(), 12, BlockCache::Want::kRead);
  ASSERT_OK(again);
  EXPECT_EQ(f.calls.load(), 3) << "not fetched again";
}

// The read that waits for room for step 12 learns that step 11, still
// being read, asks for the same block: the block is needed as soon as the
// blocks in its way, so neither waits for step 11 to pass (which could not
// happen while step 11 waits for this block). The blocks in its way are
// step 11's too, so they stay: both reads get no block (and read their own
// bytes from the source), and nothing is fetched. (Evicting one of them
// would fetch it again if step 11 had not read it yet.)
TEST(BlockCache, AReadWaitingForRoomStopsWaitingWhenAnEarlierStepAsksForItsBlock) {
  TempDir dir;
  const uint64_t len = 10000;
  auto cache = MustOpen(dir.path(), 2 * (len + BlockCache::kTrailerBytes));
  CountingFetch f;
  f.bytes = Pattern(len, 6);
  auto id = [](uint64_t i) { return BlockId{44, i}; };
  cache->SetPassed(10);
  ASSERT_OK(cache->Get(id(0), len, f.Get(), 11, BlockCache::Want::kAhead));
  ASSERT_OK(cache->Get(id(1), len, f.Get(), 11, BlockCache::Want::kAhead));
  const auto t0 = std::chrono::steady_clock::now();
  Result<BlockCache::Block> later = BlockCache::Block();
  std::thread reader([&] { later = cache->Get(id(2), len, f.Get(), 12, BlockCache::Want::kReadOrNone); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto earlier = cache->Get(id(2), len, f.Get(), 11, BlockCache::Want::kReadOrNone);
  reader.join();
  ASSERT_OK(earlier);
  ASSERT_OK(later.status());
  EXPECT_FALSE(*earlier);
  EXPECT_FALSE(*later);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500)) << "it waited for its 2 s";
  EXPECT_TRUE(cache->Contains(id(0)));
  EXPECT_TRUE(cache->Contains(id(1)));
  EXPECT_FALSE(cache->Contains(id(2)));
  EXPECT_EQ(f.calls.load(), 2) << "block 2 not fetched";
}

TEST(BlockCache, BlocksFoundOnDiskAreEvictedLeastRecentlyUsedFirst) {
  TempDir dir;
  const uint64_t len = 10000, disk = len + BlockCache::kTrailerBytes;
  CountingFetch f;
  f.bytes = Pattern(len, 4);
  std::vector<std::string> paths;
  {
    auto other_job = MustOpen(dir.path(), 10 * disk);
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_OK(other_job->Get({7, i}, len, f.Get(), -1, BlockCache::Want::kAhead));
      paths.push_back(other_job->PathOf({7, i}));
    }
  }
  // Ages: block 1 oldest, then 0, then 2.
  const int64_t now = ::time(nullptr);
  const int64_t ages[] = {200, 300, 100};
  for (size_t i = 0; i < 3; ++i) {
    timespec t[2] = {{now - ages[i], 0}, {now - ages[i], 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, paths[i].c_str(), t, 0), 0);
  }
  auto cache = MustOpen(dir.path(), 4 * disk);
  EXPECT_EQ(cache->resident_blocks(), 3u);
  ASSERT_OK(cache->Get({8, 0}, len, f.Get(), 5, BlockCache::Want::kAhead));
  ASSERT_OK(cache->Get({8, 1}, len, f.Get(), 6, BlockCache::Want::kAhead));
  EXPECT_FALSE(cache->Contains({7, 1})) << "the oldest is evicted first";
  EXPECT_TRUE(cache->Contains({7, 0}));
  ASSERT_OK(cache->Get({8, 2}, len, f.Get(), 7, BlockCache::Want::kAhead));
  EXPECT_FALSE(cache->Contains({7, 0}));
  EXPECT_TRUE(cache->Contains({7, 2}));
  EXPECT_TRUE(cache->Contains({8, 0}) && cache->Contains({8, 1}) && cache->Contains({8, 2}));
}

TEST(BlockCache, ThreadsAskingForOneBlockAtOnceFetchItOnce) {
  TempDir dir;
  auto cache = MustOpen(dir.path(), 1 << 20);
  CountingFetch f;
  f.bytes = Pattern(30000, 5);
  f.delay = std::chrono::milliseconds(50);
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto b = cache->Get({1, 1}, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
      if (b.ok() && BytesOf(*b) == f.bytes) good += 1;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 8);
  EXPECT_EQ(f.calls.load(), 1);
  EXPECT_EQ(cache->counters().hits.load() + cache->counters().misses.load(), 8u);
}

TEST(BlockCache, TwoProcessesFillingOneBlockOfASharedDirectoryFetchItOnce) {
  TempDir dir;
  const std::string count_file = dir.path() + "/fetches";
  const std::vector<uint8_t> bytes = Pattern(200000, 6);
  // Each process: its own cache on the shared directory, a slow fetch that
  // appends a byte to `count_file`.
  auto fill = [&]() -> bool {
    BlockCacheOptions o;
    o.dir = dir.path() + "/cache";
    o.capacity_bytes = 1 << 20;
    auto cache = BlockCache::Open(o);
    if (!cache.ok()) return false;
    auto b = (*cache)->Get(
        {9, 9}, bytes.size(),
        [&](uint64_t len, const BlockCache::Sink& sink) {
          int fd = ::open(count_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
          if (::write(fd, "x", 1) != 1) return Internal("write");
          ::close(fd);
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          return sink(0, bytes.data(), len);
        },
        0, BlockCache::Want::kRead);
    return b.ok() && std::memcmp(b->data(), bytes.data(), bytes.size()) == 0;
  };
  const pid_t child = ::fork();
  if (child == 0) ::_exit(fill() ? 0 : 1);
  const bool mine = fill();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(mine);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other process's bytes";
  EXPECT_EQ(std::filesystem::file_size(count_file), 1u) << "one fetch between the two processes";
}

// Runs `body` in a child process with a tmpfs of `bytes` mounted at `dir`
// (its own mount namespace; a user namespace when not root). Returns the
// child's exit code, or -1 (with `why`) when such a mount is not possible here.
int InSmallFilesystem(const std::string& dir, uint64_t bytes, const std::function<int()>& body, std::string* why) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    auto fail = [&](const char* what) {
      std::string msg = std::string(what) + ": " + std::strerror(errno);
      if (::write(pipe_fds[1], msg.data(), msg.size()) < 0) {
      }
      ::_exit(77);
    };
    if (uid != 0) {
      if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("unshare(user, mount)");
      auto write_file = [](const char* path, const std::string& text) {
        int fd = ::open(path, O_WRONLY);
        bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        if (fd >= 0) ::close(fd);
        return ok;
      };
      write_file("/proc/self/setgroups", "deny");
      if (!write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
          !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
        fail("uid_map");
      }
    } else if (::unshare(CLONE_NEWNS) != 0) {
      fail("unshare(mount)");
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("make / private");
    const std::string opts = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) fail("mount tmpfs");
    ::_exit(body());
  }
  ::close(pipe_fds[1]);
  char buf[256] = {};
  const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf - 1);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status)) return 99;
  if (WEXITSTATUS(status) == 77) {
    *why = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    return -1;
  }
  return WEXITSTATUS(status);
}

TEST(BlockCache, AFullDiskServesTheBlockFromMemoryAndSendsReadsToTheSource) {
  TempDir dir;
  const std::string mnt = dir.path() + "/small";
  std::filesystem::create_directories(mnt);
  std::string why;
  // A 256 KiB file system under a cache that believes it has 8 MiB: the
  // third 100 KB block does not fit.
  const int rc = InSmallFilesystem(
      mnt, 256 << 10,
      [&]() -> int {
        BlockCacheOptions o;
        o.dir = mnt;
        o.capacity_bytes = 8 << 20;
        auto cache = BlockCache::Open(o);
        if (!cache.ok()) return 10;
        CountingFetch f;
        f.bytes = Pattern(100000, 7);
        for (uint64_t i = 0; i < 3; ++i) {
          auto b = (*cache)->Get({5, i}, f.bytes.size(), f.Get(), 0, BlockCache::Want::kRead);
          if (!b.ok()) return 11;
          if (BytesOf(*b) != f.bytes) return 12;
        }
        if ((*cache)->counters().write_errors.load() != 1) return 13;
        if ((*cache)->storing()) return 14;
        if ((*cache)->Contains({5, 2})) return 15;
        // The disk refusing, a CachedSource reads from its source directly.
        TempDir remote_dir;
        const std::string path = remote_dir.Write("obj", std::string(300000, 'q'));
        auto files = source::MakeFileSource(source::SourceOptions{});
        if (!files.ok()) return 16;
        CachedSource cached(**files, **cache, planner::BlockGeometry{65536, 0});
        cached.AddObject(path, 300000, "");
        std::vector<uint8_t> out(1000);
        if (!cached.Read(path, 5000, out.data(), out.size()).ok()) return 17;
        if (out != std::vector<uint8_t>(1000, 'q')) return 18;
        if (cached.counters().direct_bytes.load() != 1000) return 19;
        if (!cached.LatencyBound()) return 20;
        return 0;
      },
      &why);
  if (rc == -1)
    GTEST_SKIP() << "no small file system can be mounted here (" << why << "): the full-disk path is not tested";
  EXPECT_EQ(rc, 0) << "the child's check that failed (see the test's return codes)";
}

TEST(BlockCache, AnOlderFormatsDirectoryIsRemovedANewerOneLeftAlone) {
  TempDir dir;
  dir.Write("meshload-blocks-v0/ab/x", "old");
  dir.Write("meshload-blocks-v2/ab/y", "new");
  dir.Write("unrelated/z", "kept");
  auto cache = MustOpen(dir.path(), 1 << 20);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/meshload-blocks-v0"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/meshload-blocks-v2/ab/y"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/unrelated/z"));
  EXPECT_EQ(cache->root(), dir.path() + "/meshload-blocks-v1");
  EXPECT_EQ(cache->resident_blocks(), 0u);
}

TEST(BlockCache, LeftoversOfAFillThatDiedAreRemovedOnceStale) {
  TempDir dir;
  { MustOpen(dir.path(), 1 << 20); }
  const std::string root = dir.path() + "/meshload-blocks-v1/ab/";
  const std::string stale = dir.Write("meshload-blocks-v1/ab/00000000000000ab-1.tmp.123.0", "partial");
  const std::string lock = dir.Write("meshload-blocks-v1/ab/00000000000000ab-1.fill", "");
  const std::string fresh = dir.Write("meshload-blocks-v1/ab/00000000000000ab-2.tmp.124.0", "being written");
  const int64_t old = ::time(nullptr) - 3600;
  timespec t[2] = {{old, 0}, {old, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, stale.c_str(), t, 0), 0);
  ASSERT_EQ(::utimensat(AT_FDCWD, lock.c_str(), t, 0), 0);
  auto cache = MustOpen(dir.path(), 1 << 20);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(lock));
  EXPECT_TRUE(std::filesystem::exists(fresh)) << "another process may still be writing it";
  EXPECT_EQ(cache->resident_blocks(), 0u);
}

TEST(BlockCache, RefusesADirectoryItCannotMake) {
  TempDir dir;
  const std::string file = dir.Write("a-file", "x");
  BlockCacheOptions o;
  o.dir = file + "/cache";  // under a file: no directory can be made there, root or not
  auto c = BlockCache::Open(o);
  EXPECT_THAT(c.status(),
              meshload::testing::StatusIs(StatusCode::kInvalidArgument, HasSubstr("cannot make the cache directory")));
  EXPECT_THAT(c.status().ToString(), HasSubstr(file));
}

// The real file source, counting the reads that reach it: the "remote"
// behind a CachedSource in these tests (the S3 source against versitygw is
// tests/s3/s3_run_test.sh's).
class CountingSource final : public source::Source {
 public:
  explicit CountingSource(source::Source& inner) : inner_(inner) {}
  Result<source::ObjectInfo> Stat(const std::string& uri) override { return inner_.Stat(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override {
    reads += 1;
    for (const iovec& v : iov) bytes += v.iov_len;
    {
      std::lock_guard lock(mu_);
      fetches_[{uri, offset}] += 1;
    }
    return inner_.ReadV(uri, offset, iov);
  }
  // One request, its body handed on in pieces, as a streaming remote does.
  Status ReadTo(const std::string& uri, uint64_t offset, uint64_t len, const Sink& sink) override {
    std::vector<uint8_t> all(len);
    MESHLOAD_RETURN_IF_ERROR(ReadV(uri, offset, {iovec{all.data(), all.size()}}));
    for (uint64_t at = 0; at < len; at += 100000) {
      MESHLOAD_RETURN_IF_ERROR(sink(at, all.data() + at, std::min<uint64_t>(100000, len - at)));
    }
    return Status::Ok();
  }
  // How many ranges were fetched `n` times.
  size_t FetchedTimes(int n) const {
    std::lock_guard lock(mu_);
    size_t k = 0;
    for (const auto& [where, times] : fetches_) k += times == n;
    return k;
  }
  bool LatencyBound() const override { return true; }
  uint64_t GapWorthReading() const override { return gap_worth; }
  std::atomic<uint64_t> reads{0}, bytes{0};
  uint64_t gap_worth = 0;  // set before reading

 private:
  source::Source& inner_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, uint64_t>, int> fetches_;
};

TEST(CachedSource, ReadsAcrossBlocksEqualTheSourcesBytes) {
  TempDir data, cache_dir;
  const std::vector<uint8_t> all = Pattern(1000000, 8);
  const std::string path = data.Write("obj", std::string(all.begin(), all.end()));
  auto files = source::MakeFileSource(source::SourceOptions{});
  ASSERT_OK(files);
  CountingSource remote(**files);
  auto cache = MustOpen(cache_dir.path(), 64 << 20);
  CachedSource cached(remote, *cache, planner::BlockGeometry{65536, 100000});
  cached.AddObject(path, all.size(), "");
  EXPECT_EQ(cached.BlocksOf(0, 65535, 2), (std::pair<uint64_t, uint64_t>{0, 1}));
  EXPECT_EQ(cached.BlockExtent(0, 15), (std::pair<uint64_t, uint64_t>{983040, 16960}));
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const uint64_t off = rng() % all.size();
    const uint64_t len = 1 + rng() % std::min<uint64_t>(all.size() - off, 300000);
    // Into three iovecs of uneven sizes.
    std::vector<uint8_t> out(len);
    const uint64_t a = len / 3, b = len / 2;
    std::vector<iovec> iov = {{out.data(), a}, {out.data() + a, b - a}, {out.data() + b, len - b}};
    ASSERT_OK(cached.ReadV(path, off, iov));
    ASSERT_TRUE(std::equal(out.begin(), out.end(), all.begin() + static_cast<ptrdiff_t>(off))) << off << "+" << len;
  }
  std::vector<uint8_t> whole(all.size());
  ASSERT_OK(cached.Read(path, 0, whole.data(), whole.size()));
  EXPECT_EQ(whole, all);
  EXPECT_EQ(remote.reads.load(), 16u) << "each of the 16 blocks fetched once";
  EXPECT_EQ(remote.bytes.load(), all.size());
  std::vector<uint8_t> past(10);
  EXPECT_THAT(cached.Read(path, all.size() - 5, past.data(), past.size()),
              meshload::testing::StatusIs(StatusCode::kDataLoss, HasSubstr("past the end")));
  // A small object is one block, fetched whole.
  const std::string small = data.Write("small", std::string(5000, 's'));
  cached.AddObject(small, 5000, "");
  std::vector<uint8_t> one(10);
  ASSERT_OK(cached.Read(small, 100, one.data(), one.size()));
  EXPECT_EQ(remote.bytes.load(), all.size() + 5000);
}

// A block the cache cannot store is not fetched for a read: the read asks
// the source for its own bytes, with the next reads of its batch in that
// block in the same request where the gap to each costs less than a request
// (the source's GapWorthReading), and nothing else. (Here no block fits the
// cache; the sidecar meets this when a step's blocks outgrow the room the
// earlier steps leave it.)
TEST(CachedSource, AReadWhoseBlockCannotBeStoredFetchesOnlyTheBytesItsBatchNeeds) {
  TempDir data, cache_dir;
  const std::vector<uint8_t> all = Pattern(300000, 9);
  const std::string path = data.Write("obj", std::string(all.begin(), all.end()));
  auto files = source::MakeFileSource(source::SourceOptions{});
  ASSERT_OK(files);
  CountingSource remote(**files);
  auto cache = MustOpen(cache_dir.path(), 50000);  // less than one 65536-byte block
  CachedSource cached(remote, *cache, planner::BlockGeometry{65536, 0});
  cached.AddObject(path, all.size(), "");
  // One batch: three reads in block 0 (gaps of 100 and 5,000 bytes), one
  // across blocks 0 and 1, one in block 3.
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {1000, 4096}, {5196, 4096}, {14292, 4096}, {60000, 10000}, {200000, 4096}};
  auto read_batch = [&] {
    std::vector<std::vector<uint8_t>> out;
    std::vector<std::vector<iovec>> iovs;
    for (const auto& [off, len] : ranges) out.emplace_back(len);
    for (auto& o : out) iovs.push_back({{o.data(), o.size() / 2}, {o.data() + o.size() / 2, o.size() - o.size() / 2}});
    std::vector<source::Source::ReadRequest> reads;
    for (size_t i = 0; i < ranges.size(); ++i) reads.push_back({ranges[i].first, &iovs[i]});
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_OK(cached.ReadMany(path, reads.data(), reads.size(), nullptr, nullptr));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500))
        << "no wait for room a block larger than the cache never finds";
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_TRUE(std::equal(out[i].begin(), out[i].end(), all.begin() + static_cast<ptrdiff_t>(ranges[i].first)))
          << "read " << i;
    }
  };
  uint64_t wanted = 0;
  for (const auto& [off, len] : ranges) wanted += len;
  // No gap worth reading: each read its own request (the one across two
  // blocks, one a block), exactly the bytes read.
  read_batch();
  EXPECT_EQ(remote.bytes.load(), wanted);
  EXPECT_EQ(remote.reads.load(), 6u);
  EXPECT_EQ(cache->resident_blocks(), 0u);
  EXPECT_EQ(cached.counters().direct_bytes.load(), wanted);
  EXPECT_EQ(cached.counters().delivered_bytes.load(), wanted);
  // A source that finds a gap of 1,000 bytes cheaper than a request: the
  // first two reads share one request (and its 100-byte gap); the third,
  // 5,000 bytes further, does not.
  remote.bytes = 0;
  remote.reads = 0;
  remote.gap_worth = 1000;
  read_batch();
  EXPECT_EQ(remote.bytes.load(), wanted + 100);
  EXPECT_EQ(remote.reads.load(), 5u);
  EXPECT_EQ(cache->counters().fetched_bytes.load(), 0u) << "no block was fetched";
}

// A compressed MDS shard (Streaming's MDSWriter, zstd) read through the
// cache: one block, its decompressed bytes, fetched with one read of the
// stored object; found on disk by the next cache over the directory; a
// corrupt block on disk decompressed again, never served.
TEST(CachedSource, AFileStoredCompressedIsOneBlockOfItsDecompressedBytes) {
  const std::string dir = std::string(MESHLOAD_FORMATS_DATA) + "/mds/zstd/";
  std::ifstream index_file(dir + "index.json");
  const std::string index((std::istreambuf_iterator<char>(index_file)), std::istreambuf_iterator<char>());
  auto shards = formats::ParseMdsIndex(index, "index.json");
  ASSERT_OK(shards);
  const formats::MdsShard& shard = (*shards)[2];
  const planner::StoredFile stored{dir + shard.zip_basename, shard.zip_bytes, shard.compression};
  const std::string name = dir + shard.basename;  // no such file: its bytes are the decompression
  std::vector<uint8_t> raw(shard.bytes);
  ASSERT_OK(source::ReadStored(**source::MakeFileSource({}), stored.path, stored, raw.data(), raw.size()));

  TempDir cache_dir;
  auto files = source::MakeFileSource(source::SourceOptions{});
  ASSERT_OK(files);
  CountingSource remote(**files);
  BlockId id;
  {
    auto cache = MustOpen(cache_dir.path(), 64 << 20);
    CachedSource cached(remote, *cache, planner::BlockGeometry{1024, 2048});  // the file is larger: still one block
    ASSERT_EQ(cached.AddStoredObject(name, raw.size(), stored.path, stored, ""), 0u);
    EXPECT_EQ(cached.BlocksOf(0, 0, raw.size()), (std::pair<uint64_t, uint64_t>{0, 0}));
    auto info = cached.Stat(name);
    ASSERT_OK(info);
    EXPECT_EQ(info->size, shard.bytes);
    std::mt19937_64 rng(5);
    for (int i = 0; i < 50; ++i) {
      const uint64_t off = rng() % raw.size();
      const uint64_t len = 1 + rng() % (raw.size() - off);
      std::vector<uint8_t> out(len);
      ASSERT_OK(cached.Read(name, off, out.data(), len));
      ASSERT_TRUE(std::equal(out.begin(), out.end(), raw.begin() + static_cast<ptrdiff_t>(off)));
    }
    EXPECT_EQ(remote.reads.load(), 1u) << "the stored object read once, whole";
    EXPECT_EQ(remote.bytes.load(), shard.zip_bytes);
    // Fetched: the compressed bytes storage sent, not the block's.
    EXPECT_EQ(cache->counters().fetched_bytes.load(), shard.zip_bytes);
    EXPECT_NE(shard.zip_bytes, shard.bytes);
    id = cached.IdOf(0, 0);
    EXPECT_TRUE(std::filesystem::exists(cache->PathOf(id)));
  }
  // A new cache over the directory, the shard added to a source reading
  // through it.
  struct Reopened {
    std::unique_ptr<BlockCache> cache;
    std::unique_ptr<CachedSource> cached;
  };
  auto reopen = [&] {
    Reopened r{MustOpen(cache_dir.path(), 64 << 20), nullptr};
    r.cached = std::make_unique<CachedSource>(remote, *r.cache, planner::BlockGeometry{1024, 2048});
    r.cached->AddStoredObject(name, raw.size(), stored.path, stored, "");
    return r;
  };
  {
    auto [cache, cached] = reopen();
    std::vector<uint8_t> all(raw.size());
    ASSERT_OK(cached->Read(name, 0, all.data(), all.size()));
    EXPECT_EQ(all, raw);
    EXPECT_EQ(remote.reads.load(), 1u) << "found on disk";
    // A block decompressed from another codec or stored object is another
    // block.
    planner::StoredFile other = stored;
    other.compression = "zstd:7";
    CachedSource recompressed(remote, *cache, planner::BlockGeometry{1024, 2048});
    recompressed.AddStoredObject(name, raw.size(), stored.path, other, "");
    EXPECT_NE(recompressed.IdOf(0, 0).object, id.object);
  }
  {
    // Damage on disk: found, decompressed again.
    std::fstream f(MustOpen(cache_dir.path(), 64 << 20)->PathOf(id), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x42');
    f.close();
    auto [cache, cached] = reopen();
    std::vector<uint8_t> all(raw.size());
    ASSERT_OK(cached->Read(name, 0, all.data(), all.size()));
    EXPECT_EQ(all, raw);
    EXPECT_EQ(remote.reads.load(), 2u);
    EXPECT_EQ(cache->counters().corrupt_blocks.load(), 1u);
  }
}

// Fetched bytes are counted to the epoch whose step needs them: a block
// fetched ahead for a later epoch's step counts to that epoch, a read's own
// fetch to the epoch of the step being loaded; a block already there
// counts nowhere.
TEST(CachedSource, FetchedBytesCountToTheEpochOfTheStepTheyWereFetchedFor) {
  TempDir data, cache_dir;
  const std::vector<uint8_t> all = Pattern(400000, 9);
  const std::string path = data.Write("obj", std::string(all.begin(), all.end()));
  auto files = source::MakeFileSource(source::SourceOptions{});
  ASSERT_OK(files);
  auto cache = MustOpen(cache_dir.path(), 64 << 20);
  CachedSource cached(**files, *cache, planner::BlockGeometry{100000, 100000});
  cached.AddObject(path, all.size(), "");
  cached.CountByEpoch([](int64_t step) { return step / 10; });
  ASSERT_OK(cached.Fill(0, 0, 25));  // ahead, for step 25 of epoch 2
  ASSERT_OK(cached.Fill(0, 0, 3));   // already there
  cached.NoteStep(7);
  std::vector<uint8_t> out(10);
  ASSERT_OK(cached.Read(path, 150000, out.data(), out.size()));  // block 1, for the step being loaded
  cached.NoteStep(12);
  ASSERT_OK(cached.Read(path, 399990, out.data(), out.size()));  // block 3
  EXPECT_EQ(cached.FetchedByEpoch(),
            (std::vector<std::pair<int64_t, uint64_t>>{{0, 100000}, {1, 100000}, {2, 100000}}));
}

// A FixedRecord job over generated files, read through a CachedSource whose
// "remote" is the counting file source.
struct CachedJob {
  TempDir data, cache_dir;
  std::unique_ptr<planner::ShardPlanner> planner;
  std::unique_ptr<source::SourceRegistry> sources;
  source::Source* files = nullptr;
  std::unique_ptr<CountingSource> remote;
  std::unique_ptr<BlockCache> cache;
  std::unique_ptr<CachedSource> cached;
  std::vector<int64_t> object_of_file;

  CachedJob(planner::ShuffleMode shuffle, uint64_t samples, uint64_t capacity, int nfiles = 3,
            planner::BlockGeometry geometry = {65536, 0},
            const std::function<void(planner::JobSpec&)>& edit = nullptr) {
    planner::JobSpec spec;
    spec.mesh.processes = 1;
    spec.mesh.devices_per_process = 1;
    spec.mesh.axes = {{"data", 1}};
    spec.strategy = planner::Strategy::kPerProcess;
    spec.dataset.format = planner::DatasetFormat::kFixedRecord;
    spec.dataset.record_bytes = 4096;
    spec.batch.global_batch_size = 32;
    spec.shuffle.mode = shuffle;
    spec.shuffle.seed = 3;
    if (shuffle == planner::ShuffleMode::kBlock) {
      spec.shuffle.block_size = 16;
      spec.shuffle.block_size_set = true;
    }
    if (edit) edit(spec);
    auto uri = tools::GenerateSyntheticDataset(spec.dataset, data.path(), samples, nfiles);
    EXPECT_OK(uri);
    spec.dataset.uri = *uri;
    Diagnostics d;
    auto job = source::ResolveReadingDataset(meshload::testing::MustValidate(spec), {}, source::Unreachable::kFail, d);
    EXPECT_OK(job) << d.ToString();
    planner = std::make_unique<planner::ShardPlanner>(std::move(*job));
    sources = source::SourceRegistry::WithBuiltins({});
    files = (*sources->For(planner->job().dataset.files()[0].path)).first;
    remote = std::make_unique<CountingSource>(*files);
    cache = MustOpen(cache_dir.path(), capacity);
    cached = std::make_unique<CachedSource>(*remote, *cache, geometry);
    const planner::BlockMap blocks(planner->job(), geometry);
    for (size_t i = 0; i < planner->job().dataset.files().size(); ++i) {
      const auto& f = planner->job().dataset.files()[i];
      object_of_file.push_back(static_cast<int64_t>(cached->AddObject(f.path, f.size, "", blocks.starts(i))));
    }
    sources->Interpose(files, cached.get());
  }
};

// Loads steps [first, end) of `job` through its cache with a fetch-ahead
// (`opts`), checking every sample's bytes.
void LoadThroughTheCache(CachedJob& job, const FetchAheadOptions& opts, int64_t first, int64_t end) {
  FetchAhead ahead(*job.planner, job.planner->DefaultLoading(), 0, *job.cached, job.object_of_file, opts);
  const staging::BatchLayout layout = staging::ComputeBatchLayout(job.planner->job(), 0);
  auto loader = StepLoader::Create(*job.planner, 0, job.planner->DefaultLoading(), *job.sources, layout, {});
  ASSERT_OK(loader);
  ahead.Start(first);
  std::vector<uint8_t> slot(layout.slot_bytes);
  std::vector<staging::StagedTensor> staged;
  const planner::DatasetIndex& ds = job.planner->job().dataset;
  for (int64_t step = first; step < end; ++step) {
    ahead.Passed(step - 1);
    ASSERT_OK((*loader)->Load(step, slot.data(), staged, nullptr));
    const planner::StepPlan plan = job.planner->PlanStep(step, job.planner->DefaultLoading(), 0);
    const auto& ids = plan.devices[0].samples;
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_EQ(tools::FirstMismatch(ds, ids[k], slot.data() + layout.devices[0].fields[0].offset + k * 4096), -1)
          << "step " << step << " sample " << ids[k];
    }
  }
  ahead.Stop();
}

TEST(FetchAhead, FillsTheBlocksOfTheNextStepsWithinItsLookahead) {
  CachedJob job(planner::ShuffleMode::kNone, 32 * 64, 64 << 20);
  // 32 records of 4 KiB a step: two 64 KiB blocks; 20 steps ahead at most.
  FetchAheadOptions o;
  o.lookahead_bytes = 10 * 2 * 65536;
  o.threads = 4;
  FetchAhead ahead(*job.planner, job.planner->DefaultLoading(), 0, *job.cached, job.object_of_file, o);
  EXPECT_EQ(ahead.BlocksOf(0).size(), 2u);
  ahead.Start(0);
  auto reads_reach = [&](uint64_t n) {
    return meshload::testing::WaitFor([&] { return job.remote->reads.load() >= n; }, std::chrono::seconds(20),
                                      std::chrono::milliseconds(5));
  };
  // Held at its lookahead: 10 steps' blocks, no more.
  ASSERT_TRUE(reads_reach(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(job.remote->reads.load(), 20u);
  EXPECT_EQ(ahead.ahead_bytes(), 10u * 2 * 65536);
  EXPECT_EQ(ahead.ahead_steps(), 10);
  ASSERT_OK(ahead.WaitResident(0, 10, std::chrono::seconds(20)));
  for (int64_t s = 0; s < 10; ++s) {
    for (const BlockRef& r : ahead.BlocksOf(s)) EXPECT_TRUE(job.cache->Contains(job.cached->IdOf(r.object, r.block)));
  }
  for (const BlockRef& r : ahead.BlocksOf(12)) EXPECT_FALSE(job.cache->Contains(job.cached->IdOf(r.object, r.block)));
  // The trainer passes 5 steps: 5 more are fetched.
  ahead.Passed(4);
  ASSERT_TRUE(reads_reach(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(job.remote->reads.load(), 30u);
  EXPECT_EQ(ahead.ahead_steps(), 10);
  ASSERT_OK(ahead.WaitResident(10, 5, std::chrono::seconds(20)));
  // Starting over elsewhere (a resize, a trainer that went back).
  ahead.StartAt(40);
  ASSERT_OK(ahead.WaitResident(40, 3, std::chrono::seconds(20)));
}

TEST(FetchAhead, WaitResidentSaysWhenTheCacheCannotHoldTheSteps) {
  // A capacity of one block: the first steps' four blocks cannot be held.
  CachedJob job(planner::ShuffleMode::kNone, 32 * 64, 65536 + BlockCache::kTrailerBytes);
  FetchAhead ahead(*job.planner, job.planner->DefaultLoading(), 0, *job.cached, job.object_of_file,
                   {.lookahead_bytes = 4 * 65536, .threads = 2, .max_steps_ahead = 2});
  ahead.Start(0);
  EXPECT_THAT(ahead.WaitResident(0, 2, std::chrono::seconds(20)),
              meshload::testing::StatusIs(StatusCode::kUnavailable, HasSubstr("capacity")));
}

// The step loader reads every planned byte through the cache for two epochs
// under a global shuffle; the second fetches nothing.
TEST(CachedSource, AJobReadThroughTheCacheFetchesEachBlockOnceAcrossEpochs) {
  const uint64_t samples = 32 * 40;  // 40 steps an epoch, 5 MiB
  CachedJob job(planner::ShuffleMode::kGlobal, samples, 64 << 20);
  const FetchAheadOptions opts{.lookahead_bytes = 2 << 20, .threads = 4, .max_steps_ahead = 64};
  LoadThroughTheCache(job, opts, 0, 40);
  EXPECT_EQ(job.remote->bytes.load(), samples * 4096) << "the first epoch fetched the dataset once, block by block";
  LoadThroughTheCache(job, opts, 40, 80);
  EXPECT_EQ(job.remote->bytes.load(), samples * 4096) << "the second epoch fetched nothing";
  EXPECT_EQ(job.cached->counters().delivered_bytes.load(), 2 * samples * 4096);
  const planner::FetchEstimate est =
      planner::EstimateFetch(*job.planner, job.planner->DefaultLoading(), 0, job.cached->geometry());
  EXPECT_TRUE(est.complete);
  EXPECT_EQ(est.read_bytes, samples * 4096);
  EXPECT_EQ(est.block_bytes, samples * 4096);
  EXPECT_DOUBLE_EQ(est.Amplification(), 1.0);
}

TEST(FetchPlan, TheWorkingSetFollowsTheShuffle) {
  const uint64_t samples = 32 * 64;  // 8 MiB in 128 blocks of 64 KiB, one file
  CachedJob global(planner::ShuffleMode::kGlobal, samples, 64 << 20, 1);
  CachedJob none(planner::ShuffleMode::kNone, samples, 64 << 20, 1);
  CachedJob block(planner::ShuffleMode::kBlock, samples, 64 << 20, 1);
  const planner::BlockGeometry g{65536, 0};
  const auto eg = planner::EstimateFetch(*global.planner, global.planner->DefaultLoading(), 0, g);
  const auto en = planner::EstimateFetch(*none.planner, none.planner->DefaultLoading(), 0, g);
  const auto eb = planner::EstimateFetch(*block.planner, block.planner->DefaultLoading(), 0, g);
  // Global: nearly every block is in use from the first steps to the last.
  EXPECT_GT(eg.working_set_bytes, samples * 4096 * 3 / 4);
  // None, and Block with sampler blocks of one storage block (16 samples):
  // a step's two blocks, used by that step alone.
  EXPECT_EQ(en.working_set_bytes, 2u * 65536);
  EXPECT_EQ(eb.working_set_bytes, 2u * 65536);
  for (const auto* e : {&eg, &en, &eb}) {
    EXPECT_EQ(e->read_bytes, samples * 4096);
    EXPECT_EQ(e->block_bytes, samples * 4096);
    EXPECT_EQ(e->steps, 64u);
  }
  const auto capped = planner::EstimateFetch(*global.planner, global.planner->DefaultLoading(), 0, g, 0, 320);
  EXPECT_FALSE(capped.complete);
  EXPECT_EQ(capped.steps, 10u);
}

// Window shuffling over blocks of samples that are no byte-aligned block:
// the cache's blocks follow the sampler's (BlockMap), so a window is whole
// blocks, a cache of a few windows (less than the dataset) fetches every
// byte once an epoch, and the estimate says so.
TEST(FetchPlan, AWindowShuffleFetchesEachByteOnceAnEpochWithACacheOfAFewWindows) {
  const uint64_t samples = 32 * 60;  // 7.5 MiB of 4 KiB records in 3 files; 60 steps an epoch
  auto window = [](planner::JobSpec& s) {
    s.shuffle.mode = planner::ShuffleMode::kWindow;
    s.shuffle.block_size = 10;  // 40 KiB: no 64 KiB block lines up with it
    s.shuffle.block_size_set = true;
    s.shuffle.window_blocks = 4;
    s.shuffle.window_blocks_set = true;
  };
  const uint64_t window_bytes = 4 * 10 * 4096;
  const planner::BlockGeometry g{65536, 0};
  CachedJob job(planner::ShuffleMode::kWindow, samples, 4 * window_bytes, 3, g, window);
  const planner::BlockMap map(job.planner->job(), g);
  EXPECT_TRUE(map.sample_aligned());
  const planner::FetchEstimate est = planner::EstimateFetch(*job.planner, job.planner->DefaultLoading(), 0, g);
  EXPECT_EQ(est.block_bytes, est.read_bytes) << "each byte once";
  EXPECT_LE(est.working_set_bytes, 3 * window_bytes) << "a window, and the next where a step straddles two";
  EXPECT_LT(est.working_set_bytes, samples * 4096 / 2);
  // Two epochs through the step loader, with a cache of 4 windows: the
  // source sees each byte once an epoch.
  LoadThroughTheCache(job, {.lookahead_bytes = window_bytes, .threads = 2, .max_steps_ahead = 64}, 0, 120);
  EXPECT_LE(job.cache->resident_bytes(), 4 * window_bytes);
  // Every block at most once an epoch: twice, or three times for the few
  // the fetch-ahead took for the third epoch (its lookahead, a window); a
  // block the cache kept from the first epoch to the second, once.
  EXPECT_EQ(job.remote->FetchedTimes(4) + job.remote->FetchedTimes(5), 0u);
  EXPECT_LE(job.remote->FetchedTimes(3), 4u);
  EXPECT_GE(job.remote->bytes.load(), samples * 4096);
  EXPECT_LE(job.remote->bytes.load(), 2 * samples * 4096 + window_bytes);
}

}  // namespace
}  // namespace meshload::sidecar::cache
