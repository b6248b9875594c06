#include "controller/trainer_jobs.h"

#include <algorithm>

#include "controller/kube/json_fields.h"
#include "controller/kube/label_selector.h"

namespace meshload::controller {

using nlohmann::json;

using kube::Field;
using kube::Str;

kube::ResourcePath BatchJobsResource() { return {"/apis/batch/v1", "jobs"}; }

TrainerJob TrainerJob::FromJson(const json& j) {
  TrainerJob t;
  t.metadata = kube::MetadataOf(j);
  const json& spec = Field(j, "spec");
  t.suspended = Field(spec, "suspend").is_boolean() && spec["suspend"].get<bool>();
  if (Field(spec, "parallelism").is_number_integer()) t.parallelism = spec["parallelism"].get<int64_t>();
  if (Field(spec, "completions").is_number_integer()) t.completions = spec["completions"].get<int64_t>();
  t.indexed = Str(spec, "completionMode") == "Indexed";
  const json& labels = Field(Field(Field(spec, "template"), "metadata"), "labels");
  if (labels.is_object()) {
    for (auto it = labels.begin(); it != labels.end(); ++it) {
      if (it.value().is_string()) t.template_labels[it.key()] = it.value().get<std::string>();
    }
  }
  const json& conds = Field(Field(j, "status"), "conditions");
  if (conds.is_array()) {
    for (const auto& c : conds) {
      const std::string type = Str(c, "type");
      if ((type == "Complete" || type == "Failed") && Str(c, "status") == "True") t.finished = true;
    }
  }
  return t;
}

json TrainerJob::ToJson() const {
  kube::ObjectMeta md;
  md.name = metadata.name;
  md.namespace_ = metadata.namespace_;
  md.uid = metadata.uid;
  md.resource_version = metadata.resource_version;
  md.labels = metadata.labels;
  json spec = {{"suspend", suspended}, {"parallelism", parallelism}};
  if (completions) spec["completions"] = *completions;
  if (indexed) spec["completionMode"] = "Indexed";
  spec["template"] = {{"metadata", {{"labels", template_labels}}}};
  json out = {{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"metadata", md.ToJson()}, {"spec", spec}};
  if (finished) out["status"] = {{"conditions", json::array({{{"type", "Complete"}, {"status", "True"}}})}};
  return out;
}

json SlimBatchJob(json job) { return TrainerJob::FromJson(job).ToJson(); }

std::vector<TrainerJob> TrainerJobsOf(const kube::Informer& jobs, const std::string& ns, const json& selector) {
  std::vector<TrainerJob> out;
  if (!selector.is_object()) return out;
  for (const auto& object : jobs.List(ns)) {
    TrainerJob t = TrainerJob::FromJson(*object);
    if (t.finished || t.metadata.being_deleted() || t.template_labels.empty()) continue;
    if (kube::SelectorMatches(selector, t.template_labels)) out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(),
            [](const TrainerJob& a, const TrainerJob& b) { return a.metadata.name < b.metadata.name; });
  return out;
}

std::vector<std::string> TrainerJobProblems(const std::vector<TrainerJob>& jobs, int64_t processes) {
  std::vector<std::string> out;
  if (jobs.empty()) return out;
  const std::string mesh = "the mesh has " + std::to_string(processes) + " processes (spec.mesh.processes)";
  int64_t parallel = 0;
  std::string each;
  for (const auto& t : jobs) {
    parallel += t.parallelism;
    each += (each.empty() ? "" : ", ") + t.metadata.name + " " + std::to_string(t.parallelism);
  }
  if (parallel != processes) {
    const std::string ns = jobs[0].metadata.namespace_;
    out.push_back(jobs.size() == 1 ? "TrainerParallelismMismatch: batch/v1 Job " + ns + "/" + jobs[0].metadata.name +
                                         " has spec.parallelism " + std::to_string(parallel) + " but " + mesh
                                   : "TrainerParallelismMismatch: the batch/v1 Jobs in " + ns +
                                         " whose pods the selector matches run " + std::to_string(parallel) +
                                         " pods in all (spec.parallelism: " + each + ") but " + mesh);
  }
  for (const auto& t : jobs) {
    if (t.indexed && t.completions && *t.completions != processes && jobs.size() == 1) {
      out.push_back("TrainerCompletionsMismatch: Indexed batch/v1 Job " + t.metadata.namespace_ + "/" +
                    t.metadata.name + " has spec.completions " + std::to_string(*t.completions) +
                    " but its completion indices are the process indices and " + mesh);
    }
  }
  return out;
}

}  // namespace meshload::controller
