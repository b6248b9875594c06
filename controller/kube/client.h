/// \file
/// KubeClient: a small Kubernetes REST client over cpp-httplib + OpenSSL.
///
///   MESHLOAD_ASSIGN_OR_RETURN(auto client, KubeClient::Create(config, {.qps = 20, .burst = 30}));
///   ApiResponse r = client->Get("/api/v1/namespaces/default/pods/trainer-0");
///   if (r.code == 404) ...; if (!r.ok()) return r.ToStatus("get pod");
///
/// Contract:
/// - Requests pass a client-side token bucket (`qps`, `burst`; qps <= 0: no
///   limit), as client-go's does, so a controller cannot flood the server.
/// - 429 is retried after the server's Retry-After (capped), 5xx (500, 502,
///   503, 504) and transport errors (refused, reset, timeout) with
///   exponential backoff and full jitter, up to `max_attempts` in all. Other
///   codes are returned at once: the caller decides (404, 409, 410, 422 are
///   answers, not failures). A POST that failed with a 5xx may have been
///   applied; callers treat AlreadyExists on the retry as success.
/// - Authentication: bearer token (a token file is re-read when it changes,
///   since projected service-account tokens rotate), or a client
///   certificate; TLS verified against the configured CA unless
///   insecure-skip-tls-verify.
/// - Watch() streams newline-delimited watch events to a callback until the
///   server ends the stream, the callback returns false, or CancelWatch()
///   is called from another thread; Shutdown() cancels every watch and
///   wakes every backoff sleep.
/// - Every attempt is reported to `observer` with a bounded verb label (GET,
///   LIST, WATCH, POST, PUT, PATCH, DELETE) and the code ("0" for a
///   transport error), for the `meshload_controller_api_requests_total` metric.
///
/// Thread safety: all methods are thread-safe; each request uses a
/// connection of its own from a pool of keep-alive connections.
///
/// The process must ignore SIGPIPE (meshload-controller's main does): a
/// TLS write to a connection the server has closed raises it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/kube/config.h"

namespace httplib {
class ClientImpl;
}

namespace meshload::controller::kube {

struct ClientOptions {
  double qps = 20;
  int burst = 30;
  int max_attempts = 5;
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds backoff_cap{8000};
  std::chrono::seconds max_retry_after{30};
  std::chrono::seconds request_timeout{30};
  std::chrono::seconds connect_timeout{5};
  std::string user_agent = "meshload-controller";
  /// Called after every attempt: (verb, HTTP code or 0 for a transport error).
  std::function<void(std::string_view verb, int code)> observer{};
};

/// An answer from the server, or a transport failure (code 0, `error` set).
struct ApiResponse {
  int code = 0;
  nlohmann::json body;  // the object, list or Status (null when the body is not JSON)
  std::string error;    // transport error text when code == 0
  int attempts = 0;

  bool ok() const { return code >= 200 && code < 300; }
  /// The Status reason ("NotFound", "Conflict", "AlreadyExists", "Expired", ...).
  std::string reason() const;
  /// The server's message, or the transport error.
  std::string message() const;
  /// A Status for logs and conditions: "what: 409 Conflict: message".
  Status ToStatus(std::string_view what) const;
};

/// A token bucket: `burst` tokens, refilled at `qps` per second.
/// Thread safety: thread-safe.
class RateLimiter {
 public:
  RateLimiter(double qps, int burst);
  /// Blocks until a token is available; false when `stop` becomes true first.
  bool Acquire(const std::atomic<bool>& stop) MESHLOAD_EXCLUDES(mu_);

 private:
  Mutex mu_;
  // Set by the constructor, read-only after.
  double qps_;
  double burst_;
  double tokens_ MESHLOAD_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_ MESHLOAD_GUARDED_BY(mu_);
};

class KubeClient {
 public:
  static Result<std::unique_ptr<KubeClient>> Create(ClusterConfig config, ClientOptions options = {});
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  /// `path` includes the query ("?limit=500&labelSelector=..."); values must
  /// be escaped with QueryEscape.
  ApiResponse Get(const std::string& path);
  ApiResponse Post(const std::string& path, const nlohmann::json& body);
  ApiResponse Put(const std::string& path, const nlohmann::json& body);
  ApiResponse Patch(const std::string& path, const nlohmann::json& body,
                    std::string_view content_type = "application/merge-patch+json");
  ApiResponse Delete(const std::string& path, const nlohmann::json& body = nullptr);

