// controller_bench: meshload-controller at scale against the real
// kube-apiserver and etcd (scripts/control-plane, started by this program).
//
//   build/tests/bench/controller_bench [--jobs 1000] [--pods-per-job 10] [--idle-seconds 30]
//                                      [--progress-seconds 0] [--steps-per-second 5]
//
// Creates --jobs DataLoadJobs (10 per namespace) and --pods-per-job ready
// trainer pods for each (the test plays the kubelet: pod status written
// through the API), starts a real meshload-controller process (its own
// client certificate; --workers 8 --qps 200 --burst 400 --resync-seconds
// 10), and reports:
//   - time until every job's status is converged (phase Running,
//     observedGeneration current, every process ready);
//   - the controller's peak resident memory (VmHWM);
//   - the controller's writes during --idle-seconds afterwards, counted from
//     the apiserver's audit log, Events apart (they drain at --event-qps
//     after converging; three resyncs re-reconcile every job in that time).
// Targets: converge < 60 s, RSS < 200 MiB, idle writes 0.
//
// With --progress-seconds N the controller also polls the sidecars'
// /progress at its defaults (every 15 s, granularity 100 steps, moving
// figures at most every 120 s per job): every pod gets a loopback IP and one
// HTTP server here answers for all of them (by the address a request came
// in on) with a step that advances --steps-per-second; after converging, the
// program counts the controller's writes for N seconds. Target: they stay
// under the controller's default --qps (20 per second), with every job's
// status.progress written.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include <map>
#include <mutex>

#include "common/flags.h"
#include "controller/kube/client.h"
#include "tests/testing/control_plane.h"
#include "tests/testing/yaml_json.h"

