// The typed Kubernetes objects' JSON bindings (controller/kube/objects.h)
// and the DataLoadJob status's (controller/job_status.h): what is read from
// objects as the API server sends them, what is written, and that an
// update built from an object read loses none of its metadata.
#include "controller/kube/objects.h"

#include <gtest/gtest.h>

#include "controller/job_status.h"
#include "controller/trainer_jobs.h"

namespace meshload::controller {
namespace {

using nlohmann::json;

json ServerPod() {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "trainer-1", "namespace": "ml", "uid": "u-1", "resourceVersion": "42",
                 "creationTimestamp": "2026-01-01T00:00:00Z", "generateName": "trainer-",
                 "labels": {"app": "train", "batch.kubernetes.io/job-completion-index": "3"},
                 "annotations": {"batch.kubernetes.io/job-completion-index": "1", "note": "x"},
                 "managedFields": [{"manager": "kubelet"}],
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "ju",
                                      "controller": true, "blockOwnerDeletion": true}]},
    "spec": {"containers": [{"name": "trainer"},
                            {"name": "meshload-sidecar", "ports": [{"name": "metrics", "containerPort": 9464}]}]},
    "status": {"phase": "Running", "podIP": "10.0.0.7",
               "containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0, "image": "t"},
                                     {"name": "meshload-sidecar", "ready": false, "restartCount": 2}]}
  })");
}

TEST(KubeObjects, APodReadsItsMetadataStatusAndTheSidecarsMetricsPort) {
  const kube::Pod p = kube::Pod::FromFullJson(ServerPod(), "meshload-sidecar");
  EXPECT_EQ(p.metadata.name, "trainer-1");
  EXPECT_EQ(p.metadata.namespace_, "ml");
  EXPECT_EQ(p.metadata.uid, "u-1");
  EXPECT_EQ(p.metadata.Label("app"), "train");
  EXPECT_EQ(p.metadata.ControllerUid(), "ju");
  EXPECT_EQ(p.phase, "Running");
  EXPECT_EQ(p.pod_ip, "10.0.0.7");
  EXPECT_EQ(p.sidecar_metrics_port, 9464);
  ASSERT_NE(p.StatusOf("meshload-sidecar"), nullptr);
  EXPECT_FALSE(p.StatusOf("meshload-sidecar")->ready);
  EXPECT_EQ(p.StatusOf("meshload-sidecar")->restart_count, 2);
  EXPECT_EQ(p.StatusOf("nope"), nullptr);
  // The annotation wins over the label.
  EXPECT_EQ(p.CompletionIndex(), 1);
}

TEST(KubeObjects, TheCachedPodIsSlimAndReadsBackTheSame) {
  const json slim = kube::Pod::FromFullJson(ServerPod(), "meshload-sidecar").ToJson();
  EXPECT_FALSE(slim["metadata"].contains("managedFields"));
  EXPECT_FALSE(slim["metadata"].contains("ownerReferences"));
  EXPECT_EQ(slim["metadata"]["annotations"], json({{"batch.kubernetes.io/job-completion-index", "1"}}));
  EXPECT_EQ(slim["spec"], json({{"metricsPort", 9464}}));
  EXPECT_FALSE(slim["status"]["containerStatuses"][0].contains("image"));
  const kube::Pod again = kube::Pod::FromJson(slim);
  EXPECT_EQ(again.ToJson(), slim);
  EXPECT_EQ(again.CompletionIndex(), 1);
  EXPECT_EQ(again.sidecar_metrics_port, 9464);
}

TEST(KubeObjects, ACompletionIndexThatIsNotANumberIsMinusOneAndAbsentIsNone) {
  kube::Pod p;
  EXPECT_EQ(p.CompletionIndex(), std::nullopt);
  p.metadata.labels[kube::kJobCompletionIndex] = "7";
  EXPECT_EQ(p.CompletionIndex(), 7);
  p.metadata.annotations[kube::kJobCompletionIndex] = "7x";
  EXPECT_EQ(p.CompletionIndex(), -1);
  p.metadata.annotations[kube::kJobCompletionIndex] = "1234567890";
  EXPECT_EQ(p.CompletionIndex(), -1);
}

