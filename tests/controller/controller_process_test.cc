// meshload-controller as a process against the real kube-apiserver (the
// test program's control plane): two replicas with one Lease (only the
// leader writes, counted from the audit log; SIGSTOP the leader and the
// standby takes over within 20 s; the old leader exits when resumed),
// /metrics checked by promtool, flags; and a job killed and resized that
// resumes, with real sidecars and trainers standing in for its pods, at the
// step the controller recorded.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "tests/controller/test_env.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace meshload::controller {
namespace {

using namespace std::chrono_literals;
using meshload::testing::TempDir;
using meshload::testing::TestCluster;
using meshload::testing::WaitFor;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Process {
  pid_t pid = -1;
  int status = 0;
  bool exited = false;
  ~Process() {
    if (pid > 0 && !exited) {
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  bool WaitExit(std::chrono::milliseconds timeout) {
    if (!WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout, 20ms)) return false;
    exited = true;
    return true;
  }
};

// Spawns `args` with a parent-death signal (setpriv execs it: same pid), so
// a crashed test leaves no controller behind.
std::unique_ptr<Process> Spawn(const std::vector<std::string>& args, const std::string& log,
                               const std::string& out = "/dev/null") {
  auto p = std::make_unique<Process>();
  std::vector<std::string> full = {"/usr/bin/setpriv", "--pdeathsig", "KILL"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (const auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (posix_spawn(&p->pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) p->pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What `cmd` prints on stdout (its exit status in `rc`).
std::string Shell(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int status = pclose(f);
  if (rc != nullptr) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The global batches of steps [from, to) as `meshload plan` gives them:
// each step's samples, shard by shard.
std::map<int64_t, std::vector<int64_t>> GlobalBatches(const std::string& job_file, int64_t from, int64_t to) {
  std::map<int64_t, std::vector<int64_t>> out;
  int rc = 0;
  const std::string text = Shell(std::string(MESHLOAD_BIN) + " plan -f " + job_file + " --format json --steps " +
                                     std::to_string(from) + ":" + std::to_string(to),
                                 &rc);
  json plan = json::parse(text, nullptr, false);
  if (rc != 0 || !plan.is_object()) {
    ADD_FAILURE() << "meshload plan " << job_file << " failed: " << text;
    return out;
  }
  for (const auto& step : plan["steps"]) {
    std::map<int64_t, std::vector<int64_t>> by_shard;  // replicas hold the same shard
    for (const auto& d : step["devices"]) by_shard[d["shard"]] = d["samples"].get<std::vector<int64_t>>();
    auto& batch = out[step["step"].get<int64_t>()];
    for (const auto& [shard, samples] : by_shard) batch.insert(batch.end(), samples.begin(), samples.end());
  }
  return out;
}

// status.progress.step of a job, -1 while there is none.
int64_t ProgressStep(json job) {
  const json& step = job["status"]["progress"]["step"];  // non-const access: absent keys are null
  return step.is_number_integer() ? step.get<int64_t>() : -1;
}

// The demo trainer's report: its last line of output.
json LastJsonLine(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  return json::parse(nl == std::string::npos ? text : text.substr(nl + 1), nullptr, false);
}

// The kubelet's part for one trainer pod of the test: the ConfigMap's keys
// as files (job.json, resume.json) and a sidecar on the pod's "IP" (a
// loopback address); trainers are run to completion by the test.
struct FakePod {
  std::string name, ip, dir;
  int64_t process = -1;
  std::unique_ptr<Process> sidecar;
};

class ControllerProcess : public ::testing::Test {
 protected:
  // The controller's identity (a client certificate of its own), namespace ns_.
  void SetUp() override { cluster_.WriteKubeconfig(dir_.path() + "/kubeconfig"); }
  // The controller as identity `identity` in namespace ns_ (its metrics on
  // 127.0.0.1:metrics_port), with `more` flags, logging to `log`.
  std::unique_ptr<Process> StartController(const std::string& identity, int metrics_port, const std::string& log_level,
                                           std::vector<std::string> more, const std::string& log) {
    std::vector<std::string> args = {MESHLOAD_CONTROLLER_BIN,
                                     "--kubeconfig",
                                     dir_.path() + "/kubeconfig",
                                     "--identity",
                                     identity,
                                     "--metrics-port",
                                     std::to_string(metrics_port),
                                     "--metrics-address",
                                     "127.0.0.1",
                                     "--namespace",
                                     ns_,
                                     "--leader-election-namespace",
                                     ns_,
                                     "--log-level",
                                     log_level};
    args.insert(args.end(), more.begin(), more.end());
    return Spawn(args, log);
  }
  std::unique_ptr<Process> Start(const std::string& identity, int metrics_port) {
    return StartController(identity, metrics_port, "debug", {}, dir_.path() + "/" + identity + ".log");
  }
  std::string Holder() {
    json lease = cluster_.Get("/apis/coordination.k8s.io/v1/namespaces/" + ns_ + "/leases/meshload-controller");
    return lease.is_object() ? lease["spec"].value("holderIdentity", "") : "";
  }
  // Creates one job and its pods; a new generation of readiness each call.
  void Touch(int i) {
    std::string pod = "p-" + std::to_string(i);
    cluster_.CreatePod(ns_, pod, "lead");
    cluster_.SetSidecar(ns_, pod, true);
  }
  json Job() { return cluster_.Get(JobPath("lead")); }
  // The manifest of job `name` (its pods labelled `name`), `processes`
  // processes over the synthetic dataset in dir_/data (see CreateJobOverDataset).
  json DatasetJobManifest(const std::string& name, int processes) {
    json manifest = cluster_.JobManifest(ns_, name, processes, name);
    manifest["spec"]["dataset"]["uri"] = dir_.path() + "/data";
    return manifest;
  }
  // Writes `manifest` to `file`, generates the synthetic dataset its
  // spec.dataset.uri names (the demo trainers verify every byte of it), and
  // creates the job.
  void CreateJobOverDataset(const json& manifest, const std::string& file) {
    std::ofstream(file) << manifest.dump();
    int rc = 0;
    const std::string out = Shell(std::string(MESHLOAD_BIN) + " run --local -f " + file + " --generate-dataset " +
                                      manifest["spec"]["dataset"]["uri"].get<std::string>() + " --steps 1 2>&1",
                                  &rc);
    ASSERT_EQ(rc, 0) << out;
    cluster_.CreateJob(manifest);
  }
  // A controller that polls the sidecars' /progress every second on
  // `sidecar_port`, writing every move at once.
  std::unique_ptr<Process> StartPollingController(const std::string& identity, int sidecar_port) {
    return StartController(identity, 0, "info",
                           {"--progress-interval-seconds", "1", "--progress-min-write-seconds", "0",
                            "--sidecar-metrics-port", std::to_string(sidecar_port)},
                           dir_.path() + "/" + identity + "-controller.log");
  }

  std::string JobPath(const std::string& job) const { return TestCluster::JobPath(ns_, job); }
  std::string ConfigMapPath(const std::string& job) const {
    return "/api/v1/namespaces/" + ns_ + "/configmaps/" + job + "-meshload";
  }
  // The kubelet's part for pod `p` of `job`: the ConfigMap's files and a
  // sidecar serving /progress on the pod's "IP" and `metrics_port`.
  void StartSidecar(FakePod& p, const std::string& job, int metrics_port) {
    json cm = cluster_.Get(ConfigMapPath(job));
    std::ofstream(p.dir + "/job.json") << cm["data"]["job.json"].get<std::string>();
    std::ofstream(p.dir + "/resume.json") << cm["data"]["resume.json"].get<std::string>();
    p.process = std::stoll(cm["data"]["process." + p.name].get<std::string>());
    std::filesystem::remove(p.dir + "/s.sock");
    p.sidecar = Spawn({MESHLOAD_SIDECAR_BIN, "--job", p.dir + "/job.json", "--process", std::to_string(p.process),
                       "--socket", p.dir + "/s.sock", "--metrics-port", std::to_string(metrics_port),
                       "--metrics-address", p.ip, "--progress-window", "2", "--log-level", "info"},
                      p.dir + "/sidecar.log");
  }
  // `n` ready pods <job>-0.. of `job` at 127.0.0.<first_ip + i>, each with
  // a sidecar once the controller has assigned every one a process of an
  // `n`-process plan.
  std::vector<FakePod> StartPods(const std::string& job, int n, int first_ip, int metrics_port) {
    std::vector<FakePod> pods(n);
    for (int i = 0; i < n; ++i) {
      pods[i].name = job + "-" + std::to_string(i);
      pods[i].ip = "127.0.0." + std::to_string(first_ip + i);
      pods[i].dir = dir_.path() + "/" + pods[i].name + "-" + std::to_string(first_ip);
      std::filesystem::create_directories(pods[i].dir);
      cluster_.CreatePod(ns_, pods[i].name, job);
      cluster_.SetSidecar(ns_, pods[i].name, true, 0, pods[i].ip);
    }
    EXPECT_TRUE(WaitFor(
        [&] {
          json cm = cluster_.Get(ConfigMapPath(job));
          if (!cm.is_object()) return false;
          json j = json::parse(cm["data"].value("job.json", "null"), nullptr, false);
          if (!j.is_object() || j["spec"]["mesh"]["processes"] != n) return false;
          for (const auto& p : pods) {
            if (!cm["data"].contains("process." + p.name)) return false;
          }
          return true;
        },
        30s))
        << cluster_.Get(ConfigMapPath(job)).dump(2);
    for (auto& p : pods) StartSidecar(p, job, metrics_port);
    for (auto& p : pods) WaitForSocket(p);
    return pods;
  }
  // A demo trainer of pod `p` taking `delay_ms` a step, until stopped; its
  // log and its final JSON line (trainer.out) in the pod's directory.
  static std::unique_ptr<Process> StartTrainer(const FakePod& p, const std::string& delay_ms) {
    return Spawn({MESHLOAD_BIN, "demo-trainer", "--job", p.dir + "/job.json", "--process", std::to_string(p.process),
                  "--socket", p.dir + "/s.sock", "--delay-ms", delay_ms},
                 p.dir + "/trainer.log", p.dir + "/trainer.out");
  }
  // Runs a demo trainer of pod `p` for `steps` steps; its report (the last
  // line it prints) in `report`. Fails unless it exits 0 and reports.
  static void RunTrainer(const FakePod& p, int steps, json* report) {
    int rc = 0;
    const std::string out = Shell(std::string(MESHLOAD_BIN) + " demo-trainer --job " + p.dir + "/job.json --process " +
                                      std::to_string(p.process) + " --socket " + p.dir + "/s.sock --steps " +
                                      std::to_string(steps) + " 2>&1",
                                  &rc);
    ASSERT_EQ(rc, 0) << out;
    *report = LastJsonLine(out);
    ASSERT_TRUE(report->is_object()) << out;
  }
  // The end of a test: SIGTERM to the pods' sidecars and to the controller,
  // which it waits for.
  static void StopAll(const std::vector<FakePod>& pods, Process& controller) {
    for (const auto& p : pods) kill(p.sidecar->pid, SIGTERM);
    kill(controller.pid, SIGTERM);
    controller.WaitExit(15s);
  }
  static void WaitForSocket(const FakePod& p) {
    EXPECT_TRUE(WaitFor([&] { return std::filesystem::exists(p.dir + "/s.sock"); }, 30s))
        << Slurp(p.dir + "/sidecar.log");
  }

  TestCluster cluster_;
  const std::string ns_ = cluster_.ns();
  TempDir dir_;
};

TEST_F(ControllerProcess, OneLeaderWritesAndAStandbyTakesOverFromAStoppedLeader) {
  cluster_.CreateJob(cluster_.JobManifest(ns_, "lead", 4, "lead"));
  Touch(0);
  auto a = Start("replica-a", FreePort());
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; }, 20s)) << Slurp(dir_.path() + "/replica-a.log");
  auto b = Start("replica-b", FreePort());
  ASSERT_TRUE(WaitFor([&] { return Job()["status"]["processesReady"] == 1; }, 20s));
  Touch(1);
  ASSERT_TRUE(WaitFor([&] { return Job()["status"]["processesReady"] == 2; }, 20s));
  // b has campaigned: it read the lease, found it held, and came back for it
  // again (so it has acted on the first read).
  auto lease_reads_of_b = [&] {
    return cluster_.control_plane()
        .Audit([&](const meshload::testing::AuditEvent& e) {
          return e.verb == "get" && e.resource == "leases" && e.namespace_ == ns_ && e.code == 200 &&
                 e.user_agent.find("(replica-b)") != std::string::npos;
        })
        .size();
  };
  ASSERT_TRUE(WaitFor([&] { return lease_reads_of_b() >= 2; }, 20s, 100ms)) << "replica-b never campaigned\n"
                                                                            << Slurp(dir_.path() + "/replica-b.log");
  EXPECT_GT(cluster_.WriteCountByUserAgent("(replica-a)"), 0);
  EXPECT_EQ(cluster_.WriteCountByUserAgent("(replica-b)"), 0) << "the standby must not write";

  // Freeze the leader: the standby takes the lease after it expires.
  ASSERT_EQ(kill(a->pid, SIGSTOP), 0);
  auto frozen = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-b"; }, 25s)) << Slurp(dir_.path() + "/replica-b.log");
  auto took = std::chrono::steady_clock::now() - frozen;
  EXPECT_LT(took, 20s);
  Touch(2);
  ASSERT_TRUE(WaitFor([&] { return Job()["status"]["processesReady"] == 3; }, 20s));
  EXPECT_GT(cluster_.WriteCountByUserAgent("(replica-b)"), 0);

  // The old leader wakes up: it must notice it lost the lease, not write, and exit.
  const int64_t a_writes = cluster_.WriteCountByUserAgent("(replica-a)");
  kill(a->pid, SIGCONT);
  ASSERT_TRUE(a->WaitExit(15s)) << "the old leader must exit";
  EXPECT_TRUE(WIFEXITED(a->status) && WEXITSTATUS(a->status) == 1);
  EXPECT_EQ(cluster_.WriteCountByUserAgent("(replica-a)"), a_writes) << "no writes after losing the lease";
  EXPECT_THAT(Slurp(dir_.path() + "/replica-a.log"), HasSubstr("lost"));
  std::cout << "[ measured ] takeover after SIGSTOP of the leader: "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n";

  // SIGTERM: the leader releases the lease and exits 0.
  kill(b->pid, SIGTERM);
  ASSERT_TRUE(b->WaitExit(15s));
  EXPECT_TRUE(WIFEXITED(b->status) && WEXITSTATUS(b->status) == 0);
  EXPECT_EQ(Holder(), "");
}

TEST_F(ControllerProcess, ABacklogOfWritesNeverCostsTheLeaderItsLease) {
  // 30 jobs to set up at 0.5 requests/s: a minute of backlog for the
  // reconcilers' client. Renewals (every 500 ms, deadline 2 s) go through
  // the election's own client, so the leader stays sure of its lease; with
  // one shared rate limiter they waited behind the reconcilers, the lease
  // looked expired past the renew deadline, and every reconcile failed with
  // "not the leader" (a second replica would have taken over).
  for (int i = 0; i < 30; ++i) {
    cluster_.CreateJob(cluster_.JobManifest(ns_, "backlog-" + std::to_string(i), 2, "backlog"));
  }
  auto p = StartController("slow", 0, "info",
                           {"--qps", "0.5", "--burst", "1", "--lease-duration-ms", "3000", "--renew-deadline-ms",
                            "2000", "--retry-period-ms", "500"},
                           dir_.path() + "/slow.log");
  ASSERT_GT(p->pid, 0);
  ASSERT_TRUE(WaitFor([&] { return Holder() == "slow"; }, 20s)) << Slurp(dir_.path() + "/slow.log");
  EXPECT_FALSE(p->WaitExit(10s)) << "the leader exited:\n" << Slurp(dir_.path() + "/slow.log");
  EXPECT_EQ(Holder(), "slow");
  const std::string log = Slurp(dir_.path() + "/slow.log");
  EXPECT_THAT(log, Not(HasSubstr("lost leadership")));
  // Renewals starved behind the reconcilers' writes made the leader doubt
  // its lease past the renew deadline, and refuse its own writes.
  EXPECT_THAT(log, Not(HasSubstr("not the leader"))) << "the leader's renewals fell behind";
  EXPECT_GT(cluster_.WriteCountByUserAgent("leader-election"), 0) << "renewals come from their own client";
  kill(p->pid, SIGTERM);
  EXPECT_TRUE(p->WaitExit(15s));
}

TEST_F(ControllerProcess, AJobKilledAndResizedFrom4To8ProcessesResumesAtTheRecordedStep) {
  // The dataset the demo trainers verify every byte of.
  json manifest = DatasetJobManifest("rs", 4);
  manifest["spec"]["batch"]["globalBatchSize"] = 64;  // the same global batch before and after the resize
  const std::string four = dir_.path() + "/rs-4.json";
  ASSERT_NO_FATAL_FAILURE(CreateJobOverDataset(manifest, four));

  const int metrics_port = FreePort();
  auto controller = StartPollingController("rs", metrics_port);
  const std::string cm_path = ConfigMapPath("rs");
  auto job = [&] { return cluster_.Get(JobPath("rs")); };
  auto resume = [&] {
    json cm = cluster_.Get(cm_path);
    return cm.is_object() ? json::parse(cm["data"].value("resume.json", "null"), nullptr, false) : json();
  };

  // 1. Four processes train to step 20 (steps 0..19), then stop.
  auto pods4 = StartPods("rs", 4, 10, metrics_port);
  for (auto& p : pods4) {
    json last;
    ASSERT_NO_FATAL_FAILURE(RunTrainer(p, 20, &last));
    EXPECT_EQ(last["mismatches"], 0);
    EXPECT_EQ(last["first_step"], 0);
  }
  // The reconcile writes the ConfigMap before the job's status: wait for
  // both.
  ASSERT_TRUE(WaitFor(
      [&] {
        return resume() == json({{"step", 20}, {"specStep", 0}}) && job()["status"]["progress"]["step"] == 19;
      },
      60s))
      << job()["status"].dump(2) << "\n"
      << Slurp(dir_.path() + "/rs-controller.log");
  EXPECT_EQ(job()["status"]["progress"]["step"], 19);
  EXPECT_EQ(job()["status"]["progress"]["resumeStep"], 20);

  // 2. Everything is killed; the job is resized to 8 processes with the same
  //    global batch, and new pods come up.
  for (auto& p : pods4) {
    kill(p.sidecar->pid, SIGKILL);
    p.sidecar->WaitExit(10s);
    cluster_.DeletePod(ns_, p.name);
  }
  // As kubectl edit would: again on a conflict (the controller writes the status meanwhile).
  std::string put_error;
  ASSERT_TRUE(WaitFor(
      [&] {
        json resized = job();
        resized["spec"]["mesh"]["processes"] = 8;
        resized["spec"]["mesh"]["axes"] = json::array({{{"name", "data"}, {"size", 16}}});
        resized.erase("status");
        auto put = cluster_.client().Put(JobPath("rs"), resized);
        put_error = put.message();
        return put.ok();
      },
      30s))
      << put_error;
  auto pods8 = StartPods("rs", 8, 30, metrics_port);
  EXPECT_EQ(resume(), json({{"step", 20}, {"specStep", 0}})) << "the recorded step survives the resize";

  // 3. Each new sidecar starts at the recorded step; each trainer gets step
  //    20 first and every byte of its shard as planned for 8 processes.
  for (auto& p : pods8) {
    httplib::Client http(p.ip, metrics_port);
    auto r = http.Get("/progress");
    ASSERT_TRUE(r && r->status == 200) << p.name << " " << Slurp(p.dir + "/sidecar.log");
    EXPECT_EQ(json::parse(r->body)["resumeStep"], 20) << r->body;
  }
  for (auto& p : pods8) {
    json last;
    ASSERT_NO_FATAL_FAILURE(RunTrainer(p, 10, &last));
    EXPECT_EQ(last["mismatches"], 0) << p.name;
    EXPECT_EQ(last["first_step"], 20) << p.name;
    EXPECT_EQ(last["steps"], 10) << p.name;
  }
  ASSERT_TRUE(WaitFor([&] { return job()["status"]["progress"]["step"] == 29; }, 60s)) << job()["status"].dump(2);

  // 4. Those are the global batches of the uninterrupted 4-process run.
  const std::string eight = dir_.path() + "/rs-8.json";
  std::ofstream(eight) << json::parse(Slurp(pods8[0].dir + "/job.json")).dump();
  auto before = GlobalBatches(four, 20, 30), after = GlobalBatches(eight, 20, 30);
  ASSERT_EQ(before.size(), 10u);
  EXPECT_EQ(before, after) << "the global batches of steps 20..29 depend on the mesh";

  StopAll(pods8, *controller);
}

TEST_F(ControllerProcess, ASidecarKilledMidRunComesBackAndItsTrainerGoesOnWithIdenticalBytes) {
  json manifest = DatasetJobManifest("mid", 2);
  ASSERT_NO_FATAL_FAILURE(CreateJobOverDataset(manifest, dir_.path() + "/mid.json"));
  const int metrics_port = FreePort();
  auto controller = StartPollingController("mid", metrics_port);
  std::vector<FakePod> pods = StartPods("mid", 2, 50, metrics_port);
  // Trainers that take 20 ms a step and run until stopped.
  std::vector<std::unique_ptr<Process>> trainers;
  for (auto& p : pods) trainers.push_back(StartTrainer(p, "20"));
  auto job = [&] { return cluster_.Get(JobPath("mid")); };
  ASSERT_TRUE(WaitFor([&] { return ProgressStep(job()) >= 20; }, 60s))
      << job()["status"].dump(2) << Slurp(pods[0].dir + "/trainer.log") << Slurp(pods[0].dir + "/sidecar.log");

  // Process 1's sidecar dies mid-run and is restarted (the kubelet would):
  // it starts at the recorded step, its trainer reconnects and asks for the
  // step it has not had, and goes on.
  kill(pods[1].sidecar->pid, SIGKILL);
  pods[1].sidecar->WaitExit(10s);
  StartSidecar(pods[1], "mid", metrics_port);
  WaitForSocket(pods[1]);
  ASSERT_TRUE(WaitFor(
      [&] {
        json j = job();
        return ProgressStep(j) >= 60 && !j["status"]["progress"].contains("unreachable");
      },
      60s))
      << job()["status"].dump(2);
  for (size_t i = 0; i < trainers.size(); ++i) {
    kill(trainers[i]->pid, SIGTERM);
    ASSERT_TRUE(trainers[i]->WaitExit(15s));
    EXPECT_TRUE(WIFEXITED(trainers[i]->status) && WEXITSTATUS(trainers[i]->status) == 0)
        << Slurp(pods[i].dir + "/trainer.log");
    json last = LastJsonLine(Slurp(pods[i].dir + "/trainer.out"));
    ASSERT_TRUE(last.is_object()) << Slurp(pods[i].dir + "/trainer.out");
    EXPECT_EQ(last["mismatches"], 0) << pods[i].name;
    EXPECT_GE(last["steps"].get<int64_t>(), 60) << pods[i].name;
    EXPECT_EQ(last["reconnects"].get<int64_t>() > 0, i == 1) << pods[i].name << ": " << last.dump();
  }
  StopAll(pods, *controller);
}

TEST_F(ControllerProcess, ASlowTrainerIsStragglingAndKubectlDescribeNamesItsProcessAndWhatIsSlow) {
  json manifest = DatasetJobManifest("slow", 2);
  manifest["spec"]["health"] = {{"stragglerSteps", 20}};
  ASSERT_NO_FATAL_FAILURE(CreateJobOverDataset(manifest, dir_.path() + "/slow.json"));
  const int metrics_port = FreePort();
  auto controller = StartPollingController("slow", metrics_port);
  std::vector<FakePod> pods = StartPods("slow", 2, 70, metrics_port);
  // Process of pod slow-1 trains at 60 ms a step, the other at 1 ms: the
  // slow one falls behind without ever waiting for data.
  std::vector<std::unique_ptr<Process>> trainers;
  for (size_t i = 0; i < pods.size(); ++i) trainers.push_back(StartTrainer(pods[i], i == 1 ? "60" : "1"));
  const std::string slow = "process " + std::to_string(pods[1].process) + " (pod slow-1)";
  auto job = [&] { return cluster_.Get(JobPath("slow")); };
  auto condition = [&](const json& j, const std::string& type) {
    for (const auto& c : j["status"].value("conditions", json::array())) {
      if (c.value("type", "") == type) return c;
    }
    return json();
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        json c = condition(job(), "Straggling");
        return c.is_object() && c.value("status", "") == "True";
      },
      60s))
      << job()["status"].dump(2) << Slurp(dir_.path() + "/slow-controller.log");
  json j = job();
  json straggling = condition(j, "Straggling");
  EXPECT_EQ(straggling["reason"], "ProcessesStraggle");
  EXPECT_EQ(straggling["message"],
            slow + " is more than 20 steps behind the median: its trainer is slow (it does not wait for data)")
      << straggling.dump();
  ASSERT_TRUE(j["status"]["progress"].contains("lagging")) << j["status"].dump(2);
  ASSERT_EQ(j["status"]["progress"]["lagging"].size(), 1u) << j["status"].dump(2);
  EXPECT_EQ(j["status"]["progress"]["lagging"][0]["pod"], "slow-1");
  EXPECT_EQ(j["status"]["progress"]["lagging"][0]["slow"], "trainer");

  // What a user sees: kubectl describe, as the admin.
  const std::string kubeconfig = dir_.path() + "/admin.kubeconfig";
  meshload::testing::WriteKubeconfig(kubeconfig, cluster_.config());
  int rc = 0;
  const std::string described = Shell(cluster_.control_plane().bin_dir() + "/kubectl --kubeconfig " + kubeconfig +
                                          " -n " + ns_ + " describe dlj slow 2>&1",
                                      &rc);
  ASSERT_EQ(rc, 0) << described;
  EXPECT_THAT(described, HasSubstr(slow + " is more than 20 steps behind the median: its trainer is slow"));
  EXPECT_THAT(described, HasSubstr("Lagging:"));
  EXPECT_TRUE(std::regex_search(described, std::regex("Lagging:\\n +Behind: +[0-9]+\\n +Pod: +slow-1\\n +Process: +" +
                                                      std::to_string(pods[1].process) + "\\n +Slow: +trainer\\n")))
      << described;
  // The change of condition is an Event, a warning with the same message.
  EXPECT_TRUE(std::regex_search(
      described, std::regex("Warning +ProcessesStraggle +.* meshload-controller +process " +
                            std::to_string(pods[1].process) + " \\(pod slow-1\\) is more than 20 steps")))
      << described;
  // kubectl get shows the step every process has consumed: the slow one's.
  const std::string got = Shell(cluster_.control_plane().bin_dir() + "/kubectl --kubeconfig " + kubeconfig + " -n " +
                                    ns_ + " get dlj slow -o custom-columns=STEP:.status.progress.step --no-headers",
                                &rc);
  ASSERT_EQ(rc, 0) << got;
  const json after = job();
  EXPECT_GE(std::stoll(got), j["status"]["progress"]["step"].get<int64_t>()) << got;
  EXPECT_LE(std::stoll(got), after["status"]["progress"]["step"].get<int64_t>()) << got;

  for (auto& t : trainers) kill(t->pid, SIGTERM);
  for (auto& t : trainers) t->WaitExit(15s);
  StopAll(pods, *controller);
}

TEST_F(ControllerProcess, MetricsHealthAndReadinessAndPromtool) {
  cluster_.CreateJob(cluster_.JobManifest(ns_, "lead", 2, "lead"));
  const int port = FreePort();
  auto p = Start("solo", port);
  httplib::Client http("127.0.0.1", port);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto r = http.Get("/readyz");
        return r && r->status == 200;
      },
      20s))
      << Slurp(dir_.path() + "/solo.log");
  ASSERT_TRUE(WaitFor([&] { return Job()["status"].contains("phase"); }, 20s));
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // The status write lands before the reconcile that made it is counted
  // and logged: wait for those too.
  const std::vector<std::string> wanted = {
      "meshload_controller_reconciles_total",   "meshload_controller_reconcile_duration_seconds",
      "meshload_controller_queue_depth",        "meshload_controller_leader 1",
      "meshload_controller_api_requests_total", "meshload_build_info{component=\"controller\""};
  std::string metrics;
  const bool all_there = WaitFor(
      [&] {
        auto m = http.Get("/metrics");
        if (!m) return false;
        metrics = m->body;
        for (const auto& want : wanted) {
          if (metrics.find(want) == std::string::npos) return false;
        }
        return true;
      },
      20s);
  for (const auto& want : wanted) EXPECT_THAT(metrics, HasSubstr(want)) << want;
  EXPECT_TRUE(all_there);
  // JSON logs with a reconcile id.
  EXPECT_TRUE(
      WaitFor([&] { return Slurp(dir_.path() + "/solo.log").find("\"reconcile_id\":") != std::string::npos; }, 20s))
      << Slurp(dir_.path() + "/solo.log");
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    std::ofstream(dir_.path() + "/metrics.txt") << metrics;
    std::string cmd = "promtool check metrics < " + dir_.path() + "/metrics.txt";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << metrics;
  } else {
    std::cout << "[ note ] promtool not installed: the exposition format is not checked here\n";
  }
  kill(p->pid, SIGTERM);
  ASSERT_TRUE(p->WaitExit(15s));
}

TEST_F(ControllerProcess, BadFlagsAndMissingConfigAreClearErrors) {
  auto p = Spawn({MESHLOAD_CONTROLLER_BIN, "--workers", "0"}, dir_.path() + "/flags.log");
  ASSERT_TRUE(p->WaitExit(10s));
  EXPECT_EQ(WEXITSTATUS(p->status), 2);
  EXPECT_THAT(Slurp(dir_.path() + "/flags.log"), HasSubstr("--workers"));
  auto q = Spawn({MESHLOAD_CONTROLLER_BIN, "--kubeconfig", dir_.path() + "/nope"}, dir_.path() + "/cfg.log");
  ASSERT_TRUE(q->WaitExit(10s));
  EXPECT_EQ(WEXITSTATUS(q->status), 1);
  EXPECT_THAT(Slurp(dir_.path() + "/cfg.log"), HasSubstr("nope"));
}

}  // namespace
}  // namespace meshload::controller
