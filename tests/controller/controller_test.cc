// The reconciler end to end: a Controller (informers, queue, workers)
// against the fake API server, checking what lands in the cluster.

#include "controller/controller.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "common/metrics/metrics.h"
#include "tests/controller/test_env.h"

namespace meshload::controller {
namespace {

using meshload::testing::TestCluster;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr char kNs[] = "training";

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override { cluster_.CreateNamespace(kNs); }
  void TearDown() override { StopController(); }

  void StartController(ControllerOptions options = {}) {
    registry_ = std::make_unique<metrics::Registry>();
    controller_ = std::make_unique<Controller>(&cluster_.client(), registry_.get(), options);
    ASSERT_TRUE(controller_->Start(10s).ok());
    controller_->StartWorkers();
  }
  void StopController() {
    if (controller_) controller_->Stop();
    controller_.reset();
    registry_.reset();
  }
  // Waits until the controller has nothing left to do.
  void Settle() { ASSERT_TRUE(controller_->WaitIdle(300ms, 30s)); }

  json Job(const std::string& name) {
    return cluster_.Get(std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/" + name);
  }
  json ConfigMapOf(const std::string& name) {
    return cluster_.Get(std::string("/api/v1/namespaces/") + kNs + "/configmaps/" + name + "-meshload");
  }
  static json Condition(const json& job, const std::string& type) {
    for (const auto& c : job["status"]["conditions"]) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  // pod name -> process index, from the ConfigMap.
  std::map<std::string, int> Assignment(const std::string& job) {
    std::map<std::string, int> out;
    json cm = ConfigMapOf(job);
    if (!cm.is_object()) return out;
    for (auto it = cm["data"].begin(); it != cm["data"].end(); ++it) {
      if (it.key().rfind("process.", 0) == 0) out[it.key().substr(8)] = std::stoi(it.value().get<std::string>());
    }
    return out;
  }
  void ReadyPods(const std::string& app, int n, int first = 0) {
    for (int i = first; i < first + n; ++i) {
      std::string name = app + "-" + std::to_string(i);
      cluster_.CreatePod(kNs, name, app);
      cluster_.SetSidecar(kNs, name, true);
    }
  }
  int64_t Writes() { return cluster_.server().WriteCount(); }

  TestCluster cluster_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Controller> controller_;
};

TEST_F(ControllerTest, ValidJobGetsConfigMapStatusAndFinalizer) {
  ReadyPods("llm", 4);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "train", 4, "llm"));
  StartController();
  Settle();
  json job = Job("train");
  EXPECT_EQ(job["status"]["phase"], "Running") << job["status"].dump(2);
  EXPECT_EQ(job["status"]["processesReady"], 4);
  EXPECT_EQ(job["status"]["observedGeneration"], job["metadata"]["generation"]);
  EXPECT_EQ(Condition(job, "Valid")["status"], "True");
  EXPECT_EQ(Condition(job, "Planned")["status"], "True");
  EXPECT_EQ(Condition(job, "Planned")["message"], "8192 samples, 128 steps per epoch");
  EXPECT_EQ(Condition(job, "SidecarsReady")["status"], "True");
  EXPECT_EQ(Condition(job, "Degraded")["status"], "False");
  EXPECT_EQ(job["metadata"]["finalizers"], json::array({"meshload.io/cleanup"}));

