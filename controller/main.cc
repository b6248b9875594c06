// meshload-controller: reconciles DataLoadJobs into ConfigMaps for the
// sidecars and keeps their status true. See docs/controller.md.

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/build_info.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/http_endpoints.h"
#include "common/metrics/metrics.h"
#include "controller/controller.h"
#include "controller/kube/client.h"
#include "controller/kube/config.h"
#include "controller/runtime/event_recorder.h"
#include "controller/runtime/leader_election.h"
#include "controller/webhook/server.h"

namespace {

constexpr char kUsage[] = R"(usage: meshload-controller [options]

Watches DataLoadJobs and their trainer pods, writes each job's resolved
ConfigMap and keeps its status true.

options:
  --kubeconfig PATH              kubeconfig (default: $KUBECONFIG, in-cluster, ~/.kube/config)
  --namespace NS                 watch only this namespace (default: all)
  --workers N                    concurrent reconciles (default 4)
  --qps F                        client-side API request rate (default 20)
  --burst N                      client-side burst (default 30)
  --event-qps F                  rate of Kubernetes Events about jobs, on their own client
                                 (default 5; 0: no events)
  --metrics-port N               /metrics, /healthz, /readyz (default 8080; 0: any free port)
  --metrics-address A            address to serve them on (default 0.0.0.0)
  --leader-elect true|false      use a Lease so that one replica reconciles (default true)
  --leader-election-namespace NS namespace of the Lease (default $POD_NAMESPACE, else the
                                 kubeconfig's namespace)
  --leader-election-id NAME      name of the Lease (default meshload-controller)
  --identity ID                  this replica's identity (default $POD_NAME, else hostname_pid)
  --lease-duration-ms N          15000    --renew-deadline-ms N  10000    --retry-period-ms N  2000
  --resync-seconds N             re-queue every job this often (default 600)
  --sidecar-container NAME       the sidecar container in trainer pods (default meshload-sidecar)
  --progress-interval-seconds N  poll the ready sidecars' /progress this often for
                                 status.progress and the resume step (default 15; 0: off)
  --progress-timeout-ms N        a poll request's timeout (default 2000)
  --progress-concurrency N       poll requests at once (default 16)
  --sidecar-metrics-port N       the sidecars' metrics port when their container names
                                 none (default 9464)
  --progress-step-granularity N  rewrite status.progress when a step moved this much, the
                                 rate by 10% or anything else changed (default 100)
  --progress-min-write-seconds N ...moving steps and rates no more often than this per job
                                 (default 120; other changes at once)

the sidecar-injection webhook (docs/webhook.md), on when --webhook-cert-dir is given:
  --webhook-cert-dir DIR         tls.crt and tls.key of its serving certificate (reloaded
                                 when they change)
  --webhook-port N               its HTTPS port (default 9443; 0: any free port)
  --webhook-address A            address to serve it on (default 0.0.0.0)
  --sidecar-image IMAGE          the injected sidecar's image (default meshload/sidecar:VERSION);
                                 a job's spec.sidecar.image overrides it
  --sidecar-resources JSON       its resources, {"requests": {...}, "limits": {...}}; a job's
                                 spec.sidecar.resources overrides them
  --sidecar-fs-group GID         the pod fsGroup set, when a pod has none, for jobs whose
                                 sidecars read the peer secret (default 65532)
  --log-level LEVEL              debug, info, warn, error (default info)
  --log-format FORMAT            json or kv (default json)
  --version                      print the version
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace meshload;
  ConfigureLogging(LogLevel::kInfo, LogFormat::kJson);
  if (Status st = ConfigureLoggingFromEnv(); !st.ok()) {
    std::cerr << "meshload-controller: " << st.ToString() << "\n";
    return 2;
  }
  std::string kubeconfig, watch_ns, qps = "20", event_qps = "5", leader_elect = "true", le_ns = Env("POD_NAMESPACE");
  std::string le_id = "meshload-controller", identity = Env("POD_NAME"), metrics_address = "0.0.0.0";
  std::string sidecar_container = "meshload-sidecar", log_level, log_format;
  std::string webhook_cert_dir, webhook_address = "0.0.0.0";
  std::string sidecar_image = std::string("meshload/sidecar:") + MESHLOAD_VERSION;
  std::string sidecar_resources = R"({"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}})";
  int64_t webhook_port = 9443, sidecar_fs_group = 65532;
  int64_t workers = 4, burst = 30, metrics_port = 8080, lease_ms = 15000, renew_ms = 10000, retry_ms = 2000;
  int64_t resync_s = 600;
  int64_t progress_s = 15, progress_timeout_ms = 2000, progress_concurrency = 16, sidecar_metrics_port = 9464;
  int64_t progress_granularity = 100, progress_min_write_s = 120;
  FlagParser flags("", kUsage, "meshload-controller");
  flags.String({"--kubeconfig"}, &kubeconfig);
  flags.String({"--namespace"}, &watch_ns);
  flags.Int({"--workers"}, &workers);
  flags.String({"--qps"}, &qps);
  flags.String({"--event-qps"}, &event_qps);
  flags.Int({"--burst"}, &burst);
  flags.Int({"--metrics-port"}, &metrics_port);
  flags.String({"--metrics-address"}, &metrics_address);
  flags.String({"--leader-elect"}, &leader_elect);
  flags.String({"--leader-election-namespace"}, &le_ns);
  flags.String({"--leader-election-id"}, &le_id);
  flags.String({"--identity"}, &identity);
  flags.Int({"--lease-duration-ms"}, &lease_ms);
  flags.Int({"--renew-deadline-ms"}, &renew_ms);
  flags.Int({"--retry-period-ms"}, &retry_ms);
  flags.Int({"--resync-seconds"}, &resync_s);
  flags.String({"--sidecar-container"}, &sidecar_container);
  flags.Int({"--progress-interval-seconds"}, &progress_s);
  flags.Int({"--progress-timeout-ms"}, &progress_timeout_ms);
  flags.Int({"--progress-concurrency"}, &progress_concurrency);
  flags.Int({"--sidecar-metrics-port"}, &sidecar_metrics_port);
  flags.Int({"--progress-step-granularity"}, &progress_granularity);
  flags.Int({"--progress-min-write-seconds"}, &progress_min_write_s);

  flags.String({"--webhook-cert-dir"}, &webhook_cert_dir);
  flags.Int({"--webhook-port"}, &webhook_port);
  flags.String({"--webhook-address"}, &webhook_address);
  flags.String({"--sidecar-image"}, &sidecar_image);
  flags.String({"--sidecar-resources"}, &sidecar_resources);
  flags.Int({"--sidecar-fs-group"}, &sidecar_fs_group);
  flags.String({"--log-level"}, &log_level);
  flags.String({"--log-format"}, &log_format);
  flags.Version(VersionText("meshload-controller", /*with_gpu_staging=*/false));
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  auto usage = [](const std::string& m) { return UsageError(m, "meshload-controller"); };
  if (Status st = ConfigureLoggingFromFlags(log_level, log_format); !st.ok()) return usage(st.message());
  auto number = [](const std::string& text, double* out) {
    try {
      size_t used = 0;
      *out = std::stod(text, &used);
      return used == text.size() && *out >= 0;
    } catch (...) {
      return false;
    }
  };
  double qps_value = 0, event_qps_value = 0;
  if (!number(qps, &qps_value)) return usage("--qps: expected a number >= 0 (0: no limit), got '" + qps + "'");
  if (!number(event_qps, &event_qps_value)) {
    return usage("--event-qps: expected a number >= 0, got '" + event_qps + "'");
  }
  if (workers < 1 || workers > 256) return usage("--workers must be 1..256");
  if (burst < 1) return usage("--burst must be positive");
  if (metrics_port < 0 || metrics_port > 65535) return usage("--metrics-port must be 0..65535");
  if (leader_elect != "true" && leader_elect != "false") return usage("--leader-elect must be true or false");
  if (!(renew_ms < lease_ms && retry_ms < renew_ms && retry_ms > 0)) {
    return usage("leader election needs retry period < renew deadline < lease duration");
  }
  if (resync_s < 1) return usage("--resync-seconds must be positive");
  if (progress_s < 0 || progress_s > 3600) return usage("--progress-interval-seconds must be 0..3600");
  if (progress_timeout_ms < 1 || progress_timeout_ms > 60000) return usage("--progress-timeout-ms must be 1..60000");
  if (progress_concurrency < 1 || progress_concurrency > 256) return usage("--progress-concurrency must be 1..256");
  if (sidecar_metrics_port < 1 || sidecar_metrics_port > 65535) return usage("--sidecar-metrics-port must be 1..65535");
  if (progress_granularity < 1) return usage("--progress-step-granularity must be positive");
  if (progress_min_write_s < 0 || progress_min_write_s > 86400) {
    return usage("--progress-min-write-seconds must be 0..86400");
  }

  if (webhook_port < 0 || webhook_port > 65535) return usage("--webhook-port must be 0..65535");
  if (sidecar_image.empty()) return usage("--sidecar-image must not be empty");
  if (sidecar_fs_group < 1) return usage("--sidecar-fs-group must be positive");
  controller::webhook::InjectorOptions injector;
  injector.sidecar_name = sidecar_container;
  injector.image = sidecar_image;
  injector.fs_group = sidecar_fs_group;
  injector.resources = nlohmann::json::parse(sidecar_resources, nullptr, false);
  if (!injector.resources.is_object() ||
      !std::all_of(injector.resources.items().begin(), injector.resources.items().end(), [](const auto& kv) {
        return (kv.key() == "requests" || kv.key() == "limits") && kv.value().is_object();
      })) {
    return usage("--sidecar-resources: expected a JSON object with \"requests\" and \"limits\" maps, got '" +
                 sidecar_resources + "'");
  }

  // A write to a connection the API server has closed (an idle keep-alive
  // it dropped, a restart) must be an error on that request, not SIGPIPE
  // killing the process: ignored before any thread starts.
  ::signal(SIGPIPE, SIG_IGN);
  // Signals are taken by sigwait on the main thread; block them first so no
  // other thread sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto config = controller::kube::LoadClusterConfig(kubeconfig);
  if (!config.ok()) {
    LogError("no cluster configuration", {{"error", config.status().ToString()}});
    return 1;
  }
  if (identity.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    identity = std::string(host) + "_" + std::to_string(getpid());
  }
  if (le_ns.empty()) le_ns = config->namespace_;

  metrics::Registry registry;
  metrics::RegisterBuildInfo(registry, MESHLOAD_VERSION, "controller");
  controller::kube::ClientOptions copts;
  copts.qps = qps_value;
  copts.burst = static_cast<int>(burst);
  copts.user_agent = std::string("meshload-controller/") + MESHLOAD_VERSION + " (" + identity + ")";
  copts.observer = controller::ApiRequestObserver(registry);
  // An API client, or null after logging why not; `purpose` ends the message.
  auto make_client = [&](const controller::kube::ClientOptions& o,
                         std::string_view purpose) -> std::unique_ptr<controller::kube::KubeClient> {
    auto c = controller::kube::KubeClient::Create(*config, o);
    if (c.ok()) return std::move(*c);
    LogError(std::string("cannot create the API client") + std::string(purpose), {{"error", c.status().ToString()}});
    return nullptr;
  };
  std::unique_ptr<controller::kube::KubeClient> client = make_client(copts, "");
  if (!client) return 1;
  LogInfo("starting", {{"version", MESHLOAD_VERSION},
                       {"build", CompilerBuild()},
                       {"api_server", config->server},
                       {"config", config->origin},
                       {"namespace", watch_ns.empty() ? std::string("(all)") : watch_ns},
                       {"identity", identity}});

  controller::ControllerOptions options;
  options.watch_namespace = watch_ns;
  options.workers = static_cast<int>(workers);
  options.resync_period = std::chrono::seconds(resync_s);
  options.reconciler.sidecar_container = sidecar_container;
  options.progress_interval = std::chrono::seconds(progress_s);
  options.progress.timeout = std::chrono::milliseconds(progress_timeout_ms);
  options.progress.concurrency = static_cast<int>(progress_concurrency);
  options.progress.default_port = static_cast<int>(sidecar_metrics_port);
  options.reconciler.progress_step_granularity = progress_granularity;
  options.reconciler.progress_min_write_interval = std::chrono::seconds(progress_min_write_s);
  std::unique_ptr<controller::kube::KubeClient> election_client;  // declared first: it outlives the elector
  std::unique_ptr<controller::runtime::LeaderElector> elector;
  if (leader_elect == "true") {
    // The lease has its own client: with one rate limiter shared with the
    // reconcilers, a backlog of their writes (a new leader with many jobs,
    // a low --qps) held renewals past the renew deadline, and the leader
    // gave up the lease and exited. A renewal is a GET and a PUT every
    // retry period; each is tried twice at most, and must answer within
    // half the renew deadline (the elector tries again itself).
    controller::kube::ClientOptions lopts = copts;
    lopts.user_agent += " leader-election";
    lopts.qps = 5;
    lopts.burst = 10;
    lopts.max_attempts = 2;
    lopts.max_retry_after = std::chrono::seconds(1);
    lopts.request_timeout = std::chrono::seconds(std::max<int64_t>(1, renew_ms / 2000));
    lopts.connect_timeout = std::min(lopts.connect_timeout, lopts.request_timeout);
    election_client = make_client(lopts, " for leader election");
    if (!election_client) return 1;
    controller::runtime::LeaderElectionOptions le;
    le.ns = le_ns;
    le.name = le_id;
    le.identity = identity;
    le.lease_duration = std::chrono::milliseconds(lease_ms);
    le.renew_deadline = std::chrono::milliseconds(renew_ms);
    le.retry_period = std::chrono::milliseconds(retry_ms);
    elector = std::make_unique<controller::runtime::LeaderElector>(election_client.get(), le);
    options.reconciler.may_write = [e = elector.get()] { return e->IsLeader(); };
  }
  // Events: their own client and rate, so that they never slow the status
  // writes; written by the leader only.
  std::unique_ptr<controller::kube::KubeClient> event_client;
  std::unique_ptr<controller::runtime::EventRecorder> events;
  if (event_qps_value > 0) {
    controller::kube::ClientOptions eopts = copts;
    eopts.qps = event_qps_value;
    eopts.burst = std::max(1, static_cast<int>(event_qps_value * 5));
    eopts.max_attempts = 2;  // an event is not worth a long retry
    event_client = make_client(eopts, " for events");
    if (!event_client) return 1;
    controller::runtime::EventRecorderOptions ro;
    ro.instance = identity;
    ro.may_write = options.reconciler.may_write;
    events = std::make_unique<controller::runtime::EventRecorder>(event_client.get(), &registry, ro);
    options.reconciler.record_event = [r = events.get()](const nlohmann::json& job, const std::string& type,
                                                         const std::string& reason, const std::string& message) {
      r->Record(job, type, reason, message);
    };
  }
  controller::Controller controller(client.get(), &registry, options);

  std::atomic<bool> leading{elector == nullptr};
  metrics::HealthServer health(
      registry,
      [&]() -> std::pair<bool, std::string> {
        if (!controller.synced()) return {false, "informer caches not synced"};
        return {true, ""};
      },
      {.bind_address = metrics_address, .port = static_cast<int>(metrics_port), .progress = nullptr});
  auto port = health.Start();
  if (!port.ok()) {
    LogError("cannot serve metrics", {{"error", port.status().ToString()}});
    return 1;
  }
  LogInfo("serving /metrics, /healthz, /readyz", {{"port", *port}});

  if (Status st = controller.Start(); !st.ok()) {
    LogError("cannot start", {{"error", st.ToString()}});
    return 1;
  }
  // Every replica serves the webhook from its own informer cache, leader or
  // not: the Service spreads admission requests over all of them.
  std::unique_ptr<controller::webhook::WebhookServer> webhook;
  if (!webhook_cert_dir.empty()) {
    webhook = std::make_unique<controller::webhook::WebhookServer>(
        &registry, [&controller](const std::string& ns, const std::string& name) { return controller.Job(ns, name); },
        injector,
        controller::webhook::WebhookServerOptions{
            .bind_address = webhook_address, .port = static_cast<int>(webhook_port), .cert_dir = webhook_cert_dir});
    auto wport = webhook->Start();
    if (!wport.ok()) {
      LogError("cannot serve the webhook", {{"error", wport.status().ToString()}});
      return 1;
    }
    LogInfo("serving the sidecar-injection webhook", {{"port", *wport}, {"sidecar_image", sidecar_image}});
  }

  std::thread election;
  if (elector) {
    election = std::thread([&] {
      elector->Run(
          [&] {
            leading = true;
            controller.SetLeader(true);
            controller.StartWorkers();
          },
          [&] {
            controller.SetLeader(false);
            LogError("lost leadership; exiting so that a fresh process can campaign", {{"identity", identity}});
            // Exit without unwinding: workers may be mid-reconcile, and they
            // must not write any more (IsLeader() already stops them).
            std::_Exit(1);
          });
    });
  } else {
    controller.SetLeader(true);
    controller.StartWorkers();
  }

  int sig = 0;
  sigwait(&signals, &sig);
  LogInfo("shutting down", {{"signal", sig}});
  if (elector) elector->Stop();
  if (election.joinable()) election.join();  // releases the lease if held
  // Each client before what uses it: a request waiting on the rate limit or
  // a backoff returns at once, so the workers (a reconcile can hold several
  // writes, seconds apart at a low --qps) and the event writer stop
  // promptly instead of finishing their backlog after the lease is gone.
  client->Shutdown();
  if (webhook) webhook->Stop();
  controller.Stop();
  if (event_client) event_client->Shutdown();
  if (events) events->Stop();
  health.Stop();
  return 0;
}
