// The reconciler end to end: a Controller (informers, queue, workers)
// against the real kube-apiserver (the test program's control plane, a
// namespace per test), through the fault proxy, with an identity of its
// own: what lands in the cluster, and what it asked of the server, counted
// from the audit log.
// Longer than the ~700-line rule on purpose: the cases follow the reconcile
// steps of controller/reconciler.h in order (finalizer, validation, process
// assignment, ConfigMap, peer Secret, status and Events, then faults), all
// on the one control plane this program starts.

#include "controller/controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "common/base64.h"
#include "common/metrics/metrics.h"
#include "controller/kube/informer.h"
#include "controller/reconciler.h"
#include "controller/runtime/event_recorder.h"
#include "tests/controller/test_env.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

#include <httplib.h>

namespace meshload::controller {
namespace {

using meshload::testing::TestCluster;
using meshload::testing::WaitFor;
using nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Least privilege, proven by the real authoriser: every TestCluster binds
// the chart's roles to the controller and fails a test whose controller was
// refused anything (403 in the audit log); once the whole program has run
// (not a filtered part of it), every grant of the chart must have been used.
class ChartGrantsAreAllUsed : public ::testing::Environment {
 public:
  void TearDown() override {
    const auto* unit = ::testing::UnitTest::GetInstance();
    if (unit->test_to_run_count() != unit->total_test_count()) {
      std::cout << "[ note ] a filtered run: the check that every grant of the chart is used needs the whole program\n";
      return;
    }
    auto unused = TestCluster::ChartGrantsNeverUsed();
    std::string list;
    for (const auto& g : unused) list += "\n  " + g;
    if (unused.empty()) {
      std::cout << "[ rbac ] every (verb, resource) the chart grants the controller was used\n";
    } else {
      ADD_FAILURE() << "the chart grants the controller what it never used in this program (least privilege: "
                       "take it out of charts/meshload/templates/rbac.yaml):"
                    << list;
    }
  }
};
const auto* const kChartGrants = ::testing::AddGlobalTestEnvironment(new ChartGrantsAreAllUsed);

class ControllerTest : public ::testing::Test {
 protected:
  void TearDown() override { StopController(); }

  void StartController(ControllerOptions options = {}) {
    registry_ = std::make_unique<metrics::Registry>();
    if (options.watch_namespace.empty()) options.watch_namespace = kNs;
    controller_client_ = cluster_.ControllerClient();
    controller_ = std::make_unique<Controller>(controller_client_.get(), registry_.get(), options);
    ASSERT_OK(controller_->Start(10s));
    controller_->StartWorkers();
  }
  void StopController() {
    if (controller_) controller_->Stop();
    controller_.reset();
    controller_client_.reset();
    registry_.reset();
  }
  // Waits until the controller has nothing left to do.
  // Idle for a whole second: a watch event for the test's own last write can
  // take hundreds of milliseconds to arrive on a loaded machine (two cores,
  // the control plane and ThreadSanitizer), and a shorter quiet spell ends
  // before the controller has heard of it.
  void Settle() { ASSERT_TRUE(controller_->WaitIdle(1s, 60s)); }

