// meshload-controller: reconciles DataLoadJobs into ConfigMaps for the
// sidecars and keeps their status true. See docs/controller.md.
//
// The flags are declared once (BindFlags: name, value, help, default),
// checked together (CheckFlags), and turned into the process's parts, which
// a Manager starts and stops in one order (Parts).

#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "common/manager.h"
#include "common/metrics/http_endpoints.h"
#include "common/metrics/metrics.h"
#include "controller/controller.h"
#include "controller/kube/client.h"
#include "controller/kube/config.h"
#include "controller/runtime/event_recorder.h"
#include "controller/runtime/leader_election.h"
#include "controller/webhook/server.h"

namespace meshload::controller {
namespace {

constexpr char kUsage[] = R"(usage: meshload-controller [options]

Watches DataLoadJobs and their trainer pods, writes each job's resolved
ConfigMap and keeps its status true.
)";

// Every flag of the binary, with its default.
struct Flags {
  std::string kubeconfig, watch_namespace;
  int64_t workers = 4, burst = 30;
  std::string qps = "20", event_qps = "5";
  int64_t metrics_port = 8080;
  std::string metrics_address = "0.0.0.0";
  std::string leader_elect = "true", lease_namespace = Env("POD_NAMESPACE"), lease_name = "meshload-controller";
  std::string identity = Env("POD_NAME");
  int64_t lease_ms = 15000, renew_ms = 10000, retry_ms = 2000, resync_s = 600;
  std::string sidecar_container = "meshload-sidecar";
  int64_t progress_s = 15, progress_timeout_ms = 2000, progress_concurrency = 16, sidecar_metrics_port = 9464;
  int64_t progress_granularity = 100, progress_min_write_s = 120;
  std::string webhook_cert_dir, webhook_address = "0.0.0.0";
  int64_t webhook_port = 9443, sidecar_fs_group = 65532;
  std::string sidecar_image = std::string("meshload/sidecar:") + MESHLOAD_VERSION;
  std::string sidecar_resources = R"({"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}})";
  std::string log_level, log_format;
  // Derived by CheckFlags.
  double qps_value = 0, event_qps_value = 0;
  webhook::InjectorOptions injector;
};

