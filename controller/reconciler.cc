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

json SlimPod(json pod) { return kube::Pod::FromFullJson(pod, kDefaultSidecarContainer).ToJson(); }

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
  const kube::ObjectMeta md = kube::MetadataOf(cm);
  if (md.Label(kManagedByLabel) != kManagedByValue) return "";
  const std::string job = md.Label(kJobLabel);
  return job.empty() ? "" : md.namespace_ + "/" + job;
}

std::vector<std::string> Reconciler::JobsForPod(const json& pod) const {
  const kube::ObjectMeta md = kube::MetadataOf(pod);
  std::set<std::string> keys;
  for (const auto& job : jobs_->List(md.namespace_)) {
    const json& sel = Field(Field(*job, "spec"), "selector");
    if (sel.is_object() && SelectorMatches(sel, md.labels)) {
      keys.insert(md.namespace_ + "/" + kube::MetadataOf(*job).name);
    }
  }
  // A pod whose labels no longer match still concerns the job it was assigned to.
  for (const auto& cm : configmaps_->List(md.namespace_)) {
    std::string key = JobForConfigMap(*cm);
    if (key.empty()) continue;
    if (kube::ConfigMap::FromJson(*cm).data.count("process." + md.name)) keys.insert(key);
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
