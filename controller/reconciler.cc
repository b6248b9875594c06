#include "controller/reconciler.h"

#include <algorithm>
#include <optional>
#include <set>

#include "controller/job_reconcile.h"
#include "controller/kube/json_fields.h"
#include "controller/trainer_jobs.h"

namespace meshload::controller {

using nlohmann::json;

using kube::Field;
using kube::Str;

json SlimPod(json pod) { return kube::Pod::FromFullJson(pod, kDefaultSidecarContainer).ToJson(); }

Reconciler::Reconciler(kube::KubeClient* client, kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps,
                       kube::Informer* trainer_jobs, ReconcilerOptions options)
    : client_(client),
      jobs_(jobs),
      pods_(pods),
      configmaps_(configmaps),
      trainer_jobs_(trainer_jobs),
      options_(std::move(options)) {}

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
    // A lookup in the cached object, not a copy of its data (job.json and
    // assignments.json, for every managed ConfigMap, on every pod event).
    if (Field(Field(*cm, "data"), ("process." + md.name).c_str()).is_string()) keys.insert(key);
  }
  return {keys.begin(), keys.end()};
}

std::vector<std::string> Reconciler::JobsForTrainerJob(const json& job) const {
  const TrainerJob t = TrainerJob::FromJson(job);
  std::vector<std::string> keys;
  if (t.template_labels.empty()) return keys;
  for (const auto& dlj : jobs_->List(t.metadata.namespace_)) {
    const json& sel = Field(Field(*dlj, "spec"), "selector");
    if (sel.is_object() && SelectorMatches(sel, t.template_labels)) {
      keys.push_back(t.metadata.namespace_ + "/" + kube::MetadataOf(*dlj).name);
    }
  }
  return keys;
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
  const ReconcileContext context{client_, pods_, configmaps_, trainer_jobs_, &options_, &memory_};
  return JobReconcile(context, key, ns, name, *cached, res).Run();
}

}  // namespace meshload::controller
