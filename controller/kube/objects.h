/// \file
/// The Kubernetes objects the controller reads and writes, as typed structs
/// with one JSON binding each (FromJson and ToJson beside the struct), the
/// way client-go's typed API structs are used in Go: the reconciler reads
/// `pod.metadata.name`, not key lookups into JSON.
///
/// Reading is tolerant, like kube::Field: a member that is missing or of
/// another type reads as its zero value, so a malformed object from the API
/// server never crashes the controller. Writing omits empty members, as the
/// API's `omitempty` does. ObjectMeta keeps the members it does not bind
/// (managedFields, generateName, ...) and writes them back, so an update
/// built from an object read from the server loses nothing.
///
/// Only the members the controller uses are bound; each struct says which.
/// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace meshload::controller::kube {

using StringMap = std::map<std::string, std::string>;

/// The Indexed Job's completion index, an annotation and (>= 1.28) a label.
inline constexpr char kJobCompletionIndex[] = "batch.kubernetes.io/job-completion-index";
/// An index label or annotation's value: nullopt when empty, -1 when not a
/// number of at most 9 digits.
std::optional<int64_t> ParseIndex(const std::string& v);

/// The labels JobSet (sigs.k8s.io/jobset) puts on the Jobs it makes and
/// their pods: the JobSet's name, the replicated job's name, and the Job's
/// index across the whole JobSet (0 to the number of its Jobs - 1).
inline constexpr char kJobSetNameLabel[] = "jobset.sigs.k8s.io/jobset-name";
inline constexpr char kReplicatedJobLabel[] = "jobset.sigs.k8s.io/replicatedjob-name";
inline constexpr char kJobGlobalIndexLabel[] = "jobset.sigs.k8s.io/job-global-index";

/// metav1.OwnerReference.
struct OwnerReference {
  std::string api_version, kind, name, uid;
  bool controller = false;
  bool block_owner_deletion = false;

  static OwnerReference FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
  bool operator==(const OwnerReference& o) const = default;
};

/// metav1.ObjectMeta: name, namespace, uid, resourceVersion, generation,
/// creationTimestamp, deletionTimestamp, labels, annotations, finalizers,
/// ownerReferences; every other member is kept in `other`.
struct ObjectMeta {
  std::string name, namespace_, uid, resource_version;
  int64_t generation = 0;
  std::string creation_timestamp, deletion_timestamp;
  StringMap labels, annotations;
  std::vector<std::string> finalizers;
  std::vector<OwnerReference> owner_references;
  nlohmann::json other = nlohmann::json::object();

  static ObjectMeta FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;

  bool being_deleted() const { return !deletion_timestamp.empty(); }
  bool HasFinalizer(const std::string& f) const;
  /// The uid of the owner reference with controller: true, or "".
  std::string ControllerUid() const;
  /// A label's value, or "".
  std::string Label(const std::string& key) const;
};

/// The metadata of an object, read from its JSON (ObjectMeta::FromJson of
/// obj.metadata).
ObjectMeta MetadataOf(const nlohmann::json& obj);

/// corev1.ObjectReference, as an Event's involvedObject.
struct ObjectReference {
  std::string api_version, kind, namespace_, name, uid, resource_version;

  /// The reference to an object read as JSON (apiVersion, kind, metadata).
  static ObjectReference To(const nlohmann::json& obj);
  nlohmann::json ToJson() const;
};

/// corev1.ContainerStatus: name, ready, restartCount.
struct ContainerStatus {
  std::string name;
  bool ready = false;
  int64_t restart_count = 0;

  static ContainerStatus FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

/// A corev1.Pod as the controller keeps it in its cache: the metadata
/// (annotations: only the completion index), status.phase, status.podIP,
/// the container statuses (init containers' included), and the metrics port
/// of the sidecar container (spec.metricsPort, where the progress poller
/// asks for /progress; not a member of the real Pod). ToJson writes that
/// slim form; FromJson reads it and a full Pod alike.
struct Pod {
  ObjectMeta metadata;
  std::string phase, pod_ip;
  std::vector<ContainerStatus> container_statuses, init_container_statuses;
  int64_t sidecar_metrics_port = 0;  // 0: the sidecar container names none

  static Pod FromJson(const nlohmann::json& j);
  /// FromJson of a full Pod, taking the metrics port from the container
  /// named `sidecar_container`.
  static Pod FromFullJson(const nlohmann::json& j, const std::string& sidecar_container);
  nlohmann::json ToJson() const;

  /// The status of the container of that name (regular or init), or null.
  const ContainerStatus* StatusOf(const std::string& container) const;
  bool finished() const { return phase == "Succeeded" || phase == "Failed"; }
  /// The Indexed Job's completion index: the annotation (Kubernetes >=
  /// 1.21) or the label (>= 1.28). nullopt when absent, -1 when present but
  /// not a number.
  std::optional<int64_t> CompletionIndex() const;
};

/// corev1.ConfigMap: metadata and data; every other member (binaryData,
/// immutable) is kept in `other`.
struct ConfigMap {
  ObjectMeta metadata;
  StringMap data;
  nlohmann::json other = nlohmann::json::object();

  static ConfigMap FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
  /// data[key], or "".
  std::string Data(const std::string& key) const;
};

/// corev1.Secret as the controller writes it (it reads none): metadata,
/// type, immutable, data (values base64, as the API holds them).
struct Secret {
  ObjectMeta metadata;
  std::string type = "Opaque";
  bool immutable = false;
  StringMap data;

  nlohmann::json ToJson() const;
};

/// corev1.Event (the core/v1 API that `kubectl describe` shows).
struct Event {
  ObjectMeta metadata;
  ObjectReference involved_object;
  std::string reason, message, type;
  int64_t count = 1;
  std::string first_timestamp, last_timestamp;
  std::string source_component, reporting_component, reporting_instance;

  nlohmann::json ToJson() const;
};

/// metav1.DeleteOptions with a uid precondition (none when empty).
struct DeleteOptions {
  std::string precondition_uid;

  nlohmann::json ToJson() const;
};

}  // namespace meshload::controller::kube
