/// \file
/// The trainers' batch/v1 Jobs: the Jobs whose pod template the
/// DataLoadJob's selector matches (in its namespace), whether a queue such
/// as Kueue holds them suspended, and whether their parallelism fits the
/// mesh. A JobSet's or a TrainJob's trainers are Jobs too (a JobSet makes
/// one per replica, suspended while it is), so one watch on Jobs sees all
/// three.
///
/// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/objects.h"

namespace meshload::controller {

/// batch/v1 jobs.
kube::ResourcePath BatchJobsResource();

using kube::kJobGlobalIndexLabel;  // controller/kube/objects.h
using kube::kJobSetNameLabel;
using kube::kReplicatedJobLabel;

/// A batch/v1 Job as the controller reads it: metadata (name, namespace,
/// uid, labels), spec.suspend, spec.parallelism (1 when unset, as the API
/// defaults it), spec.completions, spec.completionMode, the pod template's
/// labels, and whether a Complete or Failed condition is True.
struct TrainerJob {
  kube::ObjectMeta metadata;
  bool suspended = false;
  int64_t parallelism = 1;
  std::optional<int64_t> completions;
  bool indexed = false;
  kube::StringMap template_labels;
  bool finished = false;

  static TrainerJob FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
  /// The pods it runs at once (spec.parallelism), and the indices its
  /// pods take: spec.completions for an Indexed Job, else its parallelism.
  int64_t indices() const { return indexed && completions ? *completions : parallelism; }
  /// Its JobSet's name ("" for a Job of its own) and global index (-1).
  std::string jobset() const { return metadata.Label(kJobSetNameLabel); }
  int64_t global_index() const;
};

/// The informer transform for Jobs: what TrainerJob binds, as JSON.
nlohmann::json SlimBatchJob(nlohmann::json job);

/// The Jobs in `ns` (from the cache) whose pod template's labels `selector`
/// (a metav1.LabelSelector) matches, finished ones included, by name.
std::vector<TrainerJob> TrainerJobsOf(const kube::Informer& jobs, const std::string& ns,
                                      const nlohmann::json& selector);

/// A JobSet pod's process index: the indices of the Jobs of its JobSet with
/// a lower global index (`jobs`, finished ones included), summed, plus its
/// completion index, so that the replicated jobs' pods number 0 to P - 1
/// in the order of the JobSet's spec.replicatedJobs. nullopt for a pod of
/// no JobSet (or without a completion index); -1 with `problem` set when a
/// Job before its own is not known.
std::optional<int64_t> JobSetProcessIndex(const kube::Pod& pod, const std::vector<TrainerJob>& jobs,
                                          std::string* problem);

/// Problems with (unfinished) trainer Jobs whose pods a mesh of `processes`
/// processes cannot take, as "Reason: message" naming each Job or JobSet
/// and field: their parallelism (all together: a JobSet's Jobs share the
/// mesh) differs from the processes (TrainerParallelismMismatch), or an
/// Indexed Job's completions differ from them (a Job of its own: its
/// completion indices are the process indices) or from its parallelism (a
/// JobSet's: its pods' indices follow the Jobs before it)
/// (TrainerCompletionsMismatch).
std::vector<std::string> TrainerJobProblems(const std::vector<TrainerJob>& jobs, int64_t processes);

}  // namespace meshload::controller
