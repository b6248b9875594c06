// The HTTP transport shared by the http(s) and s3 sources
// (internal::HttpTransport, http_internal.h): ranged GETs streamed into the
// caller's iovecs, pooled keep-alive connections, and retries with jittered
// backoff; the scheme's hooks sign each attempt and explain error bodies.

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "sidecar/source/http_connection.h"
#include "sidecar/source/http_internal.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {
namespace {

using Clock = std::chrono::steady_clock;
using internal::ContentRange;
using internal::HttpConnection;
using internal::HttpIoError;
using internal::HttpIoResult;
using internal::HttpResponseHead;
using internal::HttpUrl;
using internal::IovCursor;
using internal::ParseContentRange;
using internal::ParseDecimal;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 300: return "Multiple Choices";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 410: return "Gone";
    case 412: return "Precondition Failed";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

std::string HttpStatusText(int status) {
  std::string text = "HTTP " + std::to_string(status);
  const char* phrase = ReasonPhrase(status);
  if (*phrase != '\0') {
    text += ' ';
    text += phrase;
  }
  return text;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// What one attempt came to. Statuses carry no location; the retry loop adds
// `url@offset` once.
struct Attempt {
  // kRefused: the destination (a sink) refused the bytes; its status is
  // the read's, as is (not the storage's error: no retry, no metric).
  enum class Kind { kOk, kRetry, kFail, kRefused };
  Kind kind = Kind::kOk;
  Status status;
  // kRetry: the OnRetry reason; kFail: the OnError kind. Always a literal.
  std::string_view label;
  // Retry-After from a 429/503, which replaces the jittered backoff.
  std::optional<std::chrono::milliseconds> retry_after;

  static Attempt Ok() { return {}; }
  static Attempt Retry(std::string_view reason, std::string message) {
    return {Kind::kRetry, Status(StatusCode::kUnavailable, std::move(message)), reason, {}};
  }
  static Attempt Fail(std::string_view kind, Status status) { return {Kind::kFail, std::move(status), kind, {}}; }
  static Attempt Refused(Status status) { return {Kind::kRefused, std::move(status), "", {}}; }
};

// What a small GET's callbacks record for its verdict: the response's status
// and Retry-After, and when the server last sent anything (for TimedOut).
struct ResponseProgress {
  int status = 0;
  std::string retry_after;
  Clock::time_point last = Clock::now();

  void OnResponse(const httplib::Response& res) {
    last = Clock::now();
    status = res.status;
    retry_after = res.get_header_value("Retry-After");
  }
  void OnData() { last = Clock::now(); }
};

Attempt DataLossAttempt(uint64_t offset, uint64_t len, uint64_t object_size) {
  return Attempt::Fail(
      "data_loss", DataLoss("short read: wanted " + std::to_string(len) + " bytes at offset " + std::to_string(offset) +
                            ", the object ends after " + std::to_string(object_size) + " bytes"));
}

// A response status that is neither the data we asked for nor 416, with
// what the server's error body says (`detail`, from HttpHooks::explain).
Attempt FromHttpStatus(int status, const std::string& retry_after, const internal::HttpErrorDetail& detail = {}) {
  std::string text = HttpStatusText(status);
  if (!detail.text.empty()) text += ": " + detail.text;
  if (status == 404 || status == 410) {
    return Attempt::Fail("not_found", NotFound(text + " (not retried)"));
  }
  if (status == 429 || status >= 500) {
    Attempt a = Attempt::Retry(detail.throttled ? "throttled" : status == 429 ? "http_429" : "http_5xx", text);
    if (status == 429 || status == 503) {
      // Only the delay-seconds form; an HTTP-date falls back to the backoff.
      if (std::optional<uint64_t> secs = ParseDecimal(retry_after)) {
        a.retry_after =
            std::chrono::milliseconds(std::min<uint64_t>(*secs, std::numeric_limits<int32_t>::max()) * 1000);
      }
    }
    return a;
  }
  if (status == 401 || status == 403 || status == 407) {
    // Credentials or permissions: the request is fine, the world is not.
    return Attempt::Fail("http_4xx", FailedPrecondition(text + " (not retried)"));
  }
  if (status >= 400) return Attempt::Fail("http_4xx", InvalidArgument(text + " (not retried)"));
  return Attempt::Fail("io", FailedPrecondition("unexpected " + text + " (redirects are not followed; not retried)"));
}

// httplib's own names for its errors are single words ("Connection").
std::string Describe(httplib::Error err) {
  using httplib::Error;
  switch (err) {
    case Error::Connection: return "cannot connect (refused, unreachable or unknown host)";
    case Error::Read: return "reading the response failed";
    case Error::Write: return "sending the request failed";
    case Error::SSLConnection: return "TLS handshake failed";
    case Error::SSLLoadingCerts: return "cannot load the CA certificates";
    case Error::SSLServerVerification: return "the server certificate did not verify";
    default: return "HTTP client error: " + httplib::to_string(err);
  }
}

// A request that produced no complete response.
Attempt FromTransportError(httplib::Error err, bool timed_out, bool body_started) {
  using httplib::Error;
  if (err == Error::SSLLoadingCerts || err == Error::SSLServerVerification) {
    // Retrying cannot fix a certificate; fail with something actionable.
    return Attempt::Fail("io", FailedPrecondition("TLS: " + Describe(err) + " (not retried)"));
  }
  if (err == Error::ConnectionTimeout) return Attempt::Retry("timeout", "connect timed out");
  if (timed_out) {
    return Attempt::Retry("timeout",
                          body_started ? "timed out reading the response body" : "timed out waiting for the response");
  }
  if (body_started) {
    return Attempt::Retry("short_body", "the connection ended before the whole body arrived (" + Describe(err) + ")");
  }
  return Attempt::Retry("connection", Describe(err));
}

// Idle keep-alive connections per origin (scheme://host:port): httplib
// clients, or plain HttpConnections. A request checks one out for its whole
// duration, so reader threads never share one; only a connection whose last
// exchange completed cleanly comes back. `*reused` tells a pooled one from
// a new one.
// Thread safety: thread-safe; connections are made and closed outside the
// lock.
template <typename Connection>
class IdlePool {
 public:
  using Ptr = std::unique_ptr<Connection>;
  using Maker = std::function<Result<Ptr>(const HttpUrl&)>;

  IdlePool(const SourceOptions& options, Maker make) : options_(options), make_(std::move(make)) {}

  Result<Ptr> Checkout(const HttpUrl& url, bool* reused = nullptr) MESHLOAD_EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      auto it = idle_.find(url.origin);
      if (it != idle_.end() && !it->second.empty()) {
        Ptr connection = std::move(it->second.back());
        it->second.pop_back();
        if (reused != nullptr) *reused = true;
        return connection;
      }
    }
    if (reused != nullptr) *reused = false;
    return make_(url);
  }

