// The sidecar injector without a cluster: the patch it makes for a labelled
// pod or Job template (applied here and checked as the stored object would
// be), idempotence,
// every refusal with its message, AdmissionReview decoding of bad bodies,
// and the HTTPS server (TLS, certificate reload, metrics). The API server
// calling it for real is in tests/charts/helm_cluster_test.sh.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "common/base64.h"
#include "common/metrics/metrics.h"
#include "controller/webhook/admission.h"
#include "controller/webhook/injector.h"
#include "controller/webhook/server.h"
#include "tests/testing/test_pki.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace meshload::controller::webhook {
namespace {

using meshload::testing::WaitFor;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

json Job(const std::string& strategy = "PerProcess", const std::string& fanout = "Load") {
  json j = json::parse(R"({
    "apiVersion": "meshload.io/v1alpha1", "kind": "DataLoadJob",
    "metadata": {"name": "llm", "namespace": "training"},
    "spec": {
      "mesh": {"processes": 2, "devicesPerProcess": 2, "axes": [{"name": "data", "size": 4}]},
      "dataset": {"uri": "/datasets/tokens", "format": "TokenStream", "dtype": "uint16", "sequenceLength": 2048,
                  "samples": 100000, "volume": {"name": "datasets", "mountPath": "/datasets"}},
      "batch": {"globalBatchSize": 32},
      "selector": {"matchLabels": {"app": "trainer"}}
    }})");
  j["spec"]["strategy"] = strategy;
  j["spec"]["replication"] = {{"fanout", fanout}};
  return j;
}

json Pod(bool indexed = true) {
  json pod = json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"generateName": "trainer-0-", "namespace": "training",
                 "labels": {"app": "trainer", "meshload.io/job": "llm"}},
    "spec": {
      "containers": [{"name": "trainer", "image": "trainer:1",
                      "resources": {"claims": [{"name": "gpus"}]},
                      "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}],
      "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpus"}],
      "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "tokens"}}]
    }})");
  if (indexed) pod["metadata"]["annotations"] = {{"batch.kubernetes.io/job-completion-index", "0"}};
  return pod;
}

JobLookup Lookup(const json& job) {
  auto ptr = std::make_shared<const json>(job);
  return [ptr](const std::string& ns, const std::string& name) -> std::shared_ptr<const json> {
    if (ns == "training" && name == "llm") return ptr;
    return nullptr;
  };
}

InjectorOptions Options() {
  InjectorOptions o;
  o.image = "meshload/sidecar:0.1.0";
  o.resources = {{"requests", {{"cpu", "1"}}}, {"limits", {{"memory", "2Gi"}}}};
  return o;
}

// Applies a JSON Patch of "add" operations as the API server would.
json Apply(json doc, const json& patch) {
  for (const auto& op : patch) {
    EXPECT_EQ(op["op"], "add");
    doc[json::json_pointer(op["path"].get<std::string>())] = op["value"];
  }
  return doc;
}

const json& Sidecar(const json& pod) { return pod["spec"]["initContainers"][0]; }

bool HasArg(const json& c, const std::string& arg) {
  for (const auto& a : c["args"]) {
    if (a == arg) return true;
  }
  return false;
}

json Named(const json& list, const std::string& name) {
  for (const auto& x : list) {
    if (x["name"] == name) return x;
  }
  return json();
}

