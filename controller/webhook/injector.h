/// \file
/// The sidecar injector: what the mutating admission webhook does to a pod
/// labelled `meshload.io/job: <DataLoadJob name>`, and to the pod template
/// of a Job so labelled (docs/webhook.md).
///
///   Decision d = InjectSidecar(pod, "training", lookup, options);
///   if (!d.allowed) ... refuse with d.message
///   else ... d.patch is a JSON Patch (RFC 6902), empty when nothing changes
///
/// The pod gets the sidecar as a native sidecar (an init container with
/// restartPolicy Always) that mounts the job's ConfigMap, the socket
/// emptyDir (also mounted into every trainer container, with MESHLOAD_SOCKET
/// set), the peer Secret when the job moves samples between processes, and
/// the dataset's volume (spec.dataset.volume) read-only; it shares the
/// trainer containers' DRA claims (the same GPUs). A pod already injected
/// gets an empty patch (reinvocation, retries). Refused, with a message
/// naming the job and the reason: a job that does not exist, is invalid, or
/// whose selector does not select the pod; a pod that already has a
/// container of the sidecar's name, or volumes of the names injected, or no
/// volume of spec.dataset.volume.name.
///
/// Thread safety: pure functions (the lookup must be thread-safe).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace meshload::controller::webhook {

/// The label that opts a pod in, naming its DataLoadJob.
inline constexpr char kJobLabel[] = "meshload.io/job";
/// Set on an injected pod (the job's name): the next admission leaves it alone.
inline constexpr char kInjectedAnnotation[] = "meshload.io/sidecar-injected";
/// The Indexed Job's completion index, on its pods from creation.
inline constexpr char kCompletionIndexAnnotation[] = "batch.kubernetes.io/job-completion-index";

struct InjectorOptions {
  std::string sidecar_name = "meshload-sidecar";
  /// The sidecar's image unless the job's spec.sidecar.image says otherwise.
  std::string image;
  /// The sidecar's resources ({"requests": {...}, "limits": {...}}) unless
  /// the job's spec.sidecar.resources says otherwise.
  nlohmann::json resources = nlohmann::json::object();
  int metrics_port = 9464;
  int peer_port = 7441;
  /// The group that may read the peer secret (0440), set as the pod's
  /// fsGroup when the pod has none and the job needs the secret.
  int64_t fs_group = 65532;
  /// A node directory the sidecars of every job share as their block cache
  /// (it must exist and be writable by the sidecar's user); empty: each
  /// sidecar gets an emptyDir of its job's spec.dataset.cache.capacityBytes.
  std::string cache_host_path;
};

/// A DataLoadJob by namespace and name from the controller's cache (null:
/// none).
using JobLookup = std::function<std::shared_ptr<const nlohmann::json>(const std::string& ns, const std::string& name)>;

struct Decision {
  bool allowed = true;
  /// Why it is refused (allowed false), for the user creating the pod.
  std::string message;
  /// JSON Patch operations; empty: the pod is admitted as it is.
  nlohmann::json patch = nlohmann::json::array();
  /// "injected", "unchanged" (not labelled, or already injected) or "refused".
  std::string outcome;
};

/// What to do with `pod` (a v1 Pod as JSON) created in namespace `ns`.
Decision InjectSidecar(const nlohmann::json& pod, const std::string& ns, const JobLookup& jobs,
                       const InjectorOptions& options);

/// What to do with `job` (a batch/v1 Job as JSON) created in namespace
/// `ns`: the sidecar placed in its pod template (spec.template), as
/// InjectSidecar places it in a pod, so that the Job's pods are created with
/// it and what admits workloads from their templates (Kueue's podSets, the
/// scheduler's view of a suspended Job) counts its requests. The opt-in is
/// the label `meshload.io/job` on the Job and on its template, naming the
/// same DataLoadJob (refused, naming both, when they differ or the template
/// lacks it; unchanged when neither has it). An Indexed Job's pods take
/// their process index from their completion index. The template gets the
/// injected annotation, so its pods are left alone by the pod injection.
Decision InjectJobTemplate(const nlohmann::json& job, const std::string& ns, const JobLookup& jobs,
                           const InjectorOptions& options);

/// What to do with `jobset` (a jobset.x-k8s.io/v1alpha2 JobSet as JSON)
/// created in namespace `ns`: the sidecar placed in the pod template of
/// each replicated job (spec.replicatedJobs[i].template.spec.template)
/// labelled `meshload.io/job` like the JobSet; replicated jobs whose
/// template is not labelled (a launcher, a parameter server) are left
/// alone. Refused, naming the field: a template labelled for another
/// DataLoadJob, or a labelled JobSet none of whose templates is. Its pods
/// take their process index from the controller (their completion index
/// is their place in their own Job; the controller adds the Jobs before
/// it: docs/controller.md).
Decision InjectJobSetTemplates(const nlohmann::json& jobset, const std::string& ns, const JobLookup& jobs,
                               const InjectorOptions& options);

/// What to do with `runtime` (a trainer.kubeflow.org/v1alpha1
/// TrainingRuntime as JSON) created in namespace `ns`: as
/// InjectJobSetTemplates, in the JobSet template it holds
/// (spec.template.spec.replicatedJobs[i].template.spec.template). Kubeflow
/// Trainer makes each TrainJob's JobSet from its runtime, and Kueue counts
/// a TrainJob's quota from the runtime's templates, so the sidecar must be
/// there: a TrainJob cannot add a container of its own. The runtime is
/// then the DataLoadJob's (its label names it).
Decision InjectTrainingRuntimeTemplates(const nlohmann::json& runtime, const std::string& ns, const JobLookup& jobs,
                                        const InjectorOptions& options);

}  // namespace meshload::controller::webhook