  void Return(const HttpUrl& url, Ptr connection) MESHLOAD_EXCLUDES(mu_) {
    Ptr surplus;  // declared before the lock: closed after it is released
    MutexLock lock(mu_);
    std::vector<Ptr>& idle = idle_[url.origin];
    if (idle.size() < static_cast<size_t>(options_.max_idle_connections)) {
      idle.push_back(std::move(connection));
    } else {
      surplus = std::move(connection);
    }
  }

 private:
  const SourceOptions& options_;
  const Maker make_;
  Mutex mu_;
  std::unordered_map<std::string, std::vector<Ptr>> idle_ MESHLOAD_GUARDED_BY(mu_);
};

using ClientPtr = std::unique_ptr<httplib::Client>;

Result<ClientPtr> MakeClient(const SourceOptions& options, const HttpUrl& url) {
  auto client = std::make_unique<httplib::Client>(url.origin);
  if (!client->is_valid()) {
    return FailedPrecondition("cannot create an HTTP client for " + url.origin, url.redacted);
  }
  client->set_keep_alive(true);
  client->set_tcp_nodelay(true);
  // The URL is sent exactly as given: re-encoding would break signatures.
  client->set_url_encode(false);
  client->set_decompress(false);
  client->set_follow_location(false);
  client->set_connection_timeout(options.connect_timeout);
  client->set_read_timeout(options.read_timeout);
  client->set_write_timeout(options.write_timeout);
  if (url.scheme == "https") {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
    client->enable_server_certificate_verification(options.verify_tls);
    if (!options.ca_file.empty()) client->set_ca_cert_path(options.ca_file);
#else
    return FailedPrecondition("https needs cpp-httplib built with OpenSSL support", url.redacted);
#endif
  }
  return client;
}