TEST(KubeObjects, MalformedMembersReadAsAbsentNeverThrow) {
  const json bad = json::parse(R"({"metadata": {"name": 5, "labels": {"a": 1, "b": "ok"}, "finalizers": "x",
                                                 "ownerReferences": {"uid": "u"}, "generation": "2"},
                                   "status": {"containerStatuses": [7, {"name": "s", "ready": "yes"}]},
                                   "spec": {"metricsPort": 70000}})");
  const kube::Pod p = kube::Pod::FromJson(bad);
  EXPECT_EQ(p.metadata.name, "");
  EXPECT_EQ(p.metadata.labels, (kube::StringMap{{"b", "ok"}}));
  EXPECT_TRUE(p.metadata.finalizers.empty());
  EXPECT_TRUE(p.metadata.owner_references.empty());
  EXPECT_EQ(p.metadata.generation, 0);
  ASSERT_EQ(p.container_statuses.size(), 2u);
  EXPECT_FALSE(p.container_statuses[1].ready);
  EXPECT_EQ(p.sidecar_metrics_port, 0);
  EXPECT_NO_THROW(kube::Pod::FromJson(json("not an object")));
  EXPECT_NO_THROW(kube::ConfigMap::FromJson(json::array()));
}

TEST(KubeObjects, AnUpdateOfAnObjectReadKeepsTheMetadataItDoesNotBind) {
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata",
              {{"name", "j-meshload"},
               {"namespace", "ml"},
               {"resourceVersion", "9"},
               {"uid", "c1"},
               {"managedFields", json::array({{{"manager", "meshload"}}})},
               {"annotations", {{"keep", "me"}}},
               {"finalizers", {"f"}}}},
             {"data", {{"a", "1"}}},
             {"binaryData", {{"b", "AAEC"}}}};
  kube::ConfigMap typed = kube::ConfigMap::FromJson(cm);
  EXPECT_EQ(typed.Data("a"), "1");
  EXPECT_EQ(typed.Data("b"), "");
  EXPECT_EQ(typed.ToJson(), cm);
  typed.data["b"] = "2";
  typed.metadata.labels["meshload.io/job"] = "j";
  const json out = typed.ToJson();
  EXPECT_EQ(out["metadata"]["resourceVersion"], "9");
  EXPECT_EQ(out["metadata"]["managedFields"], cm["metadata"]["managedFields"]);
  EXPECT_EQ(out["metadata"]["annotations"], cm["metadata"]["annotations"]);
  EXPECT_EQ(out["metadata"]["labels"], json({{"meshload.io/job", "j"}}));
  EXPECT_EQ(out["data"], json({{"a", "1"}, {"b", "2"}}));
  EXPECT_EQ(out["binaryData"], cm["binaryData"]) << "a member the struct does not bind is written back";
}