void BindFlags(FlagParser& p, Flags& f) {
  p.Section("options:");
  p.Text({{"--kubeconfig"}, "PATH", "kubeconfig (default: $KUBECONFIG, in-cluster, ~/.kube/config)"}, &f.kubeconfig);
  p.Text({{"--namespace"}, "NS", "watch only this namespace (default: all)"}, &f.watch_namespace);
  p.Integer({{"--workers"}, "N", "concurrent reconciles (default 4)"}, &f.workers, 1, 256);
  p.Text({{"--qps"}, "F", "client-side API request rate (default 20; 0: no limit)"}, &f.qps);
  p.Integer({{"--burst"}, "N", "client-side burst (default 30)"}, &f.burst, 1, 1 << 20);
  p.Text({{"--event-qps"}, "F", "rate of Kubernetes Events about jobs, on their own client\n(default 5; 0: no events)"},
         &f.event_qps);
  p.Integer({{"--metrics-port"}, "N", "/metrics, /healthz, /readyz (default 8080; 0: any free port)"}, &f.metrics_port,
            0, 65535);
  p.Text({{"--metrics-address"}, "A", "address to serve them on (default 0.0.0.0)"}, &f.metrics_address);
  p.Text({{"--leader-elect"}, "true|false", "use a Lease so that one replica reconciles (default true)"},
         &f.leader_elect);
  p.Text({{"--leader-election-namespace"},
          "NS",
          "namespace of the Lease (default $POD_NAMESPACE, else the\nkubeconfig's namespace)"},
         &f.lease_namespace);
  p.Text({{"--leader-election-id"}, "NAME", "name of the Lease (default meshload-controller)"}, &f.lease_name);
  p.Text({{"--identity"}, "ID", "this replica's identity (default $POD_NAME, else hostname_pid)"}, &f.identity);
  p.Integer({{"--lease-duration-ms"}, "N", "the Lease's duration (default 15000)"}, &f.lease_ms, 1, 3600000);
  p.Integer({{"--renew-deadline-ms"}, "N", "how long the leader tries to renew it (default 10000)"}, &f.renew_ms, 1,
            3600000);
  p.Integer({{"--retry-period-ms"}, "N", "between tries to take or renew it (default 2000)"}, &f.retry_ms, 1, 3600000);
  p.Integer({{"--resync-seconds"}, "N", "re-queue every job this often (default 600)"}, &f.resync_s, 1, 86400 * 7);
  p.Text({{"--sidecar-container"}, "NAME", "the sidecar container in trainer pods (default meshload-sidecar)"},
         &f.sidecar_container);
  p.Integer(
      {{"--progress-interval-seconds"},
       "N",
       "poll the ready sidecars' /progress this often for\nstatus.progress and the resume step (default 15; 0: off)"},
      &f.progress_s, 0, 3600);
  p.Integer({{"--progress-timeout-ms"}, "N", "a poll request's timeout (default 2000)"}, &f.progress_timeout_ms, 1,
            60000);
  p.Integer({{"--progress-concurrency"}, "N", "poll requests at once (default 16)"}, &f.progress_concurrency, 1, 256);
  p.Integer(
      {{"--sidecar-metrics-port"}, "N", "the sidecars' metrics port when their container names\nnone (default 9464)"},
      &f.sidecar_metrics_port, 1, 65535);
  p.Integer(
      {{"--progress-step-granularity"},
       "N",
       "rewrite status.progress when a step moved this much, the\nrate by 10% or anything else changed (default 100)"},
      &f.progress_granularity, 1, INT64_MAX);
  p.Integer({{"--progress-min-write-seconds"},
             "N",
             "...moving steps and rates no more often than this per job\n(default 120; other changes at once)"},
            &f.progress_min_write_s, 0, 86400);
  p.Section("the sidecar-injection webhook (docs/webhook.md), on when --webhook-cert-dir is given:");
  p.Text({{"--webhook-cert-dir"}, "DIR", "tls.crt and tls.key of its serving certificate (reloaded\nwhen they change)"},
         &f.webhook_cert_dir);
  p.Integer({{"--webhook-port"}, "N", "its HTTPS port (default 9443; 0: any free port)"}, &f.webhook_port, 0, 65535);
  p.Text({{"--webhook-address"}, "A", "address to serve it on (default 0.0.0.0)"}, &f.webhook_address);
  p.Text({{"--sidecar-image"},
          "IMAGE",
          "the injected sidecar's image (default meshload/sidecar:VERSION);\na job's spec.sidecar.image overrides it"},
         &f.sidecar_image);
  p.Text({{"--sidecar-resources"},
          "JSON",
          "its resources, {\"requests\": {...}, \"limits\": {...}}; a job's\nspec.sidecar.resources overrides them"},
         &f.sidecar_resources);
  p.Integer({{"--sidecar-fs-group"},
             "GID",
             "the pod fsGroup set, when a pod has none, for jobs whose\nsidecars read the peer secret (default 65532)"},
            &f.sidecar_fs_group, 1, INT32_MAX);
  p.Text({{"--sidecar-cache-host-path"},
          "DIR",
          "a node directory the sidecars of every job share as the block\n"
          "cache of remote datasets (it must exist, writable by the\n"
          "sidecar's user); default: an emptyDir per pod"},
         &f.injector.cache_host_path);
  p.Section("logging:");
  p.Text({{"--log-level"}, "LEVEL", "debug, info, warn, error (default info)"}, &f.log_level);
  p.Text({{"--log-format"}, "FORMAT", "json or kv (default json)"}, &f.log_format);
  p.Version(VersionText("meshload-controller", /*with_gpu_staging=*/false));
}