// What an HttpConnection's failure comes to; `body_started`: some of the
// data had arrived.
Attempt FromIo(const HttpIoResult& r, bool body_started) {
  switch (r.error) {
    case HttpIoError::kTimeout:
      return Attempt::Retry(
          "timeout", body_started ? "timed out reading the response body" : "timed out waiting for the response");
    case HttpIoError::kClosed:
      if (body_started) {
        return Attempt::Retry("short_body", "the connection ended before the whole body arrived (" + r.message + ")");
      }
      return Attempt::Retry("connection", r.message);
    case HttpIoError::kMalformed: return Attempt::Retry("connection", "a malformed response: " + r.message);
    case HttpIoError::kRefused: return Attempt::Refused(Status(StatusCode::kIoError, r.message));
    case HttpIoError::kNone: break;
  }
  return Attempt::Ok();
}

// What a ranged GET's response head decides, whichever client read it: the
// body is our bytes (to_iov); or a verdict from the head alone (`stop`: do
// not read the body); or neither, an error status whose body explains it.
struct RangeHeadVerdict {
  bool to_iov = false;
  bool stop = false;
  std::optional<Attempt> verdict;
  std::string retry_after;
};

RangeHeadVerdict JudgeRangeHead(int status, const std::function<std::string(const char*)>& header, uint64_t offset,
                                uint64_t len, uint64_t from) {
  RangeHeadVerdict v;
  const uint64_t last_byte = offset + len - 1;
  auto stop = [&](Attempt a) {
    v.verdict = std::move(a);
    v.stop = true;
    return v;
  };
  std::string encoding = header("Content-Encoding");
  if (!encoding.empty() && !EqualsIgnoreCase(encoding, "identity") && status / 100 == 2) {
    return stop(Attempt::Fail(
        "io", FailedPrecondition("the server applied Content-Encoding " + encoding + " to a byte range")));
  }
  if (status == 206) {
    std::optional<ContentRange> range = ParseContentRange(header("Content-Range"));
    if (!range || !range->has_range) {
      return stop(Attempt::Fail("io", FailedPrecondition("HTTP 206 without a usable Content-Range header (\"" +
                                                         header("Content-Range") + "\")")));
    }
    if (range->first != from) {
      return stop(Attempt::Fail("io", FailedPrecondition("HTTP 206 for bytes " + std::to_string(range->first) + "-" +
                                                         std::to_string(range->last) + ", asked for bytes " +
                                                         std::to_string(from) + "-" + std::to_string(last_byte))));
    }
    if (range->size && *range->size < offset + len) return stop(DataLossAttempt(offset, len, *range->size));
    v.to_iov = true;
    return v;
  }
  if (status == 200) {
    // The server ignored Range. From offset 0 the body starts with our
    // bytes; anywhere else we would have to download and drop a prefix.
    if (from != 0) {
      return stop(Attempt::Fail("io", FailedPrecondition("the server ignored the Range header (HTTP 200 for a "
                                                         "read at offset " +
                                                         std::to_string(from) + ")")));
    }
    if (std::optional<uint64_t> size = ParseDecimal(header("Content-Length")); size && *size < len) {
      return stop(DataLossAttempt(offset, len, *size));
    }
    v.to_iov = true;
    return v;
  }
  if (status == 416) {
    std::optional<ContentRange> range = ParseContentRange(header("Content-Range"));
    v.verdict =
        range && range->size
            ? DataLossAttempt(offset, len, *range->size)
            : Attempt::Fail("data_loss", DataLoss("HTTP 416 Range Not Satisfiable: wanted " + std::to_string(len) +
                                                  " bytes at offset " + std::to_string(offset)));
  }
  v.retry_after = header("Retry-After");
  return v;  // the (small) error body is read, so the connection stays usable
}

}  // namespace