TEST(KubeObjects, WhatTheControllerWritesIsTheApiShape) {
  kube::Secret s;
  s.metadata.name = "j-meshload-peer";
  s.metadata.namespace_ = "ml";
  s.metadata.owner_references = {{"meshload.io/v1alpha1", "DataLoadJob", "j", "u", true, true}};
  s.immutable = true;
  s.data = {{"secret", "c2VjcmV0"}};
  EXPECT_EQ(s.ToJson(), json::parse(R"({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": true,
    "metadata": {"name": "j-meshload-peer", "namespace": "ml",
                 "ownerReferences": [{"apiVersion": "meshload.io/v1alpha1", "kind": "DataLoadJob", "name": "j",
                                      "uid": "u", "controller": true, "blockOwnerDeletion": true}]},
    "data": {"secret": "c2VjcmV0"}})"));
  EXPECT_EQ(kube::DeleteOptions{"u"}.ToJson(),
            json::parse(R"({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "u"}})"));
  EXPECT_EQ(kube::DeleteOptions{}.ToJson(), json::parse(R"({"apiVersion": "v1", "kind": "DeleteOptions"})"));

  kube::Event e;
  e.metadata.name = "j.1";
  e.metadata.namespace_ = "ml";
  e.involved_object = kube::ObjectReference::To(
      {{"apiVersion", "meshload.io/v1alpha1"},
       {"kind", "DataLoadJob"},
       {"metadata", {{"name", "j"}, {"namespace", "ml"}, {"uid", "u"}, {"resourceVersion", "3"}}}});
  e.reason = "InvalidSpec";
  e.message = "m";
  e.type = "Warning";
  e.first_timestamp = e.last_timestamp = "t";
  e.source_component = e.reporting_component = "meshload-controller";
  e.reporting_instance = "i";
  const json ej = e.ToJson();
  EXPECT_EQ(ej["involvedObject"], json::parse(R"({"apiVersion": "meshload.io/v1alpha1", "kind": "DataLoadJob",
    "namespace": "ml", "name": "j", "uid": "u", "resourceVersion": "3"})"));
  EXPECT_EQ(ej["count"], 1);
  EXPECT_EQ(ej["source"], json({{"component", "meshload-controller"}}));
}

TEST(JobStatusBinding, AStoredStatusReadsAndWritesBackTheSame) {
  const json stored = json::parse(R"({"phase": "Running", "observedGeneration": 4, "processesReady": 2,
    "planHash": "abc", "peerSecretName": "j-meshload-peer", "peerSecretUID": "s1",
    "progress": {"step": 10}, "suspendedAtStep": 11,
    "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "message": "",
                    "observedGeneration": 4, "lastTransitionTime": "2026-01-01T00:00:00Z"}]})");
  const JobStatus s = JobStatus::FromJson(stored);
  EXPECT_EQ(s.phase, "Running");
  EXPECT_EQ(s.processes_ready, 2);
  EXPECT_EQ(s.suspended_at_step, 11);
  ASSERT_NE(s.Find("Valid"), nullptr);
  EXPECT_EQ(s.Find("Valid")->last_transition_time, "2026-01-01T00:00:00Z");
  EXPECT_EQ(s.Find("Degraded"), nullptr);
  EXPECT_EQ(s.ToJson(), stored);
  EXPECT_EQ(JobStatus::FromJson(json()).ToJson(),
            json::parse(R"({"phase": "", "observedGeneration": 0, "processesReady": 0, "conditions": []})"));
}

TEST(JobStatusBinding, AConditionKeepsItsTransitionTimeWhileItsStatusStays) {
  JobStatus current;
  current.conditions = {{"Valid", "True", "Valid", "", 3, "then"}, {"Degraded", "False", "AsExpected", "", 3, "then"}};
  DesiredStatus d;
  d.phase = "Degraded";
  d.conditions = {{"Valid", "True", "Valid", ""}, {"Degraded", "True", "TooManyPods", std::string(40000, 'x')}};
  const JobStatus out = StatusToWrite(d, 4, current);
  EXPECT_EQ(out.observed_generation, 4);
  EXPECT_EQ(out.Find("Valid")->last_transition_time, "then");
  EXPECT_NE(out.Find("Degraded")->last_transition_time, "then");
  EXPECT_EQ(out.Find("Degraded")->observed_generation, 4);
  EXPECT_EQ(out.Find("Degraded")->message, std::string(32000, 'x') + "...");
  const auto events = ConditionEvents(current, out);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "Warning");
  EXPECT_EQ(events[0].reason, "TooManyPods");
}