extern char** environ;

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t VmHwmKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace meshload;
  int64_t jobs = 1000, pods_per_job = 10, idle_seconds = 30, progress_seconds = 0, steps_per_second = 5;
  std::string controller_bin, source_dir = MESHLOAD_SOURCE_DIR;
  FlagParser flags("",
                   "usage: controller_bench [--jobs N] [--pods-per-job N] [--idle-seconds N] "
                   "[--progress-seconds N] [--steps-per-second N]\n",
                   "controller_bench");
  flags.Int({"--jobs"}, &jobs);
  flags.Int({"--pods-per-job"}, &pods_per_job);
  flags.Int({"--idle-seconds"}, &idle_seconds);
  flags.Int({"--progress-seconds"}, &progress_seconds);
  flags.Int({"--steps-per-second"}, &steps_per_second);
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  controller_bin = MESHLOAD_CONTROLLER_BIN;

  testing::ControlPlane& cp = testing::ControlPlane::Get();
  controller::kube::ClientOptions copts;
  copts.qps = 0;
  copts.max_attempts = 20;
  auto client = controller::kube::KubeClient::Create(cp.AdminConfig(), copts);
  if (!client.ok()) return 1;
  controller::kube::KubeClient& c = **client;
  auto must = [](const controller::kube::ApiResponse& r, const char* what) {
    if (!r.ok()) {
      std::cerr << r.ToStatus(what).ToString() << "\n";
      std::exit(1);
    }
  };
  must(c.Post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
              testing::LoadYamlDocuments(source_dir + "/crds/dataloadjobs.meshload.io.yaml").at(0)),
       "install the CRD");
  json example = testing::LoadYamlDocuments(source_dir + "/examples/local-fixedrecord.yaml").at(0);
  // The CRD is served once Established.
  for (int i = 0; i < 300 && !c.Get("/apis/meshload.io/v1alpha1/dataloadjobs").ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  auto setup_start = Clock::now();
  const int64_t per_ns = 10;
  const int64_t namespaces = (jobs + per_ns - 1) / per_ns;
  for (int64_t n = 0; n < namespaces; ++n) {
    const std::string ns = "team-" + std::to_string(n);
    must(c.Post("/api/v1/namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}),
         "create namespace");
  }
  // Pods are admitted once each namespace has its default service account.
  for (int64_t n = 0; n < namespaces; ++n) {
    const std::string sa = "/api/v1/namespaces/team-" + std::to_string(n) + "/serviceaccounts/default";
    for (int i = 0; i < 600 && !c.Get(sa).ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // One job and its ready pods (the benchmark plays the kubelet).
  auto make_job = [&](int64_t j) {
    const std::string ns = "team-" + std::to_string(j / per_ns), name = "job-" + std::to_string(j);
    for (int64_t p = 0; p < pods_per_job; ++p) {
      const std::string pod = name + "-" + std::to_string(p);
      const int64_t ip = j * pods_per_job + p;
      // Loopback addresses when the sidecars' /progress is served here.
      const std::string ip_text =
          (progress_seconds > 0 ? "127." + std::to_string(1 + ip / 65536) : "10." + std::to_string(ip / 65536)) + "." +
          std::to_string(ip / 256 % 256) + "." + std::to_string(ip % 256);
      // The completion index fixes the process index, which /progress must name.
      must(
          c.Post("/api/v1/namespaces/" + ns + "/pods",
                 testing::TrainerPod(ns, pod, name, {{"batch.kubernetes.io/job-completion-index", std::to_string(p)}})),
          "create pod");
      must(c.Patch("/api/v1/namespaces/" + ns + "/pods/" + pod + "/status", testing::RunningPodStatus(ip_text, true)),
           "set pod status");
    }
    json job = example;
    job["metadata"] = {{"name", name}, {"namespace", ns}};
    job["spec"]["mesh"]["processes"] = pods_per_job;
    job["spec"]["mesh"]["devicesPerProcess"] = 1;
    job["spec"]["mesh"]["axes"] = json::array({{{"name", "data"}, {"size", pods_per_job}}});
    job["spec"]["batch"]["globalBatchSize"] = pods_per_job * 4;
    job["spec"]["selector"] = {{"matchLabels", {{"app", name}}}};
    must(c.Post("/apis/meshload.io/v1alpha1/namespaces/" + ns + "/dataloadjobs", job), "create job");
  };
  // From 8 threads: the server takes requests in parallel.
  std::atomic<int64_t> next_job{0};
  auto make_jobs = [&] {
    for (int64_t j; (j = next_job.fetch_add(1)) < jobs;) make_job(j);
  };
  std::vector<std::thread> makers;
  for (int t = 0; t < 8; ++t) makers.emplace_back(make_jobs);
  for (auto& t : makers) t.join();
  double setup_s = std::chrono::duration<double>(Clock::now() - setup_start).count();
  std::printf("created %lld DataLoadJobs and %lld pods (ready) in %.1f s\n", static_cast<long long>(jobs),
              static_cast<long long>(jobs * pods_per_job), setup_s);

  // The controller has an identity of its own: the audit log tells its
  // requests from this program's.
  const std::string user = "meshload-controller-bench";
  const std::string kubeconfig = cp.dir() + "/controller.kubeconfig";
  testing::WriteKubeconfig(kubeconfig, cp.UserConfig(user, {"system:masters"}));
  // Every sidecar's /progress, from one server: the address a request came
  // in on says which pod (127.a.b.c = pod index (a-1)*65536 + b*256 + c).
  httplib::Server sidecars;
  std::thread sidecars_thread;
  int sidecar_port = 0;
  const auto t0 = Clock::now();
  std::atomic<int64_t> progress_requests{0};
  if (progress_seconds > 0) {
    sidecars.Get("/progress", [&](const httplib::Request& req, httplib::Response& res) {
      unsigned a = 0, b = 0, c3 = 0, d = 0;
      if (std::sscanf(req.local_addr.c_str(), "%u.%u.%u.%u", &a, &b, &c3, &d) != 4 || a != 127 || b < 1) {
        res.status = 404;
        return;
      }
      const int64_t ip = (static_cast<int64_t>(b) - 1) * 65536 + c3 * 256 + d;
      const int64_t process = ip % pods_per_job;
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const int64_t step = static_cast<int64_t>(seconds * static_cast<double>(steps_per_second));
      ++progress_requests;
      res.set_content(json({{"process", process},
                            {"consumedStep", step},
                            {"resumeStep", step + 1},
                            {"stepsPerSecond", static_cast<double>(steps_per_second)},
                            {"trainerConnected", true},
                            {"trainerWaitFraction", 0.01}})
                          .dump(),
                      "application/json");
    });
    sidecar_port = sidecars.bind_to_any_port("0.0.0.0");
    sidecars_thread = std::thread([&] { sidecars.listen_after_bind(); });
  }
  std::vector<std::string> args = {"/usr/bin/setpriv",
                                   "--pdeathsig",
                                   "KILL",
                                   controller_bin,
                                   "--kubeconfig",
                                   kubeconfig,
                                   "--leader-elect",
                                   "false",
                                   "--metrics-port",
                                   "0",
                                   "--workers",
                                   "8",
                                   "--qps",
                                   "200",
                                   "--burst",
                                   "400",
                                   "--resync-seconds",
                                   "10",
                                   "--log-level",
                                   "warn"};
  if (progress_seconds > 0) {
    args.insert(args.end(), {"--sidecar-metrics-port", std::to_string(sidecar_port)});
  } else {
    args.insert(args.end(), {"--progress-interval-seconds", "0"});
  }
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // Events are counted apart: they are written on their own client at
  // --event-qps, and the ones queued while converging drain afterwards.
  auto count = [&](bool events) {
    return static_cast<int64_t>(cp.Audit([&](const testing::AuditEvent& e) {
                                    return e.user == user && e.write() && e.code >= 200 && e.code < 300 &&
                                           (e.resource == "events") == events;
                                  }).size());
  };
  auto state_writes = [&] { return count(false); };
  auto event_writes = [&] { return count(true); };
  const int64_t writes_before = state_writes(), events_before = event_writes();
  auto start = Clock::now();
  pid_t pid = -1;
  if (posix_spawn(&pid, cargv[0], nullptr, nullptr, cargv.data(), environ) != 0) {
    std::cerr << "cannot start " << controller_bin << "\n";
    return 1;
  }
  // Converged: every job Running, with its generation observed.
  double converge_s = -1;
  while (std::chrono::duration<double>(Clock::now() - start).count() < 300) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    controller::kube::ApiResponse r = c.Get("/apis/meshload.io/v1alpha1/dataloadjobs");
    if (!r.ok()) continue;
    int64_t done = 0;
    for (const auto& j : r.body["items"]) {
      const auto& st = j.value("status", json::object());
      if (st.value("phase", "") == "Running" &&
          st.value("observedGeneration", int64_t{-1}) == j["metadata"].value("generation", int64_t{0}) &&
          st.value("processesReady", int64_t{0}) == pods_per_job) {
        ++done;
      }
    }
    if (done == jobs) {
      converge_s = std::chrono::duration<double>(Clock::now() - start).count();
      break;
    }
  }
  const int64_t writes_converge = state_writes() - writes_before;
  const int64_t events_converge = event_writes() - events_before;
  const int64_t idle_start = state_writes(), idle_events_start = event_writes();
  std::this_thread::sleep_for(std::chrono::seconds(progress_seconds > 0 ? 0 : idle_seconds));
  const int64_t idle_writes = state_writes() - idle_start;
  const int64_t idle_events = event_writes() - idle_events_start;
  // The progress window: the controller's writes while every job runs.
  int64_t progress_writes = 0, with_progress = 0;
  double progress_rate = 0;
  if (progress_seconds > 0) {
    const int64_t before = state_writes();
    const auto from = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(progress_seconds));
    progress_writes = state_writes() - before;
    progress_rate = static_cast<double>(progress_writes) / std::chrono::duration<double>(Clock::now() - from).count();
    controller::kube::ApiResponse r = c.Get("/apis/meshload.io/v1alpha1/dataloadjobs");
    for (const auto& j : r.body["items"]) {
      if (j.value("status", json::object()).value("progress", json::object()).contains("step")) ++with_progress;
    }
  }
  const int64_t hwm = VmHwmKiB(pid);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);

  std::printf("\n%-44s %14s %14s\n", "what", "measured", "target");
  std::printf("%-44s %12.1f s %14s\n", "time until every status converged", converge_s, "< 60 s");
  std::printf("%-44s %10.1f MiB %14s\n", "controller peak RSS (VmHWM)", hwm / 1024.0, "< 200 MiB");
  if (progress_seconds == 0) {
    std::printf("%-44s %14lld %14s\n",
                ("writes while idle (" + std::to_string(idle_seconds) + " s, resync 10 s)").c_str(),
                static_cast<long long>(idle_writes), "0");
  }
  // Each job: its finalizer, ConfigMap, peer Secret and status, once each
  // (a lagging cache may add a retried write; not a target).
  std::printf("%-44s %14lld %14s\n", "writes to converge (all but Events)", static_cast<long long>(writes_converge),
              "4 per job");
  std::printf("%-44s %14lld %14s\n", "Events written while converging / after", static_cast<long long>(events_converge),
              "");
  std::printf("%-44s %14lld %14s\n", "  (drained at --event-qps 5 while idle)", static_cast<long long>(idle_events),
              "");
  std::printf(
      "controller: --workers 8 --qps 200 --burst 400; kube-apiserver %s with etcd (scripts/control-plane, "
      "TLS on loopback, audit log), on this machine\n",
      c.Get("/version").body.value("gitVersion", "?").c_str());
  // With progress polled, the jobs are running, not idle: their writes are
  // the progress window's figure instead.
  bool ok =
      converge_s >= 0 && converge_s < 60 && hwm > 0 && hwm < 200 * 1024 && (progress_seconds > 0 || idle_writes == 0);
  if (progress_seconds > 0) {
    std::printf("\nprogress: %lld jobs x %lld sidecars at %lld steps/s, polled every 15 s (%lld requests answered)\n",
                static_cast<long long>(jobs), static_cast<long long>(pods_per_job),
                static_cast<long long>(steps_per_second), static_cast<long long>(progress_requests.load()));
    std::printf("%-44s %12.2f/s %14s\n", ("writes while running (" + std::to_string(progress_seconds) + " s)").c_str(),
                progress_rate, "< 20/s");
    std::printf("%-44s %14lld %14s\n", "  of which (status and ConfigMap), total",
                static_cast<long long>(progress_writes), "");
    std::printf("%-44s %14lld %14lld\n", "jobs with status.progress.step", static_cast<long long>(with_progress),
                static_cast<long long>(jobs));
    ok = ok && progress_rate < 20 && with_progress == jobs;
    sidecars.stop();
    sidecars_thread.join();
  }
  std::printf("%s\n", ok ? "all targets met" : "TARGETS MISSED");
  return ok ? 0 : 1;
}
