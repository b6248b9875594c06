#include "controller/fakeapi/resources.h"

#include <algorithm>

namespace meshload::fakeapi {

bool ResourceType::Serves(const std::string& version) const {
  return std::find(versions.begin(), versions.end(), version) != versions.end();
}

ResourceRegistry::ResourceRegistry() {
  Add({.group = "",
       .versions = {"v1"},
       .plural = "namespaces",
       .kind = "Namespace",
       .namespaced = false,
       .has_status = true});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "pods",
       .kind = "Pod",
       .namespaced = true,
       .has_status = true,
       .has_generation = true});
  Add({.group = "", .versions = {"v1"}, .plural = "configmaps", .kind = "ConfigMap"});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "events",
       .kind = "Event",
       .allow_create_on_update = true});
  Add({.group = "coordination.k8s.io",
       .versions = {"v1"},
       .plural = "leases",
       .kind = "Lease",
       .allow_create_on_update = true});
  Add({.group = "apiextensions.k8s.io",
       .versions = {"v1"},
       .plural = "customresourcedefinitions",
       .kind = "CustomResourceDefinition",
       .namespaced = false,
       .has_status = true,
       .has_generation = true});
}

const ResourceType* ResourceRegistry::Find(const std::string& group, const std::string& version,
                                           const std::string& plural) const {
  const ResourceType* type = FindByKey(group + "/" + plural);
  return type != nullptr && type->Serves(version) ? type : nullptr;
}

const ResourceType* ResourceRegistry::FindByKey(const std::string& key) const {
  auto it = types_.find(key);
  return it == types_.end() ? nullptr : &it->second;
}

void ResourceRegistry::Add(ResourceType type) {
  std::string key = type.Key();
  types_[key] = std::move(type);
}

void ResourceRegistry::Remove(const std::string& key) { types_.erase(key); }

std::optional<ResourceType> ResourceTypeFromCrd(const nlohmann::json& crd, std::string* error) {
  const nlohmann::json* spec = crd.contains("spec") ? &crd["spec"] : nullptr;
  auto str = [](const nlohmann::json* obj, const char* key) -> std::string {
    if (obj == nullptr || !obj->is_object()) return {};
    auto it = obj->find(key);
    return it != obj->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  ResourceType type;
  type.builtin = false;
  type.has_generation = true;
  type.group = str(spec, "group");
  const nlohmann::json* names =
      spec != nullptr && spec->is_object() && spec->contains("names") ? &(*spec)["names"] : nullptr;
  type.plural = str(names, "plural");
  type.kind = str(names, "kind");
  type.namespaced = str(spec, "scope") != "Cluster";
  if (type.group.empty() || type.plural.empty() || type.kind.empty()) {
    *error = "spec.group, spec.names.plural and spec.names.kind are required";
    return std::nullopt;
  }
  if (spec->contains("versions") && (*spec)["versions"].is_array()) {
    for (const auto& v : (*spec)["versions"]) {
      if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) continue;
      if (v.contains("served") && v["served"].is_boolean() && !v["served"].get<bool>()) continue;
      type.versions.push_back(v["name"].get<std::string>());
      // The fake serves one shape for all versions (conversion strategy None),
      // so one version declaring the status subresource enables it.
      if (v.contains("subresources") && v["subresources"].is_object() &&
          v["subresources"].contains("status")) {
        type.has_status = true;
      }
    }
  }
  if (type.versions.empty()) {
    *error = "spec.versions must name at least one served version";
    return std::nullopt;
  }
  return type;
}

}  // namespace meshload::fakeapi
