#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sidecar/source/source.h"
#include "test_support.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar::source {
namespace {

using ::testing::HasSubstr;
using testing::RandomBytes;
using testing::RecordingObserver;
using testing::TempDir;

SourceOptions Options(int max_open_files, SourceObserver* observer = nullptr) {
  SourceOptions options;
  options.max_open_files = max_open_files;
  options.observer = observer;
  return options;
}

std::unique_ptr<Source> MakeFile(const SourceOptions& options = {}) {
  auto source = MakeFileSource(options);
  EXPECT_OK(source);
  return std::move(source).value();
}

int OpenFdCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

// Bytes of `path` resident in this process's mappings (/proc/self/smaps).
uint64_t MappedResidentBytes(const std::string& path) {
  std::ifstream in("/proc/self/smaps");
  uint64_t total = 0;
  bool ours = false;
  for (std::string line; std::getline(in, line);) {
    // A mapping's first line starts "start-end perms ..." (hex addresses);
    // its fields ("Rss:        12 kB") follow.
    const std::string first = line.substr(0, line.find(' '));
    const size_t dash = first.find('-');
    if (dash != std::string::npos && first.find_first_not_of("0123456789abcdef-") == std::string::npos) {
      ours = line.size() > path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    } else if (ours && line.rfind("Rss:", 0) == 0) {
      total += std::stoull(line.substr(4)) * 1024;
    }
  }
  return total;
}

// Reads [0, n) of `path` in 4 KiB pieces (mapped reads).
void ReadInPages(Source& source, const std::string& path, uint64_t n, const std::string& want) {
  std::string out(4096, '\0');
  for (uint64_t at = 0; at < n; at += 4096) {
    ASSERT_OK(source.Read(path, at, out.data(), out.size()));
    ASSERT_EQ(out, want.substr(at, 4096)) << at;
  }
}

TEST(FileSourceTest, MappedPagesAreDroppedWhenTheMappingsTogetherExceedTheResidentLimit) {
  TempDir dir;
  const std::string a = RandomBytes(1 << 20, 11), b = RandomBytes(1 << 20, 12);
  const std::string pa = dir.Write("a.bin", a), pb = dir.Write("b.bin", b);
  SourceOptions options;
  options.mmap_resident_limit = 256 << 10;  // the two mappings hold 2 MiB
  auto source = MakeFile(options);
  ReadInPages(*source, pa, a.size(), a);
  ReadInPages(*source, pb, b.size() - 8192, b);  // ends between two drops
  const uint64_t resident = MappedResidentBytes(pa) + MappedResidentBytes(pb);
  // At most the limit, plus the kernel's fault-around beyond the last page read.
  EXPECT_LE(resident, (256u << 10) + (128u << 10));
  // And the reads went through the mappings (the check would pass trivially otherwise).
  EXPECT_GT(resident, 0u);
}

TEST(FileSourceTest, MappedPagesStayWhileTheMappingsTogetherFitTheResidentLimit) {
  TempDir dir;
  const std::string a = RandomBytes(1 << 20, 13), b = RandomBytes(1 << 20, 14);
  const std::string pa = dir.Write("a.bin", a), pb = dir.Write("b.bin", b);
  SourceOptions options;
  options.mmap_resident_limit = 4 << 20;  // 2 MiB mapped: RSS cannot pass the limit
  auto source = MakeFile(options);
  for (int pass = 0; pass < 2; ++pass) {  // 4 MiB copied: the limit's worth
    ReadInPages(*source, pa, a.size(), a);
    ReadInPages(*source, pb, b.size(), b);
  }
  ReadInPages(*source, pa, a.size(), a);  // b's pages were not touched since
  EXPECT_EQ(MappedResidentBytes(pa), a.size());
  EXPECT_EQ(MappedResidentBytes(pb), b.size());
}

TEST(FileSourceTest, PrefetchHintsNeverFailAndLeaveReadsExact) {
  TempDir dir;
  const std::string data = RandomBytes(64 << 10, 15);
  const std::string path = dir.Write("p.bin", data);
  auto source = MakeFile();
  // In range, empty, past the end, overflowing, larger than a mapped read.
  const std::vector<Source::Range> ranges = {{0, 4096},           {4098, 4098},      {100, 0},
                                             {60 << 10, 8 << 10}, {~0ull - 10, 100}, {0, 1ull << 30}};
  source->Prefetch(path, ranges.data(), ranges.size());
  source->Prefetch(path, nullptr, 0);
  source->Prefetch(dir.path() + "/missing.bin", ranges.data(), ranges.size());  // the read reports it
  std::string out(4098, '\0');
  ASSERT_OK(source->Read(path, 4098, out.data(), out.size()));
  EXPECT_EQ(out, data.substr(4098, 4098));
  // The file shrinks under its mapping: hints to pages it no longer has do
  // not fault, and the read reports the short file.
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  source->Prefetch(path, ranges.data(), 2);
  Status st = source->Read(path, 4098, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_EQ(source->Read(dir.path() + "/missing.bin", 0, out.data(), 1).code(), StatusCode::kNotFound);
}

TEST(FileSourceTest, ScatterReadFillsEveryIovecWithTheFileBytesInOrder) {
  TempDir dir;
  const std::string data = RandomBytes(10000, 1);
  const std::string path = dir.Write("a.bin", data);
  std::string a(1, '\0'), b(100, '\0'), c(4000, '\0'), d(899, '\0');
  char unused = 'x';
  std::vector<iovec> iov = {
      {a.data(), a.size()}, {b.data(), b.size()}, {&unused, 0}, {c.data(), c.size()}, {d.data(), d.size()}};
  auto source = MakeFile();
  ASSERT_OK(source->ReadV(path, 1000, iov));
  EXPECT_EQ(a + b + c + d, data.substr(1000, 5000));
  EXPECT_EQ(unused, 'x');
}

TEST(FileSourceTest, ReadsMoreIovecsThanIovMaxInOneCall) {
  TempDir dir;
  const size_t count = IOV_MAX * 2 + 17;
  const std::string data = RandomBytes(count * 3 + 5, 2);
  const std::string path = dir.Write("many.bin", data);
  std::string out(count * 3, '\0');
  std::vector<iovec> iov;
  for (size_t i = 0; i < count; ++i) iov.push_back({out.data() + 3 * i, 3});
  auto source = MakeFile();
  ASSERT_OK(source->ReadV(path, 5, iov));
  EXPECT_EQ(out, data.substr(5));
}

TEST(FileSourceTest, StatReturnsTheFileSize) {
  TempDir dir;
  const std::string path = dir.Write("s.bin", RandomBytes(1234, 3));
  auto info = MakeFile()->Stat(path);
  ASSERT_OK(info);
  EXPECT_EQ(info->size, 1234u);
}

TEST(FileSourceTest, StatOfADirectoryIsInvalidArgument) {
  TempDir dir;
  auto info = MakeFile()->Stat(dir.path());
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(info.status().location(), dir.path());
}

TEST(FileSourceTest, ReadAcrossTheEndIsDataLossNamingPathOffsetAndFileSize) {
  TempDir dir;
  const std::string path = dir.Write("short.bin", RandomBytes(1200, 4));
  RecordingObserver observer;
  auto source = MakeFile(Options(256, &observer));
  std::string a(50, '\0'), b(4046, '\0');
  Status st = source->ReadV(path, 1000, {{a.data(), a.size()}, {b.data(), b.size()}});
  ASSERT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_EQ(st.location(), path + "@1000");
  EXPECT_EQ(st.message(), "short read: wanted 4096 bytes at offset 1000, the file ends after 1200 bytes");
  EXPECT_EQ(observer.errors(), std::vector<std::string>{"data_loss"});
  EXPECT_EQ(observer.reads(), 0u);
}

TEST(FileSourceTest, ReadStartingPastTheEndIsDataLoss) {
  TempDir dir;
  const std::string path = dir.Write("tiny.bin", "abc");
  std::string out(10, '\0');
  Status st = MakeFile()->Read(path, 100, out.data(), out.size());
  ASSERT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.ToString(), path +
                               "@100: short read: wanted 10 bytes at offset 100, the file "
                               "ends after 3 bytes");
}

TEST(FileSourceTest, MissingFileIsNotFoundForReadAndStat) {
  TempDir dir;
  const std::string path = dir.path() + "/nope.bin";
  RecordingObserver observer;
  auto source = MakeFile(Options(256, &observer));
  char buf[4];
  Status st = source->Read(path, 0, buf, sizeof buf);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.location(), path);
  auto info = source->Stat(path);
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(info.status().location(), path);
  EXPECT_EQ(observer.errors(), (std::vector<std::string>{"not_found", "not_found"}));
}