TEST(Injector, AnIndexedTrainerGetsTheNativeSidecarAsDocumented) {
  Decision d = InjectSidecar(Pod(), "training", Lookup(Job()), Options());
  ASSERT_TRUE(d.allowed) << d.message;
  EXPECT_EQ(d.outcome, "injected");
  json pod = Apply(Pod(), d.patch);
  const json& sc = Sidecar(pod);
  EXPECT_EQ(sc["name"], "meshload-sidecar");
  EXPECT_EQ(sc["image"], "meshload/sidecar:0.1.0");
  EXPECT_EQ(sc["restartPolicy"], "Always");
  EXPECT_TRUE(HasArg(sc, "--job=/etc/meshload/job/job.json"));
  EXPECT_TRUE(HasArg(sc, "--socket=/run/meshload/sidecar.sock"));
  EXPECT_FALSE(HasArg(sc, "--peer-secret-file=/etc/meshload/peer/secret")) << "PerProcess/Load moves no samples";
  EXPECT_EQ(Named(sc["env"], "MESHLOAD_PROCESS")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(Named(sc["env"], "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  EXPECT_EQ(Named(sc["env"], "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace");
  EXPECT_EQ(sc["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(sc["resources"]["requests"]["cpu"], "1");
  EXPECT_EQ(sc["resources"]["claims"], json::parse(R"([{"name": "gpus"}])")) << "the trainer's GPUs";
  // PSS restricted, and the trainer's uid (the sidecar's socket accepts its own uid).
  EXPECT_EQ(sc["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(sc["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(sc["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(sc["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(sc["securityContext"]["runAsUser"], 1000);
  EXPECT_EQ(Named(sc["volumeMounts"], "datasets"),
            json::parse(R"({"name": "datasets", "mountPath": "/datasets", "readOnly": true})"));
  EXPECT_EQ(Named(sc["volumeMounts"], "meshload-job")["readOnly"], true);
  // The job's ConfigMap and the socket volume; no peer secret.
  EXPECT_EQ(Named(pod["spec"]["volumes"], "meshload-job")["configMap"]["name"], "llm-meshload");
  EXPECT_TRUE(Named(pod["spec"]["volumes"], "meshload-run").contains("emptyDir"));
  EXPECT_TRUE(Named(pod["spec"]["volumes"], "meshload-peer").is_null());
  // The trainer: the socket mounted and named.
  const json& trainer = pod["spec"]["containers"][0];
  EXPECT_EQ(Named(trainer["volumeMounts"], "meshload-run")["mountPath"], "/run/meshload");
  EXPECT_EQ(Named(trainer["env"], "MESHLOAD_SOCKET")["value"], "/run/meshload/sidecar.sock");
  EXPECT_EQ(pod["metadata"]["annotations"]["meshload.io/sidecar-injected"], "llm");
  EXPECT_FALSE(pod["spec"].contains("securityContext")) << "no fsGroup without a peer secret";
}

TEST(Injector, TrainersOfSeveralUidsAreEachLetIntoTheSocket) {
  EXPECT_THAT(Sidecar(Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(Job()), Options()).patch))["args"].dump(),
              Not(HasSubstr("--allow-uids")))
      << "one trainer: the sidecar runs as its uid, and accepts its own";
  json pod = Pod();
  pod["spec"]["securityContext"] = {{"runAsUser", 3000}};
  pod["spec"]["containers"].push_back(
      {{"name", "evaluator"}, {"image", "e:1"}, {"securityContext", {{"runAsUser", 2000}}}});
  pod["spec"]["containers"].push_back({{"name", "logger"}, {"image", "l:1"}});  // the pod's uid
  json injected = Apply(pod, InjectSidecar(pod, "training", Lookup(Job()), Options()).patch);
  EXPECT_TRUE(HasArg(Sidecar(injected), "--allow-uids=1000,2000,3000")) << Sidecar(injected)["args"].dump();
  EXPECT_EQ(Sidecar(injected)["securityContext"]["runAsUser"], 1000);
}

TEST(Injector, APodOutsideAnIndexedJobReadsItsIndexFromTheConfigMap) {
  json pod = Apply(Pod(false), InjectSidecar(Pod(false), "training", Lookup(Job()), Options()).patch);
  EXPECT_TRUE(HasArg(Sidecar(pod), "--process-file=/etc/meshload/job/process.$(POD_NAME)"));
  EXPECT_TRUE(Named(Sidecar(pod)["env"], "MESHLOAD_PROCESS").is_null());
}

TEST(Injector, JobsThatMoveSamplesGetThePeerSecretReadableByThePodsGroupOnly) {
  for (const auto& [strategy, fanout] :
       std::vector<std::pair<std::string, std::string>>{{"PerProcess", "Broadcast"}, {"LoadAndReshard", "Load"}}) {
    Decision d = InjectSidecar(Pod(), "training", Lookup(Job(strategy, fanout)), Options());
    ASSERT_TRUE(d.allowed) << d.message;
    json pod = Apply(Pod(), d.patch);
    EXPECT_TRUE(HasArg(Sidecar(pod), "--peer-secret-file=/etc/meshload/peer/secret")) << strategy << fanout;
    EXPECT_TRUE(HasArg(Sidecar(pod), "--assignments=/etc/meshload/job/assignments.json"));
    json secret = Named(pod["spec"]["volumes"], "meshload-peer")["secret"];
    EXPECT_EQ(secret["secretName"], "llm-meshload-peer");
    EXPECT_EQ(secret["defaultMode"], 0440);
    EXPECT_EQ(pod["spec"]["securityContext"]["fsGroup"], 1000) << "the sidecar's group (the trainer's)";
    EXPECT_EQ(Named(Sidecar(pod)["ports"], "peers")["containerPort"], 7441);
  }
}

TEST(Injector, AnS3JobsCredentialsSecretIsMountedAsFilesForTheSidecarOnly) {
  json job = Job();
  job["spec"]["dataset"] = json::parse(R"({"uri": "s3://corpus/tokens/", "format": "TokenStream", "dtype": "uint16",
      "sequenceLength": 2048, "samples": 100000,
      "s3": {"endpoint": "https://minio.storage:9000", "credentialsSecret": "corpus-reader"}})");
  json pod = Pod();
  pod["spec"].erase("volumes");
  Decision d = InjectSidecar(pod, "training", Lookup(job), Options());
  ASSERT_TRUE(d.allowed) << d.message;
  pod = Apply(pod, d.patch);
  json secret = Named(pod["spec"]["volumes"], "meshload-s3")["secret"];
  EXPECT_EQ(secret["secretName"], "corpus-reader");
  EXPECT_EQ(secret["defaultMode"], 0440);
  EXPECT_EQ(Named(Sidecar(pod)["volumeMounts"], "meshload-s3"),
            json::parse(R"({"name": "meshload-s3", "mountPath": "/etc/meshload/s3", "readOnly": true})"));
  EXPECT_EQ(Named(Sidecar(pod)["env"], "MESHLOAD_S3_CREDENTIALS_DIR")["value"], "/etc/meshload/s3");
  EXPECT_EQ(pod["spec"]["securityContext"]["fsGroup"], 1000) << "the sidecar's group reads the 0440 files";
  EXPECT_TRUE(Named(pod["spec"]["containers"][0]["volumeMounts"], "meshload-s3").is_null())
      << "the trainer does not see the credentials";
  // Without a Secret: nothing mounted (the sidecar's own environment or role).
  job["spec"]["dataset"]["s3"].erase("credentialsSecret");
  json plain = Pod();
  plain = Apply(plain, InjectSidecar(plain, "training", Lookup(job), Options()).patch);
  EXPECT_TRUE(Named(plain["spec"]["volumes"], "meshload-s3").is_null());
}

// A remote dataset read through the block cache: a cache volume of the
// job's capacity (an emptyDir, with the ephemeral storage it takes), or the
// node directory the controller names; a startup probe with warmSteps; no
// cache for Direct reads or a local dataset.
TEST(Injector, ARemoteDatasetGetsItsBlockCache) {
  json job = Job();
  job["spec"]["dataset"] = json::parse(R"({"uri": "s3://corpus/tokens/", "format": "TokenStream", "dtype": "uint16",
      "sequenceLength": 2048, "samples": 100000, "cache": {"capacityBytes": 1073741824}})");
  json pod = Pod();
  pod = Apply(pod, InjectSidecar(pod, "training", Lookup(job), Options()).patch);
  EXPECT_EQ(Named(pod["spec"]["volumes"], "meshload-cache"),
            json::parse(R"({"name": "meshload-cache", "emptyDir": {"sizeLimit": "1073741824"}})"));
  EXPECT_EQ(Named(Sidecar(pod)["volumeMounts"], "meshload-cache"),
            json::parse(R"({"name": "meshload-cache", "mountPath": "/var/cache/meshload"})"));
  EXPECT_EQ(Named(Sidecar(pod)["env"], "MESHLOAD_CACHE_DIR")["value"], "/var/cache/meshload");
  EXPECT_EQ(Sidecar(pod)["resources"]["requests"]["ephemeral-storage"], "1073741824");
  EXPECT_EQ(Sidecar(pod)["resources"]["requests"]["cpu"], "1") << "the other requests kept";
  EXPECT_FALSE(Sidecar(pod).contains("startupProbe"));
  EXPECT_TRUE(Named(pod["spec"]["containers"][0]["volumeMounts"], "meshload-cache").is_null());

  // The chart's node cache: a hostPath, no ephemeral storage asked for.
  InjectorOptions shared = Options();
  shared.cache_host_path = "/var/cache/meshload-node";
  json on_node = Pod();
  on_node = Apply(on_node, InjectSidecar(on_node, "training", Lookup(job), shared).patch);
  EXPECT_EQ(Named(on_node["spec"]["volumes"], "meshload-cache")["hostPath"],
            json::parse(R"({"path": "/var/cache/meshload-node", "type": "Directory"})"));
  EXPECT_FALSE(Sidecar(on_node)["resources"]["requests"].contains("ephemeral-storage"));

  // warmSteps: the trainer waits for the cache through the startup probe.
  job["spec"]["dataset"]["cache"]["warmSteps"] = 8;
  json warm = Pod();
  warm = Apply(warm, InjectSidecar(warm, "training", Lookup(job), Options()).patch);
  EXPECT_EQ(Sidecar(warm)["startupProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_GE(Sidecar(warm)["startupProbe"]["failureThreshold"].get<int>() *
                Sidecar(warm)["startupProbe"]["periodSeconds"].get<int>(),
            1800);

  // Direct reads, and a local dataset: no cache at all.
  job["spec"]["dataset"]["cache"] = {{"mode", "Direct"}};
  json direct = Pod();
  direct = Apply(direct, InjectSidecar(direct, "training", Lookup(job), Options()).patch);
  EXPECT_TRUE(Named(direct["spec"]["volumes"], "meshload-cache").is_null());
  EXPECT_TRUE(Named(Sidecar(direct)["env"], "MESHLOAD_CACHE_DIR").is_null());
  json local = Pod();
  local = Apply(local, InjectSidecar(local, "training", Lookup(Job()), Options()).patch);
  EXPECT_TRUE(Named(local["spec"]["volumes"], "meshload-cache").is_null());
}

TEST(Injector, TheJobsSidecarImageAndResourcesOverrideTheDefaults) {
  json job = Job();
  job["spec"]["sidecar"] = {{"image", "registry.example.com/sidecar:2"}, {"resources", {{"requests", {{"cpu", "4"}}}}}};
  json pod = Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(job), Options()).patch);
  EXPECT_EQ(Sidecar(pod)["image"], "registry.example.com/sidecar:2");
  EXPECT_EQ(Sidecar(pod)["resources"]["requests"], json({{"cpu", "4"}}));
  EXPECT_FALSE(Sidecar(pod)["resources"].contains("limits"));
}

TEST(Injector, TheJobsImagePullPolicyReachesTheSidecarAndKubernetesDecidesWithoutIt) {
  json job = Job();
  EXPECT_FALSE(Sidecar(Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(job), Options()).patch))
                   .contains("imagePullPolicy"));
  job["spec"]["sidecar"] = {{"imagePullPolicy", "IfNotPresent"}};
  EXPECT_EQ(Sidecar(Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(job), Options()).patch))["imagePullPolicy"],
            "IfNotPresent");
  job["spec"]["sidecar"] = {{"imagePullPolicy", "Sometimes"}};
  Decision d = InjectSidecar(Pod(), "training", Lookup(job), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("spec.sidecar.imagePullPolicy: unknown value 'Sometimes'; expected one of "
                                   "Always, IfNotPresent, Never"));
}