  std::string JobPath(const std::string& name) const { return TestCluster::JobPath(kNs, name); }
  json Job(const std::string& name) { return cluster_.Get(JobPath(name)); }
  // Deletes job `name` and waits until it is gone (the controller has taken
  // its finalizer off).
  void DeleteJob(const std::string& name, std::chrono::seconds timeout) {
    auto r = cluster_.client().Delete(JobPath(name));
    ASSERT_OK(r) << r.message();
    ASSERT_TRUE(WaitFor([&] { return cluster_.client().Get(JobPath(name)).code == 404; }, timeout));
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
  // The usual start: `processes` ready pods of app `app`, job `name` of
  // `processes` processes selecting them, and the controller, settled.
  void StartWithJob(const std::string& name, int processes, const std::string& app) {
    ReadyPods(app, processes);
    cluster_.CreateJob(cluster_.JobManifest(kNs, name, processes, app));
    StartController();
    Settle();
  }
  // Caches with the controller's identity for a Reconciler the test drives
  // itself: DataLoadJobs and pods of kNs, ConfigMaps of `configmaps_ns`;
  // listed before it returns, stopped when it goes.
  struct Caches {
    std::unique_ptr<kube::KubeClient> client;
    std::unique_ptr<kube::Informer> jobs, pods, configmaps;
    ~Caches() {
      for (kube::Informer* inf : {jobs.get(), pods.get(), configmaps.get()}) inf->Stop();
    }
    Reconciler NewReconciler(kube::Informer* cms = nullptr) {
      return Reconciler(client.get(), jobs.get(), pods.get(), cms ? cms : configmaps.get(), nullptr);
    }
  };
  std::unique_ptr<Caches> StartCaches(const std::string& configmaps_ns) {
    auto c = std::make_unique<Caches>();
    c->client = cluster_.ControllerClient();
    c->jobs =
        std::make_unique<kube::Informer>(c->client.get(), JobsResource(), kube::InformerOptions{.namespace_ = kNs});
    c->pods =
        std::make_unique<kube::Informer>(c->client.get(), PodsResource(), kube::InformerOptions{.namespace_ = kNs});
    c->configmaps = std::make_unique<kube::Informer>(c->client.get(), ConfigMapsResource(),
                                                     kube::InformerOptions{.namespace_ = configmaps_ns});
    for (kube::Informer* inf : {c->jobs.get(), c->pods.get(), c->configmaps.get()}) inf->Start();
    for (kube::Informer* inf : {c->jobs.get(), c->pods.get(), c->configmaps.get()}) {
      EXPECT_TRUE(inf->WaitForSync(10s));
    }
    return c;
  }
  // The controller's successful writes, from the audit log.
  int64_t Writes() { return cluster_.WriteCount(); }
  // A job the CRD's schema and rules take but the controller finds invalid:
  // a global batch of `batch` does not divide among the 4 data shards of 2
  // processes x 2 devices.
  json InvalidManifest(const std::string& name, const std::string& app, int batch = 3) {
    json manifest = cluster_.JobManifest(kNs, name, 2, app);
    manifest["spec"]["batch"]["globalBatchSize"] = batch;
    return manifest;
  }
  // Sets job `name`'s global batch size, as kubectl edit would: the job as
  // it is now, less its status, written back.
  void EditGlobalBatchSize(const std::string& name, int batch) {
    json job = Job(name);
    job["spec"]["batch"]["globalBatchSize"] = batch;
    job.erase("status");
    ASSERT_OK(cluster_.client().Put(JobPath(name), job));
  }
  // Options whose reconciler records events with `events`.
  static ControllerOptions RecordingEvents(runtime::EventRecorder& events) {
    ControllerOptions options;
    options.reconciler.record_event = [&events](const json& job, const std::string& type, const std::string& reason,
                                                const std::string& message) {
      events.Record(job, type, reason, message);
    };
    return options;
  }
  // Waits until the controller is idle and its events are written.
  void SettleWithEvents(runtime::EventRecorder& events) {
    Settle();
    ASSERT_TRUE(events.Flush(10s));
  }
  // Starts the controller recording Events (ControllerEventRecorder), and
  // settles it with them.
  runtime::EventRecorder& StartRecordingEvents() {
    runtime::EventRecorder& events = ControllerEventRecorder();
    StartController(RecordingEvents(events));
    SettleWithEvents(events);
    return events;
  }
  // A recorder of Events with the controller's identity, for
  // RecordingEvents(). The fixture keeps it until the controller that calls
  // it is stopped (TearDown), however the test ends.
  runtime::EventRecorder& ControllerEventRecorder() {
    event_client_ = cluster_.ControllerClient();
    events_ = std::make_unique<runtime::EventRecorder>(event_client_.get(), nullptr, runtime::EventRecorderOptions{});
    return *events_;
  }

  TestCluster cluster_{TestCluster::Options{.fault_proxy = true}};
  const std::string kNs = cluster_.ns();
  std::unique_ptr<kube::KubeClient> controller_client_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<kube::KubeClient> event_client_;
  std::unique_ptr<runtime::EventRecorder> events_;
};

// A mixture is planned from each dataset's declared samples, reading no data.
TEST_F(ControllerTest, AMixtureIsPlannedFromItsDatasetsSamples) {
  ReadyPods("mix", 2);
  json manifest = cluster_.JobManifest(kNs, "mix", 2, "mix");
  manifest["spec"]["dataset"].erase("samples");
  manifest["spec"]["mixture"] = {{"datasets",
                                  {{{"name", "web"}, {"uri", "web"}, {"weight", 0.75}, {"samples", 3000}},
                                   {{"name", "code"},
                                    {"uri", "code"},
                                    {"weight", 0.25},
                                    {"samples", 1000},
                                    {"schedule", {{{"step", 10}, {"weight", 1}}}}}}}};
  cluster_.CreateJob(manifest);
  StartController();
  Settle();
  json job = Job("mix");
  EXPECT_EQ(Condition(job, "Valid")["status"], "True") << job["status"].dump(2);
  EXPECT_EQ(Condition(job, "Planned")["message"], "4000 samples in 2 datasets mixed by weight");
}

TEST_F(ControllerTest, ValidJobGetsConfigMapStatusAndFinalizer) {
  StartWithJob("train", 4, "llm");
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
  StartWithJob("train", 2, "llm");
  const int64_t before = Writes();
  EXPECT_GE(before, 4) << "the audit log shows the controller's writes: finalizer, ConfigMap, Secret, status";
  const int64_t reconciles = controller_->reconciles();
  for (int i = 0; i < 20; ++i) controller_->queue().Add(std::string(kNs) + "/train");
  Settle();
  EXPECT_GT(controller_->reconciles(), reconciles);
  ReconcileResult r;
  ASSERT_OK(controller_->reconciler().Reconcile(std::string(kNs) + "/train", &r));
  EXPECT_EQ(r.writes, 0);
  EXPECT_EQ(Writes(), before) << "an idle reconcile must not write";
}

TEST_F(ControllerTest, InvalidSpecIsValidFalseWithTheMessagesAndNothingElse) {
  ReadyPods("bad", 2);
  cluster_.CreateJob(InvalidManifest("broken", "bad"));
  StartController();
  Settle();
  json job = Job("broken");
  EXPECT_EQ(job["status"]["phase"], "Failed");
  json valid = Condition(job, "Valid");
  EXPECT_EQ(valid["status"], "False");
  EXPECT_EQ(valid["reason"], "InvalidSpec");
  EXPECT_THAT(valid["message"].get<std::string>(), HasSubstr("spec.batch.globalBatchSize: 3")) << valid.dump();
  EXPECT_FALSE(ConfigMapOf("broken").is_object()) << "an invalid job gets no ConfigMap";

  // Fixing the spec: generation moves, the job becomes valid and configured.
  job["spec"]["batch"]["globalBatchSize"] = 32;
  job.erase("status");
  ASSERT_OK(cluster_.client().Put(JobPath("broken"), job));
  ASSERT_TRUE(WaitFor([&] { return Job("broken")["status"]["phase"] == "Running"; }, 20s));
  json fixed = Job("broken");
  EXPECT_EQ(fixed["status"]["observedGeneration"], 2);
  EXPECT_EQ(Condition(fixed, "Valid")["observedGeneration"], 2);
  EXPECT_TRUE(ConfigMapOf("broken").is_object());
}

TEST_F(ControllerTest, AConfigMapOfTheSameNameThatIsNotTheJobsIsLeftAloneAndReported) {
  // The user's own ConfigMap holds the name: the controller's cache (only
  // ConfigMaps labelled as its own) does not see it, so the create answers
  // 409. The job must still get a status saying why, and the ConfigMap
  // must stay as it is.
  ReadyPods("llm", 2);
  const std::string cms = std::string("/api/v1/namespaces/") + kNs + "/configmaps";
  json mine = {{"apiVersion", "v1"},
               {"kind", "ConfigMap"},
               {"metadata", {{"name", "train-meshload"}, {"namespace", kNs}}},
               {"data", {{"owner", "somebody else"}}}};
  ASSERT_OK(cluster_.client().Post(cms, mine));
  cluster_.CreateJob(cluster_.JobManifest(kNs, "train", 2, "llm"));
  StartController();
  ASSERT_TRUE(WaitFor([&] { return Job("train")["status"]["phase"] == "Degraded"; }, 20s))
      << Job("train")["status"].dump(2);
  json job = Job("train");
  json degraded = Condition(job, "Degraded");
  EXPECT_EQ(degraded["reason"], "ConfigMapConflict") << degraded.dump();
  EXPECT_THAT(degraded["message"].get<std::string>(), HasSubstr("train-meshload exists and was not made for this job"))
      << degraded.dump();
  EXPECT_EQ(Condition(job, "Valid")["status"], "True");
  EXPECT_EQ(job["status"]["observedGeneration"], job["metadata"]["generation"]);
  json cm = ConfigMapOf("train");
  EXPECT_EQ(cm["data"], json({{"owner", "somebody else"}})) << "the user's ConfigMap was changed";
  EXPECT_FALSE(cm["metadata"].contains("ownerReferences"));

  // Once it is gone, the job gets its own.
  ASSERT_OK(cluster_.client().Delete(cms + "/train-meshload"));
  controller_->queue().Add(std::string(kNs) + "/train");
  ASSERT_TRUE(WaitFor([&] { return Job("train")["status"]["phase"] == "Running"; }, 20s))
      << Job("train")["status"].dump(2);
  EXPECT_EQ(ConfigMapOf("train")["metadata"]["ownerReferences"][0]["uid"], Job("train")["metadata"]["uid"]);
}

TEST_F(ControllerTest, ItsOwnConfigMapWithTheLabelsTakenOffIsTakenBack) {
  StartWithJob("train", 2, "llm");
  json cm = ConfigMapOf("train");
  ASSERT_TRUE(cm.is_object());
  // Somebody removes the labels: the filtered watch reports it DELETED.
  cm["metadata"].erase("labels");
  cm["data"]["planHash"] = "edited";
  const std::string path = std::string("/api/v1/namespaces/") + kNs + "/configmaps/train-meshload";
  ASSERT_OK(cluster_.client().Put(path, cm));
  controller_->queue().Add(std::string(kNs) + "/train");
  ASSERT_TRUE(WaitFor(
      [&] {
        json now = ConfigMapOf("train");
        return now["metadata"]["labels"]["meshload.io/job"] == "train" &&
               now["data"]["planHash"] == Job("train")["status"]["planHash"];
      },
      20s))
      << ConfigMapOf("train").dump(2);
  Settle();
  EXPECT_EQ(Job("train")["status"]["phase"], "Running");
}

TEST_F(ControllerTest, ANameLongerThanALabelValueIsRefusedByTheCrdAndSixtyThreeIsFine) {
  // 64 characters: Kubernetes takes the name of an object, but not as the
  // value of the meshload.io/job label on the ConfigMap and Secret; the
  // CRD's CEL rule refuses it (the controller refuses it too, where a CRD
  // without the rule let it in: `meshload plan` tests that check).
  const std::string name(64, 'a');
  ReadyPods("llm", 2);
  auto refused = cluster_.client().Post(TestCluster::JobsPath(kNs), cluster_.JobManifest(kNs, name, 2, "llm"));
  EXPECT_EQ(refused.code, 422) << refused.body.dump();
  EXPECT_THAT(refused.message(), HasSubstr("the name is at most 63 characters"));
  StartController();

  // 63 is fine.
  const std::string ok(63, 'b');
  cluster_.CreateJob(cluster_.JobManifest(kNs, ok, 2, "llm"));
  ASSERT_TRUE(WaitFor([&] { return Job(ok)["status"]["phase"] == "Running"; }, 20s)) << Job(ok)["status"].dump(2);
  EXPECT_EQ(ConfigMapOf(ok)["metadata"]["labels"]["meshload.io/job"], ok);
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
  ASSERT_TRUE(WaitFor([&] { return Job("indexed")["status"]["phase"] == "Degraded"; }, 20s));
  json d = Condition(Job("indexed"), "Degraded");
  EXPECT_EQ(d["reason"], "DuplicateCompletionIndex");
  EXPECT_THAT(d["message"].get<std::string>(), HasSubstr("idx-dup"));
  cluster_.CreatePod(kNs, "idx-far", "idx", {{"batch.kubernetes.io/job-completion-index", "7"}});
  ASSERT_TRUE(WaitFor(
      [&] {
        return Condition(Job("indexed"), "Degraded")["message"].get<std::string>().find("completion index 7") !=
               std::string::npos;
      },
      20s));
  EXPECT_EQ(Assignment("indexed").size(), 3u);
}

TEST_F(ControllerTest, ReplacedPodsTakeTheFreedIndexAndOthersKeepTheirs) {
  StartWithJob("rep", 4, "rep");
  auto before = Assignment("rep");
  ASSERT_EQ(before.size(), 4u);
  // rep-1 dies: too few pods is a condition.
  cluster_.DeletePod(kNs, "rep-1");
  ASSERT_TRUE(WaitFor([&] { return Job("rep")["status"]["processesReady"] == 3; }, 20s));
  json job = Job("rep");
  EXPECT_EQ(job["status"]["phase"], "Degraded");
  EXPECT_EQ(Condition(job, "SidecarsReady")["reason"], "WaitingForPods");
  EXPECT_THAT(Condition(job, "SidecarsReady")["message"].get<std::string>(), HasSubstr("processes without a pod: 1"));
  // Its replacement (a new name, as a Deployment or JobSet would make) gets 1.
  cluster_.CreatePod(kNs, "rep-new", "rep");
  cluster_.SetSidecar(kNs, "rep-new", true);
  ASSERT_TRUE(WaitFor([&] { return Job("rep")["status"]["phase"] == "Running"; }, 20s));
  auto after = Assignment("rep");
  EXPECT_EQ(after["rep-new"], before["rep-1"]);
  for (const char* p : {"rep-0", "rep-2", "rep-3"}) EXPECT_EQ(after[p], before[p]) << p;
  // Too many pods: a condition naming the extra pod; assignments unchanged.
  cluster_.CreatePod(kNs, "rep-extra", "rep");
  ASSERT_TRUE(WaitFor([&] { return Condition(Job("rep"), "Degraded")["reason"] == "TooManyPods"; }, 20s));
  EXPECT_THAT(Condition(Job("rep"), "Degraded")["message"].get<std::string>(), HasSubstr("rep-extra"));
  EXPECT_EQ(Assignment("rep"), after);
}

// The ConfigMap cache can lag behind the controller's own create (its
// watch event not there yet) when a pod event starts the next reconcile. That
// reconcile must keep the stored assignment, not make a fresh one that
// renumbers the running trainers. Here the ConfigMap cache never catches up
// (it watches another namespace), so every reconcile runs on a missing one.
TEST_F(ControllerTest, AConfigMapCacheThatLagsNeverRenumbersTheTrainers) {
  ReadyPods("lag", 4);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "lag", 4, "lag"));
  auto caches = StartCaches(kNs + "-elsewhere");  // a ConfigMap cache that lags for ever
  kube::Informer& pods = *caches->pods;
  Reconciler reconciler = caches->NewReconciler();
  const std::string key = kNs + "/lag";
  // As the work queue would: again until it succeeds (a status write on a
  // job the cache has not caught up with yet answers 409 and is retried).
  auto reconcile = [&] { return WaitFor([&] { return reconciler.Reconcile(key).ok(); }, 20s); };
  ASSERT_TRUE(reconcile());
  const auto before = Assignment("lag");
  ASSERT_EQ(before.size(), 4u);
  cluster_.DeletePod(kNs, "lag-1");
  ASSERT_TRUE(WaitFor([&] { return pods.List(kNs).size() == 3; }, 20s));
  ASSERT_TRUE(reconcile());
  auto after = Assignment("lag");
  for (const char* p : {"lag-0", "lag-2", "lag-3"}) EXPECT_EQ(after[p], before.at(p)) << p << " was renumbered";
  EXPECT_EQ(after.count("lag-1"), 0u);
  EXPECT_THAT(Condition(Job("lag"), "SidecarsReady")["message"].get<std::string>(),
              HasSubstr("processes without a pod: 1"))
      << Condition(Job("lag"), "SidecarsReady").dump();
  // Nothing changed since: once the job's cache has the last status, a
  // reconcile on the lagging ConfigMap cache writes nothing.
  EXPECT_TRUE(WaitFor(
      [&] {
        ReconcileResult r;
        return reconciler.Reconcile(key, &r).ok() && r.writes == 0;
      },
      20s));
}

// A ConfigMap cache a write behind (its watch event not here yet): the
// update answers 409, which is a retry, not a problem (no ConfigMapFailed,
// no warning); the retry on the caught-up cache lands.
TEST_F(ControllerTest, AConfigMapUpdateOnAStaleCacheIsRetriedNotReportedAsAProblem) {
  ReadyPods("stale", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "stale", 2, "stale"));
  auto caches = StartCaches(kNs);
  kube::Informer &pods = *caches->pods, &cms = *caches->configmaps;
  Reconciler reconciler = caches->NewReconciler();
  const std::string key = kNs + "/stale";
  auto reconcile = [&] { return WaitFor([&] { return reconciler.Reconcile(key).ok(); }, 20s); };
  ASSERT_TRUE(reconcile());
  ASSERT_TRUE(WaitFor([&] { return cms.Get(kNs, "stale-meshload") != nullptr; }, 20s));
  cms.Stop();  // from here the cache keeps the ConfigMap's first version
  cluster_.DeletePod(kNs, "stale-1");
  ASSERT_TRUE(WaitFor([&] { return pods.List(kNs).size() == 1; }, 20s));
  ASSERT_TRUE(reconcile());  // updates the ConfigMap from the cached version: lands
  EXPECT_EQ(Assignment("stale").count("stale-1"), 0u);
  ReadyPods("stale", 1, 2);
  ASSERT_TRUE(WaitFor([&] { return pods.List(kNs).size() == 2; }, 20s));
  Status st = reconciler.Reconcile(key);  // from the stale version: 409
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(Condition(Job("stale"), "Degraded")["reason"], "ConfigMapFailed") << Job("stale").dump(2);
  EXPECT_EQ(Assignment("stale").count("stale-2"), 0u) << "nothing written from the stale version";
  // The retry, on a cache that caught up.
  kube::Informer fresh(caches->client.get(), ConfigMapsResource(), {.namespace_ = kNs});
  fresh.Start();
  ASSERT_TRUE(fresh.WaitForSync(10s));
  Reconciler caught_up = caches->NewReconciler(&fresh);
  ASSERT_TRUE(WaitFor([&] { return caught_up.Reconcile(key).ok(); }, 20s));
  EXPECT_EQ(Assignment("stale").count("stale-2"), 1u);
  EXPECT_NE(Condition(Job("stale"), "Degraded")["status"], "True") << Job("stale").dump(2);
  fresh.Stop();
}

