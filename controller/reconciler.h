/// \file
/// The DataLoadJob reconciler: level-based, it reads the world (the job, its
/// pods, its ConfigMap, all from informer caches) and makes the cluster
/// match, whatever event woke it.
///
/// For a job `ns/name`:
/// 1. Gone: nothing (its ConfigMap and peer Secret are garbage-collected
///    through the owner reference). Being deleted: delete the ConfigMap and
///    the peer Secret this controller made (by its uid), remove the finalizer
///    `meshload.io/cleanup`. Otherwise make sure the finalizer is there.
/// 2. Validate the spec with the planner (the same parser and checks as
///    `meshload plan`). Invalid: status Valid=False with every message,
///    phase Failed, and nothing else (an existing ConfigMap is left as it
///    is, so running sidecars keep their last valid job).
/// 3. Trainer pods are the pods of spec.selector in the job's namespace that
///    are not terminated or being deleted. Process indices: the pod's
///    `batch.kubernetes.io/job-completion-index` when it has one; otherwise
///    the index recorded for that pod (same name and uid) in the ConfigMap,
///    so assignments survive reconciles and controller restarts; otherwise
///    the lowest free index, pods taken oldest first. Problems (too many
///    pods, duplicate or out-of-range completion indices, a sidecar that
///    restarted and is not ready) are conditions, never crashes.
/// 4. The ConfigMap `<name>-meshload` (owner reference to the job, labels
///    `app.kubernetes.io/managed-by: meshload-controller`,
///    `meshload.io/job: <name>`) holds `job.json` (the manifest the sidecars
///    read), `assignments.json`, `planHash`, `process.<pod>` per assigned pod
///    and `rendezvous` (process 0's pod IP), and `resume.json`
///    ({"step": R, "specStep": S}): where sidecars that start now begin, the
///    step every process has consumed + 1 from the last poll of the
///    sidecars (ReconcilerOptions::progress), else the one recorded before
///    while spec.resume.step is still S, else spec.resume.step. It is
///    written only when its content differs.
///    Then the Secret `<name>-meshload-peer` (same labels and owner
///    reference; type Opaque, immutable): key `secret`, 64 random hex
///    digits, which the sidecars mount for --peer-secret-file. Created once,
///    recorded in status.peerSecretName and peerSecretUID; one that exists
///    is kept as it is (409 AlreadyExists: the controller may create and
///    delete Secrets but not read them). A failed create is a problem
///    (PeerSecretFailed): the status is written, the job retried.
/// 5. Status (phase, observedGeneration, processesReady, planHash,
///    peerSecretName, peerSecretUID, progress (ProgressStatus, rewritten as
///    ProgressToWrite says), conditions Valid, Planned, SidecarsReady, Degraded, and Starved and
///    Straggling from the last poll (ProgressConditions, thresholds from spec.health)) is written through
///    /status with the job's resourceVersion only when it differs; a 409
///    re-reads the job and tries again. lastTransitionTime moves only when a
///    condition's status does.
///
/// 6. After a status write, each condition that changed becomes an Event
///    (ReconcilerOptions::record_event): Warning when it went bad (Valid or
///    Planned False, SidecarsReady False after True, Degraded True for a
///    problem other than sidecars not all ready, which SidecarsReady
///    reports), Normal when it went good (and Planned True on a new job).
///    A condition that did not change makes none, so an idle cluster gets
///    no events.
///
/// So a reconcile with nothing changed makes no write at all.
///
/// Thread safety: Reconcile may run concurrently for different keys (the
/// work queue never hands one key to two workers).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/label_selector.h"
#include "controller/progress_poller.h"
#include "planner/spec.h"

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

/// The informer transform for pods: keeps only what the reconciler and the
/// ProgressPoller read (spec.metricsPort: the port named `metrics` of the
/// container kDefaultSidecarContainer).
nlohmann::json SlimPod(nlohmann::json pod);

using kube::SelectorMatches;  // controller/kube/label_selector.h

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
/// more: the client, the pod and ConfigMap caches, the options, the memory.
struct ReconcileContext {
  kube::KubeClient* client = nullptr;
  kube::Informer* pods = nullptr;
  kube::Informer* configmaps = nullptr;
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

class Reconciler {
 public:
  Reconciler(kube::KubeClient* client, kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps,
             ReconcilerOptions options = {});

  /// Reconciles the job with key "namespace/name". An error means "try
  /// again with backoff".
  Status Reconcile(const std::string& key, ReconcileResult* result = nullptr);

  /// Keys of the jobs that a pod event concerns: jobs in its namespace whose
  /// selector matches it, and jobs whose ConfigMap lists it.
  std::vector<std::string> JobsForPod(const nlohmann::json& pod) const;
  /// The key of the job owning a ConfigMap, or "" when it is not ours.
  static std::string JobForConfigMap(const nlohmann::json& configmap);

 private:
  // Set by the constructor, read-only after.
  kube::KubeClient* client_;
  kube::Informer* jobs_;
  kube::Informer* pods_;
  kube::Informer* configmaps_;
  ReconcilerOptions options_;
  JobMemory memory_;
};

}  // namespace meshload::controller
