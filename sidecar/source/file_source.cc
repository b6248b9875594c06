// The "file" source: preadv(2) from local files straight into the caller's
// iovecs, with a bounded LRU cache of open descriptors.

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sidecar/source/source.h"

namespace meshload::source {
namespace {

constexpr std::string_view kScheme = "file";

std::string At(const std::string& path, uint64_t offset) {
  return path + "@" + std::to_string(offset);
}

// One open descriptor, closed when the last holder lets go. Readers hold a
// shared_ptr for the length of their preadv, so evicting the entry from the
// cache never closes a descriptor under a read in flight.
class FileHandle {
 public:
  explicit FileHandle(int fd) : fd_(fd) {}
  ~FileHandle() { ::close(fd_); }
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// At most `capacity` cached descriptors, least recently used evicted first.
// Descriptors still held by readers stay open past eviction, so the process
// may briefly hold up to capacity + (reads in flight) descriptors.
// Thread safety: thread-safe; open(2) and close(2) run outside the lock so a
// slow file system does not serialise the readers.
class FdCache {
 public:
  explicit FdCache(size_t capacity) : capacity_(capacity) {}

  Result<std::shared_ptr<const FileHandle>> Acquire(const std::string& path) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(path);
      if (it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return IoErrorFromErrno("open", path, errno);
    std::shared_ptr<const FileHandle> handle = std::make_shared<const FileHandle>(fd);

    // Declared before the lock so that descriptors are closed after it is released.
    std::vector<std::shared_ptr<const FileHandle>> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(path);
    if (it != index_.end()) {
      // Another reader opened the same file meanwhile; keep one descriptor.
      dropped.push_back(std::move(handle));
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    lru_.emplace_front(path, handle);
    index_.emplace(path, lru_.begin());
    while (lru_.size() > capacity_) {
      dropped.push_back(std::move(lru_.back().second));
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return handle;
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const FileHandle>>;

  const size_t capacity_;
  std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

// Thread safety: thread-safe (the descriptor cache is; the rest is immutable).
// A cached descriptor keeps reading the file it opened even if the path is
// later replaced; datasets are immutable while a job reads them.
class FileSource final : public Source {
 public:
  explicit FileSource(const SourceOptions& options)
      : observer_(options.observer != nullptr ? options.observer : &NullObserver()),
        fds_(static_cast<size_t>(options.max_open_files)) {}

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
    return ObjectInfo{static_cast<uint64_t>(st.st_size)};
  }

  Status ReadV(const std::string& path, uint64_t offset, const std::vector<iovec>& iov) override {
    const auto start = std::chrono::steady_clock::now();
    uint64_t total = 0;
    for (const iovec& v : iov) total += v.iov_len;
    constexpr uint64_t kMaxOffset = std::numeric_limits<off_t>::max();
    if (offset > kMaxOffset || total > kMaxOffset - offset) {
      observer_->OnError(kScheme, "io");
      return InvalidArgument(
          "range of " + std::to_string(total) + " bytes does not fit in a file offset",
          At(path, offset));
    }
    if (total == 0) return Status::Ok();

    auto handle = fds_.Acquire(path);
    if (!handle.ok()) {
      observer_->OnError(kScheme,
                         handle.status().code() == StatusCode::kNotFound ? "not_found" : "io");
      return handle.status();
    }
    Status st = ReadFully((*handle)->fd(), path, offset, total, iov);
    if (!st.ok()) {
      observer_->OnError(kScheme, st.code() == StatusCode::kDataLoss ? "data_loss" : "io");
      return st;
    }
    observer_->OnRead(
        kScheme, total,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return Status::Ok();
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
        return IoErrorFromErrno("preadv at offset " + std::to_string(offset + done),
                                At(path, offset), errno);
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

  static Status ShortRead(int fd, const std::string& path, uint64_t offset, uint64_t total,
                          uint64_t done) {
    std::string msg = "short read: wanted " + std::to_string(total) + " bytes at offset " +
                      std::to_string(offset) + ", ";
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
};

}  // namespace

Result<std::unique_ptr<Source>> MakeFileSource(const SourceOptions& options) {
  if (options.max_open_files < 1) {
    return InvalidArgument("must be at least 1, got " + std::to_string(options.max_open_files),
                           "max_open_files");
  }
  return std::unique_ptr<Source>(std::make_unique<FileSource>(options));
}

}  // namespace meshload::source
