/// \file
/// Storage sources: where sample bytes come from.
///
/// A Source reads byte ranges of named objects (a local file path, an
/// http(s):// URL, an s3://bucket/key object) straight into the caller's memory. The
/// sidecar asks for the coalesced ranges the planner computed and scatters
/// each range into the destinations of its samples in the slot (preadv-style
/// iovecs), so bytes land where the trainer will see them with no
/// intermediate copy for local files.
///
/// Sources sit behind a registry keyed by URI scheme ("file" also serves plain
/// paths): file, http, https, s3. A source also lists what a dataset URI
/// names (Source::List), which is how the planner's dataset facts are
/// gathered for every scheme (sidecar/source/dataset_facts.h).
///
/// Errors name the object and, for data errors, the byte offset:
///   /data/a.bin@1048576: short read: wanted 4096 bytes, file ends after 1200
///   http://store/a.bin@0: HTTP 404 Not Found (not retried)
///
/// Thread safety: a Source is shared by the sidecar's reader threads; every
/// method is thread-safe.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace meshload::planner {
struct DatasetSpec;
struct JobSpec;
}  // namespace meshload::planner

namespace meshload::sidecar::source {

struct ObjectInfo {
  uint64_t size = 0;
  /// What changes when the object's bytes do, where the source says it
  /// (HTTP and S3: the ETag); "" otherwise.
  std::string version;
};

/// Hooks for metrics and logs; the sidecar wires them to its registry. All
/// callbacks may run concurrently from several reader threads and must be
/// cheap. `scheme` is the registry key ("file", "http", "https").
class SourceObserver {
 public:
  virtual ~SourceObserver() = default;
  /// One storage request finished successfully: bytes delivered and its latency.
  virtual void OnRead(std::string_view scheme, uint64_t bytes, double seconds) = 0;
  /// Several requests finished successfully (the reads of one batch,
  /// Source::ReadMany), reported at once so that an observer can update
  /// shared counters once per batch. The default calls OnRead for each.
  struct ReadSample {
    uint64_t bytes = 0;
    double seconds = 0;
  };
  virtual void OnReads(std::string_view scheme, const ReadSample* reads, size_t count) {
    for (size_t i = 0; i < count; ++i) OnRead(scheme, reads[i].bytes, reads[i].seconds);
  }
  /// One attempt failed and will be retried; `reason` is a bounded label
  /// value: "http_5xx", "http_429", "throttled" (S3 SlowDown), "timeout",
  /// "connection", "short_body".
  virtual void OnRetry(std::string_view scheme, std::string_view reason) = 0;
  /// A request failed for good (after retries, or a non-retryable error);
  /// `kind` is a bounded label value: "not_found", "http_4xx", "io",
  /// "data_loss", "retries_exhausted", "timeout".
  virtual void OnError(std::string_view scheme, std::string_view kind) = 0;
};

/// An observer that does nothing.
SourceObserver& NullObserver();

/// Where and how the "s3" source reaches object storage. Filled from the
/// job's spec.dataset.s3 and the standard AWS environment variables and
/// files (S3OptionsFromEnvironment). The credentials are never logged or
/// put in a message.
struct S3Options {
  /// http(s)://host[:port]; empty: https://s3.<region>.amazonaws.com.
  std::string endpoint;
  /// The region requests are signed for; empty: us-east-1.
  std::string region;
  enum class Addressing {
    kAuto,           // virtual-hosted for amazonaws.com endpoints (buckets without dots), else path-style
    kPath,           // http://endpoint/bucket/key
    kVirtualHosted,  // http://bucket.endpoint/key
  };
  Addressing addressing = Addressing::kAuto;
  /// No access key: requests go unsigned (public buckets).
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  /// ListObjectsV2 max-keys per page (1..1000).
  int list_page_size = 1000;
};

struct SourceOptions {
  // HTTP(S): timeouts per attempt.
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds read_timeout{10000};
  std::chrono::milliseconds write_timeout{10000};
  // Retries on 5xx, timeouts and connection resets; never on 4xx.
  int max_attempts = 5;  // total attempts, including the first
  std::chrono::milliseconds backoff_initial{50};
  std::chrono::milliseconds backoff_max{2000};
  // Keep-alive connections per host kept for reuse (one per reader thread).
  int max_idle_connections = 8;
  // HTTPS: verify the server certificate (CA bundle from the system, or this file).
  bool verify_tls = true;
  std::string ca_file;
  // Local files: at most this many file descriptors kept open.
  int max_open_files = 256;
  // Local files: reads smaller than this are copied from a read-only
  // mapping of the file instead of a preadv call each (small samples cost
  // more in system calls than in copying); 0 turns mapping off. A file that
  // shrinks under a mapped read is still a kDataLoss error, not a SIGBUS.
  uint64_t mmap_reads_below = 256 << 10;
  // Local files: the page-cache pages mapped into the process stay within
  // this many bytes. Mapped pages count in RSS (RssFile) although they are
  // shared and reclaimable, and cost page tables (2 MiB per GiB mapped).
  // While the files mapped at once are no larger than the limit together,
  // nothing is done; otherwise, after each `mmap_resident_limit` bytes
  // copied through mappings, their pages are dropped from the process
  // (MADV_DONTNEED; the page cache keeps them), which costs a refault per
  // page touched again (a quarter of the time of a small-sample step on a
  // dataset that fits: docs/benchmarks.md, run 8).
  uint64_t mmap_resident_limit = 4ull << 30;
  // Object storage (s3://bucket/key).
  S3Options s3;
  SourceObserver* observer = nullptr;  // NullObserver() when null
};

class Source {
 public:
  virtual ~Source() = default;