// What no flag alone can check; the message names the flag.
std::string CheckFlags(Flags& f) {
  auto number = [](const std::string& text, double* out) {
    try {
      size_t used = 0;
      *out = std::stod(text, &used);
      return used == text.size() && *out >= 0;
    } catch (...) {
      return false;
    }
  };
  if (!number(f.qps, &f.qps_value)) return "--qps: expected a number >= 0 (0: no limit), got '" + f.qps + "'";
  if (!number(f.event_qps, &f.event_qps_value)) return "--event-qps: expected a number >= 0, got '" + f.event_qps + "'";
  if (f.leader_elect != "true" && f.leader_elect != "false") return "--leader-elect must be true or false";
  if (!(f.renew_ms < f.lease_ms && f.retry_ms < f.renew_ms)) {
    return "leader election needs retry period < renew deadline < lease duration";
  }
  if (f.sidecar_image.empty()) return "--sidecar-image must not be empty";
  f.injector.sidecar_name = f.sidecar_container;
  f.injector.image = f.sidecar_image;
  f.injector.fs_group = f.sidecar_fs_group;
  f.injector.resources = nlohmann::json::parse(f.sidecar_resources, nullptr, false);
  const nlohmann::json& res = f.injector.resources;
  if (!res.is_object() || !std::all_of(res.items().begin(), res.items().end(), [](const auto& kv) {
        return (kv.key() == "requests" || kv.key() == "limits") && kv.value().is_object();
      })) {
    return "--sidecar-resources: expected a JSON object with \"requests\" and \"limits\" maps, got '" +
           f.sidecar_resources + "'";
  }
  return "";
}

// The process's parts: its API clients, the leader elector, the event
// recorder, the controller, the metrics endpoints, the webhook; Add() puts
// them into the manager in start order (stopped in reverse).
class Parts {
 public:
  explicit Parts(Flags f) : f_(std::move(f)) {}

  Status Build() {
    MESHLOAD_ASSIGN_OR_RETURN(config_, kube::LoadClusterConfig(f_.kubeconfig));
    if (f_.identity.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      f_.identity = std::string(host) + "_" + std::to_string(getpid());
    }
    if (f_.lease_namespace.empty()) f_.lease_namespace = config_->namespace_;
    metrics::RegisterBuildInfo(registry_, MESHLOAD_VERSION, "controller");
    copts_.qps = f_.qps_value;
    copts_.burst = static_cast<int>(f_.burst);
    copts_.user_agent = std::string("meshload-controller/") + MESHLOAD_VERSION + " (" + f_.identity + ")";
    copts_.observer = ApiRequestObserver(registry_);
    MESHLOAD_ASSIGN_OR_RETURN(client_, MakeClient(copts_, "the API client"));
    LogInfo("starting", {{"version", MESHLOAD_VERSION},
                         {"build", CompilerBuild()},
                         {"api_server", config_->server},
                         {"config", config_->origin},
                         {"namespace", f_.watch_namespace.empty() ? std::string("(all)") : f_.watch_namespace},
                         {"identity", f_.identity}});
    ControllerOptions options;
    options.watch_namespace = f_.watch_namespace;
    options.workers = static_cast<int>(f_.workers);
    options.resync_period = std::chrono::seconds(f_.resync_s);
    options.reconciler.sidecar_container = f_.sidecar_container;
    options.progress_interval = std::chrono::seconds(f_.progress_s);
    options.progress.timeout = std::chrono::milliseconds(f_.progress_timeout_ms);
    options.progress.concurrency = static_cast<int>(f_.progress_concurrency);
    options.progress.default_port = static_cast<int>(f_.sidecar_metrics_port);
    options.reconciler.progress_step_granularity = f_.progress_granularity;
    options.reconciler.progress_min_write_interval = std::chrono::seconds(f_.progress_min_write_s);
    if (f_.leader_elect == "true") MESHLOAD_RETURN_IF_ERROR(BuildElector(options));
    if (f_.event_qps_value > 0) MESHLOAD_RETURN_IF_ERROR(BuildEvents(options));
    controller_ = std::make_unique<Controller>(client_.get(), &registry_, options);
    health_ = std::make_unique<metrics::HealthServer>(
        registry_,
        [this]() -> std::pair<bool, std::string> {
          if (!controller_->synced()) return {false, "informer caches not synced"};
          return {true, ""};
        },
        metrics::HealthServerOptions{
            .bind_address = f_.metrics_address, .port = static_cast<int>(f_.metrics_port), .progress = nullptr});
    if (!f_.webhook_cert_dir.empty()) {
      // Every replica serves the webhook from its own informer cache, leader
      // or not: the Service spreads admission requests over all of them.
      webhook_ = std::make_unique<webhook::WebhookServer>(
          &registry_, [this](const std::string& ns, const std::string& name) { return controller_->Job(ns, name); },
          f_.injector,
          webhook::WebhookServerOptions{.bind_address = f_.webhook_address,
                                        .port = static_cast<int>(f_.webhook_port),
                                        .cert_dir = f_.webhook_cert_dir});
    }
    return Status::Ok();
  }

