#include "controller/trainer_jobs.h"

#include <algorithm>
#include <map>

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

int64_t TrainerJob::global_index() const { return kube::ParseIndex(metadata.Label(kJobGlobalIndexLabel)).value_or(-1); }

json SlimBatchJob(json job) { return TrainerJob::FromJson(job).ToJson(); }

std::optional<int64_t> JobSetProcessIndex(const kube::Pod& pod, const std::vector<TrainerJob>& jobs,
                                          std::string* problem) {
  const std::string jobset = pod.metadata.Label(kJobSetNameLabel);
  const std::optional<int64_t> ci = pod.CompletionIndex();
  if (jobset.empty() || !ci || *ci < 0) return std::nullopt;
  const int64_t g = kube::ParseIndex(pod.metadata.Label(kJobGlobalIndexLabel)).value_or(-1);
  const std::string where = "pod " + pod.metadata.name + " of JobSet " + pod.metadata.namespace_ + "/" + jobset;
  if (g < 0) {
    *problem = "JobSetIndexUnknown: " + where + " has no label " + kJobGlobalIndexLabel;
    return -1;
  }
  std::vector<const TrainerJob*> before(static_cast<size_t>(g), nullptr);
  for (const auto& t : jobs) {
    const int64_t i = t.global_index();
    if (t.jobset() == jobset && i >= 0 && i < g) before[i] = &t;
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (before[i] == nullptr) {
      *problem = "JobSetIndexUnknown: " + where + " is in its Job of global index " + std::to_string(g) +
                 ", but the Job of global index " + std::to_string(i) + " is not known (yet)";
      return -1;
    }
    offset += before[i]->indices();
  }
  return offset + *ci;
}

std::vector<TrainerJob> TrainerJobsOf(const kube::Informer& jobs, const std::string& ns, const json& selector) {
  std::vector<TrainerJob> out;
  if (!selector.is_object()) return out;
  for (const auto& object : jobs.List(ns)) {
    TrainerJob t = TrainerJob::FromJson(*object);
    if (t.metadata.being_deleted() || t.template_labels.empty()) continue;
    if (kube::SelectorMatches(selector, t.template_labels)) out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(),
            [](const TrainerJob& a, const TrainerJob& b) { return a.metadata.name < b.metadata.name; });
  return out;
}

std::vector<std::string> TrainerJobProblems(const std::vector<TrainerJob>& all, int64_t processes) {
  std::vector<std::string> out;
  std::vector<const TrainerJob*> jobs;
  for (const auto& t : all) {
    if (!t.finished) jobs.push_back(&t);
  }
  if (jobs.empty()) return out;
  const std::string ns = jobs[0]->metadata.namespace_;
  const std::string mesh = "the mesh has " + std::to_string(processes) + " processes (spec.mesh.processes)";
  // Each JobSet once, as its replicated jobs (replicas x parallelism), and
  // each Job of its own.
  int64_t parallel = 0;
  std::string each;
  std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>> jobsets;  // name -> rj -> (n, par)
  for (const TrainerJob* t : jobs) {
    parallel += t->parallelism;
    if (t->jobset().empty()) {
      each += (each.empty() ? "" : ", ") + std::string("Job ") + t->metadata.name + " spec.parallelism " +
              std::to_string(t->parallelism);
    } else {
      auto& rj = jobsets[t->jobset()][t->metadata.Label(kReplicatedJobLabel)];
      ++rj.first;
      rj.second = std::max(rj.second, t->parallelism);
    }
  }
  for (const auto& [name, rjs] : jobsets) {
    std::string parts;
    for (const auto& [rj, np] : rjs) {
      parts += (parts.empty() ? "" : ", ") + rj + " " + std::to_string(np.first) + " x " + std::to_string(np.second);
    }
    each += (each.empty() ? "" : ", ") + std::string("JobSet ") + name +
            " (spec.replicatedJobs, replicas x parallelism: " + parts + ")";
  }
  if (parallel != processes) {
    out.push_back(jobs.size() == 1 && jobsets.empty()
                      ? "TrainerParallelismMismatch: batch/v1 Job " + ns + "/" + jobs[0]->metadata.name +
                            " has spec.parallelism " + std::to_string(parallel) + " but " + mesh
                      : "TrainerParallelismMismatch: the trainer Jobs in " + ns +
                            " whose pods the selector matches run " + std::to_string(parallel) + " pods in all (" +
                            each + ") but " + mesh);
  }
  for (const TrainerJob* t : jobs) {
    if (!t->indexed || !t->completions) continue;
    const std::string job = "Indexed batch/v1 Job " + ns + "/" + t->metadata.name;
    if (!t->jobset().empty() && *t->completions != t->parallelism) {
      out.push_back("TrainerCompletionsMismatch: " + job + " of JobSet " + t->jobset() + " has spec.completions " +
                    std::to_string(*t->completions) + " but spec.parallelism " + std::to_string(t->parallelism) +
                    ": the process indices of a JobSet's pods follow from its Jobs' sizes");
    } else if (t->jobset().empty() && jobs.size() == 1 && *t->completions != processes) {
      out.push_back("TrainerCompletionsMismatch: " + job + " has spec.completions " + std::to_string(*t->completions) +
                    " but its completion indices are the process indices and " + mesh);
    }
  }
  return out;
}

}  // namespace meshload::controller
