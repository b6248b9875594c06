/// \file
/// What a DataLoadJob's reconcile works with, below both the Reconciler
/// (controller/reconciler.h), which makes one per call, and the reconcile
/// itself (controller/job_reconcile.h): the names and labels of what is
/// made for a job, the resources, the options, what the reconciler
/// remembers between reconciles (JobMemory) and the narrow context one
/// reconcile gets (ReconcileContext).
///
/// Thread safety: JobMemory is thread-safe; the rest are values.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/progress_poller.h"

namespace meshload::controller {

inline constexpr char kFinalizer[] = "meshload.io/cleanup";
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kManagedByValue[] = "meshload-controller";
inline constexpr char kJobLabel[] = "meshload.io/job";
/// The sidecar container's name in trainer pods, as the webhook injects it.
inline constexpr char kDefaultSidecarContainer[] = "meshload-sidecar";
/// On the peer Secret: the uid of the job instance it was made for (a
/// user's own Secret does not carry it), for operators to select by.
inline constexpr char kJobUidLabel[] = "meshload.io/job-uid";
/// A DataLoadJob's name is the value of kJobLabel on what is made for it,
/// so at most a label value's 63 characters (the CRD says so too).
inline constexpr size_t kMaxJobNameLength = 63;

/// The resources the controller uses.
kube::ResourcePath JobsResource();
kube::ResourcePath PodsResource();
kube::ResourcePath ConfigMapsResource();
kube::ResourcePath SecretsResource();
/// The Secret holding a job's peer secret: `<job>-meshload-peer`.
std::string PeerSecretName(const std::string& job);

struct ReconcilerOptions {
  /// The sidecar container's name in trainer pods (a container or a native
  /// sidecar init container).
  std::string sidecar_container = "meshload-sidecar";
  /// Checked before every write; false (lost leadership) aborts the
  /// reconcile with kFailedPrecondition.
  std::function<bool()> may_write;
  /// Called after a status write for each condition that changed, to become
  /// a Kubernetes Event (runtime::EventRecorder::Record): `type` "Normal" or
  /// "Warning", the condition's reason and message. Unset: no events.
  std::function<void(const nlohmann::json& job, const std::string& type, const std::string& reason,
                     const std::string& message)>
      record_event;
  /// The last poll of a job's sidecars (ProgressPoller::Get), for
  /// status.progress and resume.json. Unset: neither is written from
  /// progress (resume.json then holds spec.resume.step).
  std::function<std::optional<JobProgress>(const std::string& key)> progress;
  /// status.progress is rewritten when a step moved by this much, or the
  /// rate by 10%, or anything else changed (ProgressToWrite).
  int64_t progress_step_granularity = 100;
  /// ...but moving steps and rates no more often than this per job (other
  /// changes at once), so that the status writes of many running jobs stay
  /// within the controller's QPS.
  std::chrono::milliseconds progress_min_write_interval{std::chrono::seconds(120)};
};

/// What the reconciler remembers between reconciles of a job: the peer
/// secrets this process made or found, and when it last wrote each job's
/// status.progress (a restarted controller may write one sooner). Entries
/// go when the job does.
///
/// Thread safety: thread-safe.
class JobMemory {
 public:
  /// Whether this process made or found the peer secret of job `key` (of
  /// uid `job_uid`): then the Secret's uid ("" when found rather than made).
  std::optional<std::string> MadeSecret(const std::string& key, const std::string& job_uid) const
      MESHLOAD_EXCLUDES(secrets_mu_);
  void RememberSecret(const std::string& key, std::string job_uid, std::string secret_uid)
      MESHLOAD_EXCLUDES(secrets_mu_);
  /// Whether `min_interval` has passed since this process last wrote the
  /// job's status.progress (or it never did).
  bool ProgressDue(const std::string& key, std::chrono::milliseconds min_interval) const
      MESHLOAD_EXCLUDES(progress_mu_);
  void ProgressWritten(const std::string& key) MESHLOAD_EXCLUDES(progress_mu_);
  /// A deleted job: everything about it goes.
  void Forget(const std::string& key) MESHLOAD_EXCLUDES(secrets_mu_, progress_mu_);
  void ForgetSecret(const std::string& key) MESHLOAD_EXCLUDES(secrets_mu_);

 private:
  struct MadeSecretEntry {
    std::string job_uid, secret_uid;
  };
  mutable Mutex secrets_mu_;
  std::map<std::string, MadeSecretEntry> secrets_made_ MESHLOAD_GUARDED_BY(secrets_mu_);
  mutable Mutex progress_mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> progress_written_ MESHLOAD_GUARDED_BY(progress_mu_);
};

/// What one job's reconcile (controller/job_reconcile.h) works with, and no
/// more: the client, the pod, ConfigMap and trainer Job caches, the options, the memory.
struct ReconcileContext {
  kube::KubeClient* client = nullptr;
  kube::Informer* pods = nullptr;
  kube::Informer* configmaps = nullptr;
  /// The batch/v1 Jobs (SlimBatchJob), or null: trainers are bare pods only.
  kube::Informer* trainer_jobs = nullptr;
  const ReconcilerOptions* options = nullptr;
  JobMemory* memory = nullptr;
  /// kFailedPrecondition when this process may not write (lost leadership).
  Status CheckMayWrite() const;
};

/// What one reconcile did.
struct ReconcileResult {
  int writes = 0;
  std::string phase;
};

}  // namespace meshload::controller