  // In start order. Stopped in reverse: leadership first (the lease is
  // released), the webhook, then each client before what uses it, so that a
  // request waiting on the rate limit or a backoff returns at once and the
  // workers and the event writer stop promptly; the metrics last.
  void Add(Manager& m) {
    m.Add({"metrics", [this] { return Started(health_->Start(), "serving /metrics, /healthz, /readyz"); },
           [this] { health_->Stop(); }});
    if (events_)
      m.Add({"events", nullptr, [this] {
               event_client_->Shutdown();
               events_->Stop();
             }});
    m.Add({"controller", [this] { return controller_->Start(); },
           [this] {
             client_->Shutdown();
             controller_->Stop();
           }});
    if (webhook_) {
      m.Add({"webhook",
             [this] { return Started(webhook_->Start(), "serving the sidecar-injection webhook", f_.sidecar_image); },
             [this] { webhook_->Stop(); }});
    }
    m.Add({"leadership", [this] { return Lead(); },
           [this] {
             if (elector_) elector_->Stop();
             if (election_.joinable()) election_.join();  // releases the lease if held
           }});
  }

 private:
  Result<std::unique_ptr<kube::KubeClient>> MakeClient(const kube::ClientOptions& o, const std::string& what) {
    auto c = kube::KubeClient::Create(*config_, o);
    if (!c.ok()) return Status(c.status().code(), "cannot create " + what + ": " + c.status().message());
    return std::move(*c);
  }

  Status BuildElector(ControllerOptions& options) {
    // The lease has its own client: with one rate limiter shared with the
    // reconcilers, a backlog of their writes (a new leader with many jobs,
    // a low --qps) held renewals past the renew deadline, and the leader
    // gave up the lease and exited. A renewal is a GET and a PUT every
    // retry period; each is tried twice at most, and must answer within
    // half the renew deadline (the elector tries again itself).
    kube::ClientOptions lopts = copts_;
    lopts.user_agent += " leader-election";
    lopts.qps = 5;
    lopts.burst = 10;
    lopts.max_attempts = 2;
    lopts.max_retry_after = std::chrono::seconds(1);
    lopts.request_timeout = std::chrono::seconds(std::max<int64_t>(1, f_.renew_ms / 2000));
    lopts.connect_timeout = std::min(lopts.connect_timeout, lopts.request_timeout);
    MESHLOAD_ASSIGN_OR_RETURN(election_client_, MakeClient(lopts, "the API client for leader election"));
    runtime::LeaderElectionOptions le;
    le.ns = f_.lease_namespace;
    le.name = f_.lease_name;
    le.identity = f_.identity;
    le.lease_duration = std::chrono::milliseconds(f_.lease_ms);
    le.renew_deadline = std::chrono::milliseconds(f_.renew_ms);
    le.retry_period = std::chrono::milliseconds(f_.retry_ms);
    elector_ = std::make_unique<runtime::LeaderElector>(election_client_.get(), le);
    options.reconciler.may_write = [e = elector_.get()] { return e->IsLeader(); };
    return Status::Ok();
  }