TEST(Injector, AnInjectedPodGetsAnEmptyPatchAndAnUnlabelledOneIsLeftAlone) {
  json injected = Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(Job()), Options()).patch);
  Decision again = InjectSidecar(injected, "training", Lookup(Job()), Options());
  EXPECT_TRUE(again.allowed);
  EXPECT_TRUE(again.patch.empty());
  EXPECT_EQ(again.outcome, "unchanged");
  json plain = Pod();
  plain["metadata"]["labels"].erase("meshload.io/job");
  Decision d = InjectSidecar(plain, "training", Lookup(Job()), Options());
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.patch.empty());
}

TEST(Injector, RefusalsNameTheJobAndTheReason) {
  auto refused = [](const json& pod, const json& job) {
    Decision d = InjectSidecar(pod, "training", Lookup(job), Options());
    EXPECT_FALSE(d.allowed);
    EXPECT_EQ(d.outcome, "refused");
    return d.message;
  };
  json other = Pod();
  other["metadata"]["labels"]["meshload.io/job"] = "nope";
  EXPECT_EQ(refused(other, Job()),
            "DataLoadJob training/nope (label meshload.io/job) does not exist: create the DataLoadJob before its "
            "trainer pods");
  json invalid = Job();
  invalid["spec"]["batch"]["globalBatchSize"] = 3;
  EXPECT_THAT(refused(Pod(), invalid),
              HasSubstr("DataLoadJob training/llm (label meshload.io/job) is invalid, so its trainer pods "
                        "cannot get a sidecar: spec.batch.globalBatchSize: 3 is not divisible by the 4 data shards"));
  json own = Pod();
  own["spec"]["containers"].push_back({{"name", "meshload-sidecar"}, {"image", "x"}});
  EXPECT_THAT(refused(own, Job()), HasSubstr("already has a container named meshload-sidecar"));
  json unselected = Pod();
  unselected["metadata"]["labels"]["app"] = "other";
  EXPECT_THAT(refused(unselected, Job()),
              HasSubstr("the job's spec.selector {\"matchLabels\":{\"app\":\"trainer\"}} does not select it"));
  json no_volume = Pod();
  no_volume["spec"]["volumes"] = json::array();
  EXPECT_THAT(refused(no_volume, Job()),
              HasSubstr("has no volume named datasets (spec.dataset.volume.name of DataLoadJob training/llm"));
  json clash = Pod();
  clash["spec"]["volumes"].push_back({{"name", "meshload-run"}, {"emptyDir", json::object()}});
  EXPECT_THAT(refused(clash, Job()), HasSubstr("already has a volume named meshload-run"));
}