// Thread safety: thread-safe; per-request state lives on the caller's stack
// and each request has a Client of its own.
class internal::HttpTransport::Impl {
 public:
  Impl(const SourceOptions& options, std::string scheme, HttpHooks hooks)
      : options_(options),
        observer_(options.observer != nullptr ? options.observer : &NullObserver()),
        scheme_(std::move(scheme)),
        hooks_(std::move(hooks)),
        pool_(options_, [this](const HttpUrl& url) { return MakeClient(options_, url); }),
        plain_pool_(options_, [this](const HttpUrl& url) -> Result<std::unique_ptr<HttpConnection>> {
          HttpConnection::Timeouts t;
          t.connect = options_.connect_timeout;
          t.read = options_.read_timeout;
          t.write = options_.write_timeout;
          return HttpConnection::Connect(url.origin, t);
        }) {}

  Status Stat(const HttpUrl& url, uint64_t* size, std::string* etag) {
    return WithRetries(url, url.redacted, [&] { return StatAttempt(url, size, etag); });
  }

  Status ReadV(const HttpUrl& url, uint64_t offset, const std::vector<iovec>& iov) {
    uint64_t len = 0;
    for (const iovec& v : iov) len += v.iov_len;
    return Read(url, offset, len, IovCursor(iov));
  }

  Status ReadTo(const HttpUrl& url, uint64_t offset, uint64_t len, const Source::Sink& sink) {
    // The body lands in this buffer (one per thread, kept), then the sink
    // takes it: a few hundred KiB at a time stay in the CPU's cache
    // between the socket's copy and the sink's.
    thread_local std::unique_ptr<uint8_t[]> buffer(new uint8_t[kSinkBufferBytes]);
    return Read(url, offset, len, IovCursor(sink, buffer.get(), kSinkBufferBytes));
  }

  uint64_t GapWorthReading() const { return cost_.GapWorthReading(); }

  Status GetBody(const HttpUrl& url, std::string* body, uint64_t limit) {
    return WithRetries(url, url.redacted, [&] { return BodyAttempt(url, body, limit); });
  }

 private:
  static constexpr size_t kSinkBufferBytes = 256 << 10;

  // `dest`: where the read's bytes go, a cursor at its start; each attempt
  // copies it and moves past what earlier attempts delivered.
  Status Read(const HttpUrl& url, uint64_t offset, uint64_t len, const IovCursor& dest) {
    const auto start = Clock::now();
    std::string location = url.redacted + "@" + std::to_string(offset);
    if (len == 0) return Status::Ok();
    if (len - 1 > std::numeric_limits<uint64_t>::max() - offset) {
      return InvalidArgument("range of " + std::to_string(len) + " bytes overflows", location);
    }
    // A 206 body cut short leaves its bytes in place: the next attempt asks
    // for the rest only.
    uint64_t done = 0;
    int attempts = 0;
    MESHLOAD_RETURN_IF_ERROR(WithRetries(url, location, [&] {
      ++attempts;
      return ReadAttempt(url, offset, len, dest, done);
    }));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    observer_->OnRead(scheme_, len, seconds);
    if (attempts == 1) cost_.Add(len, seconds);  // a retried read's time is its backoff's too
    return Status::Ok();
  }

