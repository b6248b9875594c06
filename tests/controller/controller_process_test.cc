// meshload-controller as a process against the real kube-apiserver (the
// test program's control plane): two replicas with one Lease (only the
// leader writes, counted from the audit log; SIGSTOP the leader and the
// standby takes over within 20 s; the old leader exits when resumed),
// /metrics checked by promtool, flags.

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "tests/controller/test_env.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace meshload::controller {
namespace {

using meshload::testing::TempDir;
using meshload::testing::TestCluster;
using nlohmann::json;
using namespace std::chrono_literals;

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
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        return true;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
};

// Spawns `args` with a parent-death signal (setpriv execs it: same pid), so
// a crashed test leaves no controller behind.
std::unique_ptr<Process> Spawn(const std::vector<std::string>& args, const std::string& log) {
  auto p = std::make_unique<Process>();
  std::vector<std::string> full = {"/usr/bin/setpriv", "--pdeathsig", "KILL"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (const auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  if (posix_spawn(&p->pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) p->pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ControllerProcess : public ::testing::Test {
 protected:
  // The controller's identity (a client certificate of its own), namespace ns_.
  void SetUp() override { cluster_.WriteKubeconfig(dir_.path() + "/kubeconfig"); }
  std::unique_ptr<Process> Start(const std::string& identity, int metrics_port) {
    return Spawn({MESHLOAD_CONTROLLER_BIN, "--kubeconfig", dir_.path() + "/kubeconfig", "--identity", identity,
                  "--metrics-port", std::to_string(metrics_port), "--metrics-address", "127.0.0.1",
                  "--namespace", ns_, "--leader-election-namespace", ns_, "--log-level", "debug"},
                 dir_.path() + "/" + identity + ".log");
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
  json Job() { return cluster_.Get("/apis/meshload.io/v1alpha1/namespaces/" + ns_ + "/dataloadjobs/lead"); }

  TestCluster cluster_;
  const std::string ns_ = cluster_.ns();
  TempDir dir_;
};

TEST_F(ControllerProcess, OneLeaderWritesAndAStandbyTakesOverFromAStoppedLeader) {
  cluster_.CreateJob(cluster_.JobManifest(ns_, "lead", 4, "lead"));
  Touch(0);
  auto a = Start("replica-a", FreePort());
  ASSERT_TRUE(TestCluster::Eventually([&] { return Holder() == "replica-a"; }, 20s)) << Slurp(dir_.path() + "/replica-a.log");
  auto b = Start("replica-b", FreePort());
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job()["status"]["processesReady"] == 1; }, 20s));
  Touch(1);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job()["status"]["processesReady"] == 2; }, 20s));
  std::this_thread::sleep_for(2s);  // b has campaigned at least once
  EXPECT_GT(cluster_.WriteCountByUserAgent("(replica-a)"), 0);
  EXPECT_EQ(cluster_.WriteCountByUserAgent("(replica-b)"), 0) << "the standby must not write";

  // Freeze the leader: the standby takes the lease after it expires.
  ASSERT_EQ(kill(a->pid, SIGSTOP), 0);
  auto frozen = std::chrono::steady_clock::now();
  ASSERT_TRUE(TestCluster::Eventually([&] { return Holder() == "replica-b"; }, 25s)) << Slurp(dir_.path() + "/replica-b.log");
  auto took = std::chrono::steady_clock::now() - frozen;
  EXPECT_LT(took, 20s);
  Touch(2);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job()["status"]["processesReady"] == 3; }, 20s));
  EXPECT_GT(cluster_.WriteCountByUserAgent("(replica-b)"), 0);

  // The old leader wakes up: it must notice it lost the lease, not write, and exit.
  const int64_t a_writes = cluster_.WriteCountByUserAgent("(replica-a)");
  kill(a->pid, SIGCONT);
  ASSERT_TRUE(a->WaitExit(15s)) << "the old leader must exit";
  EXPECT_TRUE(WIFEXITED(a->status) && WEXITSTATUS(a->status) == 1);
  EXPECT_EQ(cluster_.WriteCountByUserAgent("(replica-a)"), a_writes) << "no writes after losing the lease";
  EXPECT_NE(Slurp(dir_.path() + "/replica-a.log").find("lost"), std::string::npos);
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
  auto p = Spawn({MESHLOAD_CONTROLLER_BIN, "--kubeconfig", dir_.path() + "/kubeconfig", "--identity", "slow",
                  "--metrics-port", "0", "--metrics-address", "127.0.0.1", "--namespace", ns_, "--leader-election-namespace", ns_,
                  "--qps", "0.5", "--burst", "1", "--lease-duration-ms", "3000", "--renew-deadline-ms", "2000",
                  "--retry-period-ms", "500", "--log-level", "info"},
                 dir_.path() + "/slow.log");
  ASSERT_GT(p->pid, 0);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Holder() == "slow"; }, 20s)) << Slurp(dir_.path() + "/slow.log");
  EXPECT_FALSE(p->WaitExit(10s)) << "the leader exited:\n" << Slurp(dir_.path() + "/slow.log");
  EXPECT_EQ(Holder(), "slow");
  const std::string log = Slurp(dir_.path() + "/slow.log");
  EXPECT_EQ(log.find("lost leadership"), std::string::npos);
  // Renewals starved behind the reconcilers' writes made the leader doubt
  // its lease past the renew deadline, and refuse its own writes.
  EXPECT_EQ(log.find("not the leader"), std::string::npos) << "the leader's renewals fell behind";
  EXPECT_GT(cluster_.WriteCountByUserAgent("leader-election"), 0) << "renewals come from their own client";
  kill(p->pid, SIGTERM);
  EXPECT_TRUE(p->WaitExit(15s));
}