TEST_F(ControllerTest, RestartKeepsTheAssignmentAndMakesNoWrites) {
  StartWithJob("rs", 3, "rs");
  // Change the pods so that a fresh assignment would differ: the oldest pod
  // goes away and comes back under a name that sorts first.
  cluster_.DeletePod(kNs, "rs-0");
  cluster_.CreatePod(kNs, "aa-rs", "rs");
  cluster_.SetSidecar(kNs, "aa-rs", true);
  ASSERT_TRUE(WaitFor([&] { return Assignment("rs").count("aa-rs") == 1; }, 20s));
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

// Each valid job gets an immutable Secret of 64 random hex digits for its
// sidecars' --peer-secret-file, owned by the job, created once: the status
// records it, so idle reconciles and a restarted controller ask no more.
// The controller creates Secrets and never reads, lists or changes one.
TEST_F(ControllerTest, AValidJobGetsItsPeerSecretOnceAndTheControllerNeverReadsSecrets) {
  ReadyPods("ps", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "ps", 2, "ps"));
  cluster_.CreateJob(cluster_.JobManifest(kNs, "other", 2, "ps-other"));
  StartController();
  Settle();
  auto& server = cluster_;
  EXPECT_EQ(server.RequestCount("POST", "secrets"), 2);
  EXPECT_EQ(server.RequestCount("", "secrets"), 2) << "no get, list, watch, update, patch or delete";
  EXPECT_EQ(server.WriteCount("secrets"), 2);

  json job = Job("ps");
  EXPECT_EQ(job["status"]["peerSecretName"], "ps-meshload-peer");
  json secret = cluster_.Get(std::string("/api/v1/namespaces/") + kNs + "/secrets/ps-meshload-peer");
  ASSERT_TRUE(secret.is_object());
  EXPECT_EQ(secret["type"], "Opaque");
  EXPECT_EQ(secret["immutable"], true);
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "DataLoadJob");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(secret["metadata"]["labels"]["meshload.io/job"], "ps");
  EXPECT_EQ(secret["metadata"]["labels"]["app.kubernetes.io/managed-by"], "meshload-controller");
  ASSERT_EQ(secret["data"].size(), 1u);
  auto value = Base64Decode(secret["data"]["secret"].get<std::string>());
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(value->size(), 64u);
  EXPECT_EQ(value->find_first_not_of("0123456789abcdef"), std::string::npos) << *value;
  json other = cluster_.Get(std::string("/api/v1/namespaces/") + kNs + "/secrets/other-meshload-peer");
  ASSERT_TRUE(other.is_object());
  EXPECT_NE(other["data"]["secret"], secret["data"]["secret"]) << "each job has its own";

  // Idle, then restarted: nothing more is asked of the Secrets (the test's
  // own reads above are not the controller's).
  const int64_t secret_requests = server.RequestCount("", "secrets");
  EXPECT_EQ(secret_requests, 2);
  for (int i = 0; i < 5; ++i) controller_->queue().Add(std::string(kNs) + "/ps");
  Settle();
  StopController();
  const int64_t writes = Writes();
  StartController();
  Settle();
  EXPECT_EQ(Writes(), writes);
  EXPECT_EQ(server.RequestCount("", "secrets"), secret_requests);
}