TEST(FileSourceTest, FileTruncatedAfterStatIsDataLossWithTheNewSize) {
  TempDir dir;
  const std::string data = RandomBytes(8192, 5);
  const std::string path = dir.Write("t.bin", data);
  auto source = MakeFile();
  auto info = source->Stat(path);
  ASSERT_OK(info);
  ASSERT_EQ(info->size, 8192u);
  // A first read caches the descriptor; the truncation must still be seen.
  std::string out(4096, '\0');
  ASSERT_OK(source->Read(path, 0, out.data(), out.size()));
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  Status st = source->Read(path, 4096, out.data(), out.size());
  ASSERT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_EQ(st.location(), path + "@4096");
  EXPECT_THAT(st.message(), HasSubstr("the file ends after 100 bytes"));
}

TEST(FileSourceTest, ZeroMaxOpenFilesIsRejected) {
  auto source = MakeFileSource(Options(0));
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(source.status().location(), "max_open_files");
}

TEST(FileSourceTest, MoreFilesThanMaxOpenFilesAreReadCorrectlyWithBoundedDescriptors) {
  TempDir dir;
  constexpr int kFiles = 20;
  std::vector<std::string> paths, contents;
  for (int i = 0; i < kFiles; ++i) {
    contents.push_back(RandomBytes(300 + i, 100 + i));
    paths.push_back(dir.Write("f" + std::to_string(i) + ".bin", contents.back()));
  }
  auto source = MakeFile(Options(3));
  const int fds_before = OpenFdCount();
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kFiles; ++i) {
      int f = (i * 7 + round) % kFiles;
      std::string out(200, '\0');
      ASSERT_OK(source->Read(paths[f], 50, out.data(), out.size()));
      ASSERT_EQ(out, contents[f].substr(50, 200)) << paths[f];
    }
  }
  EXPECT_LE(OpenFdCount() - fds_before, 3);
}

