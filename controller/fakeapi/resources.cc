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
       .has_status = true,
       .short_names = {"ns"}});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "pods",
       .kind = "Pod",
       .namespaced = true,
       .has_status = true,
       .has_generation = true,
       .short_names = {"po"},
       .categories = {"all"}});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "configmaps",
       .kind = "ConfigMap",
       .short_names = {"cm"}});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "secrets",
       .kind = "Secret"});
  Add({.group = "",
       .versions = {"v1"},
       .plural = "events",
       .kind = "Event",
       .allow_create_on_update = true,
       .short_names = {"ev"}});
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
       .has_generation = true,
       .short_names = {"crd", "crds"},
       .categories = {"api-extensions"}});
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
  type.singular = str(names, "singular");
  auto strings = [](const nlohmann::json* obj, const char* key) {
    std::vector<std::string> out;
    if (obj == nullptr || !obj->is_object() || !obj->contains(key)) return out;
    const nlohmann::json& list = (*obj)[key];
    if (!list.is_array()) return out;
    for (const auto& v : list) {
      if (v.is_string()) out.push_back(v.get<std::string>());
    }
    return out;
  };
  type.short_names = strings(names, "shortNames");
  type.categories = strings(names, "categories");
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
      if (v.contains("schema") && v["schema"].is_object() &&
          v["schema"].contains("openAPIV3Schema") && v["schema"]["openAPIV3Schema"].is_object()) {
        type.schemas[v["name"].get<std::string>()] = v["schema"]["openAPIV3Schema"];
      }
      // One shape for all versions (below), so the first served version's
      // columns stand for all of them.
      if (type.versions.size() == 1 && v.contains("additionalPrinterColumns") &&
          v["additionalPrinterColumns"].is_array()) {
        for (const auto& c : v["additionalPrinterColumns"]) {
          PrinterColumn column;
          column.name = str(&c, "name");
          column.type = str(&c, "type");
          column.json_path = str(&c, "jsonPath");
          column.description = str(&c, "description");
          if (c.is_object() && c.contains("priority") && c["priority"].is_number_integer()) {
            column.priority = c["priority"].get<int>();
          }
          if (!column.name.empty() && !column.json_path.empty()) {
            type.printer_columns.push_back(std::move(column));
          }
        }
      }
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