  // The request's headers: `base`, and the hook's authentication.
  httplib::Headers Headers(std::string_view method, const HttpUrl& url, httplib::Headers base) const {
    if (hooks_.sign) hooks_.sign(method, url, base);
    return base;
  }
  internal::HttpErrorDetail Explain(int status, const std::string& body) const {
    return hooks_.explain ? hooks_.explain(status, body) : internal::HttpErrorDetail{};
  }

  // A whole (small) response body: a listing.
  Attempt BodyAttempt(const HttpUrl& url, std::string* body, uint64_t limit) {
    auto checkout = pool_.Checkout(url);
    if (!checkout.ok()) return Attempt::Fail("io", checkout.status());
    ClientPtr client = std::move(checkout).value();
    body->clear();
    bool too_long = false;
    ResponseProgress progress;
    auto on_response = [&](const httplib::Response& res) {
      progress.OnResponse(res);
      return true;
    };
    auto on_data = [&](const char* data, size_t n) {
      progress.OnData();
      if (body->size() + n > limit) {
        too_long = true;
        return false;
      }
      body->append(data, n);
      return true;
    };
    httplib::Result res =
        client->Get(url.target, Headers("GET", url, {{"Accept-Encoding", "identity"}}), on_response, on_data);
    const bool clean = res.error() == httplib::Error::Success;
    if (too_long) {
      return Attempt::Fail("io", FailedPrecondition("the response is longer than " + std::to_string(limit) + " bytes"));
    }
    if (!clean) return FromTransportError(res.error(), TimedOut(progress.last), false);
    pool_.Return(url, std::move(client));
    if (progress.status == 200) return Attempt::Ok();
    return FromHttpStatus(progress.status, progress.retry_after, Explain(progress.status, *body));
  }

  template <typename AttemptFn>
  Status WithRetries(const HttpUrl& /*url*/, const std::string& location, AttemptFn&& attempt) {
    const int max_attempts = std::max(1, options_.max_attempts);
    Attempt last;
    for (int i = 0; i < max_attempts; ++i) {
      last = attempt();
      if (last.kind == Attempt::Kind::kOk) return Status::Ok();
      if (last.kind == Attempt::Kind::kRefused) return last.status;
      if (last.kind == Attempt::Kind::kFail) {
        observer_->OnError(scheme_, last.label);
        return Status(last.status.code(), last.status.message(), location);
      }
      if (i + 1 == max_attempts) break;
      observer_->OnRetry(scheme_, last.label);
      std::chrono::nanoseconds delay = Backoff(i, last.retry_after);
      LogDebug("source: retrying a storage request",
               {{"location", location},
                {"attempt", i + 1},
                {"reason", last.label},
                {"error", last.status.message()},
                {"delay_ms", std::chrono::duration<double, std::milli>(delay).count()}});
      std::this_thread::sleep_for(delay);
    }
    observer_->OnError(scheme_, "retries_exhausted");
    return Status(StatusCode::kUnavailable,
                  "giving up after " + std::to_string(max_attempts) +
                      (max_attempts == 1 ? " attempt: " : " attempts: ") + last.status.message(),
                  location);
  }

  std::chrono::nanoseconds Backoff(int retry, std::optional<std::chrono::milliseconds> hint) {
    if (hint) return std::min<std::chrono::nanoseconds>(*hint, options_.backoff_max);
    // Full jitter: concurrent readers that failed together spread out.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    auto bound = internal::BackoffBound(retry, options_.backoff_initial, options_.backoff_max);
    std::uniform_int_distribution<int64_t> pick(0, bound.count());
    return std::chrono::nanoseconds(pick(rng));
  }

  // A read error counts as a timeout when nothing arrived for (about) the
  // read timeout; httplib reports both as Error::Read.
  bool TimedOut(Clock::time_point last_progress) const {
    return Clock::now() - last_progress >= options_.read_timeout * 9 / 10;
  }

