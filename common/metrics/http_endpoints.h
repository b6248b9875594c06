/// \file
/// HealthServer: the HTTP endpoints every meshload process serves for
/// Prometheus and the kubelet.
///
///   GET /metrics  200, `text/plain; version=0.0.4; charset=utf-8`, the
///                 registry's Serialize() (collect hooks run per scrape)
///   GET /healthz  200 `ok` while the process can serve; 503 with the reason
///                 after SetHealthy(false, reason) (liveness: the kubelet
///                 restarts the container)
///   GET /readyz   200 `ready` when the readiness check says so, else 503 with
///                 the reason it gave (readiness: the pod leaves the Service)
///   GET /progress 200, `application/json`, the progress report's text, when
///                 HealthServerOptions::progress is set (the sidecar's; see
///                 sidecar/progress.h); 404 otherwise
///
/// HEAD is answered like GET without the body. Any other method on these
/// paths is 405 with `Allow: GET, HEAD`; any other path is 404, whatever
/// the method. Bodies other than /metrics and /progress are
/// `text/plain; charset=utf-8`.
///
///   HealthServer server(registry, [&] { return pool.Ready(); },
///                       {.bind_address = "0.0.0.0", .port = 9090});
///   MESHLOAD_ASSIGN_OR_RETURN(int port, server.Start());
///
/// Contract:
/// - Start() binds synchronously, so a busy port is an error from Start() (it
///   names the address), never a silent second listener: the socket does not
///   use SO_REUSEPORT. On success the server is accepting when Start()
///   returns.
/// - Requests are served by a small pool of worker threads owned by the
///   server; Stop() (and the destructor) joins all of them. A client that
///   keeps a connection open idle is dropped after 2 s and one that stalls
///   mid-request after 5 s, which bounds how long Stop() can take.
/// - Stop() may be called any number of times; Start() after Stop() serves
///   again (on a new ephemeral port when `port` is 0).
/// - httplib's server sets SIGPIPE to SIG_IGN for the whole process when
///   Start() creates it, so that a scraper hanging up mid-response cannot kill
///   the process; code that relies on SIGPIPE must not use this class.
/// - The registry and the readiness check must outlive the server. The check
///   runs on a worker thread for every /readyz request, concurrently with
///   other requests, so it must be thread-safe and fast (the kubelet's probe
///   timeout is 1 s by default).
///
/// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "common/metrics/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace meshload::metrics {

/// Returns {ready, reason}; the reason is the 503 body when not ready (e.g.
/// "waiting for the first plan").
using ReadinessCheck = std::function<std::pair<bool, std::string>()>;

struct HealthServerOptions {
  /// An IPv4 or IPv6 literal or a host name; "0.0.0.0" serves on every IPv4
  /// interface, as a pod needs for the kubelet and Prometheus to reach it.
  std::string bind_address = "0.0.0.0";
  /// 0 picks a free ephemeral port; Start() returns the one bound.
  int port = 0;
  /// GET /progress's body (a JSON document), made per request on a worker
  /// thread: must be thread-safe. Unset: /progress is 404.
  std::function<std::string()> progress;
};

/// Serves /metrics, /healthz and /readyz from a thread of its own.
///
/// Thread safety: thread-safe; Start(), Stop() and SetHealthy() may be called
/// from any thread, including concurrently with requests being served.
class HealthServer {
 public:
  /// A null `readiness` means always ready.
  HealthServer(const Registry& registry, ReadinessCheck readiness, HealthServerOptions options = {});
  /// Stops the server.
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  /// Binds and starts serving; returns the bound port. Errors:
  /// kFailedPrecondition when already running; kIoError, with location
  /// `address:port` (`[::1]:9090` for IPv6) and a message such as
  /// `cannot bind health server: Address already in use`, when the address
  /// cannot be bound (port in use, address not local or not resolvable,
  /// permission) or the listener fails to start.
  Result<int> Start() MESHLOAD_EXCLUDES(lifecycle_mu_);

  /// Stops accepting, finishes in-flight requests and joins every thread the
  /// server started. A no-op when not running.
  void Stop() MESHLOAD_EXCLUDES(lifecycle_mu_);

  /// Marks the process (un)healthy for /healthz; `reason` is the 503 body.
  /// For conditions a restart would cure (a wedged pipeline), not for
  /// transient ones, which belong in the readiness check.
  void SetHealthy(bool healthy, std::string reason = {}) MESHLOAD_EXCLUDES(health_mu_);

  /// True between a successful Start() and Stop().
  bool running() const MESHLOAD_EXCLUDES(lifecycle_mu_);
  /// The bound port while running, else 0.
  int port() const;

 private:
  // On a worker thread, for every request.
  void Handle(const httplib::Request& request, httplib::Response& response) const MESHLOAD_EXCLUDES(health_mu_);

  const Registry& registry_;
  const ReadinessCheck readiness_;
  const HealthServerOptions options_;

  mutable Mutex health_mu_;
  bool healthy_ MESHLOAD_GUARDED_BY(health_mu_) = true;
  std::string unhealthy_reason_ MESHLOAD_GUARDED_BY(health_mu_);

  // Held for the whole of Start() and Stop() (the listener thread never
  // takes it).
  mutable Mutex lifecycle_mu_;
  std::unique_ptr<httplib::Server> server_ MESHLOAD_GUARDED_BY(lifecycle_mu_);
  std::thread thread_ MESHLOAD_GUARDED_BY(lifecycle_mu_);
  // Written by the listener thread, read by Start().
  std::atomic<bool> listen_returned_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> port_{0};
};

}  // namespace meshload::metrics
