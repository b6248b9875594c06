/// \file
/// Parsing helpers of the HTTP(S) source, exposed for tests. Not part of the
/// source interface; the sidecar uses source.h only.
///
/// Thread safety: pure functions over values.
#pragma once

#include <httplib.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source::internal {

/// An http(s) URL split the way the source uses it.
struct HttpUrl {
  std::string scheme;    // "http" or "https"
  std::string origin;    // scheme://host:port (host lower-cased): the connection pool key
  std::string target;    // path and query as sent in the request line ("/" when empty)
  std::string redacted;  // RedactUri(url): the only form that reaches messages and logs
};

/// Splits `url`. kInvalidArgument (naming the redacted URL) for another
/// scheme, a missing host, a bad port, or user:password@ credentials.
Result<HttpUrl> ParseHttpUrl(const std::string& url);

/// A Content-Range header value: "bytes FIRST-LAST/SIZE", "bytes FIRST-LAST/*"
/// or "bytes */SIZE" (the 416 form).
struct ContentRange {
  bool has_range = false;  // false for "bytes */SIZE"
  uint64_t first = 0;
  uint64_t last = 0;
  std::optional<uint64_t> size;
};

/// Parses a Content-Range value; nullopt when it is malformed.
std::optional<ContentRange> ParseContentRange(std::string_view value);

/// A non-negative decimal integer with nothing around it (Content-Length,
/// Retry-After seconds); nullopt otherwise, or on overflow.
std::optional<uint64_t> ParseDecimal(std::string_view value);

/// The full-jitter backoff bound before retry number `retry` (0 for the first
/// retry): min(max, initial * 2^retry). The sleep is uniform in [0, bound].
std::chrono::nanoseconds BackoffBound(int retry, std::chrono::milliseconds initial, std::chrono::milliseconds max);

/// What a server's error body says, for the message (S3: "NoSuchKey: The
/// specified key does not exist."), and whether it asks the client to slow
/// down (S3 SlowDown): the retry is then counted as "throttled".
struct HttpErrorDetail {
  std::string text;
  bool throttled = false;
};

/// What a storage protocol on HTTP adds to plain requests.
struct HttpHooks {
  /// Adds the request's authentication to `headers` (S3: Signature Version
  /// 4). Called for each attempt, so each is signed at its own time.
  std::function<void(std::string_view method, const HttpUrl& url, httplib::Headers& headers)> sign;
  /// Reads an error response's body (its first 8 KiB).
  std::function<HttpErrorDetail(int status, std::string_view body)> explain;
};

/// What one request costs, from the requests a transport made: a latency
/// (the time of a request of few bytes) and a bandwidth (what a large
/// request moves per second once it started), each an exponentially
/// weighted mean. GapWorthReading() = latency × bandwidth: the bytes a
/// request moves in the time a second request would wait for its first
/// byte, so a gap up to that long between two needed ranges is cheaper
/// read and dropped than skipped. Before it has measured both it assumes
/// what `assumed_latency` and `assumed_bandwidth` say.
/// Thread safety: thread-safe.
class TransferCostModel {
 public:
  TransferCostModel(double assumed_latency = 0.002, double assumed_bandwidth = 100e6)
      : latency_(assumed_latency), bandwidth_(assumed_bandwidth) {}
  /// One request of `bytes` that took `seconds`.
  void Add(uint64_t bytes, double seconds) MESHLOAD_EXCLUDES(mu_);
  uint64_t GapWorthReading() const MESHLOAD_EXCLUDES(mu_);
  double latency() const MESHLOAD_EXCLUDES(mu_);
  double bandwidth() const MESHLOAD_EXCLUDES(mu_);

  /// Requests of at most this many bytes measure the latency; of at least
  /// kLargeBytes, the bandwidth.
  static constexpr uint64_t kSmallBytes = 64 << 10;
  static constexpr uint64_t kLargeBytes = 1 << 20;

 private:
  mutable Mutex mu_;
  double latency_ MESHLOAD_GUARDED_BY(mu_);
  double bandwidth_ MESHLOAD_GUARDED_BY(mu_);
  uint64_t small_ MESHLOAD_GUARDED_BY(mu_) = 0;
  uint64_t large_ MESHLOAD_GUARDED_BY(mu_) = 0;
};

/// Ranged GETs streamed into iovecs, HEADs and small GETs over pooled
/// keep-alive connections, with retries (jittered exponential backoff, or
/// Retry-After) on 5xx, 429, timeouts and dropped connections, never on
/// other 4xx. Errors name `url.redacted` (and @offset for reads); metrics
/// and logs name `scheme`. The "http"/"https" sources and the "s3" source
/// are built on it.
/// Thread safety: thread-safe.
class HttpTransport {
 public:
  HttpTransport(const SourceOptions& options, std::string scheme, HttpHooks hooks);
  ~HttpTransport();
  /// The object's size and, when the server gives one, its ETag: HEAD
  /// (unsigned transports fall back to a one-byte ranged GET when HEAD
  /// gives no length or is refused).
  Status Stat(const HttpUrl& url, uint64_t* size, std::string* etag = nullptr);
  /// Bytes [offset, offset + Σ iov) into the iovecs.
  Status ReadV(const HttpUrl& url, uint64_t offset, const std::vector<iovec>& iov);
  /// Bytes [offset, offset + len) handed to `sink` in pieces (Source::ReadTo), one request.
  Status ReadTo(const HttpUrl& url, uint64_t offset, uint64_t len, const Source::Sink& sink);
  /// A whole 200 response body of at most `limit` bytes (a listing).
  Status GetBody(const HttpUrl& url, std::string* body, uint64_t limit);
  /// From the ranged GETs made so far (TransferCostModel).
  uint64_t GapWorthReading() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshload::sidecar::source::internal