// Whether this process has `path` open.
bool IsOpen(const std::string& path) {
  DIR* dir = opendir("/proc/self/fd");
  bool found = false;
  while (dirent* e = readdir(dir)) {
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)) == path) found = true;
  }
  closedir(dir);
  return found;
}

TEST(FileSourceTest, TheLeastRecentlyUsedDescriptorIsTheOneClosed) {
  TempDir dir;
  const std::string a = dir.Write("a.bin", RandomBytes(64, 1)), b = dir.Write("b.bin", RandomBytes(64, 2)),
                    c = dir.Write("c.bin", RandomBytes(64, 3));
  auto source = MakeFile(Options(2));
  std::string out(8, '\0');
  for (const std::string* p : {&a, &b, &a, &c}) ASSERT_OK(source->Read(*p, 0, out.data(), out.size()));
  // a was used after b: b goes when c comes in.
  EXPECT_TRUE(IsOpen(a));
  EXPECT_FALSE(IsOpen(b));
  EXPECT_TRUE(IsOpen(c));
  ASSERT_OK(source->Read(b, 0, out.data(), out.size()));
  EXPECT_FALSE(IsOpen(a));  // now the oldest
  EXPECT_TRUE(IsOpen(b));
  EXPECT_TRUE(IsOpen(c));
}