  json cm = ConfigMapOf("train");
  ASSERT_TRUE(cm.is_object());
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(cm["metadata"]["labels"]["meshload.io/job"], "train");
  EXPECT_EQ(cm["data"]["planHash"], job["status"]["planHash"]);
  EXPECT_EQ((std::map<std::string, int>{{"llm-0", 0}, {"llm-1", 1}, {"llm-2", 2}, {"llm-3", 3}}), Assignment("train"));
  json manifest = json::parse(cm["data"]["job.json"].get<std::string>());
  EXPECT_EQ(manifest["kind"], "DataLoadJob");
  EXPECT_EQ(manifest["spec"], job["spec"]) << "the sidecars read exactly the validated spec";
  json assignments = json::parse(cm["data"]["assignments.json"].get<std::string>());
  EXPECT_EQ(assignments["processes"], 4);
  EXPECT_EQ(assignments["samples"], 8192);
  EXPECT_FALSE(cm["data"]["rendezvous"].get<std::string>().empty());
}

TEST_F(ControllerTest, ReconcileWithNothingChangedMakesZeroWrites) {
  ReadyPods("llm", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "train", 2, "llm"));
  StartController();
  Settle();
  const int64_t before = Writes();
  const int64_t reconciles = controller_->reconciles();
  for (int i = 0; i < 20; ++i) controller_->queue().Add(std::string(kNs) + "/train");
  Settle();
  EXPECT_GT(controller_->reconciles(), reconciles);
  ReconcileResult r;
  ASSERT_TRUE(controller_->reconciler().Reconcile(std::string(kNs) + "/train", &r).ok());
  EXPECT_EQ(r.writes, 0);
  EXPECT_EQ(Writes(), before) << "an idle reconcile must not write";
}

TEST_F(ControllerTest, InvalidSpecIsValidFalseWithTheMessagesAndNothingElse) {
  ReadyPods("bad", 2);
  json manifest = cluster_.JobManifest(kNs, "broken", 2, "bad");
  manifest["spec"]["mesh"]["axes"] = json::array({{{"name", "data"}, {"size", 3}}});  // 2 x 2 devices != 3
  cluster_.CreateJob(manifest);
  StartController();
  Settle();
  json job = Job("broken");
  EXPECT_EQ(job["status"]["phase"], "Failed");
  json valid = Condition(job, "Valid");
  EXPECT_EQ(valid["status"], "False");
  EXPECT_EQ(valid["reason"], "InvalidSpec");
  EXPECT_NE(valid["message"].get<std::string>().find("spec.mesh"), std::string::npos) << valid.dump();
  EXPECT_FALSE(ConfigMapOf("broken").is_object()) << "an invalid job gets no ConfigMap";

  // Fixing the spec: generation moves, the job becomes valid and configured.
  job["spec"]["mesh"]["axes"] = json::array({{{"name", "data"}, {"size", 4}}});
  job.erase("status");
  ASSERT_TRUE(cluster_.client().Put(std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/broken", job).ok());
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("broken")["status"]["phase"] == "Running"; }));
  json fixed = Job("broken");
  EXPECT_EQ(fixed["status"]["observedGeneration"], 2);
  EXPECT_EQ(Condition(fixed, "Valid")["observedGeneration"], 2);
  EXPECT_TRUE(ConfigMapOf("broken").is_object());
}

TEST_F(ControllerTest, CompletionIndexWinsAndProblemsAreConditions) {
  for (int i = 0; i < 3; ++i) {
    std::string name = "idx-" + std::to_string(i);
    cluster_.CreatePod(kNs, name, "idx", {{"batch.kubernetes.io/job-completion-index", std::to_string(2 - i)}});
    cluster_.SetSidecar(kNs, name, true);
  }
  cluster_.CreateJob(cluster_.JobManifest(kNs, "indexed", 3, "idx"));
  StartController();
  Settle();
  EXPECT_EQ((std::map<std::string, int>{{"idx-0", 2}, {"idx-1", 1}, {"idx-2", 0}}), Assignment("indexed"));
  EXPECT_EQ(Job("indexed")["status"]["phase"], "Running");

  // A fourth pod with a duplicate index: Degraded, nobody crashes, the
  // assignment holds.
  cluster_.CreatePod(kNs, "idx-dup", "idx", {{"batch.kubernetes.io/job-completion-index", "1"}});
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("indexed")["status"]["phase"] == "Degraded"; }));
  json d = Condition(Job("indexed"), "Degraded");
  EXPECT_EQ(d["reason"], "DuplicateCompletionIndex");
  EXPECT_NE(d["message"].get<std::string>().find("idx-dup"), std::string::npos);
  cluster_.CreatePod(kNs, "idx-far", "idx", {{"batch.kubernetes.io/job-completion-index", "7"}});
  ASSERT_TRUE(TestCluster::Eventually([&] {
    return Condition(Job("indexed"), "Degraded")["message"].get<std::string>().find("completion index 7") !=
           std::string::npos;
  }));
  EXPECT_EQ(Assignment("indexed").size(), 3u);
}