// A Secret of that name that exists already (the user's own, made with
// kubectl create secret) is kept as it is; an invalid job gets none, and an
// edit that makes a job invalid keeps the name in its status.
TEST_F(ControllerTest, AnExistingPeerSecretIsKeptAndAnInvalidJobGetsNone) {
  const std::string secrets = std::string("/api/v1/namespaces/") + kNs + "/secrets";
  auto mine = cluster_.client().Post(secrets, {{"apiVersion", "v1"},
                                               {"kind", "Secret"},
                                               {"metadata", {{"name", "own-meshload-peer"}}},
                                               {"stringData", {{"secret", "the user's own secret, 32 bytes+"}}}});
  ASSERT_OK(mine) << mine.message();
  ReadyPods("own", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "own", 2, "own"));
  cluster_.CreateJob(InvalidManifest("bad", "bad"));
  StartController();
  Settle();
  json kept = cluster_.Get(secrets + "/own-meshload-peer");
  EXPECT_EQ(kept["data"], mine.body["data"]);
  EXPECT_EQ(kept["metadata"]["resourceVersion"], mine.body["metadata"]["resourceVersion"]);
  EXPECT_FALSE(kept["metadata"].contains("ownerReferences"));
  EXPECT_EQ(Job("own")["status"]["peerSecretName"], "own-meshload-peer");
  EXPECT_EQ(cluster_.WriteCount("secrets"), 0) << "the controller makes none (the one there is the user's)";
  EXPECT_FALSE(cluster_.Get(secrets + "/bad-meshload-peer").is_object());
  EXPECT_FALSE(Job("bad")["status"].contains("peerSecretName"));

  // The valid job goes invalid: its status keeps the Secret's name.
  json job = Job("own");
  job["spec"]["batch"]["globalBatchSize"] = 3;
  ASSERT_OK(cluster_.client().Put(JobPath("own"), job));
  ASSERT_TRUE(WaitFor([&] { return Job("own")["status"]["phase"] == "Failed"; }, 20s));
  EXPECT_EQ(Job("own")["status"]["peerSecretName"], "own-meshload-peer");
  EXPECT_FALSE(Job("own")["status"].contains("peerSecretUID")) << "found, not made";

  // Deleting the job leaves the user's Secret alone.
  ASSERT_NO_FATAL_FAILURE(DeleteJob("own", 20s));
  EXPECT_EQ(cluster_.Get(secrets + "/own-meshload-peer")["data"], mine.body["data"]);
}

TEST_F(ControllerTest, APeerSecretIsLabelledWithItsJobInstanceAndGoesWithIt) {
  // The label tells the Secret of this job instance from an earlier job's of
  // the same name; deleting the job deletes its Secret (by uid), and the
  // same job applied again gets a new one for its new uid.
  const std::string secrets = std::string("/api/v1/namespaces/") + kNs + "/secrets";
  StartWithJob("again", 2, "again");
  json made = cluster_.Get(secrets + "/again-meshload-peer");
  ASSERT_TRUE(made.is_object());
  EXPECT_EQ(made["metadata"]["labels"]["meshload.io/job-uid"], Job("again")["metadata"]["uid"]);
  EXPECT_EQ(made["metadata"]["labels"]["meshload.io/job"], "again");
  EXPECT_EQ(Job("again")["status"]["peerSecretUID"], made["metadata"]["uid"]);

  ASSERT_NO_FATAL_FAILURE(DeleteJob("again", 20s));
  EXPECT_EQ(cluster_.client().Get(secrets + "/again-meshload-peer").code, 404);

  cluster_.CreateJob(cluster_.JobManifest(kNs, "again", 2, "again"));
  ASSERT_TRUE(WaitFor([&] { return Job("again")["status"]["phase"] == "Running"; }, 20s));
  json again = cluster_.Get(secrets + "/again-meshload-peer");
  ASSERT_TRUE(again.is_object());
  EXPECT_NE(again["metadata"]["uid"], made["metadata"]["uid"]);
  EXPECT_EQ(again["metadata"]["labels"]["meshload.io/job-uid"], Job("again")["metadata"]["uid"]);
  EXPECT_EQ(Job("again")["status"]["peerSecretUID"], again["metadata"]["uid"]);
}

// "type reason: message (count)" of the Events about `name`, oldest first
// (defined with the event tests below).
std::vector<std::string> EventsAbout(TestCluster& cluster, const std::string& name);

// Stands in for a sidecar's GET /progress (whose own report is tested in
// tests/sidecar: progress_test and sidecar.cli) on a loopback address of
// its own, as a pod IP: the step and rate are set by the test.
class ProgressEndpoint {
 public:
  ProgressEndpoint(std::string ip, int port, int64_t process) : ip_(std::move(ip)), process_(process) {
    server_.Get("/progress", [this](const httplib::Request&, httplib::Response& res) {
      ++polls_;
      std::lock_guard lock(mu_);
      res.set_content(json({{"job", "pg"},
                            {"process", process_},
                            {"consumedStep", step_},
                            {"resumeStep", step_ + 1},
                            {"stepsPerSecond", rate_}})
                          .dump(),
                      "application/json");
    });
    ok_ = server_.bind_to_port(ip_, port);
    if (ok_) thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~ProgressEndpoint() { Stop(); }
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  void Set(int64_t step, double rate) {
    std::lock_guard lock(mu_);
    step_ = step;
    rate_ = rate;
  }
  bool ok() const { return ok_; }
  /// GET /progress requests so far.
  int polls() const { return polls_.load(); }

 private:
  std::string ip_;
  int64_t process_;
  httplib::Server server_;
  std::thread thread_;
  bool ok_ = false;
  std::mutex mu_;
  int64_t step_ = -1;
  double rate_ = 0;
  std::atomic<int> polls_{0};
};

TEST_F(ControllerTest, TheSidecarsProgressIsInTheStatusAndTheResumeStepInTheConfigMap) {
  // Two "pods" on 127.0.0.2 and 127.0.0.3, one port: the poller asks each
  // pod IP on the sidecars' metrics port.
  const int port = 20000 + static_cast<int>(::getpid() % 10000);
  ProgressEndpoint p0("127.0.0.2", port, 0), p1("127.0.0.3", port, 1);
  ASSERT_TRUE(p0.ok() && p1.ok()) << "cannot listen on 127.0.0.2/3:" << port;
  p0.Set(41, 2.0);
  p1.Set(43, 2.0);
  cluster_.CreatePod(kNs, "pg-0", "pg");
  cluster_.CreatePod(kNs, "pg-1", "pg");
  cluster_.SetSidecar(kNs, "pg-0", true, 0, "127.0.0.2");
  cluster_.SetSidecar(kNs, "pg-1", true, 0, "127.0.0.3");
  cluster_.CreateJob(cluster_.JobManifest(kNs, "pg", 2, "pg"));
  runtime::EventRecorder& events = ControllerEventRecorder();
  ControllerOptions options = RecordingEvents(events);
  options.progress_interval = 200ms;
  options.progress.default_port = port;
  options.progress.timeout = 1s;
  options.reconciler.progress_step_granularity = 100;
  options.reconciler.progress_min_write_interval = 0ms;  // the granularity alone (the floor: progress_poller_test)
  StartController(options);
  auto progress = [&] { return Job("pg")["status"]["progress"]; };
  auto resume = [&] {
    json cm = ConfigMapOf("pg");
    return cm.is_object() ? json::parse(cm["data"]["resume.json"].get<std::string>()) : json();
  };
  ASSERT_TRUE(WaitFor([&] { return progress()["step"] == 41; }, 20s)) << Job("pg").dump(2);
  json p = progress();
  EXPECT_EQ(p["resumeStep"], 42);
  EXPECT_EQ(p["maxStep"], 43);
  EXPECT_EQ(p["processesReporting"], 2);
  EXPECT_DOUBLE_EQ(p["samplesPerSecond"].get<double>(), 2.0 * 32);  // 2 processes x 2 devices x 8
  ASSERT_TRUE(WaitFor(
      [&] {
        return resume() == json({{"step", 42}, {"specStep", 0}});
      },
      20s))
      << ConfigMapOf("pg").dump(2);

  // With the poller queueing the job every 200 ms the controller is never
  // idle (Settle would wait in vain): wait until its writes stop instead.
  // (Quiet is no write for 1.5 s: that time is part of the condition.)
  auto quiet = [&] {
    int64_t last = Writes();
    auto since = std::chrono::steady_clock::now();
    return WaitFor(
        [&] {
          const int64_t now = Writes();
          if (now != last) {
            last = now;
            since = std::chrono::steady_clock::now();
            return false;
          }
          return std::chrono::steady_clock::now() - since >= 1500ms;
        },
        60s, 250ms);
  };

  // Running on by less than the granularity, at the same rate: nothing is
  // written, however often the sidecars are polled.
  ASSERT_TRUE(quiet());
  const int64_t writes = Writes();
  p0.Set(91, 2.0);
  p1.Set(93, 2.0);
  const int p0_polls = p0.polls(), p1_polls = p1.polls();
  ASSERT_TRUE(WaitFor([&] { return p0.polls() >= p0_polls + 7 && p1.polls() >= p1_polls + 7; }, 30s))
      << "the sidecars were not polled seven times at their new steps";
  ASSERT_TRUE(quiet());
  EXPECT_EQ(progress()["step"], 41);
  EXPECT_EQ(Writes(), writes) << "moves below the granularity made writes";

  // The trainers stop: the exact step is written, and recorded for a restart.
  p0.Set(95, 0.0);
  p1.Set(95, 0.0);
  ASSERT_TRUE(WaitFor([&] { return progress()["step"] == 95; }, 20s)) << Job("pg").dump(2);
  EXPECT_EQ(progress()["samplesPerSecond"], 0.0);
  ASSERT_TRUE(WaitFor([&] { return resume() == json({{"step", 96}, {"specStep", 0}}); }, 20s));

  // One far behind: named as lagging. One that stops answering: named as
  // unreachable, and the recorded resume step stays as it was.
  p0.Set(400, 0.0);
  ASSERT_TRUE(WaitFor([&] { return progress().contains("lagging"); }, 20s)) << Job("pg").dump(2);
  EXPECT_EQ(progress()["lagging"][0]["process"], 1);
  EXPECT_EQ(progress()["lagging"][0]["pod"], "pg-1");
  ASSERT_TRUE(WaitFor([&] { return Condition(Job("pg"), "Straggling")["status"] == "True"; }, 20s))
      << Job("pg").dump(2);
  EXPECT_THAT(Condition(Job("pg"), "Straggling")["message"].get<std::string>(),
              HasSubstr("process 1 (pod pg-1) is more than 100 steps behind the median"))
      << Condition(Job("pg"), "Straggling").dump();
  EXPECT_EQ(Condition(Job("pg"), "Starved")["status"], "False") << "no trainer reported waiting";
  p1.Stop();
  ASSERT_TRUE(WaitFor([&] { return progress().contains("unreachable"); }, 20s)) << Job("pg").dump(2);
  p = progress();
  EXPECT_EQ(p["unreachable"][0]["process"], 1);
  EXPECT_EQ(p["unreachable"][0]["pod"], "pg-1");
  EXPECT_THAT(p["unreachable"][0]["reason"].get<std::string>(), HasSubstr("127.0.0.3")) << p.dump();
  EXPECT_FALSE(p.contains("step")) << "a step is not guessed while a process cannot be asked";
  EXPECT_EQ(p["processesReporting"], 1);
  ASSERT_TRUE(WaitFor([&] { return Condition(Job("pg"), "Straggling")["status"] == "False"; }, 20s))
      << Job("pg").dump(2);
  ASSERT_TRUE(quiet());
  ASSERT_TRUE(events.Flush(10s));
  EXPECT_EQ(resume(), json({{"step", 96}, {"specStep", 0}}));
  // The straggler came and went as two events; starvation never began.
  std::vector<std::string> straggle;
  for (const auto& e : EventsAbout(cluster_, "pg")) {
    if (e.find("Straggl") != std::string::npos || e.find("Starv") != std::string::npos) straggle.push_back(e);
  }
  ASSERT_EQ(straggle.size(), 2u) << ::testing::PrintToString(EventsAbout(cluster_, "pg"));
  EXPECT_EQ(straggle[0].rfind("Warning ProcessesStraggle: process 1 (pod pg-1) is more than 100 steps behind", 0), 0u)
      << straggle[0];
  EXPECT_EQ(straggle[1], "Normal NoStragglers: Straggling is now False (1)");
}

// A trainer Job as a queue such as Kueue makes it: Indexed, created
// suspended, unsuspended on admission and suspended again on preemption
// (the Job controller of the control plane makes and deletes its pods).
json TrainerJobManifest(const std::string& ns, const std::string& name, const std::string& app, int parallelism,
                        int completions, bool suspend) {
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"suspend", suspend},
            {"completionMode", "Indexed"},
            {"completions", completions},
            {"parallelism", parallelism},
            {"template",
             {{"metadata", {{"labels", {{"app", app}}}}},
              {"spec",
               {{"restartPolicy", "Never"},
                {"containers", json::array({{{"name", "trainer"}, {"image", "trainer:1"}}})}}}}}}}};
}

