#include "controller/reconciler.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "common/base64.h"
#include "common/diagnostics.h"
#include "common/logging.h"
#include "controller/kube/json_fields.h"
#include "planner/shard_planner.h"
#include "planner/spec.h"

namespace meshload::controller {
namespace {

using nlohmann::json;

using kube::Field;
using kube::Str;

std::string Sha256Hex(const std::string& data, size_t hex_chars) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len && out.size() < hex_chars; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

bool HasFinalizer(const json& obj) {
  const json& f = Field(Field(obj, "metadata"), "finalizers");
  if (!f.is_array()) return false;
  return std::any_of(f.begin(), f.end(), [](const json& v) { return v.is_string() && v == kFinalizer; });
}

std::string ConfigMapName(const std::string& job) { return job + "-meshload"; }

// 32 bytes from the kernel's CSPRNG, as 64 hex digits (what
// `openssl rand -hex 32` gives; the sidecar takes the file's text as is).
Result<std::string> NewPeerSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status(StatusCode::kInternal, std::string("getrandom: ") + std::strerror(errno), "peer secret");
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// A pod's completion index: the annotation (Kubernetes >= 1.21), or the
// label (>= 1.28). nullopt when absent; -1 when present but not a number.
std::optional<int64_t> CompletionIndex(const json& pod) {
  const json& md = Field(pod, "metadata");
  std::string v = Str(Field(md, "annotations"), kCompletionIndex);
  if (v.empty()) v = Str(Field(md, "labels"), kCompletionIndex);
  if (v.empty()) return std::nullopt;
  if (v.size() > 9 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(v);
}

// The sidecar container's status in a pod, or null.
const json* SidecarStatus(const json& pod, const std::string& container) {
  const json& st = Field(pod, "status");
  for (const char* list : {"containerStatuses", "initContainerStatuses"}) {
    const json& cs = Field(st, list);
    if (!cs.is_array()) continue;
    for (const auto& c : cs) {
      if (Str(c, "name") == container) return &c;
    }
  }
  return nullptr;
}

struct Condition {
  std::string type, status, reason, message;
};

// The desired status, built from the world; lastTransitionTime is added by
// MergeConditions from the stored status.
struct DesiredStatus {
  std::string phase;
  int64_t processes_ready = 0;
  std::string plan_hash;
  std::string peer_secret;      // the Secret's name, once it exists
  std::string peer_secret_uid;  // its uid, when this controller made it
  json progress;                // status.progress (ProgressStatus), null without a poll
  std::vector<Condition> conditions;
};

json StatusJson(const DesiredStatus& d, int64_t generation, const json& current) {
  json out = json::object();
  out["phase"] = d.phase;
  out["observedGeneration"] = generation;
  out["processesReady"] = d.processes_ready;
  if (!d.plan_hash.empty()) out["planHash"] = d.plan_hash;
  if (!d.peer_secret.empty()) out["peerSecretName"] = d.peer_secret;
  if (!d.peer_secret_uid.empty()) out["peerSecretUID"] = d.peer_secret_uid;
  if (d.progress.is_object()) out["progress"] = d.progress;
  json conds = json::array();
  const json& old = Field(current, "conditions");
  for (const auto& c : d.conditions) {
    std::string ltt = kube::NowRfc3339();
    if (old.is_array()) {
      for (const auto& o : old) {
        if (Str(o, "type") == c.type && Str(o, "status") == c.status && !Str(o, "lastTransitionTime").empty()) {
          ltt = Str(o, "lastTransitionTime");
        }
      }
    }
    json cj = {{"type", c.type},
               {"status", c.status},
               {"reason", c.reason},
               {"message", kube::CutUtf8(c.message, 32000)},
               {"observedGeneration", generation},
               {"lastTransitionTime", ltt}};
    conds.push_back(std::move(cj));
  }
  out["conditions"] = std::move(conds);
  return out;
}

// The events a status change deserves: one per condition whose status
// changed (or, on a new job, that starts bad, or Planned).
struct ConditionEvent {
  std::string type, reason, message;
};
std::vector<ConditionEvent> ConditionEvents(const json& before, const json& after) {
  std::vector<ConditionEvent> out;
  const json& old = Field(before, "conditions");
  const json& now = Field(after, "conditions");
  if (!now.is_array()) return out;
  for (const auto& c : now) {
    const std::string type = Str(c, "type"), status = Str(c, "status");
    std::string reason = Str(c, "reason"), message = Str(c, "message");
    std::string was, was_reason, was_message;
    if (old.is_array()) {
      for (const auto& o : old) {
        if (Str(o, "type") == type) {
          was = Str(o, "status");
          was_reason = Str(o, "reason");
          was_message = Str(o, "message");
        }
      }
    }
    if (status == "Unknown") continue;
    // Degraded, Starved and Straggling are good when False.
    const bool negative = type == "Degraded" || type == "Starved" || type == "Straggling";
    const bool good = negative == (status == "False");
    const bool fresh = was.empty() || was == "Unknown";  // a new, or newly valid, job
    if (was == status) {
      // Still bad, for another reason or with other errors (an edit that
      // leaves the spec invalid, a different problem): say so. Repeats of
      // the same are raised counts, not new events.
      const bool still_bad = !good && (type == "Valid" || type == "Degraded");
      if (!still_bad || (reason == was_reason && message == was_message)) continue;
    } else if (fresh) {
      // Say what is wrong, that it was planned, and that its sidecars are
      // ready; not ready yet, and not degraded, is how a job starts.
      const bool worth = type == "Planned" || (type == "SidecarsReady" ? good : !good);
      if (!worth) continue;
    } else if (type == "Degraded" && good && reason == "InvalidSpec") {
      continue;  // not a recovery: the spec went invalid (Valid says so)
    }
    // Sidecars that are not all ready are SidecarsReady's events (Degraded
    // says it too, and would repeat each one, at every job's start as well).
    if (type == "Degraded" && (good ? was_reason : reason) == "NotAllSidecarsReady") continue;
    if (type == "Degraded" && good) {
      reason = "Recovered";
      message = "no longer degraded (was: " + was_reason + ")";
    }
    if (message.empty()) message = type + " is now " + status;
    if (message.rfind(reason + ": ", 0) == 0) message.erase(0, reason.size() + 2);  // "Reason: ..." problems
    out.push_back({good ? "Normal" : "Warning", reason.empty() ? type : reason, message});
  }
  return out;
}

std::string JoinDiagnostics(const Diagnostics& d) {
  std::string s = d.ToString();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// The uid of an object's controller owner reference, or "".
std::string ControllerUid(const json& obj) {
  const json& refs = Field(Field(obj, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "";
  for (const auto& r : refs) {
    if (Field(r, "controller").is_boolean() && r["controller"].get<bool>()) return Str(r, "uid");
  }
  return "";
}

}  // namespace

kube::ResourcePath JobsResource() { return {"/apis/meshload.io/v1alpha1", "dataloadjobs"}; }
kube::ResourcePath PodsResource() { return {"/api/v1", "pods"}; }
kube::ResourcePath ConfigMapsResource() { return {"/api/v1", "configmaps"}; }
kube::ResourcePath SecretsResource() { return {"/api/v1", "secrets"}; }
std::string PeerSecretName(const std::string& job) { return job + "-meshload-peer"; }

json SlimPod(json pod) {
  json md = Field(pod, "metadata");
  json slim_md = json::object();
  for (const char* k : {"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                        "labels"}) {
    if (md.contains(k)) slim_md[k] = std::move(md[k]);
  }
  std::string index = Str(Field(md, "annotations"), kCompletionIndex);
  if (!index.empty()) slim_md["annotations"] = {{kCompletionIndex, index}};
  json st = Field(pod, "status");
  json slim_st = json::object();
  for (const char* k : {"phase", "podIP"}) {
    if (st.contains(k)) slim_st[k] = std::move(st[k]);
  }
  for (const char* list : {"containerStatuses", "initContainerStatuses"}) {
    const json& cs = Field(st, list);
    if (!cs.is_array()) continue;
    json slim = json::array();
    for (const auto& c : cs) {
      slim.push_back({{"name", Str(c, "name")},
                      {"ready", Field(c, "ready").is_boolean() ? Field(c, "ready").get<bool>() : false},
                      {"restartCount", Field(c, "restartCount").is_number() ? Field(c, "restartCount").get<int64_t>() : 0}});
    }
    slim_st[list] = std::move(slim);
  }
  // The sidecar's metrics port, where the ProgressPoller asks for /progress.
  json slim_spec = json::object();
  const json& spec = Field(pod, "spec");
  for (const char* list : {"containers", "initContainers"}) {
    const json& cs = Field(spec, list);
    if (!cs.is_array()) continue;
    for (const auto& c : cs) {
      if (Str(c, "name") != kDefaultSidecarContainer || !Field(c, "ports").is_array()) continue;
      for (const auto& port : Field(c, "ports")) {
        if (Str(port, "name") == "metrics" && Field(port, "containerPort").is_number_integer()) {
          slim_spec["metricsPort"] = Field(port, "containerPort");
        }
      }
    }
  }
  json slim = {{"metadata", std::move(slim_md)}, {"status", std::move(slim_st)}};
  if (!slim_spec.empty()) slim["spec"] = std::move(slim_spec);
  return slim;
}

bool SelectorMatches(const json& selector, const json& labels) {
  auto label = [&](const std::string& key) -> std::optional<std::string> {
    if (!labels.is_object()) return std::nullopt;
    auto it = labels.find(key);
    if (it == labels.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const json& ml = Field(selector, "matchLabels");
  if (ml.is_object()) {
    for (auto it = ml.begin(); it != ml.end(); ++it) {
      auto v = label(it.key());
      if (!v || !it.value().is_string() || *v != it.value().get<std::string>()) return false;
    }
  }
  const json& me = Field(selector, "matchExpressions");
  if (me.is_array()) {
    for (const auto& e : me) {
      auto v = label(Str(e, "key"));
      const std::string op = Str(e, "operator");
      const json& values = Field(e, "values");
      bool in = false;
      if (v && values.is_array()) {
        in = std::any_of(values.begin(), values.end(), [&](const json& x) { return x.is_string() && x == *v; });
      }
      if (op == "In" && !in) return false;
      if (op == "NotIn" && in) return false;
      if (op == "Exists" && !v) return false;
      if (op == "DoesNotExist" && v) return false;
      if (op != "In" && op != "NotIn" && op != "Exists" && op != "DoesNotExist") return false;
    }
  }
  return true;
}

Reconciler::Reconciler(kube::KubeClient* client, kube::Informer* jobs, kube::Informer* pods,
                       kube::Informer* configmaps, ReconcilerOptions options)
    : client_(client), jobs_(jobs), pods_(pods), configmaps_(configmaps), options_(std::move(options)) {}

std::optional<std::string> Reconciler::MadeSecret(const std::string& key, const std::string& job_uid) const {
  std::lock_guard lock(secrets_mu_);
  auto it = secrets_made_.find(key);
  if (it == secrets_made_.end() || it->second.job_uid != job_uid) return std::nullopt;
  return it->second.secret_uid;
}

Status Reconciler::CheckMayWrite() const {
  if (options_.may_write && !options_.may_write()) {
    return FailedPrecondition("not the leader: no writes");
  }
  return Status::Ok();
}

std::string Reconciler::JobForConfigMap(const json& cm) {
  const json& md = Field(cm, "metadata");
  if (Str(Field(md, "labels"), kManagedByLabel) != kManagedByValue) return "";
  std::string job = Str(Field(md, "labels"), kJobLabel);
  return job.empty() ? "" : Str(md, "namespace") + "/" + job;
}

std::vector<std::string> Reconciler::JobsForPod(const json& pod) const {
  const json& md = Field(pod, "metadata");
  const std::string ns = Str(md, "namespace"), name = Str(md, "name");
  std::set<std::string> keys;
  for (const auto& job : jobs_->List(ns)) {
    const json& sel = Field(Field(*job, "spec"), "selector");
    if (sel.is_object() && SelectorMatches(sel, Field(md, "labels"))) {
      keys.insert(ns + "/" + Str(Field(*job, "metadata"), "name"));
    }
  }
  // A pod whose labels no longer match still concerns the job it was assigned to.
  for (const auto& cm : configmaps_->List(ns)) {
    std::string key = JobForConfigMap(*cm);
    if (key.empty()) continue;
    if (Field(Field(*cm, "data"), ("process." + name).c_str()).is_string()) keys.insert(key);
  }
  return {keys.begin(), keys.end()};
}

Status Reconciler::Reconcile(const std::string& key, ReconcileResult* result) {
  ReconcileResult local;
  ReconcileResult& res = result ? *result : local;
  res = {};
  const size_t slash = key.find('/');
  if (slash == std::string::npos) return InvalidArgument("a key is namespace/name", key);
  const std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
  kube::ObjectPtr cached = jobs_->Get(ns, name);
  if (!cached) {  // deleted; owner references clean up
    {
      std::lock_guard lock(progress_mu_);
      progress_written_.erase(key);
    }
    std::lock_guard lock(secrets_mu_);
    secrets_made_.erase(key);
    return Status::Ok();
  }
  json job = *cached;
  const kube::ResourcePath jobs = JobsResource(), cms = ConfigMapsResource();
  const std::string cm_name = ConfigMapName(name);

  // 1. Deletion and the finalizer.
  if (!Field(Field(job, "metadata"), "deletionTimestamp").is_null()) {
    if (!HasFinalizer(job)) return Status::Ok();
    MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
    if (configmaps_->Get(ns, cm_name)) {
      kube::ApiResponse del = client_->Delete(cms.Object(ns, cm_name));
      if (!del.ok() && del.code != 404) return del.ToStatus("delete ConfigMap " + ns + "/" + cm_name);
      ++res.writes;
    }
    // The peer secret this controller made, by its uid (never one it found:
    // the user's own is left alone). Deleted before the job goes, so a job
    // re-created under the same name at once does not find it still there,
    // waiting for garbage collection, and take it for its own. By name with
    // a uid precondition, never by label (deletecollection answers with the
    // Secrets it deleted, data included: the controller reads no Secret).
    std::string secret_uid = Str(Field(job, "status"), "peerSecretUID");
    if (secret_uid.empty()) secret_uid = MadeSecret(key, Str(Field(job, "metadata"), "uid")).value_or("");
    if (!secret_uid.empty()) {
      const std::string secret_name = PeerSecretName(name);
      kube::ApiResponse del = client_->Delete(SecretsResource().Object(ns, secret_name),
                                              {{"apiVersion", "v1"},
                                               {"kind", "DeleteOptions"},
                                               {"preconditions", {{"uid", secret_uid}}}});
      // 404: gone already; 409: the uid differs, someone else's now.
      if (!del.ok() && del.code != 404 && del.code != 409) {
        return del.ToStatus("delete Secret " + ns + "/" + secret_name);
      }
      if (del.ok()) ++res.writes;
    }
    json& fins = job["metadata"]["finalizers"];
    json kept = json::array();
    for (const auto& f : fins) {
      if (f != kFinalizer) kept.push_back(f);
    }
    fins = kept;
    job.erase("status");
    kube::ApiResponse put = client_->Put(jobs.Object(ns, name), job);
    if (put.code == 404) return Status::Ok();
    if (!put.ok()) return put.ToStatus("remove the finalizer of " + key);
    ++res.writes;
    {
      std::lock_guard lock(secrets_mu_);
      secrets_made_.erase(key);
    }
    LogInfo("cleaned up a deleted DataLoadJob", {{"job", key}});
    return Status::Ok();
  }
  if (!HasFinalizer(job)) {
    MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
    json updated = job;
    if (!updated["metadata"]["finalizers"].is_array()) updated["metadata"]["finalizers"] = json::array();
    updated["metadata"]["finalizers"].push_back(kFinalizer);
    updated.erase("status");
    kube::ApiResponse put = client_->Put(jobs.Object(ns, name), updated);
    if (put.code == 404) return Status::Ok();
    if (!put.ok()) return put.ToStatus("add the finalizer to " + key);
    ++res.writes;
    job = put.body;
  }

  const int64_t generation = Field(Field(job, "metadata"), "generation").is_number()
                                 ? Field(Field(job, "metadata"), "generation").get<int64_t>()
                                 : 0;
  DesiredStatus desired;
  // A child that could not be made (the peer secret, a ConfigMap name
  // taken): reported in the status, then returned so the job is retried.
  Status deferred;
  // Once created, the peer secret stays in the status (an invalid edit
  // does not take it away).
  desired.peer_secret = Str(Field(job, "status"), "peerSecretName");
  desired.peer_secret_uid = Str(Field(job, "status"), "peerSecretUID");
  // Made, and its status write lost (a conflict, a lagging cache): the
  // status gets it now, whether or not this generation is valid.
  if (desired.peer_secret != PeerSecretName(name)) {
    if (std::optional<std::string> made = MadeSecret(key, Str(Field(job, "metadata"), "uid"))) {
      desired.peer_secret = PeerSecretName(name);
      desired.peer_secret_uid = *made;
    }
  }

  // 2. Validation, with the planner's own parser and checks.
  Diagnostics diags;
  const json& spec_json = Field(job, "spec");
  auto spec = ParseJobSpecText(spec_json.dump(), diags);
  if (spec.ok()) ValidateJobSpec(*spec, diags);
  if (spec.ok() && diags.ok() && !spec->selector) diags.Add(InvalidArgument("a selector is required: it names the trainer pods", "spec.selector"));
  if (name.size() > kMaxJobNameLength) {
    // It is the value of the meshload.io/job label on the objects made for
    // the job (label values have at most 63 characters), as for batch Jobs.
    diags.Add(InvalidArgument("at most " + std::to_string(kMaxJobNameLength) +
                                  " characters (it labels the ConfigMap and Secret made for the job), got " +
                                  std::to_string(name.size()),
                              "metadata.name"));
  }
  std::optional<ResolvedJob> resolved;
  if (spec.ok() && diags.ok() && spec->dataset.samples) {
    ResolveOptions ro;
    ro.samples = spec->dataset.samples;  // the controller reads no dataset
    auto r = ResolveJob(*spec, ro, diags);
    if (r.ok() && diags.ok()) resolved = std::move(*r);
  }
  if (!spec.ok() || !diags.ok()) {
    std::string msg = spec.ok() ? JoinDiagnostics(diags) : spec.status().ToString();
    if (msg.empty()) msg = "the spec is invalid";
    desired.phase = "Failed";
    desired.conditions = {{"Valid", "False", "InvalidSpec", msg},
                          {"Planned", "False", "InvalidSpec", "the spec must be valid first"},
                          {"SidecarsReady", "Unknown", "InvalidSpec", "the spec must be valid first"},
                          {"Degraded", "False", "InvalidSpec", ""}};
  } else {
    const int64_t processes = spec->mesh.processes;
    // 3. Pods and process indices.
    const json& selector = spec_json["selector"];
    std::vector<kube::ObjectPtr> pods;
    for (const auto& p : pods_->List(ns)) {
      const json& md = Field(*p, "metadata");
      std::string phase = Str(Field(*p, "status"), "phase");
      if (phase == "Succeeded" || phase == "Failed") continue;
      if (!Field(md, "deletionTimestamp").is_null()) continue;
      if (SelectorMatches(selector, Field(md, "labels"))) pods.push_back(p);
    }
    // Oldest first, then by name: a deterministic order for fresh assignments.
    std::sort(pods.begin(), pods.end(), [](const kube::ObjectPtr& a, const kube::ObjectPtr& b) {
      const json& ma = Field(*a, "metadata");
      const json& mb = Field(*b, "metadata");
      auto ta = Str(ma, "creationTimestamp"), tb = Str(mb, "creationTimestamp");
      return ta != tb ? ta < tb : Str(ma, "name") < Str(mb, "name");
    });
    // The ConfigMap holds the assignment every later one must keep. The
    // cache holds only ConfigMaps labelled as ours and may lag behind our
    // own create (its watch event not here yet): when it has none, the
    // server is asked, so that a lagging cache never makes a fresh
    // assignment that renumbers running trainers. Somebody else's of that
    // name is left alone (ConfigMapConflict below).
    json previous = json::object();
    kube::ObjectPtr cm = configmaps_->Get(ns, cm_name);
    json foreign;  // a ConfigMap of that name not made for this job
    if (!cm) {
      kube::ApiResponse got = client_->Get(cms.Object(ns, cm_name));
      if (got.ok()) {
        if (ControllerUid(got.body) == Str(Field(job, "metadata"), "uid")) {
          cm = std::make_shared<const json>(std::move(got.body));
        } else {
          foreign = std::move(got.body);
        }
      } else if (got.code != 404) {
        return got.ToStatus("read ConfigMap " + ns + "/" + cm_name);
      }
    }
    if (cm) {
      auto parsed = json::parse(Str(Field(*cm, "data"), "assignments.json"), nullptr, false);
      if (parsed.is_object() && Field(parsed, "pods").is_object()) previous = parsed["pods"];
    }
    std::vector<const json*> by_index(static_cast<size_t>(processes), nullptr);
    std::map<std::string, int64_t> index_of;  // pod name -> index
    std::vector<std::string> problems;  // "Reason: message"
    std::vector<const json*> waiting;
    for (const auto& p : pods) {
      const json& md = Field(*p, "metadata");
      std::optional<int64_t> ci = CompletionIndex(*p);
      if (!ci) {
        waiting.push_back(p.get());
        continue;
      }
      if (*ci < 0 || *ci >= processes) {
        problems.push_back("CompletionIndexOutOfRange: pod " + Str(md, "name") + " has completion index " +
                           (*ci < 0 ? std::string("that is not a number") : std::to_string(*ci)) +
                           " but the job has " + std::to_string(processes) + " processes");
        continue;
      }
      if (by_index[*ci] != nullptr) {
        problems.push_back("DuplicateCompletionIndex: pods " + Str(Field(*by_index[*ci], "metadata"), "name") +
                           " and " + Str(md, "name") + " both have completion index " + std::to_string(*ci));
        continue;
      }
      by_index[*ci] = p.get();
      index_of[Str(md, "name")] = *ci;
    }
    std::vector<const json*> fresh;
    for (const json* p : waiting) {
      const json& md = Field(*p, "metadata");
      const json& prev = Field(previous, Str(md, "name").c_str());
      if (prev.is_object() && Str(prev, "uid") == Str(md, "uid") && Field(prev, "index").is_number_integer()) {
        int64_t i = prev["index"].get<int64_t>();
        if (i >= 0 && i < processes && by_index[i] == nullptr) {
          by_index[i] = p;
          index_of[Str(md, "name")] = i;
          continue;
        }
      }
      fresh.push_back(p);
    }
    std::vector<std::string> extra;
    size_t next_free = 0;
    for (const json* p : fresh) {
      while (next_free < by_index.size() && by_index[next_free] != nullptr) ++next_free;
      const std::string pod_name = Str(Field(*p, "metadata"), "name");
      if (next_free == by_index.size()) {
        extra.push_back(pod_name);
        continue;
      }
      by_index[next_free] = p;
      index_of[pod_name] = static_cast<int64_t>(next_free);
    }
    if (!extra.empty()) {
      std::string names;
      for (const auto& e : extra) names += (names.empty() ? "" : ", ") + e;
      problems.push_back("TooManyPods: " + std::to_string(pods.size()) + " pods match the selector but the job has " +
                         std::to_string(processes) + " processes; not assigned: " + names);
    }

    // Readiness.
    std::vector<int64_t> missing, not_ready;
    for (int64_t i = 0; i < processes; ++i) {
      const json* p = by_index[i];
      if (p == nullptr) {
        missing.push_back(i);
        continue;
      }
      const json* sc = SidecarStatus(*p, options_.sidecar_container);
      bool ready = sc != nullptr && Field(*sc, "ready").is_boolean() && Field(*sc, "ready").get<bool>();
      if (ready) {
        ++desired.processes_ready;
      } else {
        not_ready.push_back(i);
        if (sc != nullptr && Field(*sc, "restartCount").is_number() && Field(*sc, "restartCount").get<int64_t>() > 0) {
          problems.push_back("SidecarRestarting: the sidecar of process " + std::to_string(i) + " (pod " +
                             Str(Field(*p, "metadata"), "name") + ") restarted " +
                             std::to_string(Field(*sc, "restartCount").get<int64_t>()) + " times and is not ready");
        }
      }
    }

    // 4. The ConfigMap.
    json manifest = {{"apiVersion", "meshload.io/v1alpha1"},
                     {"kind", "DataLoadJob"},
                     {"metadata", {{"name", name}, {"namespace", ns}}},
                     {"spec", spec_json}};
    const std::string job_text = manifest.dump(2) + "\n";
    desired.plan_hash = Sha256Hex(job_text, 16);
    json assigned = json::object();
    json data = json::object();
    std::string rendezvous;
    for (int64_t i = 0; i < processes; ++i) {
      const json* p = by_index[i];
      if (p == nullptr) continue;
      const json& md = Field(*p, "metadata");
      std::string ip = Str(Field(*p, "status"), "podIP");
      assigned[Str(md, "name")] = {{"uid", Str(md, "uid")}, {"index", i}, {"ip", ip}};
      data["process." + Str(md, "name")] = std::to_string(i);
      if (i == 0) rendezvous = ip;
    }
    // Progress (the sidecars' /progress, polled by the ProgressPoller) and
    // the step a restarted or resized job resumes at: resume.json, which
    // the sidecars read at start next to job.json.
    std::vector<ProgressCondition> progress_conditions;
    if (options_.progress) {
      if (std::optional<JobProgress> poll = options_.progress(key)) {
        const HealthThresholds thresholds{spec->health.starved_wait_percent, spec->health.straggler_steps,
                                          spec->health.straggler_latency_factor};
        const json fresh = ProgressStatus(*poll, spec->batch.global_batch_size, thresholds,
                                          Field(Field(job, "status"), "progress"));
        bool moves_due = true;
        {
          std::lock_guard lock(progress_mu_);
          auto it = progress_written_.find(key);
          moves_due = it == progress_written_.end() ||
                      std::chrono::steady_clock::now() - it->second >= options_.progress_min_write_interval;
        }
        desired.progress = ProgressToWrite(Field(Field(job, "status"), "progress"), fresh,
                                           options_.progress_step_granularity, moves_due);
        progress_conditions = ProgressConditions(*poll, thresholds, Field(Field(job, "status"), "conditions"));
      }
    }
    const int64_t spec_resume = spec->resume.step;
    int64_t resume_step = spec_resume;
    if (desired.progress.is_object() && Field(desired.progress, "resumeStep").is_number_integer()) {
      resume_step = Field(desired.progress, "resumeStep").get<int64_t>();
    } else if (cm) {
      // No fresh figure: keep the recorded one, unless spec.resume.step was
      // changed since it was recorded (then the spec says where to start).
      json recorded = json::parse(Str(Field(*cm, "data"), "resume.json"), nullptr, false);
      if (Field(recorded, "specStep") == json(spec_resume) && Field(recorded, "step").is_number_integer()) {
        resume_step = Field(recorded, "step").get<int64_t>();
      }
    }
    json assignments = {{"processes", processes}, {"pods", assigned}};
    if (resolved) assignments["samples"] = resolved->samples;
    data["job.json"] = job_text;
    data["assignments.json"] = assignments.dump(2) + "\n";
    data["planHash"] = desired.plan_hash;
    data["rendezvous"] = rendezvous;
    data["resume.json"] = json({{"step", resume_step}, {"specStep", spec_resume}}).dump() + "\n";
    json labels = {{kManagedByLabel, kManagedByValue}, {kJobLabel, name}};
    json owner = json::array({{{"apiVersion", "meshload.io/v1alpha1"},
                               {"kind", "DataLoadJob"},
                               {"name", name},
                               {"uid", Str(Field(job, "metadata"), "uid")},
                               {"controller", true},
                               {"blockOwnerDeletion", true}}});
    // The ConfigMap there is: ours from the cache or the server (ours with
    // its labels taken off included), somebody else's, or none.
    json existing = cm ? *cm : json();
    auto conflict = [&] {
      // Somebody else's: left alone. The job says so and is retried.
      problems.push_back("ConfigMapConflict: ConfigMap " + ns + "/" + cm_name +
                         " exists and was not made for this job (no controller reference to it); the trainer "
                         "pods mount that name: rename or delete it");
      deferred = Status(StatusCode::kUnavailable, "ConfigMap " + ns + "/" + cm_name + " belongs to something else",
                        key);
    };
    auto configmap_failed = [&](const Status& error) {
      problems.push_back("ConfigMapFailed: " + error.ToString());
      if (deferred.ok()) deferred = error;
    };
    if (foreign.is_object()) {
      conflict();
    } else if (!cm) {
      MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
      json body = {{"apiVersion", "v1"},
                   {"kind", "ConfigMap"},
                   {"metadata", {{"name", cm_name}, {"namespace", ns}, {"labels", labels}, {"ownerReferences", owner}}},
                   {"data", data}};
      kube::ApiResponse r = client_->Post(cms.Collection(ns), body);
      if (r.code == 409 && Str(r.body, "reason") == "AlreadyExists") {
        // Made since it was read (a retried POST that had landed): this
        // reconcile's assignment did not start from it, so nothing is
        // written; the next one reads it.
        kube::ApiResponse got = client_->Get(cms.Object(ns, cm_name));
        if (!got.ok()) return got.ToStatus("read ConfigMap " + ns + "/" + cm_name);
        if (ControllerUid(got.body) != Str(Field(job, "metadata"), "uid")) {
          conflict();
        } else {
          deferred = Status(StatusCode::kUnavailable,
                            "ConfigMap " + ns + "/" + cm_name + " appeared while reconciling: reconciled again", key);
        }
      } else if (!r.ok()) {
        // Refused (a role without the finalizers grant, a quota, a webhook):
        // the status says why, and the job is retried.
        configmap_failed(r.ToStatus("create ConfigMap " + ns + "/" + cm_name));
      } else {
        ++res.writes;
      }
    }
    if (existing.is_object()) {
      const json& md = Field(existing, "metadata");
      bool same = Field(existing, "data") == data && Field(md, "ownerReferences") == owner;
      const json& have_labels = Field(md, "labels");
      for (auto it = labels.begin(); same && it != labels.end(); ++it) {
        same = Field(have_labels, it.key().c_str()) == it.value();
      }
      if (!same) {
        MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
        json body = existing;
        body["data"] = data;
        body["metadata"]["ownerReferences"] = owner;
        for (auto it = labels.begin(); it != labels.end(); ++it) body["metadata"]["labels"][it.key()] = it.value();
        kube::ApiResponse r = client_->Put(cms.Object(ns, cm_name), body);
        if (r.ok()) {
          ++res.writes;
        } else {
          configmap_failed(r.ToStatus("update ConfigMap " + ns + "/" + cm_name));
        }
      }
    }

    // 4b. The peer secret, created once: status.peerSecretName records it
    // (and peerSecretUID, when this controller made it), so neither an idle
    // reconcile nor a restarted controller asks again. The controller may
    // create and delete Secrets but never read them: one that exists
    // already (the user's own, or a lost status write) is kept. A job whose
    // status write has not reached the informer yet is in secrets_made_, so
    // a lagging cache does not ask again either. A failure does not hold up
    // the status: the job is Degraded (PeerSecretFailed) and retried.
    const std::string secret_name = PeerSecretName(name);
    const std::string uid = Str(Field(job, "metadata"), "uid");
    if (desired.peer_secret != secret_name) {
      MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
      MESHLOAD_ASSIGN_OR_RETURN(std::string secret, NewPeerSecret());
      json secret_labels = labels;
      secret_labels[kJobUidLabel] = uid;  // which job instance it was made for (kubectl -l)
      json body = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"metadata",
                    {{"name", secret_name}, {"namespace", ns}, {"labels", secret_labels}, {"ownerReferences", owner}}},
                   {"type", "Opaque"},
                   {"immutable", true},
                   {"data", {{"secret", Base64Encode(secret)}}}};
      kube::ApiResponse r = client_->Post(SecretsResource().Collection(ns), body);
      if (r.ok() || (r.code == 409 && Str(r.body, "reason") == "AlreadyExists")) {
        desired.peer_secret = secret_name;
        desired.peer_secret_uid = r.ok() ? Str(Field(r.body, "metadata"), "uid") : "";
        if (r.ok()) {
          ++res.writes;
          LogInfo("created the peer secret", {{"job", key}, {"secret", ns + "/" + secret_name}});
        } else {
          LogInfo("kept the peer secret that exists", {{"job", key}, {"secret", ns + "/" + secret_name}});
        }
        std::lock_guard lock(secrets_mu_);
        secrets_made_[key] = {uid, desired.peer_secret_uid};
      } else {
        const Status secret_error = r.ToStatus("create Secret " + ns + "/" + secret_name);
        problems.push_back("PeerSecretFailed: " + secret_error.ToString());
        if (deferred.ok()) deferred = secret_error;
      }
    }

    // 5. Conditions and phase.
    std::string planned_msg = resolved ? std::to_string(resolved->samples) + " samples, " +
                                             std::to_string(resolved->steps_per_epoch) + " steps per epoch"
                                       : "the sidecars read the dataset size from the files";
    desired.conditions.push_back({"Valid", "True", "Valid", ""});
    desired.conditions.push_back({"Planned", "True", resolved ? "Resolved" : "DatasetSizeFromSidecars", planned_msg});
    auto list = [](const std::vector<int64_t>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 32; ++i) s += (s.empty() ? "" : ", ") + std::to_string(v[i]);
      if (v.size() > 32) s += ", ...";
      return s;
    };
    const bool all_ready = desired.processes_ready == processes;
    std::string ready_msg = std::to_string(desired.processes_ready) + " of " + std::to_string(processes) +
                            " sidecars ready";
    if (!missing.empty()) ready_msg += "; processes without a pod: " + list(missing);
    if (!not_ready.empty()) ready_msg += "; sidecars not ready: " + list(not_ready);
    desired.conditions.push_back({"SidecarsReady", all_ready ? "True" : "False",
                                  all_ready ? "AllSidecarsReady" : (missing.empty() ? "SidecarsNotReady" : "WaitingForPods"),
                                  ready_msg});
    if (!problems.empty() || (desired.processes_ready > 0 && !all_ready)) {
      std::string reason = problems.empty() ? "NotAllSidecarsReady" : problems[0].substr(0, problems[0].find(':'));
      std::string msg;
      for (const auto& p : problems) msg += (msg.empty() ? "" : "; ") + p;
      if (problems.empty()) msg = ready_msg;
      desired.conditions.push_back({"Degraded", "True", reason, msg});
      desired.phase = "Degraded";
    } else {
      desired.conditions.push_back({"Degraded", "False", "AsExpected", ""});
      desired.phase = all_ready ? "Running" : "Pending";
    }
    for (const auto& c : progress_conditions) desired.conditions.push_back({c.type, c.status, c.reason, c.message});
  }
  res.phase = desired.phase;

  // Status: written only when different; 409 re-reads and retries.
  for (int attempt = 0; attempt < 5; ++attempt) {
    const json& current = Field(job, "status");
    json want = StatusJson(desired, generation, current);
    if (current == want) return deferred;
    MESHLOAD_RETURN_IF_ERROR(CheckMayWrite());
    json body = job;
    body["status"] = want;
    kube::ApiResponse r = client_->Put(jobs.Object(ns, name) + "/status", body);
    if (r.ok()) {
      ++res.writes;
      if (Field(want, "progress") != Field(current, "progress")) {
        std::lock_guard lock(progress_mu_);
        progress_written_[key] = std::chrono::steady_clock::now();
      }
      if (options_.record_event) {
        for (const auto& e : ConditionEvents(current, want)) options_.record_event(job, e.type, e.reason, e.message);
      }
      return deferred;
    }
    if (r.code == 404) return Status::Ok();
    if (r.code != 409) return r.ToStatus("update the status of " + key);
    kube::ApiResponse fresh = client_->Get(jobs.Object(ns, name));
    if (fresh.code == 404) return Status::Ok();
    if (!fresh.ok()) return fresh.ToStatus("re-read " + key);
    const int64_t fresh_gen = Field(Field(fresh.body, "metadata"), "generation").is_number()
                                  ? fresh.body["metadata"]["generation"].get<int64_t>()
                                  : 0;
    // The spec moved on: this status describes an older generation; the
    // informer will bring the new one.
    if (fresh_gen != generation) return Status(StatusCode::kUnavailable, "the job changed during the reconcile", key);
    job = std::move(fresh.body);
  }
  return Status(StatusCode::kUnavailable, "the status kept conflicting", key);
}

}  // namespace meshload::controller