TEST_F(ControllerTest, ReplacedPodsTakeTheFreedIndexAndOthersKeepTheirs) {
  ReadyPods("rep", 4);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "rep", 4, "rep"));
  StartController();
  Settle();
  auto before = Assignment("rep");
  ASSERT_EQ(before.size(), 4u);
  // rep-1 dies: too few pods is a condition.
  cluster_.DeletePod(kNs, "rep-1");
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("rep")["status"]["processesReady"] == 3; }));
  json job = Job("rep");
  EXPECT_EQ(job["status"]["phase"], "Degraded");
  EXPECT_EQ(Condition(job, "SidecarsReady")["reason"], "WaitingForPods");
  EXPECT_NE(Condition(job, "SidecarsReady")["message"].get<std::string>().find("processes without a pod: 1"),
            std::string::npos);
  // Its replacement (a new name, as a Deployment or JobSet would make) gets 1.
  cluster_.CreatePod(kNs, "rep-new", "rep");
  cluster_.SetSidecar(kNs, "rep-new", true);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("rep")["status"]["phase"] == "Running"; }));
  auto after = Assignment("rep");
  EXPECT_EQ(after["rep-new"], before["rep-1"]);
  for (const char* p : {"rep-0", "rep-2", "rep-3"}) EXPECT_EQ(after[p], before[p]) << p;
  // Too many pods: a condition naming the extra pod; assignments unchanged.
  cluster_.CreatePod(kNs, "rep-extra", "rep");
  ASSERT_TRUE(TestCluster::Eventually([&] { return Condition(Job("rep"), "Degraded")["reason"] == "TooManyPods"; }));
  EXPECT_NE(Condition(Job("rep"), "Degraded")["message"].get<std::string>().find("rep-extra"), std::string::npos);
  EXPECT_EQ(Assignment("rep"), after);
}

TEST_F(ControllerTest, RestartKeepsTheAssignmentAndMakesNoWrites) {
  ReadyPods("rs", 3);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "rs", 3, "rs"));
  StartController();
  Settle();
  // Change the pods so that a fresh assignment would differ: the oldest pod
  // goes away and comes back under a name that sorts first.
  cluster_.DeletePod(kNs, "rs-0");
  cluster_.CreatePod(kNs, "aa-rs", "rs");
  cluster_.SetSidecar(kNs, "aa-rs", true);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Assignment("rs").count("aa-rs") == 1; }));
  Settle();
  auto assignment = Assignment("rs");
  json status = Job("rs")["status"];
  StopController();
  const int64_t writes = Writes();
  StartController();
  Settle();
  EXPECT_EQ(Assignment("rs"), assignment);
  EXPECT_EQ(Job("rs")["status"], status);
  EXPECT_EQ(Writes(), writes) << "a restarted controller must find nothing to write";
}