TEST_F(ControllerTest, ASuspendedTrainerJobWaitsForAdmissionAndAPreemptedOneIsSuspendedAtItsStep) {
  const std::string jobs = "/apis/batch/v1/namespaces/" + kNs + "/jobs";
  auto set_suspend = [&](bool suspend) {
    auto r = cluster_.client().Patch(jobs + "/q-trainers", json{{"spec", {{"suspend", suspend}}}},
                                     "application/merge-patch+json");
    ASSERT_OK(r) << r.message();
  };
  // The Job controller's pods of Job q-trainers, by completion index ("" when gone).
  auto pods = [&] {
    std::vector<std::string> out(2);
    json list = cluster_.Get("/api/v1/namespaces/" + kNs + "/pods?labelSelector=app%3Dq");
    for (const auto& p : list["items"]) {
      if (p["metadata"].contains("deletionTimestamp")) continue;
      const json& a = p["metadata"]["annotations"];
      const int i = std::stoi(a.value(kube::kJobCompletionIndex, std::string("9")));
      if (i < 2) out[i] = p["metadata"]["name"];
    }
    return out;
  };
  // Two sidecars on 127.0.0.2 and .3 whose trainers stopped at step 57.
  const int port = 21000 + static_cast<int>(::getpid() % 9000);
  ProgressEndpoint p0("127.0.0.2", port, 0), p1("127.0.0.3", port, 1);
  ASSERT_TRUE(p0.ok() && p1.ok()) << "cannot listen on 127.0.0.2/3:" << port;
  p0.Set(57, 0.0);
  p1.Set(57, 0.0);
  auto admit = [&] {
    set_suspend(false);
    std::vector<std::string> made;
    ASSERT_TRUE(WaitFor(
        [&] {
          made = pods();
          return !made[0].empty() && !made[1].empty();
        },
        30s))
        << "the Job controller made no pods for Job q-trainers";
    cluster_.SetSidecar(kNs, made[0], true, 0, "127.0.0.2");
    cluster_.SetSidecar(kNs, made[1], true, 0, "127.0.0.3");
  };

  ASSERT_OK(cluster_.client().Post(jobs, TrainerJobManifest(kNs, "q-trainers", "q", 2, 2, /*suspend=*/true)));
  json manifest = cluster_.JobManifest(kNs, "q", 2, "q");
  manifest["spec"]["resume"] = {{"step", 40}};
  cluster_.CreateJob(manifest);
  runtime::EventRecorder& events = ControllerEventRecorder();
  ControllerOptions options = RecordingEvents(events);
  options.progress_interval = 200ms;
  options.progress.default_port = port;
  options.progress.timeout = 1s;
  options.reconciler.progress_min_write_interval = 0ms;
  StartController(options);

  // Queued: waiting for admission, at the spec's step; no pods is no problem.
  ASSERT_TRUE(WaitFor([&] { return Job("q")["status"]["phase"] == "WaitingForAdmission"; }, 20s)) << Job("q").dump(2);
  json job = Job("q");
  EXPECT_EQ(Condition(job, "Admitted")["status"], "False");
  EXPECT_EQ(Condition(job, "Admitted")["reason"], "WaitingForAdmission");
  EXPECT_EQ(Condition(job, "Admitted")["message"],
            "batch/v1 Job " + kNs +
                "/q-trainers is suspended (spec.suspend: true): waiting for admission by its queue; the "
                "trainers start at step 40");
  EXPECT_EQ(Condition(job, "SidecarsReady")["reason"], "TrainersSuspended");
  EXPECT_EQ(Condition(job, "Degraded")["status"], "False");
  EXPECT_EQ(Condition(job, "Starved")["reason"], "TrainersSuspended");
  EXPECT_EQ(Condition(job, "Straggling")["reason"], "TrainersSuspended");
  EXPECT_FALSE(job["status"].contains("suspendedAtStep"));

  // Admitted: its pods run and their sidecars report step 57.
  admit();
  ASSERT_TRUE(WaitFor([&] { return Job("q")["status"]["progress"]["resumeStep"] == 58; }, 30s)) << Job("q").dump(2);
  ASSERT_TRUE(WaitFor([&] { return Job("q")["status"]["phase"] == "Running"; }, 20s)) << Job("q").dump(2);
  EXPECT_EQ(Condition(Job("q"), "Admitted")["reason"], "TrainersAdmitted");

  // Preempted: the queue suspends the Job, whose pods go. Suspended at the
  // step the trainers reached, which the ConfigMap keeps for their return.
  set_suspend(true);
  ASSERT_TRUE(WaitFor([&] { return Job("q")["status"]["phase"] == "Suspended"; }, 30s)) << Job("q").dump(2);
  job = Job("q");
  EXPECT_EQ(job["status"]["suspendedAtStep"], 58);
  EXPECT_EQ(Condition(job, "Admitted")["reason"], "Suspended");
  EXPECT_THAT(Condition(job, "Admitted")["message"].get<std::string>(),
              HasSubstr("after running: preempted by its queue or stopped; the trainers resume at step 58"));
  EXPECT_EQ(Condition(job, "Degraded")["status"], "False");
  EXPECT_EQ(Condition(job, "Starved")["status"], "False");
  EXPECT_EQ(job["status"]["progress"]["resumeStep"], 58) << "the progress the trainers left is kept";
  ASSERT_TRUE(WaitFor([&] { return pods() == std::vector<std::string>(2); }, 30s));
  auto resume = [&] { return json::parse(ConfigMapOf("q")["data"]["resume.json"].get<std::string>()); };
  EXPECT_EQ(resume(), json({{"step", 58}, {"specStep", 40}}));
  // Still Suspended after the controller restarts.
  StopController();
  StartController(options);
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(Job("q")["status"]["phase"], "Suspended");

  // Admitted again: new pods, which start at the recorded step.
  admit();
  ASSERT_TRUE(WaitFor([&] { return Job("q")["status"]["phase"] == "Running"; }, 30s)) << Job("q").dump(2);
  EXPECT_FALSE(Job("q")["status"].contains("suspendedAtStep"));
  EXPECT_EQ(resume(), json({{"step", 58}, {"specStep", 40}}));
  ASSERT_TRUE(events.Flush(10s));
  std::vector<std::string> seen;
  for (const auto& e : EventsAbout(cluster_, "q")) {
    if (e.rfind("Warning", 0) == 0) ADD_FAILURE() << "a warning about a queued job: " << e;
    if (e.find("Admi") != std::string::npos || e.find("Suspend") != std::string::npos) seen.push_back(e);
  }
  ASSERT_EQ(seen.size(), 3u) << ::testing::PrintToString(EventsAbout(cluster_, "q"));
  EXPECT_EQ(seen[0].rfind("Normal WaitingForAdmission: batch/v1 Job " + kNs + "/q-trainers is suspended", 0), 0u)
      << seen[0];
  EXPECT_EQ(seen[1].rfind("Normal TrainersAdmitted: batch/v1 Job " + kNs + "/q-trainers not suspended", 0), 0u)
      << seen[1];
  EXPECT_EQ(seen[2].rfind("Normal Suspended: batch/v1 Job " + kNs + "/q-trainers is suspended", 0), 0u) << seen[2];
}