TEST_F(ControllerProcess, MetricsHealthAndReadinessAndPromtool) {
  cluster_.CreateJob(cluster_.JobManifest(ns_, "lead", 2, "lead"));
  const int port = FreePort();
  auto p = Start("solo", port);
  httplib::Client http("127.0.0.1", port);
  ASSERT_TRUE(TestCluster::Eventually([&] {
    auto r = http.Get("/readyz");
    return r && r->status == 200;
  }, 20s)) << Slurp(dir_.path() + "/solo.log");
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job()["status"].contains("phase"); }, 20s));
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // The status write lands before the reconcile that made it is counted
  // and logged: wait for those too.
  const std::vector<std::string> wanted = {
      "meshload_controller_reconciles_total", "meshload_controller_reconcile_duration_seconds",
      "meshload_controller_queue_depth", "meshload_controller_leader 1", "meshload_controller_api_requests_total",
      "meshload_build_info{component=\"controller\""};
  std::string metrics;
  const bool all_there = TestCluster::Eventually([&] {
    auto m = http.Get("/metrics");
    if (!m) return false;
    metrics = m->body;
    for (const auto& want : wanted) {
      if (metrics.find(want) == std::string::npos) return false;
    }
    return true;
  }, 20s);
  for (const auto& want : wanted) EXPECT_NE(metrics.find(want), std::string::npos) << want;
  EXPECT_TRUE(all_there);
  // JSON logs with a reconcile id.
  EXPECT_TRUE(TestCluster::Eventually(
      [&] { return Slurp(dir_.path() + "/solo.log").find("\"reconcile_id\":") != std::string::npos; }, 20s))
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
  EXPECT_NE(Slurp(dir_.path() + "/flags.log").find("--workers"), std::string::npos);
  auto q = Spawn({MESHLOAD_CONTROLLER_BIN, "--kubeconfig", dir_.path() + "/nope"}, dir_.path() + "/cfg.log");
  ASSERT_TRUE(q->WaitExit(10s));
  EXPECT_EQ(WEXITSTATUS(q->status), 1);
  EXPECT_NE(Slurp(dir_.path() + "/cfg.log").find("nope"), std::string::npos);
}

}  // namespace
}  // namespace meshload::controller