TEST_F(ControllerTest, SidecarNotReadyAndRestartingAreVisible) {
  ReadyPods("sc", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "sc", 2, "sc"));
  StartController();
  Settle();
  cluster_.SetSidecar(kNs, "sc-1", false, /*restarts=*/3);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("sc")["status"]["processesReady"] == 1; }));
  json job = Job("sc");
  EXPECT_EQ(job["status"]["phase"], "Degraded");
  EXPECT_EQ(Condition(job, "Degraded")["reason"], "SidecarRestarting");
  EXPECT_EQ(Condition(job, "SidecarsReady")["reason"], "SidecarsNotReady");
  std::string ltt = Condition(job, "Valid")["lastTransitionTime"];
  cluster_.SetSidecar(kNs, "sc-1", true, 3);
  ASSERT_TRUE(TestCluster::Eventually([&] { return Job("sc")["status"]["phase"] == "Running"; }));
  EXPECT_EQ(Condition(Job("sc"), "Valid")["lastTransitionTime"], ltt)
      << "a condition whose status did not change keeps its lastTransitionTime";
}

TEST_F(ControllerTest, DeletionCleansUpAndRemovesTheFinalizer) {
  ReadyPods("del", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "del", 2, "del"));
  StartController();
  Settle();
  ASSERT_TRUE(ConfigMapOf("del").is_object());
  auto r = cluster_.client().Delete(std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/del");
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_TRUE(TestCluster::Eventually([&] {
    return cluster_.client().Get(std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/del").code == 404;
  }));
  EXPECT_FALSE(ConfigMapOf("del").is_object());
}

TEST_F(ControllerTest, StatusConflictsAreRetriedAfterReReading) {
  ReadyPods("cf", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "cf", 2, "cf"));
  StartController();
  Settle();
  // Someone else bumps the resourceVersion (a label) while a pod changes.
  std::string path = std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/cf";
  for (int i = 0; i < 5; ++i) {
    cluster_.client().Patch(path, {{"metadata", {{"labels", {{"touch", std::to_string(i)}}}}}});
    cluster_.SetSidecar(kNs, "cf-1", i % 2 == 0);
  }
  Settle();
  EXPECT_EQ(Job("cf")["status"]["processesReady"], 2);
  EXPECT_EQ(Job("cf")["status"]["phase"], "Running");
}

