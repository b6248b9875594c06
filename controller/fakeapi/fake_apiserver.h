/// \file
/// FakeApiServer: an in-memory Kubernetes API server for controller tests.
///
/// It speaks the REST API (JSON) over plain HTTP on 127.0.0.1 for core/v1
/// namespaces, pods, configmaps, secrets and events, coordination.k8s.io/v1 leases,
/// apiextensions.k8s.io/v1 CRDs and the custom resources they define, with
/// the semantics a controller depends on: resourceVersion conflicts, the
/// status subresource, generation, finalizers, merge patch, selectors,
/// paging, and watches with history, bookmarks and 410 Gone (see store.h for
/// the full contract). What a real server rejects, this one rejects too, so a
/// controller that passes against it has not been forgiven anything.
///
/// It also serves what the real `kubectl` needs (tests/controller/
/// kubectl_test.sh): legacy discovery and a minimal OpenAPI generated from
/// the registry (discovery.h), Tables for `kubectl get`, strategic merge
/// patch (simplified) and JSON patch for `kubectl apply`/`patch`.
///
/// The C++ test hooks (not reachable over HTTP) inject faults, count writes
/// and count requests by method and resource, so tests can check retry
/// behaviour, write amplification and what a client touched.
///
/// Thread safety: all methods are thread-safe. Start() and Stop() may each be
/// called once; the destructor calls Stop().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/test_pki.h"

namespace meshload::fakeapi {

struct FakeApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port, read it back with port()
  // Events kept for watch replay and paged lists; older RVs are 410 Gone.
  size_t history_limit = 200;
  std::chrono::milliseconds bookmark_interval{1000};
  // Each open watch holds a worker thread for its lifetime.
  int worker_threads = 64;
  // HTTPS with a CA and server certificate made at Start() (ca_pem());
  // clients may present a certificate signed by that CA (MakeClientCert).
  bool tls = false;
  // When not empty, every request must authenticate, as on a real server:
  // `Authorization: Bearer <one of these>` or (with tls) a client
  // certificate from MakeClientCert. Otherwise: 401 Unauthorized.
  std::vector<std::string> bearer_tokens;
};

class FakeApiServer {
 public:
  explicit FakeApiServer(FakeApiServerOptions options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  /// Binds and starts serving on a background thread; returns once the port
  /// accepts connections.
  Status Start();
  /// Ends open watches, stops serving and joins the server thread. Idempotent.
  void Stop();

  int port() const;
  /// "http://127.0.0.1:PORT", or https:// with options.tls.
  std::string url() const;
  /// The PEM of the CA that signed the server's certificate (empty without
  /// TLS): what a kubeconfig's certificate-authority-data carries.
  std::string ca_pem() const;
  /// A client certificate for `user` (group system:masters) that the server
  /// accepts; FailedPrecondition without TLS.
  Result<pki::CertAndKey> MakeClientCert(const std::string& user) const;

  // ---- test hooks --------------------------------------------------------
  /// Ends every open watch stream cleanly; clients must re-watch.
  void CloseAllWatches();
  /// Watches the server has begun (a client's watch counts once the server
  /// holds it, so CloseAllWatches() after this sees it).
  uint64_t WatchesBegun() const;
  /// Answers the next `count` requests whose path starts with `path_prefix`
  /// with `status_code` and a real `Status` body; a positive
  /// `retry_after_seconds` adds a Retry-After header (as a real 429 carries).
  void InjectErrors(std::string path_prefix, int status_code, int count,
                    int retry_after_seconds = 0);
  /// Injected errors not yet answered.
  int InjectedErrorsPending() const;
  /// Drops every injected error not yet answered.
  void ClearInjectedErrors();
  /// Delays every request by `latency` before it is handled.
  void SetLatency(std::chrono::milliseconds latency);
  /// Successful (2xx) create/update/patch/delete requests: all of them when
  /// `resource` is empty, else those on one resource named as in Status
  /// messages ("pods", "leases.coordination.k8s.io", "dataloadjobs.meshload.io").
  int64_t WriteCount(std::string_view resource = {}) const;
  /// Successful writes from clients whose User-Agent header contains
  /// `part` (what an audit log tells apart: which controller replica wrote).
  int64_t WriteCountByUserAgent(std::string_view part) const;
  /// Requests handled, of any outcome (watches and errors included; an
  /// injected error is answered before and not counted), with HTTP `method`
  /// ("GET", "POST", ...; empty: all) on `resource`, named as in
  /// WriteCount: what an audit log shows a client has touched.
  int64_t RequestCount(std::string_view method, std::string_view resource) const;
  /// Drops the event history, so watches and continue tokens from any older
  /// resourceVersion get 410 Gone.
  void CompactHistory();
  /// The global resourceVersion now.
  std::string CurrentResourceVersion() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshload::fakeapi
