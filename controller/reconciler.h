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
///    are not terminated or being deleted. Process indices: a JobSet's pod
///    (label jobset.sigs.k8s.io/jobset-name) takes the indices of the Jobs
///    of its JobSet before its own (by jobset.sigs.k8s.io/job-global-index)
///    plus its completion index; else the pod's
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

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/label_selector.h"
#include "controller/reconcile_context.h"

namespace meshload::controller {

/// The informer transform for pods: keeps only what the reconciler and the
/// ProgressPoller read (spec.metricsPort: the port named `metrics` of the
/// container kDefaultSidecarContainer).
nlohmann::json SlimPod(nlohmann::json pod);

using kube::SelectorMatches;  // controller/kube/label_selector.h

class Reconciler {
 public:
  /// `trainer_jobs`: the batch/v1 Jobs (SlimBatchJob), or null.
  Reconciler(kube::KubeClient* client, kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps,
             kube::Informer* trainer_jobs, ReconcilerOptions options = {});

  /// Reconciles the job with key "namespace/name". An error means "try
  /// again with backoff".
  Status Reconcile(const std::string& key, ReconcileResult* result = nullptr);

  /// Keys of the jobs that a pod event concerns: jobs in its namespace whose
  /// selector matches it, and jobs whose ConfigMap lists it.
  std::vector<std::string> JobsForPod(const nlohmann::json& pod) const;
  /// Keys of the jobs in a batch/v1 Job's namespace whose selector matches
  /// its pod template's labels (its suspension is theirs).
  std::vector<std::string> JobsForTrainerJob(const nlohmann::json& job) const;
  /// The key of the job owning a ConfigMap, or "" when it is not ours.
  static std::string JobForConfigMap(const nlohmann::json& configmap);

 private:
  // Set by the constructor, read-only after.
  kube::KubeClient* client_;
  kube::Informer* jobs_;
  kube::Informer* pods_;
  kube::Informer* configmaps_;
  kube::Informer* trainer_jobs_;
  ReconcilerOptions options_;
  JobMemory memory_;
};

}  // namespace meshload::controller
