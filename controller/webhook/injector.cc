#include "controller/webhook/injector.h"

#include <set>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/kube/json_fields.h"
#include "controller/kube/label_selector.h"
#include "controller/kube/objects.h"
#include "planner/spec.h"

namespace meshload::controller::webhook {

using nlohmann::json;

namespace {

constexpr char kJobVolume[] = "meshload-job";
constexpr char kRunVolume[] = "meshload-run";
constexpr char kPeerVolume[] = "meshload-peer";
constexpr char kS3Volume[] = "meshload-s3";
constexpr char kS3Dir[] = "/etc/meshload/s3";
constexpr char kCacheVolume[] = "meshload-cache";
constexpr char kCacheDir[] = "/var/cache/meshload";
constexpr char kJobDir[] = "/etc/meshload/job";
constexpr char kPeerDir[] = "/etc/meshload/peer";
constexpr char kRunDir[] = "/run/meshload";
constexpr char kSocket[] = "/run/meshload/sidecar.sock";

using kube::Field;
using kube::SelectorMatches;
using kube::Str;

// j[key] when it is an array, else an empty one.
const json& Items(const json& j, const char* key) {
  static const json kEmpty = json::array();
  const json& v = Field(j, key);
  return v.is_array() ? v : kEmpty;
}

Decision Unchanged() {
  Decision d;
  d.outcome = "unchanged";
  return d;
}

Decision Refuse(std::string message) {
  Decision d;
  d.allowed = false;
  d.outcome = "refused";
  d.message = std::move(message);
  return d;
}

json FieldEnv(const std::string& name, const std::string& path) {
  return {{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", path}}}}}};
}

// Whether spec[list] (containers, volumes, ...) has an entry named `name`.
bool HasNamed(const json& spec, const char* list, const std::string& name) {
  for (const auto& x : Items(spec, list)) {
    if (Str(x, "name") == name) return true;
  }
  return false;
}

// A pod, or the pod template of a workload: its metadata and spec, how
// messages name it, where it is in the object (the JSON Pointer of the
// patch's paths: "" for a pod), and whether its pods are an Indexed Job's.
struct Target {
  const json& md;
  const json& spec;
  std::string what;
  std::string at;
  bool indexed = false;
};

std::string NameOf(const json& md) { return Str(md, "name").empty() ? Str(md, "generateName") + "*" : Str(md, "name"); }

Decision InjectInto(const Target& t, const std::string& ns, const JobLookup& jobs, const InjectorOptions& options) {
  const json& md = t.md;
  const json& spec = t.spec;
  const std::string& what = t.what;
  const std::string job_name = Str(Field(md, "labels"), kJobLabel);
  if (job_name.empty()) return Unchanged();
  const std::string job_ref = "DataLoadJob " + ns + "/" + job_name + " (label " + kJobLabel + ")";

  // Injected already (a reinvocation, or a retried create): nothing to do.
  if (Str(Field(md, "annotations"), kInjectedAnnotation) == job_name &&
      HasNamed(spec, "initContainers", options.sidecar_name)) {
    return Unchanged();
  }
  if (HasNamed(spec, "initContainers", options.sidecar_name) || HasNamed(spec, "containers", options.sidecar_name)) {
    return Refuse(what + " already has a container named " + options.sidecar_name +
                  ": remove it to have it injected for " + job_ref + ", or remove the label to keep your own");
  }
  for (const auto& v : Items(spec, "volumes")) {
    const std::string name = Str(v, "name");
    if (name == kJobVolume || name == kRunVolume || name == kPeerVolume || name == kS3Volume || name == kCacheVolume) {
      return Refuse(what + " already has a volume named " + name + ", which the sidecar's injection adds for " +
                    job_ref + ": rename it");
    }
  }

  std::shared_ptr<const json> job = jobs ? jobs(ns, job_name) : nullptr;
  if (!job) {
    return Refuse(job_ref + " does not exist: create the DataLoadJob before its trainer pods");
  }
  // The job from the informer's cache, loaded and validated once.
  Diagnostics diags;
  auto loaded = planner::LoadJobObject(*job, diags);
  if (!loaded.ok()) {
    std::string why = diags.ok() ? loaded.status().ToString() : diags.ToString();
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Refuse(job_ref + " is invalid, so its trainer pods cannot get a sidecar: " + why);
  }
  const planner::JobSpec& js = loaded->spec();
  if (!js.selector || !SelectorMatches(*js.selector, kube::ObjectMeta::FromJson(md).labels)) {
    const bool pod = t.at.empty();
    return Refuse(what + " is labelled for " + job_ref + " but the job's spec.selector " +
                  Field(Field(*job, "spec"), "selector").dump() +
                  (pod ? " does not select it, so it would get no process index: give the pod"
                       : " does not select its pods, so they would get no process index: give the template") +
                  " the labels the selector asks for");
  }
  if (js.dataset.volume && !HasNamed(spec, "volumes", js.dataset.volume->name)) {
    return Refuse(what + " has no volume named " + js.dataset.volume->name + " (spec.dataset.volume.name of " +
                  job_ref + "), which holds the dataset");
  }

  const bool peers = planner::MovesSamplesBetweenProcesses(js) && js.mesh.processes > 1;
  const json& annotations = Field(md, "annotations");
  const bool indexed = t.indexed;
  const json& containers = Items(spec, "containers");

  json sidecar = {{"name", options.sidecar_name},
                  {"image", js.sidecar.image.empty() ? options.image : js.sidecar.image},
                  {"restartPolicy", "Always"}};
  if (js.sidecar.image_pull_policy) sidecar["imagePullPolicy"] = planner::ToString(*js.sidecar.image_pull_policy);
  json args = json::array({std::string("--job=") + kJobDir + "/job.json", std::string("--socket=") + kSocket,
                           "--metrics-port=" + std::to_string(options.metrics_port)});
  json env = json::array({FieldEnv("POD_NAME", "metadata.name"), FieldEnv("POD_NAMESPACE", "metadata.namespace"),
                          FieldEnv("POD_IP", "status.podIP")});
  if (indexed) {
    // The Indexed Job's completion index, which the controller gives the pod too.
    env.push_back(
        FieldEnv("MESHLOAD_PROCESS", std::string("metadata.annotations['") + kCompletionIndexAnnotation + "']"));
  } else {
    // The index the controller writes to the job's ConfigMap (the sidecar waits for it).
    args.push_back(std::string("--process-file=") + kJobDir + "/process.$(POD_NAME)");
  }
  json ports = json::array({{{"name", "metrics"}, {"containerPort", options.metrics_port}, {"protocol", "TCP"}}});
  json mounts = json::array({{{"name", kJobVolume}, {"mountPath", kJobDir}, {"readOnly", true}},
                             {{"name", kRunVolume}, {"mountPath", kRunDir}}});
  if (peers) {
    args.push_back(std::string("--assignments=") + kJobDir + "/assignments.json");
    args.push_back("--peer-port=" + std::to_string(options.peer_port));
    args.push_back(std::string("--peer-secret-file=") + kPeerDir + "/secret");
    ports.push_back({{"name", "peers"}, {"containerPort", options.peer_port}, {"protocol", "TCP"}});
    mounts.push_back({{"name", kPeerVolume}, {"mountPath", kPeerDir}, {"readOnly", true}});
  }
  if (js.dataset.volume) {
    mounts.push_back(
        {{"name", js.dataset.volume->name}, {"mountPath", js.dataset.volume->mount_path}, {"readOnly", true}});
  }
  // The object store's credentials: the Secret's keys as files, which the
  // sidecar reads (never environment variables, which `kubectl describe`
  // and crash reports show).
  const bool s3_secret = js.dataset.s3 && !js.dataset.s3->credentials_secret.empty();
  if (s3_secret) {
    mounts.push_back({{"name", kS3Volume}, {"mountPath", kS3Dir}, {"readOnly", true}});
    env.push_back({{"name", "MESHLOAD_S3_CREDENTIALS_DIR"}, {"value", kS3Dir}});
  }
  // A remote dataset's block cache (spec.dataset.cache): an emptyDir of
  // its capacity, or the node's directory the chart shares between jobs.
  const planner::DatasetCache& cache = js.dataset.cache;
  const bool remote = js.dataset.uri.find("://") != std::string::npos && js.dataset.uri.rfind("file://", 0) != 0;
  const bool cached = remote && cache.mode != planner::CacheMode::kDirect;
  if (cached) {
    mounts.push_back({{"name", kCacheVolume}, {"mountPath", kCacheDir}});
    env.push_back({{"name", "MESHLOAD_CACHE_DIR"}, {"value", kCacheDir}});
  }
  sidecar["args"] = args;
  sidecar["env"] = env;
  sidecar["ports"] = ports;
  sidecar["readinessProbe"] = {{"httpGet", {{"path", "/readyz"}, {"port", options.metrics_port}}},
                               {"periodSeconds", 5}};

  json resources = options.resources.is_object() ? options.resources : json::object();
  if (js.sidecar.resources_set) {
    resources = json::object();
    if (!js.sidecar.resources.requests.empty()) resources["requests"] = js.sidecar.resources.requests;
    if (!js.sidecar.resources.limits.empty()) resources["limits"] = js.sidecar.resources.limits;
  }
  // The trainers' DRA claims: the sidecar stages batches on the same GPUs.
  json claims = json::array();
  std::set<std::string> claimed;
  for (const auto& c : containers) {
    for (const auto& claim : Items(Field(c, "resources"), "claims")) {
      if (claimed.insert(Str(claim, "name")).second) claims.push_back(claim);
    }
  }
  if (!claims.empty()) resources["claims"] = claims;
  if (cached && options.cache_host_path.empty()) {
    // The cache's disk, so the scheduler places the pod where it fits and
    // the kubelet does not evict it for using what it asked for.
    json& requests = resources["requests"];
    if (!requests.is_object()) requests = json::object();
    if (!requests.contains("ephemeral-storage")) requests["ephemeral-storage"] = std::to_string(cache.capacity_bytes);
  }
  if (!resources.empty()) sidecar["resources"] = resources;
  if (cached && cache.warm_steps > 0) {
    // The trainer container starts once the first steps' blocks are cached
    // (a native sidecar's startup probe holds the pod's containers).
    sidecar["startupProbe"] = {{"httpGet", {{"path", "/readyz"}, {"port", options.metrics_port}}},
                               {"periodSeconds", 2},
                               {"failureThreshold", 900}};
  }

  // Restricted (Pod Security Standards), and the trainer's uid where the
  // trainer sets its own: the sidecar accepts connections from its own uid.
  json sc = {{"runAsNonRoot", true},
             {"allowPrivilegeEscalation", false},
             {"readOnlyRootFilesystem", true},
             {"capabilities", {{"drop", json::array({"ALL"})}}},
             {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  if (!containers.empty()) {
    const json& trainer_sc = Field(containers[0], "securityContext");
    for (const char* k : {"runAsUser", "runAsGroup"}) {
      if (Field(trainer_sc, k).is_number_integer()) sc[k] = Field(trainer_sc, k);
    }
  }
  sidecar["securityContext"] = sc;
  // Trainer containers of several uids: the sidecar lets each of them in
  // (it accepts its own uid only otherwise).
  std::set<int64_t> uids;
  bool all_known = true;
  const json& pod_uid = Field(Field(spec, "securityContext"), "runAsUser");
  for (const auto& c : containers) {
    const json& uid = Field(Field(c, "securityContext"), "runAsUser");
    if (uid.is_number_integer()) {
      uids.insert(uid.get<int64_t>());
    } else if (pod_uid.is_number_integer()) {
      uids.insert(pod_uid.get<int64_t>());
    } else {
      all_known = false;
    }
  }
  if (all_known && uids.size() > 1) {
    std::string list;
    for (int64_t u : uids) list += (list.empty() ? "" : ",") + std::to_string(u);
    sidecar["args"].push_back("--allow-uids=" + list);
  }
  sidecar["volumeMounts"] = mounts;

  // The pod.
  json init = Items(spec, "initContainers");
  init.insert(init.begin(), sidecar);
  json volumes = Items(spec, "volumes");
  volumes.push_back({{"name", kJobVolume}, {"configMap", {{"name", job_name + "-meshload"}, {"optional", true}}}});
  volumes.push_back({{"name", kRunVolume}, {"emptyDir", json::object()}});
  if (peers) {
    volumes.push_back(
        {{"name", kPeerVolume}, {"secret", {{"secretName", job_name + "-meshload-peer"}, {"defaultMode", 0440}}}});
  }
  if (s3_secret) {
    volumes.push_back(
        {{"name", kS3Volume}, {"secret", {{"secretName", js.dataset.s3->credentials_secret}, {"defaultMode", 0440}}}});
  }
  if (cached) {
    if (options.cache_host_path.empty()) {
      volumes.push_back({{"name", kCacheVolume}, {"emptyDir", {{"sizeLimit", std::to_string(cache.capacity_bytes)}}}});
    } else {
      volumes.push_back(
          {{"name", kCacheVolume}, {"hostPath", {{"path", options.cache_host_path}, {"type", "Directory"}}}});
    }
  }
  json trainers = containers;
  for (auto& c : trainers) {
    bool mounted = false;
    for (const auto& m : Items(c, "volumeMounts")) {
      mounted = mounted || Str(m, "mountPath") == kRunDir;
    }
    if (!mounted) c["volumeMounts"].push_back({{"name", kRunVolume}, {"mountPath", kRunDir}});
    bool has_env = false;
    for (const auto& e : Items(c, "env")) {
      has_env = has_env || Str(e, "name") == "MESHLOAD_SOCKET";
    }
    if (!has_env) c["env"].push_back({{"name", "MESHLOAD_SOCKET"}, {"value", kSocket}});
  }
  json new_annotations = annotations.is_object() ? annotations : json::object();
  new_annotations[kInjectedAnnotation] = job_name;

  Decision d;
  d.outcome = "injected";
  // "add" replaces a member that exists (RFC 6902 4.1), so each is one op.
  d.patch.push_back({{"op", "add"}, {"path", t.at + "/metadata/annotations"}, {"value", new_annotations}});
  d.patch.push_back({{"op", "add"}, {"path", t.at + "/spec/initContainers"}, {"value", init}});
  d.patch.push_back({{"op", "add"}, {"path", t.at + "/spec/containers"}, {"value", trainers}});
  d.patch.push_back({{"op", "add"}, {"path", t.at + "/spec/volumes"}, {"value", volumes}});
  if (peers || s3_secret) {
    // The peer and S3 Secrets are 0440: readable by the pod's fsGroup (the sidecar's group).
    json pod_sc = Field(spec, "securityContext").is_object() ? Field(spec, "securityContext") : json::object();
    if (!pod_sc.contains("fsGroup")) {
      pod_sc["fsGroup"] = sc.contains("runAsGroup") ? sc["runAsGroup"] : json(options.fs_group);
      if (!pod_sc.contains("fsGroupChangePolicy")) pod_sc["fsGroupChangePolicy"] = "OnRootMismatch";
      d.patch.push_back({{"op", "add"}, {"path", t.at + "/spec/securityContext"}, {"value", pod_sc}});
    }
  }
  return d;
}

}  // namespace

Decision InjectSidecar(const json& pod, const std::string& ns, const JobLookup& jobs, const InjectorOptions& options) {
  const json& md = Field(pod, "metadata");
  const json& annotations = Field(md, "annotations");
  // A JobSet's pod: its completion index is its place in its own Job only,
  // so it reads its place in the JobSet from the controller, as others do.
  const bool jobset = !Str(Field(md, "labels"), kube::kJobSetNameLabel).empty();
  const bool indexed = !jobset && annotations.is_object() && annotations.contains(kCompletionIndexAnnotation);
  return InjectInto({md, Field(pod, "spec"), "pod " + ns + "/" + NameOf(md), "", indexed}, ns, jobs, options);
}

Decision InjectJobTemplate(const json& job, const std::string& ns, const JobLookup& jobs,
                           const InjectorOptions& options) {
  const json& md = Field(job, "metadata");
  const json& spec = Field(job, "spec");
  const json& tmpl = Field(spec, "template");
  const std::string name = "Job " + ns + "/" + NameOf(md);
  const std::string on_job = Str(Field(md, "labels"), kJobLabel);
  const std::string on_template = Str(Field(Field(tmpl, "metadata"), "labels"), kJobLabel);
  if (on_job.empty() && on_template.empty()) return Unchanged();
  if (on_template != on_job) {
    return Refuse(name + " is labelled " + kJobLabel + "=" + on_job +
                  (on_template.empty() ? std::string(" but its pod template is not")
                                       : " but its pod template " + std::string(kJobLabel) + "=" + on_template) +
                  ": give spec.template.metadata.labels the Job's " + kJobLabel +
                  " label, so that its pods are the DataLoadJob's trainers");
  }
  return InjectInto({Field(tmpl, "metadata"), Field(tmpl, "spec"), name + "'s pod template", "/spec/template",
                     Str(spec, "completionMode") == "Indexed"},
                    ns, jobs, options);
}

namespace {

// The pod templates of a JobSet's replicated jobs, `rjs` at JSON Pointer
// `at` ("/spec/replicatedJobs" in a JobSet; a TrainingRuntime holds a
// JobSet template), `field` the same as a field path; `what` names the
// object, labelled `on_object`.
Decision InjectReplicatedJobs(const std::string& what, const std::string& on_object, const json& rjs,
                              const std::string& at, const std::string& field, const std::string& ns,
                              const JobLookup& jobs, const InjectorOptions& options) {
  Decision out = Unchanged();
  int labelled = 0;
  for (size_t i = 0; i < rjs.size(); ++i) {
    const json& tmpl = Field(Field(Field(rjs[i], "template"), "spec"), "template");
    const std::string tmpl_field = field + "[" + std::to_string(i) + "].template.spec.template";
    const std::string on_template = Str(Field(Field(tmpl, "metadata"), "labels"), kJobLabel);
    if (on_template.empty()) continue;  // pods of another kind (a launcher): no sidecar
    if (on_template != on_object) {
      return Refuse(what +
                    (on_object.empty() ? std::string(" is not labelled ") + kJobLabel
                                       : " is labelled " + std::string(kJobLabel) + "=" + on_object) +
                    " but its " + tmpl_field + " (replicated job " + Str(rjs[i], "name") + ") " + kJobLabel + "=" +
                    on_template + ": label it and the pod templates of its trainers for the same DataLoadJob");
    }
    ++labelled;
    // Not indexed: a pod's completion index is its place in its own Job;
    // the controller gives it its place in the JobSet.
    Decision d = InjectInto({Field(tmpl, "metadata"), Field(tmpl, "spec"),
                             what + "'s " + tmpl_field + " (replicated job " + Str(rjs[i], "name") + ")",
                             at + "/" + std::to_string(i) + "/template/spec/template", false},
                            ns, jobs, options);
    if (!d.allowed) return d;
    for (auto& op : d.patch) out.patch.push_back(std::move(op));
    if (d.outcome == "injected") out.outcome = "injected";
  }
  if (!on_object.empty() && labelled == 0) {
    return Refuse(what + " is labelled " + kJobLabel + "=" + on_object + " but none of its " + field +
                  "[].template.spec.template is: give the pod templates of its trainers the label, so that their "
                  "pods are the DataLoadJob's trainers");
  }
  return out;
}

}  // namespace

Decision InjectJobSetTemplates(const json& jobset, const std::string& ns, const JobLookup& jobs,
                               const InjectorOptions& options) {
  const json& md = Field(jobset, "metadata");
  return InjectReplicatedJobs("JobSet " + ns + "/" + NameOf(md), Str(Field(md, "labels"), kJobLabel),
                              Items(Field(jobset, "spec"), "replicatedJobs"), "/spec/replicatedJobs",
                              "spec.replicatedJobs", ns, jobs, options);
}

Decision InjectTrainingRuntimeTemplates(const json& runtime, const std::string& ns, const JobLookup& jobs,
                                        const InjectorOptions& options) {
  const json& md = Field(runtime, "metadata");
  return InjectReplicatedJobs("TrainingRuntime " + ns + "/" + NameOf(md), Str(Field(md, "labels"), kJobLabel),
                              Items(Field(Field(Field(runtime, "spec"), "template"), "spec"), "replicatedJobs"),
                              "/spec/template/spec/replicatedJobs", "spec.template.spec.replicatedJobs", ns, jobs,
                              options);
}

}  // namespace meshload::controller::webhook
