/// \file
/// The fake API server's resource registry: what each served resource is
/// (group, version, plural, kind, scope, subresources). Routing, discovery and
/// Status messages all read from here, so a resource added to the registry
/// (a built-in, or a custom resource when its CRD is created) is served
/// everywhere at once.
///
/// Thread safety: ResourceType is a value. ResourceRegistry is not
/// thread-safe; its owner (ObjectStore) guards it with its own mutex.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace meshload::fakeapi {

/// One of a CRD's additionalPrinterColumns: what `kubectl get` shows.
struct PrinterColumn {
  std::string name;       // "Strategy"
  std::string type;       // "string", "integer", "number", "boolean", "date"
  std::string json_path;  // ".spec.strategy"; only simple dotted paths are evaluated
  std::string description;
  int priority = 0;  // > 0: shown only with -o wide
};

struct ResourceType {
  std::string group;                  // "" for core
  std::vector<std::string> versions;  // served versions; the first is the preferred one
  std::string plural;                 // "pods"
  std::string kind;                   // "Pod"
  bool namespaced = true;
  bool has_status = false;  // a /status subresource exists
  // metadata.generation is maintained (the real server does so for CRs, CRDs, pods).
  bool has_generation = false;
  // PUT on a missing object creates it (true for leases and events on a real server).
  bool allow_create_on_update = false;
  // Built-in types are encoded without kind/apiVersion inside list items;
  // custom resources keep them, as on a real server.
  bool builtin = true;
  // Discovery metadata (spec.names of a CRD); `kubectl get dlj` resolves
  // short names and categories only through discovery.
  std::string singular{};  // "pod"; empty: the lower-case kind
  std::vector<std::string> short_names{};
  std::vector<std::string> categories{};
  // Table columns after Name; empty: Name and Age only, as a real server does
  // for a CRD without additionalPrinterColumns.
  std::vector<PrinterColumn> printer_columns{};
  // A CRD's `schema.openAPIV3Schema` by served version (absent: no schema);
  // custom resources are defaulted and validated against it (schema.h).
  std::map<std::string, nlohmann::json> schemas{};

  /// "pods" for core, "leases.coordination.k8s.io" otherwise: the form used
  /// in real Status messages and in WriteCount().
  std::string QualifiedName() const { return group.empty() ? plural : plural + "." + group; }
  /// "v1" or "group/version".
  std::string ApiVersion(const std::string& version) const {
    return group.empty() ? version : group + "/" + version;
  }
  /// A stable key for the store: "group/plural".
  std::string Key() const { return group + "/" + plural; }
  bool Serves(const std::string& version) const;
};

class ResourceRegistry {
 public:
  /// Starts with the built-ins: namespaces, pods, configmaps, events (core/v1),
  /// leases (coordination.k8s.io/v1), customresourcedefinitions
  /// (apiextensions.k8s.io/v1).
  ResourceRegistry();

  /// The type served at group/version/plural, if any.
  const ResourceType* Find(const std::string& group, const std::string& version,
                           const std::string& plural) const;
  /// By store key ("group/plural"), whatever the version.
  const ResourceType* FindByKey(const std::string& key) const;

  void Add(ResourceType type);
  void Remove(const std::string& key);
  const std::map<std::string, ResourceType>& all() const { return types_; }

 private:
  std::map<std::string, ResourceType> types_;  // by Key()
};

/// The ResourceType a CRD object describes, or nullopt with `*error` set
/// when the CRD lacks what the fake needs (group, names, versions).
std::optional<ResourceType> ResourceTypeFromCrd(const nlohmann::json& crd, std::string* error);

}  // namespace meshload::fakeapi