// A JobSet's trainers: the Jobs JobSet makes (here as it makes them: each
// Indexed, its template labelled with the JobSet, the replicated job and
// the Job's global index), whose pods the Job controller makes. Their
// process indices run across the Jobs: 2 x global index + completion index.
TEST_F(ControllerTest, AJobSetsPodsTakeProcessIndicesAcrossItsJobs) {
  const std::string jobs = "/apis/batch/v1/namespaces/" + kNs + "/jobs";
  for (int g = 0; g < 2; ++g) {
    json j = TrainerJobManifest(kNs, "js-workers-" + std::to_string(g), "js", 2, 2, /*suspend=*/false);
    json labels = {{"app", "js"},
                   {"jobset.sigs.k8s.io/jobset-name", "js"},
                   {"jobset.sigs.k8s.io/replicatedjob-name", "workers"},
                   {"jobset.sigs.k8s.io/job-global-index", std::to_string(g)}};
    j["metadata"]["labels"] = labels;
    j["spec"]["template"]["metadata"]["labels"] = labels;
    ASSERT_OK(cluster_.client().Post(jobs, j));
  }
  // process index -> pod, from the pods' labels and completion index.
  std::map<int, std::string> want;
  ASSERT_TRUE(WaitFor(
      [&] {
        want.clear();
        json list = cluster_.Get("/api/v1/namespaces/" + kNs + "/pods?labelSelector=app%3Djs");
        for (const auto& p : list["items"]) {
          const int g = std::stoi(p["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"].get<std::string>());
          const int c = std::stoi(p["metadata"]["annotations"][kube::kJobCompletionIndex].get<std::string>());
          want[2 * g + c] = p["metadata"]["name"];
        }
        return want.size() == 4;
      },
      30s))
      << "the Job controller made " << want.size() << " of 4 pods";
  for (const auto& [i, name] : want) cluster_.SetSidecar(kNs, name, true);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "js", 4, "js"));
  StartController();
  ASSERT_TRUE(WaitFor([&] { return Job("js")["status"]["phase"] == "Running"; }, 30s)) << Job("js").dump(2);
  const auto assignment = Assignment("js");
  for (const auto& [i, name] : want) EXPECT_EQ(assignment.at(name), i) << name;
  EXPECT_EQ(Condition(Job("js"), "Admitted")["reason"], "TrainersAdmitted");
}

TEST_F(ControllerTest, TrainerJobsWhoseParallelismTheMeshCannotTakeAreNamedWithTheirField) {
  const std::string jobs = "/apis/batch/v1/namespaces/" + kNs + "/jobs";
  ASSERT_OK(cluster_.client().Post(jobs, TrainerJobManifest(kNs, "wide", "par", 3, 3, /*suspend=*/true)));
  cluster_.CreateJob(cluster_.JobManifest(kNs, "par", 2, "par"));
  runtime::EventRecorder& events = StartRecordingEvents();
  ASSERT_TRUE(WaitFor([&] { return Condition(Job("par"), "Degraded")["status"] == "True"; }, 20s))
      << Job("par").dump(2);
  json d = Condition(Job("par"), "Degraded");
  EXPECT_EQ(d["reason"], "TrainerParallelismMismatch");
  EXPECT_THAT(d["message"].get<std::string>(), HasSubstr("batch/v1 Job " + kNs +
                                                         "/wide has spec.parallelism 3 but the mesh has 2 processes "
                                                         "(spec.mesh.processes)"));
  EXPECT_THAT(d["message"].get<std::string>(),
              HasSubstr("TrainerCompletionsMismatch: Indexed batch/v1 Job " + kNs + "/wide has spec.completions 3"));
  EXPECT_EQ(Job("par")["status"]["phase"], "WaitingForAdmission") << "still queued, with a problem";
  // Fixed (a new Job of the right size): no longer degraded.
  auto r = cluster_.client().Delete(jobs + "/wide");
  ASSERT_OK(r) << r.message();
  ASSERT_OK(cluster_.client().Post(jobs, TrainerJobManifest(kNs, "fits", "par", 2, 2, /*suspend=*/true)));
  ASSERT_TRUE(WaitFor([&] { return Condition(Job("par"), "Degraded")["status"] == "False"; }, 20s))
      << Job("par").dump(2);
  SettleWithEvents(events);
  bool warned = false;
  for (const auto& e : EventsAbout(cluster_, "par")) {
    warned = warned || e.rfind("Warning TrainerParallelismMismatch: batch/v1 Job " + kNs + "/wide", 0) == 0;
  }
  EXPECT_TRUE(warned) << ::testing::PrintToString(EventsAbout(cluster_, "par"));
}

TEST_F(ControllerTest, SidecarNotReadyAndRestartingAreVisible) {
  StartWithJob("sc", 2, "sc");
  cluster_.SetSidecar(kNs, "sc-1", false, /*restarts=*/3);
  ASSERT_TRUE(WaitFor([&] { return Job("sc")["status"]["processesReady"] == 1; }, 20s));
  json job = Job("sc");
  EXPECT_EQ(job["status"]["phase"], "Degraded");
  EXPECT_EQ(Condition(job, "Degraded")["reason"], "SidecarRestarting");
  EXPECT_EQ(Condition(job, "SidecarsReady")["reason"], "SidecarsNotReady");
  std::string ltt = Condition(job, "Valid")["lastTransitionTime"];
  cluster_.SetSidecar(kNs, "sc-1", true, 3);
  ASSERT_TRUE(WaitFor([&] { return Job("sc")["status"]["phase"] == "Running"; }, 20s));
  EXPECT_EQ(Condition(Job("sc"), "Valid")["lastTransitionTime"], ltt)
      << "a condition whose status did not change keeps its lastTransitionTime";
}

TEST_F(ControllerTest, DeletionCleansUpAndRemovesTheFinalizer) {
  StartWithJob("del", 2, "del");
  ASSERT_TRUE(ConfigMapOf("del").is_object());
  ASSERT_NO_FATAL_FAILURE(DeleteJob("del", 60s));
  EXPECT_FALSE(ConfigMapOf("del").is_object());
  // The peer secret it made goes before the job does (by uid precondition),
  // so the same job applied again at once gets a new one, not the old one
  // waiting for garbage collection.
  const std::string secret = std::string("/api/v1/namespaces/") + kNs + "/secrets/del-meshload-peer";
  EXPECT_FALSE(cluster_.Get(secret).is_object());
  cluster_.CreateJob(cluster_.JobManifest(kNs, "del", 2, "del"));
  ASSERT_TRUE(WaitFor([&] { return Job("del")["status"].contains("peerSecretUID"); }, 60s)) << Job("del").dump(2);
  Settle();
  json again = cluster_.Get(secret);
  ASSERT_TRUE(again.is_object());
  EXPECT_EQ(again["metadata"]["ownerReferences"][0]["uid"], Job("del")["metadata"]["uid"]);
  EXPECT_EQ(Job("del")["status"]["peerSecretUID"], again["metadata"]["uid"]);
}