TEST(FileSourceTest, EightThreadsReadingManyFilesGetExactBytes) {
  TempDir dir;
  constexpr int kFiles = 64;
  std::vector<std::string> paths, contents;
  for (int i = 0; i < kFiles; ++i) {
    contents.push_back(RandomBytes(4096 + 37 * i, 1000 + i));
    paths.push_back(dir.Write("h" + std::to_string(i) + ".bin", contents.back()));
  }
  RecordingObserver observer;
  // Far fewer descriptors than files, so eviction races with reads in flight.
  auto source = MakeFile(Options(5, &observer));
  constexpr int kThreads = 8;
  constexpr int kReadsPerThread = 1500;
  std::atomic<int> mismatches{0};
  std::atomic<uint64_t> bytes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int r = 0; r < kReadsPerThread; ++r) {
        int f = static_cast<int>(rng() % kFiles);
        const std::string& want = contents[f];
        uint64_t offset = rng() % want.size();
        uint64_t len = 1 + rng() % (want.size() - offset);
        std::string out(len, '\0');
        uint64_t split = rng() % (len + 1);
        std::vector<iovec> iov = {{out.data(), split}, {out.data() + split, len - split}};
        Status st = source->ReadV(paths[f], offset, iov);
        if (!st.ok() || out != want.substr(offset, len)) mismatches.fetch_add(1);
        bytes.fetch_add(len);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(observer.reads(), uint64_t{kThreads} * kReadsPerThread);
  EXPECT_EQ(observer.bytes(), bytes.load());
}

TEST(FileSourceTest, ObserverCountsEachSuccessfulReadAndItsBytes) {
  TempDir dir;
  const std::string path = dir.Write("o.bin", RandomBytes(1000, 6));
  RecordingObserver observer;
  auto source = MakeFile(Options(256, &observer));
  std::string out(100, '\0');
  for (int i = 0; i < 5; ++i) ASSERT_OK(source->Read(path, 10 * i, out.data(), 100));
  EXPECT_EQ(observer.reads(), 5u);
  EXPECT_EQ(observer.bytes(), 500u);
  EXPECT_EQ(observer.schemes(), std::set<std::string>{"file"});
  EXPECT_TRUE(observer.errors().empty());
}

// Counts the batches the source reports, as well as the reads in them.
class BatchObserver : public RecordingObserver {
 public:
  void OnReads(std::string_view scheme, const ReadSample* reads, size_t count) override {
    batches.push_back(count);
    for (size_t i = 0; i < count; ++i) latencies_ok &= reads[i].seconds >= 0 && reads[i].seconds < 10;
    RecordingObserver::OnReads(scheme, reads, count);
  }
  std::vector<size_t> batches;
  bool latencies_ok = true;
};

