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
};

/// The informer transform for Jobs: what TrainerJob binds, as JSON.
nlohmann::json SlimBatchJob(nlohmann::json job);

/// The Jobs in `ns` (from the cache) that are not finished and whose pod
/// template's labels `selector` (a metav1.LabelSelector) matches, by name.
std::vector<TrainerJob> TrainerJobsOf(const kube::Informer& jobs, const std::string& ns,
                                      const nlohmann::json& selector);

/// Problems with trainer Jobs whose pods a mesh of `processes` processes
/// cannot take, as "Reason: message" naming each Job and field: their
/// parallelism (all together: a JobSet's Jobs share the mesh) differs from
/// the processes (TrainerParallelismMismatch), or an Indexed Job's
/// completions do (its completion indices are the process indices:
/// TrainerCompletionsMismatch).
std::vector<std::string> TrainerJobProblems(const std::vector<TrainerJob>& jobs, int64_t processes);

}  // namespace meshload::controller
