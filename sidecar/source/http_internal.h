/// \file
/// Parsing helpers of the HTTP(S) source, exposed for tests. Not part of the
/// source interface; the sidecar uses source.h only.
///
/// Thread safety: pure functions over values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace meshload::source::internal {

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
std::chrono::nanoseconds BackoffBound(int retry, std::chrono::milliseconds initial,
                                      std::chrono::milliseconds max);

}  // namespace meshload::source::internal
