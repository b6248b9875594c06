// The "file" source: preadv(2) from local files straight into the caller's
// iovecs, with a bounded LRU cache of open descriptors. Small reads are
// copied from a read-only mapping instead (one memcpy, no system call),
// guarded against SIGBUS so that a file truncated under a read is an error.

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {
namespace {

constexpr std::string_view kScheme = "file";

std::string At(const std::string& path, uint64_t offset) { return path + "@" + std::to_string(offset); }

// --- SIGBUS guard for mapped reads ----------------------------------------
// Touching a mapped page past the end of a file that shrank raises SIGBUS.
// A guarded copy records its source range; the handler jumps back out of the
// copy when the fault lies in it, and otherwise restores the previous
// disposition so any other SIGBUS behaves as if we were not here.
// volatile + signal fences: the compiler knows memcpy reads no globals and
// would otherwise drop the stores before the copy as dead.
thread_local sigjmp_buf* volatile t_bus_jump = nullptr;
thread_local const uint8_t* volatile t_bus_lo = nullptr;
thread_local const uint8_t* volatile t_bus_hi = nullptr;
struct sigaction g_previous_bus;

void OnSigbus(int, siginfo_t* info, void*) {
  const auto* addr = static_cast<const uint8_t*>(info->si_addr);
  if (t_bus_jump != nullptr && addr >= t_bus_lo && addr < t_bus_hi) siglongjmp(*t_bus_jump, 1);
  ::sigaction(SIGBUS, &g_previous_bus, nullptr);  // returning re-runs the access
}

void InstallSigbusGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    // NODEFER: the jump out of the handler does not restore the signal mask.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

// Copies n bytes from a mapping; false if the source faulted (the file shrank).
bool GuardedCopy(void* dst, const uint8_t* src, size_t n) {
  sigjmp_buf env;
  if (sigsetjmp(env, 0) != 0) {
    t_bus_jump = nullptr;
    return false;
  }
  t_bus_lo = src;
  t_bus_hi = src + n;
  t_bus_jump = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_jump = nullptr;
  return true;
}

// One open descriptor, closed when the last holder lets go. Readers hold a
// shared_ptr for the length of their read, so evicting the entry from the
// cache never closes a descriptor (or unmaps a mapping) under a read in
// flight. The mapping is made on the first small read.
class FileHandle {
 public:
  // `mapped_total` sums the sizes of the mappings of every live handle of
  // one source (shared with the source, which may go first).
  FileHandle(int fd, std::shared_ptr<std::atomic<uint64_t>> mapped_total)
      : fd_(fd), mapped_total_(std::move(mapped_total)) {}
  ~FileHandle() {
    if (const uint8_t* map = map_.load(); map != nullptr) {
      ::munmap(const_cast<uint8_t*>(map), map_size_);
      mapped_total_->fetch_sub(map_size_, std::memory_order_relaxed);
    }
    ::close(fd_);
  }
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  int fd() const { return fd_; }

  // The whole file mapped read-only, or nullptr (empty file, mmap failure).
  const uint8_t* Mapping(uint64_t* size) const {
    std::call_once(map_once_, [this] {
      struct stat st;
      if (::fstat(fd_, &st) != 0 || st.st_size <= 0) return;
      void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) return;
      ::madvise(p, static_cast<size_t>(st.st_size), MADV_RANDOM);  // samples are read shuffled
      map_size_ = static_cast<uint64_t>(st.st_size);
      mapped_total_->fetch_add(map_size_, std::memory_order_relaxed);
      map_.store(static_cast<const uint8_t*>(p), std::memory_order_release);  // after the size
    });
    *size = map_size_;
    return map_.load(std::memory_order_acquire);
  }
  // Drops the mapping's pages from this process (not from the page cache).
  // May race with another thread's first Mapping(): the pointer is
  // published after the size, so a non-null pointer has its size.
  void DropResidentPages() const {
    const uint8_t* map = map_.load(std::memory_order_acquire);
    if (map != nullptr && touched_.exchange(false)) ::madvise(const_cast<uint8_t*>(map), map_size_, MADV_DONTNEED);
  }
  // Loads first: a store on every read would bounce the line between readers.
  void MarkTouched() const {
    if (!touched_.load(std::memory_order_relaxed)) touched_.store(true, std::memory_order_relaxed);
  }

 private:
  int fd_;
  const std::shared_ptr<std::atomic<uint64_t>> mapped_total_;
  mutable std::once_flag map_once_;
  mutable std::atomic<const uint8_t*> map_{nullptr};
  mutable uint64_t map_size_ = 0;
  mutable std::atomic<bool> touched_{false};
};

// At most `capacity` cached descriptors, least recently used evicted first.
// Descriptors still held by readers stay open past eviction, so the process
// may briefly hold up to capacity + (reads in flight) descriptors.
// Thread safety: thread-safe. A hit (every read but a file's first) takes
// the lock shared and stamps the entry with an atomic use counter, so
// readers on several threads never wait for each other; open(2), close(2)
// and eviction (the entry with the oldest stamp) happen on a miss, open and
// close outside the lock so a slow file system does not serialise readers.
class FdCache {
 public:
  explicit FdCache(size_t capacity) : capacity_(capacity) {}

  // The bytes mapped by this cache's handles, evicted ones still held
  // by a reader included.
  uint64_t mapped_bytes() const { return mapped_total_->load(std::memory_order_relaxed); }

  Result<std::shared_ptr<const FileHandle>> Acquire(const std::string& path) {
    {
      ReaderLock lock(mu_);
      auto it = index_.find(path);
      if (it != index_.end()) {
        it->second.last_used.store(clock_.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
        return it->second.handle;
      }
    }
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return IoErrorFromErrno("open", path, errno);
    std::shared_ptr<const FileHandle> handle = std::make_shared<const FileHandle>(fd, mapped_total_);

    // Declared before the lock so that descriptors are closed after it is released.
    std::vector<std::shared_ptr<const FileHandle>> dropped;
    WriterLock lock(mu_);
    auto [it, inserted] = index_.try_emplace(path);
    if (!inserted) {
      // Another reader opened the same file meanwhile; keep one descriptor.
      dropped.push_back(std::move(handle));
    } else {
      it->second.handle = std::move(handle);
    }
    it->second.last_used.store(clock_.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
    std::shared_ptr<const FileHandle> out = it->second.handle;
    while (index_.size() > capacity_) {
      auto oldest = index_.begin();
      for (auto e = index_.begin(); e != index_.end(); ++e) {
        if (e->second.last_used.load(std::memory_order_relaxed) <
            oldest->second.last_used.load(std::memory_order_relaxed)) {
          oldest = e;
        }
      }
      dropped.push_back(std::move(oldest->second.handle));
      index_.erase(oldest);
    }
    return out;
  }

  // The cached handles (for dropping mapped pages).
  std::vector<std::shared_ptr<const FileHandle>> Snapshot() {
    ReaderLock lock(mu_);
    std::vector<std::shared_ptr<const FileHandle>> out;
    for (const auto& e : index_) out.push_back(e.second.handle);
    return out;
  }

 private:
  struct Entry {
    std::shared_ptr<const FileHandle> handle;
    std::atomic<uint64_t> last_used{0};
  };

  const size_t capacity_;
  const std::shared_ptr<std::atomic<uint64_t>> mapped_total_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Taken shared for lookups (and Snapshot), exclusive to insert and evict:
  // readers never wait for each other on a hit. An entry's last_used is an
  // atomic, stored under the shared lock.
  SharedMutex mu_;
  std::atomic<uint64_t> clock_{1};
  std::unordered_map<std::string, Entry> index_ MESHLOAD_GUARDED_BY(mu_);
};

// Thread safety: thread-safe (the descriptor cache is; the rest is immutable).
// A cached descriptor keeps reading the file it opened even if the path is
// later replaced; datasets are immutable while a job reads them.
class FileSource final : public Source {
 public:
  explicit FileSource(const SourceOptions& options)
      : observer_(options.observer != nullptr ? options.observer : &NullObserver()),
        fds_(static_cast<size_t>(options.max_open_files)),
        mmap_below_(options.mmap_reads_below),
        resident_limit_(options.mmap_resident_limit) {
    if (mmap_below_ > 0) InstallSigbusGuard();
  }

  Result<ObjectInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      int err = errno;
      observer_->OnError(kScheme, err == ENOENT ? "not_found" : "io");
      return IoErrorFromErrno("stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      observer_->OnError(kScheme, "io");
      return InvalidArgument("not a regular file", path);
    }
    ObjectInfo info;
    info.size = static_cast<uint64_t>(st.st_size);
    return info;
  }

  // A file, a directory's regular non-hidden files, or a glob's regular
  // files, in byte order of their paths.
  Result<std::vector<Listed>> List(const std::string& path) override {
    std::vector<Listed> files;
    auto add_regular = [&](const std::string& p) {
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode))
        files.push_back({p, static_cast<uint64_t>(st.st_size), {}});
    };
    if (path.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(path.c_str(), GLOB_ERR | GLOB_NOSORT, nullptr, &g);
      if (rc == GLOB_NOMATCH || rc == GLOB_ABORTED) {
        globfree(&g);
        return NotFound(rc == GLOB_NOMATCH ? "the glob matches no file"
                                           : "the glob matches no file (a directory in it cannot be read)",
                        path);
      }
      if (rc != 0) {
        globfree(&g);
        return IoError("cannot expand the glob", path);
      }
      for (size_t i = 0; i < g.gl_pathc; ++i) add_regular(g.gl_pathv[i]);
      globfree(&g);
      if (files.empty()) return NotFound("the glob matches no regular file", path);
    } else {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) return IoErrorFromErrno("cannot stat dataset", path, errno);
      if (S_ISDIR(st.st_mode)) {
        DIR* dir = ::opendir(path.c_str());
        if (!dir) return IoErrorFromErrno("cannot open dataset directory", path, errno);
        while (struct dirent* e = ::readdir(dir)) {
          const std::string name = e->d_name;
          if (name.empty() || name[0] == '.') continue;  // hidden files and . / ..
          add_regular(path + (path.back() == '/' ? "" : "/") + name);
        }
        ::closedir(dir);
        if (files.empty()) return NotFound("the dataset directory has no regular files", path);
      } else if (S_ISREG(st.st_mode)) {
        files.push_back({path, static_cast<uint64_t>(st.st_size), {}});
      } else {
        return InvalidArgument("is neither a regular file nor a directory", path);
      }
    }
    std::sort(files.begin(), files.end(), [](const Listed& a, const Listed& b) { return a.name < b.name; });
    return files;
  }

  void Prefetch(const std::string& path, const Range* ranges, size_t count) override {
    // Only ranges that will be copied from the mapping: a file read with
    // preadv alone is never mapped for a hint.
    auto mapped_read = [&](const Range& r) { return r.length > 0 && r.length < mmap_below_; };
    if (std::none_of(ranges, ranges + count, mapped_read)) return;
    auto handle = fds_.Acquire(path);  // a miss opens it, as the read would
    if (!handle.ok()) return;          // the read reports it
    uint64_t size = 0;
    const uint8_t* map = (*handle)->Mapping(&size);
    if (map == nullptr) return;
    for (size_t i = 0; i < count; ++i) {
      const Range& r = ranges[i];
      if (!mapped_read(r) || r.offset > size || r.length > size - r.offset) continue;
      // A prefetch never faults: a page the file no longer has is skipped
      // by the CPU, and the read itself reports it.
      __builtin_prefetch(map + r.offset, 0, 3);
      __builtin_prefetch(map + r.offset + r.length - 1, 0, 3);
    }
  }

  Status ReadV(const std::string& path, uint64_t offset, const std::vector<iovec>& iov) override {
    const ReadRequest read{offset, &iov};
    return ReadMany(path, &read, 1, nullptr, nullptr);
  }

  // One descriptor-cache lookup for the batch, and the shared counters (the
  // observer's, the bytes copied through mappings) updated once at its end:
  // with small samples those atomics, bounced between reader threads, cost
  // more than the copies.
  Status ReadMany(const std::string& path, const ReadRequest* reads, size_t count, BeforeRead before,
                  void* context) override {
    thread_local std::vector<SourceObserver::ReadSample> done;
    done.clear();
    std::shared_ptr<const FileHandle> handle;
    uint64_t mapped_copied = 0;
    Status st;
    // One clock read per read: each read's end is the next one's start.
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < count && st.ok(); ++i) {
      if (before != nullptr) before(context, i);
      const uint64_t offset = reads[i].offset;
      const std::vector<iovec>& iov = *reads[i].iov;
      uint64_t total = 0;
      for (const iovec& v : iov) total += v.iov_len;
      constexpr uint64_t kMaxOffset = std::numeric_limits<off_t>::max();
      if (offset > kMaxOffset || total > kMaxOffset - offset) {
        st = InvalidArgument("range of " + std::to_string(total) + " bytes does not fit in a file offset",
                             At(path, offset));
        break;
      }
      if (total == 0) continue;
      if (handle == nullptr) {
        auto acquired = fds_.Acquire(path);
        if (!acquired.ok()) {
          st = acquired.status();
          break;
        }
        handle = std::move(*acquired);
      }
      if (total < mmap_below_) {
        bool via_mapping = false;
        st = ReadMapped(*handle, path, offset, total, iov, &via_mapping);
        if (st.ok() && via_mapping) mapped_copied += total;
      } else {
        st = ReadFully(handle->fd(), path, offset, total, iov);
      }
      if (st.ok()) {
        const auto end = std::chrono::steady_clock::now();
        done.push_back({total, std::chrono::duration<double>(end - start).count()});
        start = end;
      }
    }
    if (!done.empty()) observer_->OnReads(kScheme, done.data(), done.size());
    if (mapped_copied > 0) {
      // After the copies: a drop between a copy and the mark then still
      // finds the mark (and a drop before it finds the pages).
      handle->MarkTouched();
      AccountMappedCopy(mapped_copied);
    }
    if (!st.ok()) {
      const char* kind = st.code() == StatusCode::kNotFound   ? "not_found"
                         : st.code() == StatusCode::kDataLoss ? "data_loss"
                                                              : "io";
      observer_->OnError(kScheme, kind);
    }
    return st;
  }

 private:
  // preadv until `total` bytes have landed. The caller's array is used as is
  // while whole iovecs complete; a partial one (short read) or more than
  // IOV_MAX entries make a private copy that is advanced in place.
  static Status ReadFully(int fd, const std::string& path, uint64_t offset, uint64_t total,
                          const std::vector<iovec>& iov) {
    const iovec* cur = iov.data();
    size_t left = iov.size();
    std::vector<iovec> own;
    bool owned = false;  // cur points into `own`
    uint64_t done = 0;
    while (done < total) {
      while (left > 0 && cur->iov_len == 0) {
        ++cur;
        --left;
      }
      int count = static_cast<int>(std::min<size_t>(left, IOV_MAX));
      ssize_t n = ::preadv(fd, cur, count, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoErrorFromErrno("preadv at offset " + std::to_string(offset + done), At(path, offset), errno);
      }
      if (n == 0) return ShortRead(fd, path, offset, total, done);
      done += static_cast<uint64_t>(n);
      auto got = static_cast<size_t>(n);
      while (got > 0 && got >= cur->iov_len) {
        got -= cur->iov_len;
        ++cur;
        --left;
      }
      if (got > 0) {
        if (!owned) {
          own.assign(cur, cur + left);
          cur = own.data();
          owned = true;
        }
        iovec& first = own[static_cast<size_t>(cur - own.data())];
        first.iov_base = static_cast<char*>(first.iov_base) + got;
        first.iov_len -= got;
      }
    }
    return Status::Ok();
  }

  // Copies [offset, offset + total) from the file's mapping. A range past
  // the mapped size, or a fault because the file shrank, falls back to
  // preadv, which reports the short read with the file's current size.
  // `*via_mapping`: the bytes came from the mapping (not from preadv).
  Status ReadMapped(const FileHandle& h, const std::string& path, uint64_t offset, uint64_t total,
                    const std::vector<iovec>& iov, bool* via_mapping) {
    uint64_t size = 0;
    const uint8_t* map = h.Mapping(&size);
    if (map == nullptr || offset > size || total > size - offset) return ReadFully(h.fd(), path, offset, total, iov);
    uint64_t at = offset;
    for (const iovec& v : iov) {
      if (!GuardedCopy(v.iov_base, map + at, v.iov_len)) {
        return ReadFully(h.fd(), path, offset, total, iov);
      }
      at += v.iov_len;
    }
    *via_mapping = true;
    return Status::Ok();
  }

  // Counts `bytes` copied through mappings; after each `resident_limit_` of
  // them, drops the mapped pages if the mappings together exceed the limit.
  // While every mapping together is no larger than the limit, the pages
  // mapped cannot exceed it and dropping them would only cost refaults.
  void AccountMappedCopy(uint64_t bytes) {
    if (copied_.fetch_add(bytes, std::memory_order_relaxed) + bytes >= resident_limit_) {
      copied_.store(0, std::memory_order_relaxed);
      if (fds_.mapped_bytes() > resident_limit_) {
        for (const auto& handle : fds_.Snapshot()) handle->DropResidentPages();
      }
    }
  }

  static Status ShortRead(int fd, const std::string& path, uint64_t offset, uint64_t total, uint64_t done) {
    std::string msg =
        "short read: wanted " + std::to_string(total) + " bytes at offset " + std::to_string(offset) + ", ";
    struct stat st;
    if (::fstat(fd, &st) == 0) {
      msg += "the file ends after " + std::to_string(st.st_size) + " bytes";
    } else {
      msg += "the file ended after " + std::to_string(done) + " of them";
    }
    return DataLoss(std::move(msg), At(path, offset));
  }

  SourceObserver* observer_;
  FdCache fds_;
  const uint64_t mmap_below_;
  const uint64_t resident_limit_;
  std::atomic<uint64_t> copied_{0};  // through mappings since pages were last dropped
};

}  // namespace

Result<std::unique_ptr<Source>> MakeFileSource(const SourceOptions& options) {
  if (options.max_open_files < 1) {
    return InvalidArgument("must be at least 1, got " + std::to_string(options.max_open_files), "max_open_files");
  }
  return std::unique_ptr<Source>(std::make_unique<FileSource>(options));
}

}  // namespace meshload::sidecar::source