// A batch/v1 Job whose template is Pod()'s, labelled for llm (on the Job too).
json TrainerJob(bool indexed = true) {
  json pod = Pod(false);
  json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", "trainer"}, {"namespace", "training"}, {"labels", {{"meshload.io/job", "llm"}}}}},
              {"spec",
               {{"completions", 2},
                {"parallelism", 2},
                {"template", {{"metadata", {{"labels", pod["metadata"]["labels"]}}}, {"spec", pod["spec"]}}}}}};
  if (indexed) job["spec"]["completionMode"] = "Indexed";
  return job;
}

TEST(Injector, AJobsTemplateGetsWhatAPodGetsAndItsPodsAreLeftAlone) {
  Decision d = InjectJobTemplate(TrainerJob(), "training", Lookup(Job()), Options());
  ASSERT_TRUE(d.allowed) << d.message;
  EXPECT_EQ(d.outcome, "injected");
  for (const auto& op : d.patch) EXPECT_EQ(op["path"].get<std::string>().rfind("/spec/template/", 0), 0u) << op;
  json job = Apply(TrainerJob(), d.patch);
  const json& tmpl = job["spec"]["template"];
  // The same sidecar as a pod of an Indexed Job gets, in the template.
  json pod = Apply(Pod(), InjectSidecar(Pod(), "training", Lookup(Job()), Options()).patch);
  EXPECT_EQ(tmpl["spec"]["initContainers"], pod["spec"]["initContainers"]);
  EXPECT_EQ(tmpl["spec"]["containers"], pod["spec"]["containers"]);
  EXPECT_EQ(tmpl["spec"]["volumes"], pod["spec"]["volumes"]);
  EXPECT_EQ(tmpl["metadata"]["annotations"]["meshload.io/sidecar-injected"], "llm");
  EXPECT_EQ(Named(Sidecar(tmpl)["env"], "MESHLOAD_PROCESS")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(job["metadata"], TrainerJob()["metadata"]) << "the Job's own metadata is not touched";

  // A pod the Job controller makes from it (the template, plus the
  // completion index): left as it is.
  json made = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", tmpl["metadata"]}, {"spec", tmpl["spec"]}};
  made["metadata"]["generateName"] = "trainer-0-";
  made["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = "0";
  Decision again = InjectSidecar(made, "training", Lookup(Job()), Options());
  EXPECT_TRUE(again.allowed);
  EXPECT_EQ(again.outcome, "unchanged");
  EXPECT_TRUE(again.patch.empty());
  // And the Job again (a retried create): unchanged.
  EXPECT_EQ(InjectJobTemplate(job, "training", Lookup(Job()), Options()).outcome, "unchanged");
}

TEST(Injector, ANonIndexedJobsPodsReadTheirIndexFromTheConfigMap) {
  json job = Apply(TrainerJob(false), InjectJobTemplate(TrainerJob(false), "training", Lookup(Job()), Options()).patch);
  const json& sc = Sidecar(job["spec"]["template"]);
  EXPECT_TRUE(Named(sc["env"], "MESHLOAD_PROCESS").is_null());
  EXPECT_TRUE(HasArg(sc, "--process-file=/etc/meshload/job/process.$(POD_NAME)"));
}

TEST(Injector, AJobIsInjectedOnlyWhenItAndItsTemplateNameTheSameDataLoadJob) {
  json plain = TrainerJob();
  plain["metadata"]["labels"].erase("meshload.io/job");
  plain["spec"]["template"]["metadata"]["labels"].erase("meshload.io/job");
  Decision d = InjectJobTemplate(plain, "training", Lookup(Job()), Options());
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.outcome, "unchanged");
  EXPECT_TRUE(d.patch.empty());

  json bare_template = TrainerJob();
  bare_template["spec"]["template"]["metadata"]["labels"].erase("meshload.io/job");
  d = InjectJobTemplate(bare_template, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.message,
            "Job training/trainer is labelled meshload.io/job=llm but its pod template is not: give "
            "spec.template.metadata.labels the Job's meshload.io/job label, so that its pods are the DataLoadJob's "
            "trainers");
  json other = TrainerJob();
  other["spec"]["template"]["metadata"]["labels"]["meshload.io/job"] = "other";
  d = InjectJobTemplate(other, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("labelled meshload.io/job=llm but its pod template meshload.io/job=other"));

  // What a pod is refused for, naming the Job's template.
  json unselected = TrainerJob();
  unselected["spec"]["template"]["metadata"]["labels"]["app"] = "other";
  d = InjectJobTemplate(unselected, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("Job training/trainer's pod template is labelled for DataLoadJob training/llm "
                                   "(label meshload.io/job) but the job's spec.selector "
                                   "{\"matchLabels\":{\"app\":\"trainer\"}} does not select its pods"));
  json missing = TrainerJob();
  missing["metadata"]["labels"]["meshload.io/job"] = "nope";
  missing["spec"]["template"]["metadata"]["labels"]["meshload.io/job"] = "nope";
  d = InjectJobTemplate(missing, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("DataLoadJob training/nope (label meshload.io/job) does not exist"));
}

// A JobSet of a launcher (no label: no sidecar) and 2 replicas of an
// Indexed worker Job of 1 pod each, labelled for DataLoadJob llm.
json TrainerJobSet() {
  json workers = TrainerJob();
  workers["spec"]["completions"] = 1;
  workers["spec"]["parallelism"] = 1;
  workers["metadata"].erase("labels");
  json launcher = workers;
  launcher["spec"]["template"]["metadata"]["labels"] = {{"app", "launcher"}};
  launcher["spec"]["template"]["spec"].erase("resourceClaims");
  launcher["spec"]["template"]["spec"]["containers"][0].erase("resources");
  return {{"apiVersion", "jobset.x-k8s.io/v1alpha2"},
          {"kind", "JobSet"},
          {"metadata", {{"name", "llm-run"}, {"namespace", "training"}, {"labels", {{"meshload.io/job", "llm"}}}}},
          {"spec",
           {{"replicatedJobs", json::array({{{"name", "launcher"}, {"replicas", 1}, {"template", launcher}},
                                            {{"name", "workers"}, {"replicas", 2}, {"template", workers}}})}}}};
}

TEST(Injector, AJobSetsLabelledTemplatesGetTheSidecarAndTheirPodsTheirIndexFromTheController) {
  Decision d = InjectJobSetTemplates(TrainerJobSet(), "training", Lookup(Job()), Options());
  ASSERT_TRUE(d.allowed) << d.message;
  EXPECT_EQ(d.outcome, "injected");
  for (const auto& op : d.patch) {
    EXPECT_EQ(op["path"].get<std::string>().rfind("/spec/replicatedJobs/1/template/spec/template/", 0), 0u) << op;
  }
  json js = Apply(TrainerJobSet(), d.patch);
  EXPECT_EQ(js["spec"]["replicatedJobs"][0], TrainerJobSet()["spec"]["replicatedJobs"][0]) << "the launcher's";
  const json& tmpl = js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"];
  const json& sc = Sidecar(tmpl);
  EXPECT_EQ(sc["name"], "meshload-sidecar");
  // Its completion index is its place in its own Job, not in the JobSet.
  EXPECT_TRUE(Named(sc["env"], "MESHLOAD_PROCESS").is_null());
  EXPECT_TRUE(HasArg(sc, "--process-file=/etc/meshload/job/process.$(POD_NAME)"));
  EXPECT_EQ(tmpl["metadata"]["annotations"]["meshload.io/sidecar-injected"], "llm");
  EXPECT_EQ(InjectJobSetTemplates(js, "training", Lookup(Job()), Options()).outcome, "unchanged");
  // The same for a JobSet pod given the sidecar at its creation (the
  // template injection off).
  json pod = Pod();
  pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "llm-run";
  json injected = Apply(pod, InjectSidecar(pod, "training", Lookup(Job()), Options()).patch);
  EXPECT_TRUE(Named(Sidecar(injected)["env"], "MESHLOAD_PROCESS").is_null());
  EXPECT_TRUE(HasArg(Sidecar(injected), "--process-file=/etc/meshload/job/process.$(POD_NAME)"));

  // Refused, naming the field: a template labelled for another job, a
  // labelled JobSet with no labelled template.
  json other = TrainerJobSet();
  other["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"]["labels"]["meshload.io/job"] = "x";
  d = InjectJobSetTemplates(other, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.message,
            "JobSet training/llm-run is labelled meshload.io/job=llm but its "
            "spec.replicatedJobs[1].template.spec.template (replicated job workers) meshload.io/job=x: label it and "
            "the pod templates of its trainers for the same DataLoadJob");
  json none = TrainerJobSet();
  none["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"]["labels"].erase("meshload.io/job");
  d = InjectJobSetTemplates(none, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("none of its spec.replicatedJobs[].template.spec.template is"));
  json unselected = TrainerJobSet();
  unselected["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"]["labels"]["app"] = "x";
  d = InjectJobSetTemplates(unselected, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.message, HasSubstr("JobSet training/llm-run's spec.replicatedJobs[1].template.spec.template "
                                   "(replicated job workers) is labelled for DataLoadJob training/llm"));
  json plain = none;
  plain["metadata"].erase("labels");
  EXPECT_EQ(InjectJobSetTemplates(plain, "training", Lookup(Job()), Options()).outcome, "unchanged");
}

std::string Review(const json& pod, const std::string& operation = "CREATE") {
  const std::string kind = pod["kind"];
  const std::string group = kind == "Job"               ? "batch"
                            : kind == "JobSet"          ? "jobset.x-k8s.io"
                            : kind == "TrainingRuntime" ? "trainer.kubeflow.org"
                                                        : "";
  const std::string version = kind == "JobSet" ? "v1alpha2" : kind == "TrainingRuntime" ? "v1alpha1" : "v1";
  const std::string resource = kind == "Job"               ? "jobs"
                               : kind == "JobSet"          ? "jobsets"
                               : kind == "TrainingRuntime" ? "trainingruntimes"
                                                           : "pods";
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                {"kind", {{"group", group}, {"version", version}, {"kind", kind}}},
                {"resource", {{"group", group}, {"version", version}, {"resource", resource}}},
                {"namespace", "training"},
                {"operation", operation},
                {"object", pod}}}}
      .dump();
}