// Waiting for a queue and being preempted by it are how queued trainers
// run: Normal events, once each; the pods that go with a suspended Job are
// not a sidecar problem nor a recovery.
TEST(JobStatusBinding, AdmissionChangesAreNormalEventsAndSuspendedPodsNoWarning) {
  JobStatus none;
  JobStatus waiting;
  waiting.conditions = {{"Admitted", "False", "WaitingForAdmission", "queued", 1, "t"},
                        {"SidecarsReady", "False", "TrainersSuspended", "no pods", 1, "t"},
                        {"Degraded", "False", "TrainersSuspended", "", 1, "t"}};
  auto events = ConditionEvents(none, waiting);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "Normal");
  EXPECT_EQ(events[0].reason, "WaitingForAdmission");
  JobStatus running;
  running.conditions = {{"Admitted", "True", "TrainersAdmitted", "go", 1, "t"},
                        {"SidecarsReady", "True", "AllSidecarsReady", "2 of 2", 1, "t"},
                        {"Degraded", "False", "AsExpected", "", 1, "t"}};
  events = ConditionEvents(waiting, running);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].reason, "TrainersAdmitted");
  EXPECT_EQ(events[1].reason, "AllSidecarsReady");
  JobStatus suspended = waiting;
  suspended.conditions[0] = {"Admitted", "False", "Suspended", "preempted at 58", 1, "t"};
  events = ConditionEvents(running, suspended);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "Normal");
  EXPECT_EQ(events[0].reason, "Suspended");
  EXPECT_EQ(events[0].message, "preempted at 58");
  EXPECT_TRUE(ConditionEvents(suspended, suspended).empty());
}

TEST(TrainerJobs, ABatchJobIsReadSlimAndItsSizeCheckedAgainstTheMesh) {
  const json server = json::parse(R"({"apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "t", "namespace": "ml", "uid": "u", "resourceVersion": "9", "labels": {"q": "a"},
                 "annotations": {"big": "x"}, "managedFields": [{"manager": "kueue"}]},
    "spec": {"suspend": true, "parallelism": 3, "completions": 4, "completionMode": "Indexed",
             "template": {"metadata": {"labels": {"app": "tr"}}, "spec": {"containers": [{"name": "c"}]}}},
    "status": {"conditions": [{"type": "Suspended", "status": "True"}]}})");
  const TrainerJob t = TrainerJob::FromJson(server);
  EXPECT_TRUE(t.suspended);
  EXPECT_EQ(t.parallelism, 3);
  EXPECT_EQ(t.completions, 4);
  EXPECT_TRUE(t.indexed);
  EXPECT_FALSE(t.finished);
  EXPECT_EQ(t.template_labels, (kube::StringMap{{"app", "tr"}}));
  const json slim = SlimBatchJob(server);
  EXPECT_FALSE(slim["metadata"].contains("annotations"));
  EXPECT_FALSE(slim["spec"]["template"].contains("spec"));
  EXPECT_EQ(slim["metadata"]["resourceVersion"], "9");
  EXPECT_EQ(TrainerJob::FromJson(slim).ToJson(), slim);
  // Unset parallelism is 1, as the API defaults it; a Complete Job is finished.
  const TrainerJob done = TrainerJob::FromJson(
      json::parse(R"({"spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}})"));
  EXPECT_EQ(done.parallelism, 1);
  EXPECT_TRUE(done.finished);

  auto problems = TrainerJobProblems({t}, 4);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0],
            "TrainerParallelismMismatch: batch/v1 Job ml/t has spec.parallelism 3 but the mesh has 4 processes "
            "(spec.mesh.processes)");
  problems = TrainerJobProblems({t}, 3);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("TrainerCompletionsMismatch: Indexed batch/v1 Job ml/t has spec.completions 4", 0), 0u);
  TrainerJob u = t;
  u.metadata.name = "u";
  u.parallelism = 2;
  problems = TrainerJobProblems({t, u}, 4);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0],
            "TrainerParallelismMismatch: the trainer Jobs in ml whose pods the selector matches run 5 pods in all "
            "(Job t spec.parallelism 3, Job u spec.parallelism 2) but the mesh has 4 processes (spec.mesh.processes)");
  u.parallelism = 1;
  EXPECT_TRUE(TrainerJobProblems({t, u}, 4).empty());
  EXPECT_TRUE(TrainerJobProblems({}, 4).empty());
}