  // Reads bytes [offset + done, offset + len) into dest (from byte `done`
  // of it) and advances `done` by what a 206 delivered, even on failure.
  Attempt ReadAttempt(const HttpUrl& url, uint64_t offset, uint64_t len, const IovCursor& dest, uint64_t& done) {
    if (url.scheme == "http") return PlainReadAttempt(url, offset, len, dest, done);
    auto checkout = pool_.Checkout(url);
    if (!checkout.ok()) return Attempt::Fail("io", checkout.status());
    ClientPtr client = std::move(checkout).value();

    const uint64_t from = offset + done;
    const httplib::Headers headers = RangeHeaders(url, from, offset + len - 1);
    std::string error_body;  // the start of an error response's body, for Explain
    int status = 0;
    RangeHeadVerdict head;
    bool overflow = false;  // the server sent more than asked; we stopped reading
    uint64_t received = done;
    IovCursor writer = dest;
    writer.Advance(done);
    Clock::time_point last_progress = Clock::now();

    auto on_response = [&](const httplib::Response& res) {
      last_progress = Clock::now();
      status = res.status;
      head = JudgeRangeHead(
          status, [&](const char* name) { return res.get_header_value(name); }, offset, len, from);
      return !head.stop;
    };
    auto on_data = [&](const char* data, size_t n) {
      last_progress = Clock::now();
      if (!head.to_iov) {
        AppendErrorBody(error_body, data, n);
        return true;
      }
      size_t take = static_cast<size_t>(std::min<uint64_t>(n, len - received));
      if (!writer.Write(data, take)) return false;
      received += take;
      if (take < n) {
        overflow = true;
        return false;
      }
      return true;
    };

    httplib::Result res = client->Get(url.target, headers, on_response, on_data);
    const bool clean = res.error() == httplib::Error::Success;
    if (head.to_iov && status == 206) done = received;  // kept for the next attempt
    if (!writer.sink_status().ok()) return Attempt::Refused(writer.sink_status());
    // Only a connection whose exchange finished cleanly is reused.
    auto give_back = [&] {
      if (clean) pool_.Return(url, std::move(client));
    };

    if (head.verdict) {
      give_back();
      return *head.verdict;
    }
    if (head.to_iov && received == len && (clean || overflow)) {
      give_back();
      return Attempt::Ok();
    }
    if (!clean) return FromTransportError(res.error(), TimedOut(last_progress), head.to_iov);
    give_back();
    return AfterCompleteBody(status, head, offset, len, received, error_body);
  }

