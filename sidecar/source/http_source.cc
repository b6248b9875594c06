// The "http" and "https" sources: a dataset served over HTTP(S), read
// through the shared transport (http_transport.cc).

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "sidecar/source/http_internal.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {
namespace {

using internal::HttpUrl;

// Thread safety: thread-safe (HttpTransport is).
class HttpSource final : public Source {
 public:
  explicit HttpSource(const SourceOptions& options)
      : transport_(options, "http", {}), transport_tls_(options, "https", {}) {}

  Result<ObjectInfo> Stat(const std::string& uri) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, internal::ParseHttpUrl(uri));
    ObjectInfo info;
    MESHLOAD_RETURN_IF_ERROR(For(url).Stat(url, &info.size, &info.version));
    return info;
  }

  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, internal::ParseHttpUrl(uri));
    return For(url).ReadV(url, offset, iov);
  }

  Status ReadTo(const std::string& uri, uint64_t offset, uint64_t len, const Sink& sink) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, internal::ParseHttpUrl(uri));
    return For(url).ReadTo(url, offset, len, sink);
  }

  bool LatencyBound() const override { return true; }
  uint64_t GapWorthReading() const override {
    return std::max(transport_.GapWorthReading(), transport_tls_.GapWorthReading());
  }

 private:
  // Metrics and logs name the scheme the URL has.
  internal::HttpTransport& For(const HttpUrl& url) { return url.scheme == "https" ? transport_tls_ : transport_; }

  internal::HttpTransport transport_, transport_tls_;
};

Status ValidateOptions(const SourceOptions& o) {
  auto positive = [](std::chrono::milliseconds d, const char* field) {
    return d.count() > 0 ? Status::Ok()
                         : InvalidArgument("must be positive, got " + std::to_string(d.count()) + " ms", field);
  };
  MESHLOAD_RETURN_IF_ERROR(positive(o.connect_timeout, "connect_timeout"));
  MESHLOAD_RETURN_IF_ERROR(positive(o.read_timeout, "read_timeout"));
  MESHLOAD_RETURN_IF_ERROR(positive(o.write_timeout, "write_timeout"));
  if (o.max_attempts < 1) {
    return InvalidArgument("must be at least 1, got " + std::to_string(o.max_attempts), "max_attempts");
  }
  if (o.backoff_initial.count() < 0 || o.backoff_max.count() < 0) {
    return InvalidArgument("backoff_initial and backoff_max must not be negative", "backoff");
  }
  if (o.max_idle_connections < 0) {
    return InvalidArgument("must not be negative", "max_idle_connections");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Source>> MakeHttpSource(const SourceOptions& options) {
  MESHLOAD_RETURN_IF_ERROR(ValidateOptions(options));
  return std::unique_ptr<Source>(std::make_unique<HttpSource>(options));
}

}  // namespace meshload::sidecar::source