  /// One object a dataset URI names: what ReadV takes, and its size.
  struct Listed {
    std::string name;
    uint64_t size = 0;
    /// As ObjectInfo::version (an S3 listing's ETag); "" when the listing
    /// says nothing.
    std::string version;
  };
  /// The objects `uri` names, in lexicographic byte order of their names:
  /// one object; a directory's (a prefix ending in '/', or a key that is
  /// one) direct, non-hidden objects; or a glob (*, ?, [...]) in the last
  /// path segment. kNotFound naming `uri` when it names nothing. The
  /// default: the one object, by Stat.
  virtual Result<std::vector<Listed>> List(const std::string& uri) {
    MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo info, Stat(uri));
    return std::vector<Listed>{{uri, info.size, info.version}};
  }

  /// The size of an object. kNotFound when it does not exist.
  virtual Result<ObjectInfo> Stat(const std::string& uri) = 0;

  /// Reads exactly the bytes [offset, offset + Σ iov[i].iov_len) of `uri`
  /// into the buffers of `iov`, in order. A range past the end of the object
  /// is kDataLoss naming `uri@offset` and how many bytes were there; nothing
  /// is retried for local files except EINTR and short reads.
  virtual Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) = 0;

  /// Several reads of one object, run in order: read i is
  /// ReadV(uri, reads[i].offset, *reads[i].iov). `before(context, i)`, when
  /// given, is called just before read i starts (the sidecar's watchdog
  /// notes the read in flight there). Stops at the first read that fails and
  /// returns its error, which names `uri@offset` of that read (or just
  /// `uri` when the object cannot be opened at all); the reads
  /// before it have landed. Each read is still one storage request for
  /// metrics (an override reports them with SourceObserver::OnReads, once
  /// per batch; the default, through ReadV, one OnRead each). A source that can
  /// share work between the reads of one object overrides it (local files:
  /// one descriptor-cache lookup and one metrics update per batch); the
  /// default calls ReadV for each.
  struct ReadRequest {
    uint64_t offset = 0;
    const std::vector<iovec>* iov = nullptr;
  };
  using BeforeRead = void (*)(void* context, size_t i);
  virtual Status ReadMany(const std::string& uri, const ReadRequest* reads, size_t count, BeforeRead before,
                          void* context) {
    for (size_t i = 0; i < count; ++i) {
      if (before != nullptr) before(context, i);
      if (Status st = ReadV(uri, reads[i].offset, *reads[i].iov); !st.ok()) return st;
    }
    return Status::Ok();
  }

  /// A hint that [offset, offset + length) of `uri` will be read soon, for
  /// each range: a source that can start fetching them without waiting for
  /// the data does so (local files: the CPU fetches the first and last cache
  /// line of each range that will be copied from the mapping, which
  /// overlaps the TLB and cache misses of many small samples; the first
  /// hint for a file opens and maps it, as its first read would). Never
  /// fails: errors are left to the read. The default does nothing.
  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  virtual void Prefetch(const std::string& uri, const Range* ranges, size_t count) {
    (void)uri;
    (void)ranges;
    (void)count;
  }

  /// True when a read costs mostly waiting on a network round trip (http,
  /// https, s3) rather than copying: the sidecar then reads a step's ranges
  /// on all its reader threads at once however small the step is, and gives
  /// such datasets more reader threads by default.
  virtual bool LatencyBound() const { return false; }

  /// For a latency-bound source: the longest gap between two needed ranges
  /// of one object that costs less to read (and drop) than a second
  /// request, from the latency and bandwidth this source measured on its
  /// own requests (internal::TransferCostModel). The step loader merges
  /// reads across such gaps, and no longer ones. 0: never merge.
  virtual uint64_t GapWorthReading() const { return 0; }

  /// Where ReadTo hands bytes: `n` bytes at position `at` of the read
  /// (0 is its offset). A non-OK status stops the read and is its result.
  using Sink = std::function<Status(uint64_t at, const uint8_t* data, size_t n)>;
  /// Reads bytes [offset, offset + len) of `uri` and hands them to `sink`
  /// in pieces, in order, the bytes of each piece valid during the call
  /// only: a reader that stores the bytes somewhere other than memory it
  /// already holds (the block cache writes them to a file) never needs a
  /// buffer of `len`. A retried request may hand a range again from an
  /// earlier position (the same bytes). A source that can stream overrides
  /// it with one request whose body arrives in pieces (http, https, s3);
  /// the default reads pieces of kStreamPiece with ReadV. Errors as ReadV's.
  virtual Status ReadTo(const std::string& uri, uint64_t offset, uint64_t len, const Sink& sink);
  static constexpr size_t kStreamPiece = 1 << 20;

  /// Convenience: one destination buffer.
  Status Read(const std::string& uri, uint64_t offset, void* dst, uint64_t len) {
    return ReadV(uri, offset, {iovec{dst, static_cast<size_t>(len)}});
  }
};