// The chart's grant of dataloadjobs/finalizers is what lets the controller
// own its ConfigMap with blockOwnerDeletion (the server's
// OwnerReferencesPermissionEnforcement): taken out of the chart's role, the
// server refuses the create, and the cluster's 403 check names it.
TEST_F(ControllerTest, WithoutTheChartsFinalizersGrantTheServerRefusesTheOwnedConfigMap) {
  const std::string role = "/apis/rbac.authorization.k8s.io/v1/clusterroles/" + cluster_.chart_release();
  json cr = cluster_.Get(role);
  ASSERT_TRUE(cr.is_object());
  json kept = json::array();
  for (const auto& rule : cr["rules"]) {
    if (rule["resources"] != json::array({"dataloadjobs/finalizers"})) kept.push_back(rule);
  }
  ASSERT_EQ(kept.size() + 1, cr["rules"].size()) << "the chart's role has no dataloadjobs/finalizers rule";
  cr["rules"] = kept;
  ASSERT_OK(cluster_.client().Put(role, cr));
  cluster_.ExpectForbidden();
  // The authoriser follows the role by its own watch.
  ASSERT_TRUE(WaitFor(
      [&] {
        json review = {{"apiVersion", "authorization.k8s.io/v1"},
                       {"kind", "SubjectAccessReview"},
                       {"spec",
                        {{"user", cluster_.controller_user()},
                         {"resourceAttributes",
                          {{"verb", "update"},
                           {"group", "meshload.io"},
                           {"resource", "dataloadjobs"},
                           {"subresource", "finalizers"},
                           {"namespace", kNs}}}}}};
        auto r = cluster_.client().Post("/apis/authorization.k8s.io/v1/subjectaccessreviews", review);
        return r.ok() && !r.body["status"].value("allowed", true);
      },
      20s));
  ReadyPods("fin", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "fin", 2, "fin"));
  StartController();
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const auto& f : cluster_.Forbidden()) {
          if (f.rfind("create core/configmaps", 0) == 0) return true;
        }
        return false;
      },
      30s));
  EXPECT_FALSE(ConfigMapOf("fin").is_object());
  ASSERT_TRUE(WaitFor([&] { return Job("fin")["status"]["phase"] == "Degraded"; }, 30s)) << Job("fin").dump(2);
  EXPECT_THAT(Condition(Job("fin"), "Degraded")["message"].get<std::string>(), HasSubstr("403"))
      << Condition(Job("fin"), "Degraded").dump();
}

// A Secret that cannot be created does not hold up the status: the job is
// Degraded with PeerSecretFailed and the error, and recovers once the
// create succeeds.
TEST_F(ControllerTest, APeerSecretThatCannotBeCreatedDegradesTheJobUntilItCan) {
  ReadyPods("sf", 2);
  cluster_.proxy().InjectErrors(std::string("/api/v1/namespaces/") + kNs + "/secrets", 403, 1000);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "sf", 2, "sf"));
  StartController();
  ASSERT_TRUE(WaitFor([&] { return Job("sf")["status"]["phase"] == "Degraded"; }, 20s));
  json job = Job("sf");
  EXPECT_EQ(Condition(job, "Degraded")["reason"], "PeerSecretFailed");
  EXPECT_THAT(Condition(job, "Degraded")["message"].get<std::string>(),
              HasSubstr("create Secret " + kNs + "/sf-meshload-peer"))
      << Condition(job, "Degraded").dump();
  EXPECT_EQ(job["status"]["processesReady"], 2) << "the rest of the status is written";
  EXPECT_FALSE(job["status"].contains("peerSecretName"));
  cluster_.proxy().ClearInjectedErrors();
  ASSERT_TRUE(WaitFor([&] { return Job("sf")["status"]["phase"] == "Running"; }, 30s));
  EXPECT_EQ(Job("sf")["status"]["peerSecretName"], "sf-meshload-peer");
  EXPECT_TRUE(cluster_.Get(std::string("/api/v1/namespaces/") + kNs + "/secrets/sf-meshload-peer").is_object());
}

TEST_F(ControllerTest, StatusConflictsAreRetriedAfterReReading) {
  StartWithJob("cf", 2, "cf");
  // Someone else bumps the resourceVersion (a label) while a pod changes.
  std::string path = JobPath("cf");
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
  // The controller goes through the fault proxy; the test's own client goes
  // straight to the server.
  TestCluster cluster(TestCluster::Options{.fault_proxy = true});
  const std::string kNs = cluster.ns();
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
          case 0: cluster.proxy().CloseAllWatches(); break;
          case 1: cluster.proxy().InjectErrors("/api", 500, 2); break;
          case 2: cluster.proxy().InjectErrors("/api", 429, 1, 1); break;
          case 3:
            (void)cluster.control_plane().Compact();  // a resumed watch gets 410 Gone
            cluster.proxy().CloseAllWatches();
            break;
          case 4: cluster.proxy().InjectErrors("/apis/meshload.io", 503, 1); break;
        }
        // A change while the faults go on: the last pod of app2 becomes ready.
        if (rounds == 8) cluster.SetSidecar(kNs, "app2-2", true);
        std::this_thread::sleep_for(150ms);  // fixed on purpose: the faults go on for a set time
      }
      cluster.proxy().ClearInjectedErrors();
    });
  }
  metrics::Registry registry;
  ControllerOptions options;
  options.watch_namespace = kNs;
  options.watch_timeout = std::chrono::seconds(2);
  auto client = cluster.ControllerClient();  // default retries, as in production
  Controller controller(client.get(), &registry, options);
  EXPECT_OK(controller.Start(120s));
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
      json job = cluster.Get(TestCluster::JobPath(kNs, j));
      json status = job["status"];
      for (auto& c : status["conditions"]) c.erase("lastTransitionTime");
      // The Secret's uid differs between the two clusters; that there is one must not.
      if (status.contains("peerSecretUID"))
        status["peerSecretUID"] = !status["peerSecretUID"].get<std::string>().empty();
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
    // The two runs have namespaces of their own: the name, and the plan hash
    // it goes into, are the same where they say the same.
    std::string text = state.dump();
    for (size_t at; (at = text.find(kNs)) != std::string::npos;) text.replace(at, kNs.size(), "NS");
    state = json::parse(text);
    for (auto& [name, j] : state.items()) {
      if (!j["status"].contains("planHash")) continue;
      const bool same = j.contains("data") && j["data"]["planHash"] == j["status"]["planHash"];
      j["status"]["planHash"] = same;
      if (j.contains("data")) j["data"]["planHash"] = same;
    }
    return state;
  };
  json state;
  if (expect.is_null()) {
    EXPECT_TRUE(controller.WaitIdle(1s, 60s));
    state = snapshot();
  } else {
    (void)WaitFor([&] { return (state = snapshot()) == expect; }, 60s);  // the caller compares the states
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

// Events in the cluster's namespace about `name`, oldest first: "type reason: message (count)".
std::vector<std::string> EventsAbout(TestCluster& cluster, const std::string& name) {
  json list = cluster.Get("/api/v1/namespaces/" + cluster.ns() + "/events");
  std::vector<std::pair<std::string, std::string>> found;  // (name, line)
  for (const auto& e : list["items"]) {
    if (e["involvedObject"]["name"] != name) continue;
    found.emplace_back(e["metadata"]["name"].get<std::string>(),
                       e["type"].get<std::string>() + " " + e["reason"].get<std::string>() + ": " +
                           e["message"].get<std::string>() + " (" + std::to_string(e["count"].get<int64_t>()) + ")");
  }
  std::sort(found.begin(), found.end());  // names end in the creation time, in hex of equal width
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

TEST(EventRecorder, WritesEventsAggregatesRepeatsAndLimitsEachObject) {
  TestCluster cluster;
  const std::string kNs = cluster.ns();
  json job = cluster.CreateJob(cluster.JobManifest(kNs, "ev", 2, "ev"));
  metrics::Registry registry;
  runtime::EventRecorderOptions o;
  o.instance = "replica-a";
  o.burst_per_object = 4;
  auto event_client = cluster.ControllerClient();
  runtime::EventRecorder events(event_client.get(), &registry, o);
  events.Record(job, "Warning", "InvalidSpec", "spec.mesh: 3 devices");
  events.Record(job, "Warning", "InvalidSpec", "spec.mesh: 3 devices");  // the same: counted, not a new one
  events.Record(job, "Normal", "Planned", "8192 samples");
  ASSERT_TRUE(events.Flush(10s));
  EXPECT_EQ(EventsAbout(cluster, "ev"), (std::vector<std::string>{"Warning InvalidSpec: spec.mesh: 3 devices (2)",
                                                                  "Normal Planned: 8192 samples (1)"}));
  json list = cluster.Get(std::string("/api/v1/namespaces/") + kNs + "/events");
  const json& e = list["items"][0];
  EXPECT_EQ(e["involvedObject"]["kind"], "DataLoadJob");
  EXPECT_EQ(e["involvedObject"]["apiVersion"], "meshload.io/v1alpha1");
  EXPECT_EQ(e["involvedObject"]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(e["source"]["component"], "meshload-controller");
  EXPECT_EQ(e["reportingInstance"], "replica-a");
  EXPECT_FALSE(e["firstTimestamp"].get<std::string>().empty());

  // The object's bucket held 4: 3 taken above, 1 left, then dropped.
  events.Record(job, "Normal", "A", "one");
  events.Record(job, "Normal", "B", "two");
  ASSERT_TRUE(events.Flush(10s));
  EXPECT_EQ(EventsAbout(cluster, "ev").size(), 3u);
  const auto c = events.counts();
  EXPECT_EQ(c.created, 3u);
  EXPECT_EQ(c.aggregated, 1u);
  EXPECT_EQ(c.dropped, 1u);
  EXPECT_EQ(c.failed, 0u);
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("meshload_controller_events_total{outcome=\"dropped\"} 1"));
  // A message longer than 1 KiB is cut, at a character boundary (a cut
  // inside a UTF-8 character would make the JSON writer throw).
  json other = cluster.CreateJob(cluster.JobManifest(kNs, "long", 2, "ev"));
  events.Record(other, "Warning", "X", std::string(5000, 'm'));
  std::string accents;
  for (int i = 0; i < 1000; ++i) accents += "\xc3\xa9";  // é, two bytes each
  events.Record(other, "Warning", "Y", accents);         // 1,021 bytes would end inside an é
  ASSERT_TRUE(events.Flush(10s));
  const auto long_events = EventsAbout(cluster, "long");
  ASSERT_EQ(long_events.size(), 2u) << ::testing::PrintToString(long_events);
  EXPECT_LT(long_events[0].size(), 1100u);
  EXPECT_LT(long_events[1].size(), 1100u);
  EXPECT_THAT(long_events[1], HasSubstr("\xc3\xa9..."));
  EXPECT_EQ(events.counts().failed, 0u);
}

TEST(EventRecorder, NeverBlocksAFullQueueOrANonLeaderDrops) {
  TestCluster cluster;
  const std::string kNs = cluster.ns();
  json job = cluster.CreateJob(cluster.JobManifest(kNs, "q", 2, "q"));
  std::atomic<bool> leader{true}, hold{true};
  std::atomic<int> asked{0};
  runtime::EventRecorderOptions o;
  o.queue_capacity = 2;
  o.may_write = [&] {
    ++asked;
    // The writer is stuck on the first event (bounded, so that a failed
    // assertion below cannot hang the test in the recorder's destructor).
    (void)WaitFor([&] { return !hold.load(); }, 10s, 1ms);
    return leader.load();
  };
  auto event_client = cluster.ControllerClient();
  runtime::EventRecorder events(event_client.get(), nullptr, o);
  events.Record(job, "Normal", "R", "0");
  ASSERT_TRUE(WaitFor([&] { return asked.load() == 1; }, 20s));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= 4; ++i) events.Record(job, "Normal", "R", std::to_string(i));  // 2 queued, 2 dropped
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 100ms) << "Record must not wait for the writer";
  EXPECT_EQ(events.counts().dropped, 2u);
  hold = false;
  ASSERT_TRUE(events.Flush(10s));
  EXPECT_EQ(events.counts().created, 3u);
  leader = false;  // lost the lease: nothing more is written
  events.Record(job, "Warning", "R", "late");
  ASSERT_TRUE(events.Flush(10s));
  EXPECT_EQ(events.counts().created, 3u);
  EXPECT_EQ(events.counts().dropped, 3u);
  EXPECT_EQ(EventsAbout(cluster, "q").size(), 3u);
}

