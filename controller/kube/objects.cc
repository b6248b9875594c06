#include "controller/kube/objects.h"

#include <algorithm>

#include "controller/kube/json_fields.h"

namespace meshload::controller::kube {
namespace {

using nlohmann::json;

StringMap Strings(const json& obj, const char* key) {
  StringMap out;
  const json& m = Field(obj, key);
  if (!m.is_object()) return out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.value().is_string()) out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

template <typename T>
std::vector<T> List(const json& obj, const char* key) {
  std::vector<T> out;
  const json& a = Field(obj, key);
  if (!a.is_array()) return out;
  for (const auto& e : a) out.push_back(T::FromJson(e));
  return out;
}

template <typename T>
json ListJson(const std::vector<T>& v) {
  json out = json::array();
  for (const auto& e : v) out.push_back(e.ToJson());
  return out;
}

void PutIf(json& out, const char* key, const std::string& v) {
  if (!v.empty()) out[key] = v;
}

void PutIf(json& out, const char* key, const StringMap& v) {
  if (!v.empty()) out[key] = v;
}

constexpr const char* kBoundMeta[] = {
    "name",   "namespace",   "uid",        "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "labels", "annotations", "finalizers", "ownerReferences"};

}  // namespace

OwnerReference OwnerReference::FromJson(const json& j) {
  return {Str(j, "apiVersion"), Str(j, "kind"),        Str(j, "name"),
          Str(j, "uid"),        Bool(j, "controller"), Bool(j, "blockOwnerDeletion")};
}

json OwnerReference::ToJson() const {
  json out = {{"apiVersion", api_version}, {"kind", kind}, {"name", name}, {"uid", uid}};
  if (controller) out["controller"] = true;
  if (block_owner_deletion) out["blockOwnerDeletion"] = true;
  return out;
}

ObjectMeta ObjectMeta::FromJson(const json& j) {
  ObjectMeta m;
  m.name = Str(j, "name");
  m.namespace_ = Str(j, "namespace");
  m.uid = Str(j, "uid");
  m.resource_version = Str(j, "resourceVersion");
  m.generation = Int(j, "generation");
  m.creation_timestamp = Str(j, "creationTimestamp");
  m.deletion_timestamp = Str(j, "deletionTimestamp");
  m.labels = Strings(j, "labels");
  m.annotations = Strings(j, "annotations");
  const json& f = Field(j, "finalizers");
  if (f.is_array()) {
    for (const auto& v : f) {
      if (v.is_string()) m.finalizers.push_back(v.get<std::string>());
    }
  }
  m.owner_references = List<OwnerReference>(j, "ownerReferences");
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (std::find(std::begin(kBoundMeta), std::end(kBoundMeta), it.key()) == std::end(kBoundMeta)) {
        m.other[it.key()] = it.value();
      }
    }
  }
  return m;
}

json ObjectMeta::ToJson() const {
  json out = other.is_object() ? other : json::object();
  PutIf(out, "name", name);
  PutIf(out, "namespace", namespace_);
  PutIf(out, "uid", uid);
  PutIf(out, "resourceVersion", resource_version);
  if (generation != 0) out["generation"] = generation;
  PutIf(out, "creationTimestamp", creation_timestamp);
  PutIf(out, "deletionTimestamp", deletion_timestamp);
  PutIf(out, "labels", labels);
  PutIf(out, "annotations", annotations);
  if (!finalizers.empty()) out["finalizers"] = finalizers;
  if (!owner_references.empty()) out["ownerReferences"] = ListJson(owner_references);
  return out;
}

bool ObjectMeta::HasFinalizer(const std::string& f) const {
  return std::find(finalizers.begin(), finalizers.end(), f) != finalizers.end();
}

std::string ObjectMeta::ControllerUid() const {
  for (const auto& r : owner_references) {
    if (r.controller) return r.uid;
  }
  return "";
}

std::string ObjectMeta::Label(const std::string& key) const {
  auto it = labels.find(key);
  return it == labels.end() ? "" : it->second;
}

ObjectMeta MetadataOf(const json& obj) { return ObjectMeta::FromJson(Field(obj, "metadata")); }

ObjectReference ObjectReference::To(const json& obj) {
  const json& md = Field(obj, "metadata");
  return {Str(obj, "apiVersion"), Str(obj, "kind"), Str(md, "namespace"),
          Str(md, "name"),        Str(md, "uid"),   Str(md, "resourceVersion")};
}

json ObjectReference::ToJson() const {
  json out = {{"apiVersion", api_version}, {"kind", kind}, {"namespace", namespace_}, {"name", name}, {"uid", uid}};
  PutIf(out, "resourceVersion", resource_version);
  return out;
}

