// One reconcile of one DataLoadJob, one method per step of the reconcile
// that controller/reconciler.h describes:
//   1. Finalize (being deleted) or EnsureFinalizer
//   2. Validate (the planner's parser and checks)
//   3. ReadConfigMap, ReadTrainerJobs, AssignProcesses, CheckReadiness
//   4. ReadProgress, ConfigMapData, ApplyConfigMap, EnsurePeerSecret
//   5. SetConditions, then WriteStatus (and the Events it makes)
// Internal to the controller: Reconciler::Reconcile makes one per call, on
// the calling worker's thread; it holds no lock of its own and takes the
// Reconciler's (secrets_mu_, progress_mu_) only around their maps.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/job_status.h"
#include "controller/kube/informer.h"
#include "controller/kube/objects.h"
#include "controller/progress_poller.h"
#include "controller/reconcile_context.h"
#include "controller/trainer_jobs.h"
#include "planner/shard_planner.h"
#include "planner/spec.h"

namespace meshload::controller {

class JobReconcile {
 public:
  JobReconcile(ReconcileContext context, std::string key, std::string ns, std::string name, nlohmann::json job,
               ReconcileResult& result);

  /// Runs the steps; an error means "try again with backoff".
  Status Run();

 private:
  // 1. A job being deleted: its ConfigMap and the peer Secret this
  // controller made go, then the finalizer.
  Status Finalize();
  // Adds the finalizer when missing. False: the job is gone, nothing to do.
  Result<bool> EnsureFinalizer();
  // The peer secret the status records, or this process made and has not
  // seen in the status yet.
  void RecordedPeerSecret();
  // 2. The spec, parsed and checked; false: desired_ says why it is invalid.
  bool Validate();
  // 3. The ConfigMap there is (ours, somebody else's, or none), read from the
  // cache or, when the cache has none, from the server.
  Status ReadConfigMap();
  // Process indices for the selected pods: a JobSet pod's place in its
  // JobSet (JobSetProcessIndex), else its completion index, else the one
  // recorded in the ConfigMap, else the lowest free one, oldest pod first.
  void AssignProcesses();
  // Which processes have no pod, or a sidecar that is not ready.
  void CheckReadiness();
  // The trainers' batch/v1 Jobs (controller/trainer_jobs.h): which are
  // suspended, and whether their parallelism fits the mesh.
  void ReadTrainerJobs();
  // "batch/v1 Job ns/a" or "batch/v1 Jobs ns/a, ns/b": the unfinished
  // trainer Jobs (the suspended ones only); "" when none.
  std::string TrainerJobNames(bool suspended_only) const;
  // While trainer Jobs are suspended: the Admitted condition, the phase
  // WaitingForAdmission (never admitted) or Suspended (admitted before;
  // suspendedAtStep), and the conditions missing pods would otherwise set.
  void SetSuspendedConditions();
  // 4. Progress from the last poll of the sidecars (status.progress and the
  // Starved/Straggling conditions).
  void ReadProgress();
  // The step sidecars that start now begin at (resume.json).
  int64_t ResumeStep() const;
  // The ConfigMap's data: job.json, assignments.json, planHash, rendezvous,
  // resume.json and process.<pod>; sets desired_.plan_hash.
  kube::StringMap ConfigMapData();
  // Creates or updates the ConfigMap; somebody else's is left alone.
  Status ApplyConfigMap(const kube::StringMap& data);
  // The peer secret, created once.
  Status EnsurePeerSecret();
  // 5. Valid, Planned, SidecarsReady, Degraded, progress conditions; phase.
  void SetConditions();
  // Written only when different; a conflict re-reads the job and retries.
  Status WriteStatus();

  // A ConfigMap of the job's name that is not the job's: a problem, retried.
  void ConfigMapConflict();
  void ConfigMapFailed(const Status& error);
  // job_ and the typed views of it (meta_, status_).
  void SetJob(nlohmann::json job);
  // The job with `meta` as its metadata and no status: a PUT's body.
  nlohmann::json JobWith(const kube::ObjectMeta& meta) const;
  // The metadata, labels and controller reference of what the job owns
  // (the ConfigMap, the peer Secret).
  kube::ObjectMeta ChildMeta(const std::string& child_name) const;
  kube::StringMap ChildLabels() const;
  kube::OwnerReference ChildOwner() const;

  const ReconcileContext ctx_;
  const std::string key_, ns_, name_, cm_name_;
  nlohmann::json job_;     // as read: a PUT sends its spec back untouched
  kube::ObjectMeta meta_;  // job_.metadata
  JobStatus status_;       // job_.status
  ReconcileResult& res_;
  int64_t generation_ = 0;
  DesiredStatus desired_;
  // A child that could not be made (the peer secret, a ConfigMap name
  // taken): reported in the status, then returned so the job is retried.
  Status deferred_;

  std::optional<planner::JobSpec> spec_;
  std::optional<planner::ResolvedJob> resolved_;
  int64_t processes_ = 0;
  std::optional<kube::ConfigMap> cm_;       // ours, from the cache or the server
  bool foreign_ = false;                    // a ConfigMap of that name not made for this job
  std::vector<const kube::Pod*> by_index_;  // process -> pod
  std::vector<kube::Pod> pods_;             // the selected pods (by_index_ points into them)
  std::vector<std::string> problems_;       // "Reason: message"
  std::vector<int64_t> missing_, not_ready_;
  std::vector<ProgressCondition> progress_conditions_;
  std::vector<TrainerJob> trainer_jobs_;  // finished ones included (a JobSet's pods count from them)
  std::string suspended_jobs_;            // "batch/v1 Job ns/a" or "batch/v1 Jobs ns/a, ns/b"; empty: none suspended
};

}  // namespace meshload::controller
