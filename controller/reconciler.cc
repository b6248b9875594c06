#include "controller/reconciler.h"

#include <algorithm>
#include <optional>
#include <set>

#include "controller/job_reconcile.h"
#include "controller/kube/json_fields.h"

namespace meshload::controller {

using nlohmann::json;

using kube::Field;
using kube::Str;

kube::ResourcePath JobsResource() { return {"/apis/meshload.io/v1alpha1", "dataloadjobs"}; }
kube::ResourcePath PodsResource() { return {"/api/v1", "pods"}; }
kube::ResourcePath ConfigMapsResource() { return {"/api/v1", "configmaps"}; }
kube::ResourcePath SecretsResource() { return {"/api/v1", "secrets"}; }
std::string PeerSecretName(const std::string& job) { return job + "-meshload-peer"; }

json SlimPod(json pod) {
  json md = Field(pod, "metadata");
  json slim_md = json::object();
  for (const char* k :
       {"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "labels"}) {
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
      slim.push_back(
          {{"name", Str(c, "name")},
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

Reconciler::Reconciler(kube::KubeClient* client, kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps,
                       ReconcilerOptions options)
    : client_(client), jobs_(jobs), pods_(pods), configmaps_(configmaps), options_(std::move(options)) {}

std::optional<std::string> JobMemory::MadeSecret(const std::string& key, const std::string& job_uid) const {
  MutexLock lock(secrets_mu_);
  auto it = secrets_made_.find(key);
  if (it == secrets_made_.end() || it->second.job_uid != job_uid) return std::nullopt;
  return it->second.secret_uid;
}

void JobMemory::RememberSecret(const std::string& key, std::string job_uid, std::string secret_uid) {
  MutexLock lock(secrets_mu_);
  secrets_made_[key] = {std::move(job_uid), std::move(secret_uid)};
}

void JobMemory::ForgetSecret(const std::string& key) {
  MutexLock lock(secrets_mu_);
  secrets_made_.erase(key);
}

bool JobMemory::ProgressDue(const std::string& key, std::chrono::milliseconds min_interval) const {
  MutexLock lock(progress_mu_);
  auto it = progress_written_.find(key);
  return it == progress_written_.end() || std::chrono::steady_clock::now() - it->second >= min_interval;
}

void JobMemory::ProgressWritten(const std::string& key) {
  MutexLock lock(progress_mu_);
  progress_written_[key] = std::chrono::steady_clock::now();
}

void JobMemory::Forget(const std::string& key) {
  {
    MutexLock lock(progress_mu_);
    progress_written_.erase(key);
  }
  ForgetSecret(key);
}

Status ReconcileContext::CheckMayWrite() const {
  if (options->may_write && !options->may_write()) {
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
    memory_.Forget(key);
    return Status::Ok();
  }
  const ReconcileContext context{client_, pods_, configmaps_, &options_, &memory_};
  return JobReconcile(context, key, ns, name, *cached, res).Run();
}

}  // namespace meshload::controller