// ReadMany on files: every read lands exactly, `before` sees each index just
// before its read, and the observer hears of the batch once, with each read
// in it. Small reads go through the mapping, large ones through preadv.
TEST(FileSourceTest, ReadManyReadsEachRangeInOrderAndReportsTheBatchOnce) {
  for (const uint64_t size : {uint64_t{100}, uint64_t{300} << 10}) {
    SCOPED_TRACE(std::to_string(size) + "-byte reads");
    TempDir dir;
    const std::string data = RandomBytes(8 * size + 7, 11);
    const std::string path = dir.Write("m.bin", data);
    BatchObserver observer;
    auto source = MakeFile(Options(256, &observer));
    const std::vector<uint64_t> offsets = {7 * size, 3, size, 2 * size + 1, 5 * size};
    std::vector<std::string> out(offsets.size(), std::string(size, '\0'));
    std::vector<std::vector<iovec>> iovs;
    std::vector<Source::ReadRequest> reads;
    for (size_t i = 0; i < offsets.size(); ++i) {
      // Two iovecs each: the scatter is kept within a read.
      iovs.push_back({{out[i].data(), 10}, {out[i].data() + 10, size - 10}});
    }
    for (size_t i = 0; i < offsets.size(); ++i) reads.push_back({offsets[i], &iovs[i]});
    struct Seen {
      std::vector<size_t> order;
      std::vector<std::string>* out;
      bool clean = true;  // read i's buffer untouched when `before` sees it
    } seen{{}, &out};
    ASSERT_TRUE(source
                    ->ReadMany(
                        path, reads.data(), reads.size(),
                        [](void* context, size_t i) {
                          auto* s = static_cast<Seen*>(context);
                          s->order.push_back(i);
                          s->clean &= (*s->out)[i] == std::string((*s->out)[i].size(), '\0');
                        },
                        &seen)
                    .ok());
    for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(out[i], data.substr(offsets[i], size)) << i;
    EXPECT_EQ(seen.order, (std::vector<size_t>{0, 1, 2, 3, 4}));
    EXPECT_TRUE(seen.clean);
    EXPECT_EQ(observer.batches, std::vector<size_t>{5});
    EXPECT_EQ(observer.reads(), 5u);
    EXPECT_EQ(observer.bytes(), 5 * size);
    EXPECT_TRUE(observer.latencies_ok);

    // No callback is fine too; an empty batch reads and reports nothing.
    out[0].assign(size, '\0');
    ASSERT_OK(source->ReadMany(path, reads.data(), 1, nullptr, nullptr));
    EXPECT_EQ(out[0], data.substr(offsets[0], size));
    ASSERT_OK(source->ReadMany(path, reads.data(), 0, nullptr, nullptr));
    EXPECT_EQ(observer.batches, (std::vector<size_t>{5, 1}));
  }
}

// A batch stops at its first failing read: the error names that read's
// offset, the reads before it landed and are reported, the ones after it
// are not attempted.
TEST(FileSourceTest, ReadManyStopsAtTheFirstFailingReadAndNamesIt) {
  TempDir dir;
  const std::string data = RandomBytes(4096, 12);
  const std::string path = dir.Write("f.bin", data);
  BatchObserver observer;
  auto source = MakeFile(Options(256, &observer));
  std::string a(100, '\0'), b(100, '\0'), c(100, '\0');
  std::vector<iovec> ia = {{a.data(), a.size()}}, ib = {{b.data(), b.size()}}, ic = {{c.data(), c.size()}};
  const std::vector<Source::ReadRequest> reads = {{200, &ia}, {4050, &ib}, {0, &ic}};
  std::vector<size_t> order;
  Status st = source->ReadMany(
      path, reads.data(), reads.size(),
      [](void* context, size_t i) { static_cast<std::vector<size_t>*>(context)->push_back(i); }, &order);
  ASSERT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_EQ(st.location(), path + "@4050");
  EXPECT_EQ(st.message(), "short read: wanted 100 bytes at offset 4050, the file ends after 4096 bytes");
  EXPECT_EQ(a, data.substr(200, 100));
  EXPECT_EQ(c, std::string(100, '\0'));
  EXPECT_EQ(order, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(observer.batches, std::vector<size_t>{1});
  EXPECT_EQ(observer.bytes(), 100u);
  EXPECT_EQ(observer.errors(), std::vector<std::string>{"data_loss"});

  // A missing file fails at its first read, as not_found.
  const std::string missing = dir.path() + "/nope.bin";
  order.clear();
  st = source->ReadMany(
      missing, reads.data(), reads.size(),
      [](void* context, size_t i) { static_cast<std::vector<size_t>*>(context)->push_back(i); }, &order);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_EQ(st.location(), missing);
  EXPECT_EQ(order, std::vector<size_t>{0});
  EXPECT_EQ(observer.errors(), (std::vector<std::string>{"data_loss", "not_found"}));
  EXPECT_EQ(observer.batches, std::vector<size_t>{1});
}

}  // namespace
}  // namespace meshload::sidecar::source