// A Kubeflow Trainer TrainingRuntime whose JobSet template's node job is
// labelled for DataLoadJob llm (as the torch runtime, with the labels).
json TrainerRuntime() {
  json js = TrainerJobSet();
  json node = js["spec"]["replicatedJobs"][1];
  node["name"] = "node";
  return {{"apiVersion", "trainer.kubeflow.org/v1alpha1"},
          {"kind", "TrainingRuntime"},
          {"metadata", {{"name", "torch-llm"}, {"namespace", "training"}, {"labels", {{"meshload.io/job", "llm"}}}}},
          {"spec",
           {{"mlPolicy", {{"numNodes", 2}, {"torch", json::object()}}},
            {"template", {{"spec", {{"replicatedJobs", json::array({node})}}}}}}}};
}

TEST(Injector, ATrainingRuntimesLabelledTemplateGetsTheSidecarAsAJobSetsDoes) {
  Decision d = InjectTrainingRuntimeTemplates(TrainerRuntime(), "training", Lookup(Job()), Options());
  ASSERT_TRUE(d.allowed) << d.message;
  EXPECT_EQ(d.outcome, "injected");
  for (const auto& op : d.patch) {
    EXPECT_EQ(op["path"].get<std::string>().rfind("/spec/template/spec/replicatedJobs/0/template/spec/template/", 0),
              0u)
        << op;
  }
  json rt = Apply(TrainerRuntime(), d.patch);
  json js = Apply(TrainerJobSet(), InjectJobSetTemplates(TrainerJobSet(), "training", Lookup(Job()), Options()).patch);
  // What the JobSet's template gets, in the runtime's JobSet template.
  EXPECT_EQ(rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
            js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]);
  // The JobSet Kubeflow Trainer makes from it: left as it is.
  json made = TrainerJobSet();
  made["spec"]["replicatedJobs"] = rt["spec"]["template"]["spec"]["replicatedJobs"];
  EXPECT_EQ(InjectJobSetTemplates(made, "training", Lookup(Job()), Options()).outcome, "unchanged");

  json other = TrainerRuntime();
  other["metadata"]["labels"]["meshload.io/job"] = "x";
  d = InjectTrainingRuntimeTemplates(other, "training", Lookup(Job()), Options());
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.message,
            "TrainingRuntime training/torch-llm is labelled meshload.io/job=x but its "
            "spec.template.spec.replicatedJobs[0].template.spec.template (replicated job node) meshload.io/job=llm: "
            "label it and the pod templates of its trainers for the same DataLoadJob");
  AdmissionAnswer a = ReviewAdmission(Review(TrainerRuntime()), Lookup(Job()), Options());
  ASSERT_EQ(a.http_status, 200) << a.body;
  EXPECT_EQ(a.outcome, "injected");
}