// The whole scenario, once cleanly and once with the API server misbehaving
// (watch drops, 410s, 429s, 500s) for the controller's whole start-up and
// its first reconciles: the end state must be the same.
json RunScenario(bool faults, const json& expect = nullptr) {
  // The test's own client insists, so that only the controller feels the faults.
  TestCluster cluster(TestCluster::Options{
      .client = {.max_attempts = 1000, .backoff_base = std::chrono::milliseconds(5),
                 .backoff_cap = std::chrono::milliseconds(50)}});
  cluster.CreateNamespace(kNs);
  for (int j = 0; j < 3; ++j) {
    std::string app = "app" + std::to_string(j);
    for (int i = 0; i < 3; ++i) {
      std::string pod = app + "-" + std::to_string(i);
      cluster.CreatePod(kNs, pod, app);
      cluster.SetSidecar(kNs, pod, !(j == 2 && i == 2));
    }
    cluster.CreateJob(cluster.JobManifest(kNs, "job" + std::to_string(j), 3, app));
  }
  json bad = cluster.JobManifest(kNs, "bad", 2, "none");
  bad["spec"]["batch"]["globalBatchSize"] = 3;
  cluster.CreateJob(bad);

  // The faults last a fixed 25 rounds (about 4 s) from before the
  // controller starts, however slowly it starts (sanitizer builds), and a
  // change lands in the middle of them.
  std::atomic<int> rounds{0};
  std::thread chaos;
  if (faults) {
    chaos = std::thread([&] {
      for (; rounds < 25; ++rounds) {
        switch (rounds % 5) {
          case 0: cluster.server().CloseAllWatches(); break;
          case 1: cluster.server().InjectErrors("/api", 500, 2); break;
          case 2: cluster.server().InjectErrors("/api", 429, 1, 1); break;
          case 3: cluster.server().CompactHistory(); cluster.server().CloseAllWatches(); break;
          case 4: cluster.server().InjectErrors("/apis/meshload.io", 503, 1); break;
        }
        // A change while the faults go on: the last pod of app2 becomes ready.
        if (rounds == 8) cluster.SetSidecar(kNs, "app2-2", true);
        std::this_thread::sleep_for(150ms);
      }
      cluster.server().ClearInjectedErrors();
    });
  }
  metrics::Registry registry;
  ControllerOptions options;
  options.watch_timeout = std::chrono::seconds(2);
  auto client = cluster.NewClient();  // default retries, as in production
  Controller controller(client.get(), &registry, options);
  EXPECT_TRUE(controller.Start(120s).ok());
  controller.StartWorkers();
  if (!faults) cluster.SetSidecar(kNs, "app2-2", true);
  if (chaos.joinable()) chaos.join();
  if (faults) {
    EXPECT_GE(rounds.load(), 15);
  }
  // After the faults stop, the controller must converge on its own (its
  // informers may still be backing off from the last failures).
  auto snapshot = [&] {
  json state = json::object();
  for (const char* j : {"job0", "job1", "job2", "bad"}) {
    json job = cluster.Get(std::string("/apis/meshload.io/v1alpha1/namespaces/") + kNs + "/dataloadjobs/" + j);
    json status = job["status"];
    for (auto& c : status["conditions"]) c.erase("lastTransitionTime");
    state[j] = {{"status", status}, {"finalizers", job["metadata"]["finalizers"]}};
    json cm = cluster.Get(std::string("/api/v1/namespaces/") + kNs + "/configmaps/" + j + "-meshload");
    if (!cm.is_object()) continue;
    json data = cm["data"];
    // Pod uids differ between the two clusters; everything else must not.
    json assignments = json::parse(data["assignments.json"].get<std::string>());
    for (auto& p : assignments["pods"]) p.erase("uid");
    data["assignments.json"] = assignments;
    state[j]["data"] = data;
  }
  return state;
  };
  json state;
  if (expect.is_null()) {
    EXPECT_TRUE(controller.WaitIdle(1s, 60s));
    state = snapshot();
  } else {
    TestCluster::Eventually([&] { return (state = snapshot()) == expect; }, 60s);
  }
  controller.Stop();
  return state;
}

TEST(ControllerFaults, EndStateUnderApiFaultsEqualsTheCleanRun) {
  json clean = RunScenario(false);
  json faulty = RunScenario(true, clean);
  EXPECT_EQ(clean["job2"]["status"]["phase"], "Running");
  EXPECT_EQ(clean["bad"]["status"]["phase"], "Failed");
  EXPECT_EQ(clean["job0"]["status"]["phase"], "Running");
  EXPECT_EQ(faulty, clean) << "clean:\n" << clean.dump(1) << "\nwith faults:\n" << faulty.dump(1);
}

TEST(ControllerMetrics, ExposesReconcilesQueueAndApiRequests) {
  TestCluster cluster;
  metrics::Registry registry;
  auto client = cluster.NewClient({.observer = ApiRequestObserver(registry)});
  cluster.CreateNamespace(kNs);
  cluster.CreateJob(cluster.JobManifest(kNs, "m", 2, "m"));
  Controller controller(client.get(), &registry, {});
  ASSERT_TRUE(controller.Start(10s).ok());
  controller.SetLeader(true);
  controller.StartWorkers();
  ASSERT_TRUE(controller.WaitIdle(200ms, 20s));
  std::string text = registry.Serialize();
  for (const char* want : {"meshload_controller_reconciles_total{result=\"success\"}",
                           "meshload_controller_reconcile_duration_seconds_bucket",
                           "meshload_controller_queue_depth 0", "meshload_controller_leader 1",
                           "meshload_controller_api_requests_total{code=\"200\",verb=\"LIST\"}",
                           "meshload_controller_api_requests_total{code=\"201\",verb=\"POST\"}",
                           "meshload_controller_cached_objects{resource=\"dataloadjobs\"} 1"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  controller.Stop();
}

}  // namespace
}  // namespace meshload::controller