TEST_F(ControllerTest, ConditionChangesBecomeEventsAndAnIdleJobMakesNone) {
  cluster_.CreateJob(InvalidManifest("watched", "w"));
  runtime::EventRecorder& events = StartRecordingEvents();
  auto seen = EventsAbout(cluster_, "watched");
  ASSERT_EQ(seen.size(), 2u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen[0].rfind("Warning InvalidSpec: ", 0), 0u) << seen[0];
  EXPECT_THAT(seen[0], HasSubstr("spec.batch.globalBatchSize"));
  EXPECT_EQ(seen[1], "Warning InvalidSpec: the spec must be valid first (1)");

  // Fixed, then its trainers come up.
  ASSERT_NO_FATAL_FAILURE(EditGlobalBatchSize("watched", 32));
  ASSERT_TRUE(WaitFor([&] { return Job("watched")["status"]["phase"] == "Pending"; }, 20s));
  ReadyPods("w", 2);
  ASSERT_TRUE(WaitFor([&] { return Job("watched")["status"]["phase"] == "Running"; }, 20s));
  SettleWithEvents(events);
  seen = EventsAbout(cluster_, "watched");
  ASSERT_EQ(seen.size(), 5u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen[2], "Normal Valid: Valid is now True (1)");
  EXPECT_EQ(seen[3].rfind("Normal Resolved: ", 0), 0u) << seen[3];
  EXPECT_EQ(seen[4], "Normal AllSidecarsReady: 2 of 2 sidecars ready (1)");

  // A sidecar restarts and is not ready: SidecarsReady False, and Degraded
  // True for the restart (a sidecar merely not ready is SidecarsReady's).
  cluster_.SetSidecar(kNs, "w-1", false, 1);
  ASSERT_TRUE(WaitFor([&] { return Job("watched")["status"]["phase"] == "Degraded"; }, 20s));
  SettleWithEvents(events);
  seen = EventsAbout(cluster_, "watched");
  ASSERT_EQ(seen.size(), 7u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen[5].rfind("Warning SidecarsNotReady: 1 of 2 sidecars ready", 0), 0u) << seen[5];
  EXPECT_EQ(seen[6].rfind("Warning SidecarRestarting: the sidecar of process 1 (pod w-1) restarted", 0), 0u) << seen[6];
  // It comes back: ready again, and recovered.
  cluster_.SetSidecar(kNs, "w-1", true, 1);
  ASSERT_TRUE(WaitFor([&] { return Job("watched")["status"]["phase"] == "Running"; }, 20s));
  SettleWithEvents(events);
  seen = EventsAbout(cluster_, "watched");
  // The same event again within 10 minutes raises the first one's count.
  ASSERT_EQ(seen.size(), 8u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen[4], "Normal AllSidecarsReady: 2 of 2 sidecars ready (2)");
  EXPECT_EQ(seen[7], "Normal Recovered: no longer degraded (was: SidecarRestarting) (1)");

  // Nothing changes: reconciles make no events.
  const auto before = events.counts();
  for (int i = 0; i < 10; ++i) controller_->queue().Add(std::string(kNs) + "/watched");
  SettleWithEvents(events);
  EXPECT_EQ(events.counts().created, before.created);
  EXPECT_EQ(events.counts().aggregated, before.aggregated);
  StopController();
}

TEST_F(ControllerTest, EventsForAJobReadyAtOnceAndForEditsThatKeepItInvalid) {
  // Pods ready before the job: its first status is Running.
  ReadyPods("r", 2);
  cluster_.CreateJob(cluster_.JobManifest(kNs, "ready", 2, "r"));
  // Invalid, then edited and still invalid, for another reason.
  cluster_.CreateJob(InvalidManifest("edited", "e"));
  runtime::EventRecorder& events = StartRecordingEvents();
  auto ready = EventsAbout(cluster_, "ready");
  ASSERT_EQ(ready.size(), 2u) << ::testing::PrintToString(ready);
  EXPECT_EQ(ready[0].rfind("Normal Resolved: ", 0), 0u) << ready[0];
  EXPECT_EQ(ready[1], "Normal AllSidecarsReady: 2 of 2 sidecars ready (1)");

  ASSERT_NO_FATAL_FAILURE(EditGlobalBatchSize("edited", 5));
  ASSERT_TRUE(WaitFor([&] { return Job("edited")["status"]["observedGeneration"] == 2; }, 20s));
  SettleWithEvents(events);
  auto edited = EventsAbout(cluster_, "edited");
  ASSERT_EQ(edited.size(), 3u) << ::testing::PrintToString(edited);
  EXPECT_THAT(edited[0], HasSubstr("globalBatchSize: 3 "));
  EXPECT_EQ(edited[1], "Warning InvalidSpec: the spec must be valid first (1)");
  EXPECT_THAT(edited[2], HasSubstr("globalBatchSize: 5 "));
}

TEST(ControllerMetrics, ExposesReconcilesQueueAndApiRequests) {
  TestCluster cluster;
  metrics::Registry registry;
  auto client = cluster.ControllerClient({.observer = ApiRequestObserver(registry)});
  const std::string kNs = cluster.ns();
  cluster.CreateJob(cluster.JobManifest(kNs, "m", 2, "m"));
  ControllerOptions options;
  options.watch_namespace = kNs;
  Controller controller(client.get(), &registry, options);
  ASSERT_OK(controller.Start(10s));
  controller.SetLeader(true);
  controller.StartWorkers();
  ASSERT_TRUE(controller.WaitIdle(200ms, 20s));
  std::string text = registry.Serialize();
  for (const char* want :
       {"meshload_controller_reconciles_total{result=\"success\"}",
        "meshload_controller_reconcile_duration_seconds_bucket", "meshload_controller_queue_depth 0",
        "meshload_controller_leader 1", "meshload_controller_api_requests_total{code=\"200\",verb=\"LIST\"}",
        "meshload_controller_api_requests_total{code=\"201\",verb=\"POST\"}",
        "meshload_controller_cached_objects{resource=\"dataloadjobs\"} 1"}) {
    EXPECT_THAT(text, HasSubstr(want)) << want << "\n" << text;
  }
  controller.Stop();
}

}  // namespace
}  // namespace meshload::controller