ContainerStatus ContainerStatus::FromJson(const json& j) {
  return {Str(j, "name"), Bool(j, "ready"), Int(j, "restartCount")};
}

json ContainerStatus::ToJson() const { return {{"name", name}, {"ready", ready}, {"restartCount", restart_count}}; }

Pod Pod::FromJson(const json& j) {
  Pod p;
  p.metadata = MetadataOf(j);
  const json& st = Field(j, "status");
  p.phase = Str(st, "phase");
  p.pod_ip = Str(st, "podIP");
  p.container_statuses = List<ContainerStatus>(st, "containerStatuses");
  p.init_container_statuses = List<ContainerStatus>(st, "initContainerStatuses");
  const int64_t port = Int(Field(j, "spec"), "metricsPort");
  p.sidecar_metrics_port = port > 0 && port < 65536 ? port : 0;
  return p;
}

Pod Pod::FromFullJson(const json& j, const std::string& sidecar_container) {
  Pod p = FromJson(j);
  const json& spec = Field(j, "spec");
  for (const char* list : {"containers", "initContainers"}) {
    const json& cs = Field(spec, list);
    if (!cs.is_array()) continue;
    for (const auto& c : cs) {
      const json& ports = Field(c, "ports");
      if (Str(c, "name") != sidecar_container || !ports.is_array()) continue;
      for (const auto& port : ports) {
        const int64_t n = Int(port, "containerPort");
        if (Str(port, "name") == "metrics" && n > 0 && n < 65536) p.sidecar_metrics_port = n;
      }
    }
  }
  return p;
}

json Pod::ToJson() const {
  ObjectMeta md = metadata;
  // The cache keeps only the annotation the controller reads.
  md.other = json::object();
  md.generation = 0;
  md.finalizers.clear();
  md.owner_references.clear();
  StringMap kept;
  if (auto it = md.annotations.find(kJobCompletionIndex); it != md.annotations.end()) kept.insert(*it);
  md.annotations = std::move(kept);
  json st = json::object();
  PutIf(st, "phase", phase);
  PutIf(st, "podIP", pod_ip);
  if (!container_statuses.empty()) st["containerStatuses"] = ListJson(container_statuses);
  if (!init_container_statuses.empty()) st["initContainerStatuses"] = ListJson(init_container_statuses);
  json out = {{"metadata", md.ToJson()}, {"status", std::move(st)}};
  if (sidecar_metrics_port > 0) out["spec"] = {{"metricsPort", sidecar_metrics_port}};
  return out;
}

const ContainerStatus* Pod::StatusOf(const std::string& container) const {
  for (const auto* list : {&container_statuses, &init_container_statuses}) {
    for (const auto& c : *list) {
      if (c.name == container) return &c;
    }
  }
  return nullptr;
}

std::optional<int64_t> ParseIndex(const std::string& v) {
  if (v.empty()) return std::nullopt;
  if (v.size() > 9 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(v);
}

std::optional<int64_t> Pod::CompletionIndex() const {
  std::string v;
  if (auto it = metadata.annotations.find(kJobCompletionIndex); it != metadata.annotations.end()) v = it->second;
  if (v.empty()) v = metadata.Label(kJobCompletionIndex);
  return ParseIndex(v);
}

ConfigMap ConfigMap::FromJson(const json& j) {
  ConfigMap cm{MetadataOf(j), Strings(j, "data")};
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k != "apiVersion" && k != "kind" && k != "metadata" && k != "data") cm.other[k] = it.value();
    }
  }
  return cm;
}

json ConfigMap::ToJson() const {
  json out = other.is_object() ? other : json::object();
  out["apiVersion"] = "v1";
  out["kind"] = "ConfigMap";
  out["metadata"] = metadata.ToJson();
  out["data"] = data;
  return out;
}

std::string ConfigMap::Data(const std::string& key) const {
  auto it = data.find(key);
  return it == data.end() ? "" : it->second;
}

json Secret::ToJson() const {
  json out = {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", metadata.ToJson()}, {"type", type}};
  if (immutable) out["immutable"] = true;
  out["data"] = data;
  return out;
}

json Event::ToJson() const {
  return {{"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata", metadata.ToJson()},
          {"involvedObject", involved_object.ToJson()},
          {"reason", reason},
          {"message", message},
          {"type", type},
          {"count", count},
          {"firstTimestamp", first_timestamp},
          {"lastTimestamp", last_timestamp},
          {"source", {{"component", source_component}}},
          {"reportingComponent", reporting_component},
          {"reportingInstance", reporting_instance}};
}

json DeleteOptions::ToJson() const {
  json out = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (!precondition_uid.empty()) out["preconditions"] = {{"uid", precondition_uid}};
  return out;
}

}  // namespace meshload::controller::kube