/// Runs fn(0) ... fn(n - 1) on up to `threads` threads (the caller's
/// among them), each i once, and returns when all have.
void ForEach(size_t n, size_t threads, const std::function<void(size_t)>& fn);
/// ForEach over n objects of `source`: 16 at a time on a source that waits
/// on the network (a request per object: their round trips overlap), one
/// after the other on local files. Sources are thread-safe.
void ForEachObject(const Source& source, size_t n, const std::function<void(size_t)>& fn);

/// The step the calling thread reads for. The step loader sets it on each
/// thread that reads a step's bytes (the caller of Load and its reader
/// threads), so a source that keeps bytes for the steps that need them (the
/// block cache, sidecar/cache/cached_source.h) knows which step a read
/// serves. -1 until set on the thread.
void SetReadingStep(int64_t step);
int64_t ReadingStep();

/// Creates a source for one scheme.
using SourceFactory = std::function<Result<std::unique_ptr<Source>>(const SourceOptions&)>;

/// Maps URI schemes to sources. Plain paths and file:// URIs use "file";
/// file:// is stripped before the path reaches the file source.
/// Thread safety: Register before use; For() is thread-safe and creates each
/// scheme's source once (it is then shared).
class SourceRegistry {
 public:
  explicit SourceRegistry(SourceOptions options);
  /// A registry with the built-in schemes: file, http, https, s3.
  static std::unique_ptr<SourceRegistry> WithBuiltins(SourceOptions options);