// A JobSet's replicated jobs number their pods in the order of their Jobs'
// global indices: a driver Job of 1 pod, then 2 worker Jobs of 2.
TEST(TrainerJobs, AJobSetsPodsAreNumberedAcrossItsJobs) {
  auto job = [](const std::string& name, const std::string& rj, int g, int par) {
    TrainerJob t;
    t.metadata.name = name;
    t.metadata.namespace_ = "ml";
    t.metadata.labels = {
        {kJobSetNameLabel, "js"}, {kReplicatedJobLabel, rj}, {kJobGlobalIndexLabel, std::to_string(g)}};
    t.parallelism = par;
    t.completions = par;
    t.indexed = true;
    return t;
  };
  std::vector<TrainerJob> jobs = {job("js-driver-0", "driver", 0, 1), job("js-workers-0", "workers", 1, 2),
                                  job("js-workers-1", "workers", 2, 2)};
  auto pod = [](int g, int c, const std::string& jobset = "js") {
    kube::Pod p;
    p.metadata.name = "p" + std::to_string(g) + std::to_string(c);
    p.metadata.namespace_ = "ml";
    p.metadata.labels = {{kJobSetNameLabel, jobset}, {kJobGlobalIndexLabel, std::to_string(g)}};
    p.metadata.annotations = {{kube::kJobCompletionIndex, std::to_string(c)}};
    return p;
  };
  std::string problem;
  EXPECT_EQ(JobSetProcessIndex(pod(0, 0), jobs, &problem), 0);
  EXPECT_EQ(JobSetProcessIndex(pod(1, 0), jobs, &problem), 1);
  EXPECT_EQ(JobSetProcessIndex(pod(1, 1), jobs, &problem), 2);
  EXPECT_EQ(JobSetProcessIndex(pod(2, 0), jobs, &problem), 3);
  EXPECT_EQ(JobSetProcessIndex(pod(2, 1), jobs, &problem), 4);
  EXPECT_EQ(problem, "");
  kube::Pod bare;
  bare.metadata.annotations = {{kube::kJobCompletionIndex, "1"}};
  EXPECT_EQ(JobSetProcessIndex(bare, jobs, &problem), std::nullopt) << "an Indexed Job's pod of no JobSet";
  // A Job before its own not known (yet): a problem, never a guess.
  EXPECT_EQ(JobSetProcessIndex(pod(2, 0), {jobs[0], jobs[2]}, &problem), -1);
  EXPECT_EQ(problem,
            "JobSetIndexUnknown: pod p20 of JobSet ml/js is in its Job of global index 2, but the Job of global "
            "index 1 is not known (yet)");
  EXPECT_TRUE(TrainerJobProblems(jobs, 5).empty());
  auto problems = TrainerJobProblems(jobs, 4);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0],
            "TrainerParallelismMismatch: the trainer Jobs in ml whose pods the selector matches run 5 pods in all "
            "(JobSet js (spec.replicatedJobs, replicas x parallelism: driver 1 x 1, workers 2 x 2)) but the mesh has "
            "4 processes (spec.mesh.processes)");
  jobs[2].completions = 3;
  problems = TrainerJobProblems(jobs, 5);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("TrainerCompletionsMismatch: Indexed batch/v1 Job ml/js-workers-1 of JobSet js has "
                              "spec.completions 3 but spec.parallelism 2",
                              0),
            0u)
      << problems[0];
}

}  // namespace
}  // namespace meshload::controller