TEST(Admission, ARequestIsAnsweredWithItsUidAndABase64JsonPatch) {
  AdmissionAnswer a = ReviewAdmission(Review(Pod()), Lookup(Job()), Options());
  ASSERT_EQ(a.http_status, 200) << a.body;
  EXPECT_EQ(a.outcome, "injected");
  json r = json::parse(a.body);
  EXPECT_EQ(r["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(r["kind"], "AdmissionReview");
  EXPECT_EQ(r["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(r["response"]["allowed"], true);
  EXPECT_EQ(r["response"]["patchType"], "JSONPatch");
  auto patch = Base64Decode(r["response"]["patch"].get<std::string>());
  ASSERT_TRUE(patch.has_value());
  EXPECT_EQ(json::parse(*patch), InjectSidecar(Pod(), "training", Lookup(Job()), Options()).patch);
}

TEST(Admission, AJobCreateIsAnsweredWithItsTemplatesPatch) {
  AdmissionAnswer a = ReviewAdmission(Review(TrainerJob()), Lookup(Job()), Options());
  ASSERT_EQ(a.http_status, 200) << a.body;
  EXPECT_EQ(a.outcome, "injected");
  json r = json::parse(a.body);
  auto patch = Base64Decode(r["response"]["patch"].get<std::string>());
  ASSERT_TRUE(patch.has_value());
  EXPECT_EQ(json::parse(*patch), InjectJobTemplate(TrainerJob(), "training", Lookup(Job()), Options()).patch);
  // A Job's other operations, and a Job of another group, are let through.
  EXPECT_FALSE(
      json::parse(ReviewAdmission(Review(TrainerJob(), "UPDATE"), Lookup(Job()), Options()).body)["response"].contains(
          "patch"));
  json review = json::parse(Review(TrainerJob()));
  review["request"]["kind"]["group"] = "example.com";
  AdmissionAnswer other = ReviewAdmission(review.dump(), Lookup(Job()), Options());
  EXPECT_EQ(other.outcome, "unchanged");
  EXPECT_FALSE(json::parse(other.body)["response"].contains("patch"));
}

TEST(Admission, AJobSetCreateIsAnsweredWithItsTemplatesPatch) {
  AdmissionAnswer a = ReviewAdmission(Review(TrainerJobSet()), Lookup(Job()), Options());
  ASSERT_EQ(a.http_status, 200) << a.body;
  EXPECT_EQ(a.outcome, "injected");
  auto patch = Base64Decode(json::parse(a.body)["response"]["patch"].get<std::string>());
  ASSERT_TRUE(patch.has_value());
  EXPECT_EQ(json::parse(*patch), InjectJobSetTemplates(TrainerJobSet(), "training", Lookup(Job()), Options()).patch);
}

TEST(Admission, ARefusalIsA403StatusWithTheMessage) {
  json pod = Pod();
  pod["metadata"]["labels"]["meshload.io/job"] = "nope";
  json r = json::parse(ReviewAdmission(Review(pod), Lookup(Job()), Options()).body);
  EXPECT_EQ(r["response"]["allowed"], false);
  EXPECT_EQ(r["response"]["status"]["code"], 403);
  EXPECT_EQ(r["response"]["status"]["message"].get<std::string>().rfind("meshload: DataLoadJob training/nope", 0), 0u);
  EXPECT_FALSE(r["response"].contains("patch"));
}

TEST(Admission, OtherOperationsAndKindsAreAllowedUnchanged) {
  json r = json::parse(ReviewAdmission(Review(Pod(), "UPDATE"), Lookup(Job()), Options()).body);
  EXPECT_EQ(r["response"]["allowed"], true);
  EXPECT_FALSE(r["response"].contains("patch"));
}

TEST(Admission, MalformedBodiesAre400NamingTheProblem) {
  const std::map<std::string, std::string> cases = {
      {"", "not JSON"},
      {"{", "not JSON"},
      {"[]", "not a JSON object"},
      {R"({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"})", "must be admission.k8s.io/v1"},
      {R"({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})", "no request object"},
      {R"({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}})",
       "request.uid is missing"},
      {R"({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u",
          "kind": {"group": "", "kind": "Pod"}, "operation": "CREATE", "object": "pod"}})",
       "request.object is not an object"},
  };
  for (const auto& [body, says] : cases) {
    AdmissionAnswer a = ReviewAdmission(body, Lookup(Job()), Options());
    EXPECT_EQ(a.http_status, 400) << body;
    EXPECT_EQ(a.outcome, "bad_request");
    EXPECT_THAT(a.body, HasSubstr(says)) << body << " -> " << a.body;
  }
  std::string big(kMaxAdmissionReviewBytes + 1, ' ');
  EXPECT_EQ(ReviewAdmission(big, Lookup(Job()), Options()).http_status, 400);
}