  /// How reads of a scheme's sources cost: copying (local files) or waiting
  /// on a network round trip (http, https, s3). The sidecar sizes its
  /// readers by it before any source exists (SourceRegistry::Network); a
  /// source's LatencyBound() says the same of one made source, at run time.
  enum class Latency { kLocal, kNetwork };
  void Register(std::string scheme, SourceFactory factory, Latency latency = Latency::kLocal) MESHLOAD_EXCLUDES(mu_);
  /// Whether `uri`'s scheme was registered as kNetwork (false for an
  /// unknown scheme: For() reports it).
  bool Network(const std::string& uri) const MESHLOAD_EXCLUDES(mu_);

  /// The source for `uri`'s scheme, and the object name it expects (the
  /// path for files, the whole URL for http). kInvalidArgument naming the
  /// URI for an unknown scheme, listing the known ones.
  Result<std::pair<Source*, std::string>> For(const std::string& uri) MESHLOAD_EXCLUDES(mu_);

  /// The scheme of a URI: "file" for plain paths.
  static std::string SchemeOf(const std::string& uri);

  /// From now on, For() gives `outer` where it gave `inner` (a source that
  /// reads through `inner`, such as the block cache's; it must outlive its
  /// use through this registry). `inner` may be one interposed before:
  /// For() follows the chain to its last.
  void Interpose(Source* inner, Source* outer) MESHLOAD_EXCLUDES(mu_);

 private:
  SourceOptions options_;  // set in the constructor, read-only after
  mutable Mutex mu_;
  std::map<std::string, SourceFactory> factories_ MESHLOAD_GUARDED_BY(mu_);
  std::map<std::string, Latency> latency_ MESHLOAD_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Source>> sources_ MESHLOAD_GUARDED_BY(mu_);
  std::map<Source*, Source*> interposed_ MESHLOAD_GUARDED_BY(mu_);
};

/// `uri` safe to log: without its query string and fragment (signed URLs
/// carry credentials there) and without user:password@ in the authority.
/// An s3:// URI is kept whole: it has no query ('?' is a glob character of
/// its key) and its credentials never are in it.
std::string RedactUri(std::string_view uri);

/// The options a job's storage needs, from the job: `base`, with each
/// built-in scheme that one of the job's datasets (spec.dataset, or each of
/// a mixture's) uses filling in its own settings (s3: spec.dataset.s3's
/// endpoint, region and addressing, then what they leave empty from the
/// environment, S3OptionsFromEnvironment). Each scheme's settings are
/// registered with its factory and latency (registry.cc), so a caller never
/// names a scheme. Errors name where a setting came from, never a secret.
Result<SourceOptions> SourceOptionsForJob(const planner::JobSpec& spec, SourceOptions base = {});
/// The same for URIs named without a job (meshload index): each scheme's
/// settings from the environment alone.
Result<SourceOptions> SourceOptionsForUris(const std::vector<std::string>& uris, SourceOptions base = {});

/// The built-in sources (exposed for tests).
Result<std::unique_ptr<Source>> MakeFileSource(const SourceOptions& options);
Result<std::unique_ptr<Source>> MakeHttpSource(const SourceOptions& options);
Result<std::unique_ptr<Source>> MakeS3Source(const SourceOptions& options);

/// Fills what `s3` leaves empty from the environment, as the AWS tools do:
/// AWS_ENDPOINT_URL_S3 (else AWS_ENDPOINT_URL), AWS_REGION (else
/// AWS_DEFAULT_REGION); credentials from AWS_ACCESS_KEY_ID,
/// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else from the files of a
/// mounted Secret in MESHLOAD_S3_CREDENTIALS_DIR (files AWS_ACCESS_KEY_ID,
/// AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN), else from the shared
/// credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials;
/// profile AWS_PROFILE, else "default"). An access key without its secret
/// is kInvalidArgument naming where it came from (never its value).
Status S3OptionsFromEnvironment(S3Options& s3);

}  // namespace meshload::sidecar::source