  Status BuildEvents(ControllerOptions& options) {
    // Events: their own client and rate, so that they never slow the status
    // writes; written by the leader only.
    kube::ClientOptions eopts = copts_;
    eopts.qps = f_.event_qps_value;
    eopts.burst = std::max(1, static_cast<int>(f_.event_qps_value * 5));
    eopts.max_attempts = 2;  // an event is not worth a long retry
    MESHLOAD_ASSIGN_OR_RETURN(event_client_, MakeClient(eopts, "the API client for events"));
    runtime::EventRecorderOptions ro;
    ro.instance = f_.identity;
    ro.may_write = options.reconciler.may_write;
    events_ = std::make_unique<runtime::EventRecorder>(event_client_.get(), &registry_, ro);
    options.reconciler.record_event = [r = events_.get()](const nlohmann::json& job, const std::string& type,
                                                          const std::string& reason, const std::string& message) {
      r->Record(job, type, reason, message);
    };
    return Status::Ok();
  }

  static Status Started(const Result<int>& port, const char* what, const std::string& image = "") {
    if (!port.ok()) return port.status();
    if (image.empty()) {
      LogInfo(what, {{"port", *port}});
    } else {
      LogInfo(what, {{"port", *port}, {"sidecar_image", image}});
    }
    return Status::Ok();
  }

  // Campaigns for the lease (the workers start when it is won), or leads at
  // once without leader election.
  Status Lead() {
    if (!elector_) {
      controller_->SetLeader(true);
      controller_->StartWorkers();
      return Status::Ok();
    }
    election_ = std::thread([this] {
      elector_->Run(
          [this] {
            controller_->SetLeader(true);
            controller_->StartWorkers();
          },
          [this] {
            controller_->SetLeader(false);
            LogError("lost leadership; exiting so that a fresh process can campaign", {{"identity", f_.identity}});
            // Exit without unwinding: workers may be mid-reconcile, and they
            // must not write any more (IsLeader() already stops them).
            std::_Exit(1);
          });
    });
    return Status::Ok();
  }

  Flags f_;
  std::optional<kube::ClusterConfig> config_;
  metrics::Registry registry_;
  kube::ClientOptions copts_;
  // Each client is declared before what uses it, so that it outlives it.
  std::unique_ptr<kube::KubeClient> client_, election_client_, event_client_;
  std::unique_ptr<runtime::LeaderElector> elector_;
  std::unique_ptr<runtime::EventRecorder> events_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<metrics::HealthServer> health_;
  std::unique_ptr<webhook::WebhookServer> webhook_;
  std::thread election_;
};

}  // namespace
}  // namespace meshload::controller

int main(int argc, char** argv) {
  using namespace meshload;
  ConfigureLogging(LogLevel::kInfo, LogFormat::kJson);
  if (Status st = ConfigureLoggingFromEnv(); !st.ok()) return UsageError(st.ToString(), "meshload-controller");
  controller::Flags flags;
  FlagParser parser("", controller::kUsage, "meshload-controller");
  controller::BindFlags(parser, flags);
  if (int rc = parser.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  if (Status st = ConfigureLoggingFromFlags(flags.log_level, flags.log_format); !st.ok()) {
    return UsageError(st.message(), "meshload-controller");
  }
  if (std::string why = controller::CheckFlags(flags); !why.empty()) return UsageError(why, "meshload-controller");
  // A write to a connection the API server closed must be an error on that
  // request, not SIGPIPE; SIGTERM and SIGINT are taken by sigwait below, so
  // they are blocked before any thread starts.
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  controller::Parts parts(std::move(flags));
  Manager manager("meshload-controller");
  if (Status st = parts.Build(); !st.ok()) {
    LogError("cannot start", {{"error", st.ToString()}});
    return 1;
  }
  parts.Add(manager);
  if (!manager.Start().ok()) return 1;
  int sig = 0;
  sigwait(&signals, &sig);
  LogInfo("shutting down", {{"signal", sig}});
  manager.Stop();
  return 0;
}