  /// A watch stream. `path` carries `watch=true` and the other parameters.
  /// Each decoded event object goes to `on_event`; return false to stop.
  /// Returns OK when the server ended the stream or the callback stopped it,
  /// kCancelled after CancelWatch/Shutdown, an error on transport failure or
  /// a non-200 answer (`*code` receives the HTTP code, 0 for transport).
  Status Watch(const std::string& path, const std::function<bool(nlohmann::json&)>& on_event, uint64_t watch_id,
               int* code = nullptr) MESHLOAD_EXCLUDES(mu_);
  uint64_t NewWatchId() MESHLOAD_EXCLUDES(mu_);
  void CancelWatch(uint64_t watch_id) MESHLOAD_EXCLUDES(mu_);

  /// Cancels every watch and backoff sleep; later calls fail at once.
  void Shutdown() MESHLOAD_EXCLUDES(mu_);
  bool shutting_down() const { return stopping_.load(); }

  const ClusterConfig& config() const { return config_; }

 private:
  KubeClient(ClusterConfig config, ClientOptions options);
  Status Init();
  ApiResponse Call(std::string_view method, const std::string& path, const std::string& body,
                   std::string_view content_type) MESHLOAD_EXCLUDES(mu_);
  Result<std::unique_ptr<httplib::ClientImpl>> NewConnection(std::chrono::seconds read_timeout);
  /// A pooled keep-alive connection (*pooled = true) or a new one.
  std::unique_ptr<httplib::ClientImpl> TakeConnection(bool* pooled) MESHLOAD_EXCLUDES(mu_);
  void ReturnConnection(std::unique_ptr<httplib::ClientImpl> c) MESHLOAD_EXCLUDES(mu_);
  std::string AuthorizationHeader() MESHLOAD_EXCLUDES(mu_);
  /// Sleeps `d` unless Shutdown() comes first (then false).
  bool Sleep(std::chrono::milliseconds d) MESHLOAD_EXCLUDES(mu_);
  std::chrono::milliseconds Backoff(int attempt);

  // Set by the constructor and Init() (before Create returns), read-only after.
  ClusterConfig config_;
  ClientOptions options_;
  std::string scheme_, host_;
  int port_ = 0;
  RateLimiter limiter_;
  std::atomic<bool> stopping_{false};

  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<httplib::ClientImpl>> idle_ MESHLOAD_GUARDED_BY(mu_);
  // Active watch connections: the map is guarded, the connections are used
  // by their Watch() call without the lock (stop() from another thread is
  // what cpp-httplib allows).
  std::map<uint64_t, httplib::ClientImpl*> watches_ MESHLOAD_GUARDED_BY(mu_);
  std::vector<uint64_t> cancelled_watches_ MESHLOAD_GUARDED_BY(mu_);
  uint64_t next_watch_id_ MESHLOAD_GUARDED_BY(mu_) = 1;
  std::string token_ MESHLOAD_GUARDED_BY(mu_);  // from token_file, re-read when its mtime changes
  int64_t token_mtime_ns_ MESHLOAD_GUARDED_BY(mu_) = -1;
};

/// Percent-encodes a query parameter value.
std::string QueryEscape(std::string_view s);

/// The time now as Kubernetes writes it in timestamps ("2026-11-22T04:47:29Z").
std::string NowRfc3339();

/// At most `max_bytes` of `s` (then "..." when cut), cut at a UTF-8
/// character boundary: the JSON writer refuses a split character.
std::string CutUtf8(const std::string& s, size_t max_bytes);

/// The verb label for a request: LIST and WATCH are GETs on collections.
std::string_view VerbLabel(std::string_view method, const std::string& path);

}  // namespace meshload::controller::kube
