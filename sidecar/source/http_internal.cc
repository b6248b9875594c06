// URLs, Content-Range and Retry-After values, and the retry backoff of the
// HTTP transport (sidecar/source/http_internal.h), apart from any socket.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "sidecar/source/http_internal.h"

namespace meshload::sidecar::source {
namespace internal {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<HttpUrl> ParseHttpUrl(const std::string& url) {
  HttpUrl out;
  out.redacted = RedactUri(url);
  size_t sep = url.find("://");
  if (sep == std::string::npos) return InvalidArgument("not an http(s) URL", out.redacted);
  out.scheme = Lower(std::string_view(url).substr(0, sep));
  if (out.scheme != "http" && out.scheme != "https") {
    return InvalidArgument("not an http(s) URL", out.redacted);
  }
  size_t authority_begin = sep + 3;
  size_t authority_end = url.find_first_of("/?#", authority_begin);
  if (authority_end == std::string::npos) authority_end = url.size();
  std::string_view authority = std::string_view(url).substr(authority_begin, authority_end - authority_begin);
  if (authority.find('@') != std::string_view::npos) {
    return InvalidArgument("credentials in the URL (user:password@host) are not supported", out.redacted);
  }

  std::string_view host;
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgument("unterminated IPv6 address in the URL", out.redacted);
    }
    host = authority.substr(0, close + 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return InvalidArgument("bad port in the URL", out.redacted);
      port_text = rest.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (host.empty() || host == "[]") return InvalidArgument("the URL has no host", out.redacted);
  uint64_t port = out.scheme == "https" ? 443 : 80;
  if (!port_text.empty()) {
    std::optional<uint64_t> parsed = ParseDecimal(port_text);
    if (!parsed || *parsed == 0 || *parsed > 65535) {
      return InvalidArgument("bad port \"" + std::string(port_text) + "\" in the URL", out.redacted);
    }
    port = *parsed;
  }
  out.origin = out.scheme + "://" + Lower(host) + ":" + std::to_string(port);

  // The fragment never goes on the wire; the query does (signed URLs need it).
  std::string_view target = std::string_view(url).substr(authority_end);
  target = target.substr(0, target.find('#'));
  if (target.empty() || target.front() != '/') out.target = "/";
  out.target += target;
  return out;
}

std::optional<uint64_t> ParseDecimal(std::string_view value) {
  if (value.empty()) return std::nullopt;
  uint64_t n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    auto digit = static_cast<uint64_t>(c - '0');
    if (n > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    n = n * 10 + digit;
  }
  return n;
}

std::optional<ContentRange> ParseContentRange(std::string_view value) {
  constexpr std::string_view kUnit = "bytes ";
  if (value.size() < kUnit.size() || Lower(value.substr(0, kUnit.size())) != kUnit) {
    return std::nullopt;
  }
  value.remove_prefix(kUnit.size());
  size_t slash = value.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view range = value.substr(0, slash);
  std::string_view size = value.substr(slash + 1);
  ContentRange out;
  if (size != "*") {
    out.size = ParseDecimal(size);
    if (!out.size) return std::nullopt;
  }
  if (range == "*") {
    // "bytes */*" says nothing at all.
    if (!out.size) return std::nullopt;
    return out;
  }
  size_t dash = range.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  std::optional<uint64_t> first = ParseDecimal(range.substr(0, dash));
  std::optional<uint64_t> last = ParseDecimal(range.substr(dash + 1));
  if (!first || !last || *last < *first) return std::nullopt;
  if (out.size && *last >= *out.size) return std::nullopt;
  out.has_range = true;
  out.first = *first;
  out.last = *last;
  return out;
}

std::chrono::nanoseconds BackoffBound(int retry, std::chrono::milliseconds initial, std::chrono::milliseconds max) {
  // Doubling in floating point cannot overflow; min() brings it back in range.
  double bound = std::chrono::duration<double, std::nano>(initial).count() * std::pow(2.0, std::clamp(retry, 0, 1000));
  double cap = std::chrono::duration<double, std::nano>(max).count();
  return std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, std::min(bound, cap))));
}

void TransferCostModel::Add(uint64_t bytes, double seconds) {
  constexpr double kWeight = 0.1;  // of a new measurement
  MutexLock lock(mu_);
  if (bytes <= kSmallBytes) {
    latency_ = small_++ == 0 ? seconds : latency_ + kWeight * (seconds - latency_);
  } else if (bytes >= kLargeBytes) {
    const double moving = seconds - latency_;
    if (moving <= 0) return;
    const double bw = static_cast<double>(bytes) / moving;
    bandwidth_ = large_++ == 0 ? bw : bandwidth_ + kWeight * (bw - bandwidth_);
  }
}

uint64_t TransferCostModel::GapWorthReading() const {
  MutexLock lock(mu_);
  const double gap = latency_ * bandwidth_;
  return static_cast<uint64_t>(std::clamp(gap, 4096.0, 64.0 * (1 << 20)));
}

double TransferCostModel::latency() const {
  MutexLock lock(mu_);
  return latency_;
}

double TransferCostModel::bandwidth() const {
  MutexLock lock(mu_);
  return bandwidth_;
}

}  // namespace internal

}  // namespace meshload::sidecar::source
