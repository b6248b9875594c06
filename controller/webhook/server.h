/// \file
/// WebhookServer: the sidecar injector's HTTPS endpoint in
/// meshload-controller (POST /mutate-pods, AdmissionReview v1).
///
///   WebhookServer server(&registry, lookup, injector_options,
///                        {.port = 9443, .cert_dir = "/etc/meshload/webhook"});
///   MESHLOAD_ASSIGN_OR_RETURN(int port, server.Start());
///
/// Contract:
/// - TLS only (1.2 or later), with the serving certificate and key from
///   `cert_dir`/tls.crt (leaf first, then its chain) and `cert_dir`/tls.key,
///   as a kubernetes.io/tls Secret mounts them. Start() fails, naming the
///   file, when they cannot be read or do not match.
/// - The pair is reloaded when either file changes (a renewed Secret, a
///   cert-manager rotation): checked at most once a second, on the next
///   handshake; a pair that fails to load is logged and counted, and the
///   last good one stays in use.
/// - Request bodies over kMaxAdmissionReviewBytes are refused (413) before
///   they are read in full; any other path is 404, any other method 405.
/// - Metrics: meshload_controller_webhook_requests_total{outcome},
///   meshload_controller_webhook_request_duration_seconds,
///   meshload_controller_webhook_certificate_reloads_total{result},
///   meshload_controller_webhook_certificate_expiry_timestamp_seconds.
///
/// Thread safety: Start() and Stop() from one thread; requests are served on
/// the server's own threads.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/metrics/metrics.h"
#include "common/status.h"
#include "controller/webhook/injector.h"

namespace httplib {
class SSLServer;
}

namespace meshload::controller::webhook {

class CertificateStore;

struct WebhookServerOptions {
  std::string bind_address = "0.0.0.0";
  int port = 9443;  // 0: any free port
  std::string cert_dir;
};

class WebhookServer {
 public:
  WebhookServer(metrics::Registry* registry, JobLookup jobs, InjectorOptions injector, WebhookServerOptions options);
  ~WebhookServer();
  WebhookServer(const WebhookServer&) = delete;
  WebhookServer& operator=(const WebhookServer&) = delete;

  /// Loads the certificate, binds and starts serving; returns the port.
  Result<int> Start();
  void Stop();

 private:
  JobLookup jobs_;
  InjectorOptions injector_;
  WebhookServerOptions options_;
  std::unique_ptr<CertificateStore> certs_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  std::map<std::string, metrics::Counter*> requests_;  // by outcome; empty without a registry
  metrics::Histogram* duration_ = nullptr;
};

}  // namespace meshload::controller::webhook