  // ReadAttempt over plain http: the body goes straight from the socket into
  // the iovecs (HttpConnection).
  Attempt PlainReadAttempt(const HttpUrl& url, uint64_t offset, uint64_t len, const IovCursor& dest, uint64_t& done) {
    const uint64_t from = offset + done;
    const httplib::Headers headers = RangeHeaders(url, from, offset + len - 1);
    for (;;) {
      bool reused = false;
      auto checkout = plain_pool_.Checkout(url, &reused);
      if (!checkout.ok()) {
        const Status& st = checkout.status();
        if (st.code() == StatusCode::kDeadlineExceeded) return Attempt::Retry("timeout", "connect timed out");
        if (st.code() == StatusCode::kUnavailable) return Attempt::Retry("connection", st.message());
        return Attempt::Fail("io", st);
      }
      std::unique_ptr<HttpConnection> conn = std::move(checkout).value();
      if (reused && !conn->Reusable()) continue;  // the server closed it while it was idle

      HttpResponseHead response;
      bool got_bytes = false;
      HttpIoResult r = conn->SendGet(url.target, headers);
      if (r.ok()) r = conn->ReadHead(&response, &got_bytes);
      if (!r.ok()) {
        // A pooled connection the server closed as the request went out:
        // once more on a new one (nothing was received, a GET is safe to repeat).
        if (reused && !got_bytes && r.error == HttpIoError::kClosed) continue;
        return FromIo(r, false);
      }
      RangeHeadVerdict head = JudgeRangeHead(
          response.status, [&](const char* name) { return response.Header(name); }, offset, len, from);
      if (head.stop) return *head.verdict;

      auto give_back = [&] {
        if (conn->Reusable()) plain_pool_.Return(url, std::move(conn));
      };
      if (head.to_iov) {
        IovCursor writer = dest;
        writer.Advance(done);
        uint64_t received = done;
        bool overflow = false;
        if (response.content_length && !response.chunked) {
          uint64_t got = 0;
          r = conn->ReadBodyInto(response, len - done, writer, &got);
          received += got;
          overflow = *response.content_length > len - done;
        } else {
          r = conn->ReadBody(response, std::numeric_limits<uint64_t>::max(), [&](const char* data, size_t n) {
            const size_t take = static_cast<size_t>(std::min<uint64_t>(n, len - received));
            if (!writer.Write(data, take)) return false;
            received += take;
            overflow = take < n;
            return !overflow;
          });
        }
        if (response.status == 206) done = received;  // kept for the next attempt
        if (!writer.sink_status().ok()) return Attempt::Refused(writer.sink_status());
        if (received == len && r.ok()) {
          if (!overflow) give_back();
          return Attempt::Ok();
        }
        if (!r.ok()) return FromIo(r, true);
        give_back();
        return AfterCompleteBody(response.status, head, offset, len, received, "");
      }
      std::string error_body;
      r = conn->ReadBody(response, kErrorDrainLimit, [&](const char* data, size_t n) {
        AppendErrorBody(error_body, data, n);
        return true;
      });
      if (head.verdict) {
        if (r.ok()) give_back();
        return *head.verdict;
      }
      if (!r.ok()) return FromIo(r, false);
      give_back();
      return AfterCompleteBody(response.status, head, offset, len, len, error_body);
    }
  }

  httplib::Headers RangeHeaders(const HttpUrl& url, uint64_t from, uint64_t last_byte) const {
    return Headers("GET", url,
                   {
                       {"Range", "bytes=" + std::to_string(from) + "-" + std::to_string(last_byte)},
                       // Byte ranges of the stored representation, never of a compressed one.
                       {"Accept-Encoding", "identity"},
                   });
  }

  static void AppendErrorBody(std::string& body, const char* data, size_t n) {
    if (body.size() < kErrorBodyLimit) body.append(data, std::min(n, kErrorBodyLimit - body.size()));
  }

  // A ranged GET whose response arrived whole without delivering our bytes:
  // a body of data shorter than asked, or an error status.
  Attempt AfterCompleteBody(int status, const RangeHeadVerdict& head, uint64_t offset, uint64_t len, uint64_t received,
                            const std::string& error_body) const {
    if (head.to_iov && status == 200) {
      // A complete 200 body is the whole object, so the object is this short.
      return DataLossAttempt(offset, len, received);
    }
    if (head.to_iov) {
      return Attempt::Retry("short_body",
                            "short body: got " + std::to_string(received) + " of " + std::to_string(len) + " bytes");
    }
    return FromHttpStatus(status, head.retry_after, Explain(status, error_body));
  }

  Attempt StatAttempt(const HttpUrl& url, uint64_t* size, std::string* etag) {
    auto checkout = pool_.Checkout(url);
    if (!checkout.ok()) return Attempt::Fail("io", checkout.status());
    ClientPtr client = std::move(checkout).value();

    const Clock::time_point start = Clock::now();
    httplib::Result res = client->Head(url.target, Headers("HEAD", url, {{"Accept-Encoding", "identity"}}));
    if (res.error() != httplib::Error::Success) {
      return FromTransportError(res.error(), TimedOut(start), false);
    }
    const int status = res->status;
    std::optional<uint64_t> length = ParseDecimal(res->get_header_value("Content-Length"));
    std::string retry_after = res->get_header_value("Retry-After");
    if (etag != nullptr) *etag = res->get_header_value("ETag");
    pool_.Return(url, std::move(client));
    // A presigned URL is signed for one method, so a GET-signed URL answers
    // HEAD with 403; some servers do not allow HEAD at all (405).
    if ((status == 403 || status == 405) && !hooks_.sign) return ProbeSize(url, size);
    if (status / 100 != 2) return FromHttpStatus(status, retry_after, Explain(status, ""));
    if (length) {
      *size = *length;
      return Attempt::Ok();
    }
    return ProbeSize(url, size);
  }