// ---- the HTTPS server ----

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/meshload-webhook-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WritePair(const std::string& dir, const pki::CertAndKey& pair) {
  // As the kubelet updates a Secret volume: new files, then a rename.
  ASSERT_OK(pki::WritePem(dir + "/tls.crt.new", pair.cert_pem));
  ASSERT_OK(pki::WritePem(dir + "/tls.key.new", pair.key_pem));
  std::filesystem::rename(dir + "/tls.key.new", dir + "/tls.key");
  std::filesystem::rename(dir + "/tls.crt.new", dir + "/tls.crt");
}

TEST(WebhookServer, ServesOverTlsReloadsItsCertificateAndCounts) {
  auto first = pki::MakeTestPki();
  auto second = pki::MakeTestPki();
  ASSERT_TRUE(first.ok() && second.ok());
  TempDir dir;
  WritePair(dir.path(), first->server);
  metrics::Registry registry;
  WebhookServer server(&registry, Lookup(Job()), Options(),
                       {.bind_address = "127.0.0.1", .port = 0, .cert_dir = dir.path()});
  auto port = server.Start();
  ASSERT_OK(port);

  TempDir cas;
  ASSERT_OK(pki::WritePem(cas.path() + "/first.pem", first->ca.cert_pem));
  ASSERT_OK(pki::WritePem(cas.path() + "/second.pem", second->ca.cert_pem));
  auto client = [&](const pki::TestPki& trust) {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", *port);
    c->set_ca_cert_path((cas.path() + (&trust == &*first ? "/first.pem" : "/second.pem")).c_str());
    c->enable_server_certificate_verification(true);
    return c;
  };
  auto r = client(*first)->Post("/mutate-pods", Review(Pod()), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["response"]["patchType"], "JSONPatch");
  auto bad = client(*first)->Post("/mutate-pods", "{", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto get = client(*first)->Get("/mutate-pods");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(client(*first)->Post("/other", "{}", "application/json")->status, 404);
  EXPECT_FALSE(client(*second)->Post("/mutate-pods", Review(Pod()), "application/json"))
      << "a client trusting another CA does not connect";

  // A renewed certificate (another CA here) is served without a restart.
  // The server looks at the files at a handshake, at most once a second:
  // handshakes go on until one has noticed (the reload is counted).
  auto reloads = [&](const std::string& result) {
    return registry.Serialize().find("meshload_controller_webhook_certificate_reloads_total{result=\"" + result +
                                     "\"} 1") != std::string::npos;
  };
  WritePair(dir.path(), second->server);
  ASSERT_TRUE(WaitFor(
      [&] {
        client(*second)->Post("/mutate-pods", Review(Pod()), "application/json");  // a handshake that may notice
        return reloads("ok");
      },
      20s, 100ms))
      << "the renewed certificate was not loaded";
  auto after = client(*second)->Post("/mutate-pods", Review(Pod()), "application/json");
  ASSERT_TRUE(after) << "the new certificate is not served: " << httplib::to_string(after.error());
  EXPECT_EQ(after->status, 200);
  EXPECT_FALSE(client(*first)->Post("/mutate-pods", Review(Pod()), "application/json")) << "the old one is gone";

  // A broken pair is not taken: the last good one stays.
  { std::ofstream(dir.path() + "/tls.crt") << "not a certificate"; }
  ASSERT_TRUE(WaitFor(
      [&] {
        client(*second)->Post("/mutate-pods", Review(Pod()), "application/json");
        return reloads("error");
      },
      20s, 100ms))
      << "the broken pair was not looked at";
  auto kept = client(*second)->Post("/mutate-pods", Review(Pod()), "application/json");
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->status, 200);

  const std::string m = registry.Serialize();
  EXPECT_THAT(m, HasSubstr("meshload_controller_webhook_requests_total{outcome=\"bad_request\"} 1"));
  EXPECT_THAT(m, HasSubstr("meshload_controller_webhook_certificate_reloads_total{result=\"ok\"} 1"));
  EXPECT_THAT(m, HasSubstr("meshload_controller_webhook_certificate_reloads_total{result=\"error\"} 1"));
  EXPECT_THAT(m, HasSubstr("meshload_controller_webhook_certificate_expiry_timestamp_seconds "));
  EXPECT_THAT(m, HasSubstr("meshload_controller_webhook_request_duration_seconds_count"));
  // promtool is installed with the project's dependencies (Debian's prometheus).
  ASSERT_EQ(std::system("command -v promtool >/dev/null 2>&1"), 0)
      << "promtool is not installed (scripts/install-deps.sh)";
  std::ofstream(dir.path() + "/metrics.txt") << m;
  EXPECT_EQ(std::system(("promtool check metrics < " + dir.path() + "/metrics.txt").c_str()), 0) << m;
  server.Stop();
}

TEST(WebhookServer, AMissingOrMismatchedCertificateIsAnErrorNamingTheFile) {
  TempDir dir;
  WebhookServer none(nullptr, Lookup(Job()), Options(),
                     {.bind_address = "127.0.0.1", .port = 0, .cert_dir = dir.path()});
  auto r = none.Start();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(dir.path() + "/tls.crt")) << r.status().ToString();
  auto a = pki::MakeTestPki();
  auto b = pki::MakeTestPki();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_OK(pki::WritePem(dir.path() + "/tls.crt", a->server.cert_pem));
  ASSERT_OK(pki::WritePem(dir.path() + "/tls.key", b->server.key_pem));
  WebhookServer mismatched(nullptr, Lookup(Job()), Options(),
                           {.bind_address = "127.0.0.1", .port = 0, .cert_dir = dir.path()});
  r = mismatched.Start();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("is not the certificate's")) << r.status().ToString();
}

}  // namespace
}  // namespace meshload::controller::webhook