  // HEAD gave no Content-Length (e.g. a chunked response) or was refused: ask
  // for one byte and read the size from Content-Range.
  Attempt ProbeSize(const HttpUrl& url, uint64_t* size) {
    auto checkout = pool_.Checkout(url);
    if (!checkout.ok()) return Attempt::Fail("io", checkout.status());
    ClientPtr client = std::move(checkout).value();

    std::optional<uint64_t> found;
    ResponseProgress progress;
    auto on_response = [&](const httplib::Response& res) {
      progress.OnResponse(res);
      const int status = res.status;
      if (status == 206 || status == 416) {
        std::optional<ContentRange> range = ParseContentRange(res.get_header_value("Content-Range"));
        if (range) found = range->size;
        return true;
      }
      if (status == 200) {
        // Range ignored: the length of the whole body is the size; do not download it.
        found = ParseDecimal(res.get_header_value("Content-Length"));
        return false;
      }
      return true;
    };
    auto on_data = [&](const char*, size_t) {
      progress.OnData();
      return true;
    };
    httplib::Result res =
        client->Get(url.target, Headers("GET", url, {{"Range", "bytes=0-0"}, {"Accept-Encoding", "identity"}}),
                    on_response, on_data);
    const bool clean = res.error() == httplib::Error::Success;
    if (clean) pool_.Return(url, std::move(client));
    if (found) {
      *size = *found;
      return Attempt::Ok();
    }
    const int status = progress.status;
    if (status == 200 || status == 206 || status == 416) {
      return Attempt::Fail("io", FailedPrecondition("the server reports no object size (no Content-Length on "
                                                    "HEAD, no Content-Range on a ranged GET)"));
    }
    if (!clean) return FromTransportError(res.error(), TimedOut(progress.last), false);
    return FromHttpStatus(status, progress.retry_after);
  }

  static constexpr size_t kErrorBodyLimit = 8192;
  // An error body longer than this is not read to its end; its connection closes.
  static constexpr uint64_t kErrorDrainLimit = 1 << 20;

  const SourceOptions options_;
  SourceObserver* const observer_;
  const std::string scheme_;
  const HttpHooks hooks_;
  IdlePool<httplib::Client> pool_;       // HEADs, listings, and https
  IdlePool<HttpConnection> plain_pool_;  // ranged GETs over http
  TransferCostModel cost_;
};

namespace internal {

HttpTransport::HttpTransport(const SourceOptions& options, std::string scheme, HttpHooks hooks)
    : impl_(std::make_unique<Impl>(options, std::move(scheme), std::move(hooks))) {}
HttpTransport::~HttpTransport() = default;
uint64_t HttpTransport::GapWorthReading() const { return impl_->GapWorthReading(); }

Status HttpTransport::Stat(const HttpUrl& url, uint64_t* size, std::string* etag) {
  return impl_->Stat(url, size, etag);
}
Status HttpTransport::ReadV(const HttpUrl& url, uint64_t offset, const std::vector<iovec>& iov) {
  return impl_->ReadV(url, offset, iov);
}
Status HttpTransport::ReadTo(const HttpUrl& url, uint64_t offset, uint64_t len, const Source::Sink& sink) {
  return impl_->ReadTo(url, offset, len, sink);
}
Status HttpTransport::GetBody(const HttpUrl& url, std::string* body, uint64_t limit) {
  return impl_->GetBody(url, body, limit);
}

}  // namespace internal

}  // namespace meshload::sidecar::source
