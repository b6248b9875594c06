#include "controller/fakeapi/discovery.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <vector>

namespace meshload::fakeapi {
namespace {

using nlohmann::json;

// The verbs every fake-served resource supports.
json Verbs() {
  return json::array({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"});
}

json GroupVersion(const std::string& group, const std::string& version) {
  return {{"groupVersion", group + "/" + version}, {"version", version}};
}

// The versions of `group` in first-seen order; the first is the preferred one.
std::vector<std::string> GroupVersions(const ResourceTypes& types, const std::string& group) {
  std::vector<std::string> versions;
  for (const auto& [key, type] : types) {
    if (type.group != group) continue;
    for (const std::string& v : type.versions) {
      if (std::find(versions.begin(), versions.end(), v) == versions.end()) versions.push_back(v);
    }
  }
  return versions;
}

json GroupJson(const std::string& group, const std::vector<std::string>& versions) {
  json list = json::array();
  for (const std::string& v : versions) list.push_back(GroupVersion(group, v));
  return {{"name", group}, {"versions", list}, {"preferredVersion", list.at(0)}};
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Evaluates a JSONPath of the form `.a.b.c` (what printer columns use in
// practice); anything else (filters, indices, `..`) yields null, which
// kubectl prints as "<none>", rather than a guessed value.
json Lookup(const json& obj, const std::string& path) {
  if (path.empty() || path[0] != '.') return nullptr;
  const json* cur = &obj;
  size_t start = 1;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    std::string key = path.substr(start, dot - start);
    if (key.empty() || key.find_first_of("[]*@?()") != std::string::npos) return nullptr;
    if (!cur->is_object() || !cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    start = dot + 1;
  }
  return *cur;
}

// Seconds since the RFC 3339 UTC timestamp `ts`, or nullopt when it does
// not parse.
std::optional<int64_t> SecondsSince(const std::string& ts, std::time_t now) {
  std::tm tm{};
  const char* end = strptime(ts.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr) return std::nullopt;
  return static_cast<int64_t>(now - timegm(&tm));
}

json DateCell(const json& value, std::time_t now) {
  if (!value.is_string()) return nullptr;
  std::optional<int64_t> s = SecondsSince(value.get<std::string>(), now);
  return s ? json(HumanDuration(*s)) : json(nullptr);
}

json Column(const std::string& name, const std::string& type, const std::string& format,
            const std::string& description, int priority = 0) {
  return {{"name", name},
          {"type", type},
          {"format", format},
          {"description", description},
          {"priority", priority}};
}

constexpr char kNameDescription[] =
    "Name must be unique within a namespace. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
constexpr char kAgeDescription[] =
    "CreationTimestamp is a timestamp representing the server time when this object was created.";

json Columns(const ResourceType& type) {
  json columns = json::array({Column("Name", "string", "name", kNameDescription)});
  if (!type.builtin && !type.printer_columns.empty()) {
    for (const PrinterColumn& c : type.printer_columns) {
      columns.push_back(Column(c.name, c.type, "", c.description, c.priority));
    }
  } else if (type.builtin && type.Key() == "/pods") {
    columns.push_back(Column("Ready", "string", "",
                             "The aggregate readiness state of this pod for accepting traffic."));
    columns.push_back(Column("Status", "string", "", "The aggregate status of the pod."));
    columns.push_back(Column("Restarts", "string", "", "The number of times the containers restarted."));
    columns.push_back(Column("Age", "string", "", kAgeDescription));
  } else {
    columns.push_back(Column("Age", "string", "", kAgeDescription));
  }
  return columns;
}

json Cells(const ResourceType& type, const json& obj, std::time_t now) {
  const json& md = obj.contains("metadata") ? obj["metadata"] : json::object();
  json cells = json::array({md.value("name", "")});
  json age = DateCell(md.value("creationTimestamp", json(nullptr)), now);
  if (!type.builtin && !type.printer_columns.empty()) {
    for (const PrinterColumn& c : type.printer_columns) {
      json v = Lookup(obj, c.json_path);
      cells.push_back(c.type == "date" ? DateCell(v, now) : v);
    }
  } else if (type.builtin && type.Key() == "/pods") {
    // Nothing runs pods here, so a pod stays as its writer left its status.
    const json empty = json::object();
    const json& spec = obj.contains("spec") ? obj["spec"] : empty;
    const json& status = obj.contains("status") ? obj["status"] : empty;
    size_t total = spec.contains("containers") && spec["containers"].is_array()
                       ? spec["containers"].size()
                       : 0;
    size_t ready = 0;
    int64_t restarts = 0;
    if (status.contains("containerStatuses") && status["containerStatuses"].is_array()) {
      for (const json& cs : status["containerStatuses"]) {
        if (cs.value("ready", false)) ++ready;
        restarts += cs.value("restartCount", int64_t{0});
      }
    }
    cells.push_back(std::to_string(ready) + "/" + std::to_string(total));
    cells.push_back(status.value("phase", "Pending"));
    cells.push_back(std::to_string(restarts));
    cells.push_back(age);
  } else {
    cells.push_back(age);
  }
  return cells;
}

json RowObject(const json& obj, IncludeObject include) {
  switch (include) {
    case IncludeObject::kNone:
      return nullptr;
    case IncludeObject::kObject:
      return obj;
    case IncludeObject::kMetadata:
      break;
  }
  return {{"kind", "PartialObjectMetadata"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", obj.contains("metadata") ? obj["metadata"] : json::object()}};
}

// The item path of `type` at `version`, as the real server names it in OpenAPI.
std::string ItemPath(const ResourceType& type, const std::string& version) {
  std::string path = type.group.empty() ? "/api/" + version : "/apis/" + type.group + "/" + version;
  if (type.namespaced) path += "/namespaces/{namespace}";
  return path + "/" + type.plural + "/{name}";
}

// The PATCH operation kubectl's query-parameter verifier looks for. `v3`
// picks the parameter shape (OpenAPI 3 nests the type under `schema`).
json PatchOperation(const ResourceType& type, const std::string& version, bool v3) {
  json param = {{"name", "fieldValidation"},
                {"in", "query"},
                {"description", "Strict, Warn or Ignore: what to do with unknown fields."}};
  if (v3) {
    param["schema"] = {{"type", "string"}, {"uniqueItems", true}};
  } else {
    param["type"] = "string";
    param["uniqueItems"] = true;
  }
  return {{"operationId", "patch" + type.kind},
          {"parameters", json::array({param})},
          {"responses", {{"200", {{"description", "OK"}}}}},
          {"x-kubernetes-action", "patch"},
          {"x-kubernetes-group-version-kind",
           {{"group", type.group}, {"version", version}, {"kind", type.kind}}}};
}

std::string GroupVersionPath(const std::string& group, const std::string& version) {
  return group.empty() ? "api/" + version : "apis/" + group + "/" + version;
}

}  // namespace

json OpenApiV3Index(const ResourceTypes& types) {
  json paths = json::object();
  for (const auto& [key, type] : types) {
    for (const std::string& v : type.versions) {
      std::string gv = GroupVersionPath(type.group, v);
      if (paths.contains(gv)) continue;
      std::optional<json> doc = OpenApiV3GroupVersion(types, type.group, v);
      size_t hash = std::hash<std::string>{}(doc->dump());
      paths[gv] = {{"serverRelativeURL", "/openapi/v3/" + gv + "?hash=" + std::to_string(hash)}};
    }
  }
  return {{"paths", paths}};
}

std::optional<json> OpenApiV3GroupVersion(const ResourceTypes& types, const std::string& group,
                                          const std::string& version) {
  json paths = json::object();
  for (const auto& [key, type] : types) {
    if (type.group != group || !type.Serves(version)) continue;
    paths[ItemPath(type, version)] = {{"patch", PatchOperation(type, version, true)}};
  }
  if (paths.empty()) return std::nullopt;
  return json{{"openapi", "3.0.0"},
              {"info", {{"title", "Kubernetes"}, {"version", kFakeGitVersion}}},
              {"paths", paths},
              {"components", {{"schemas", json::object()}}}};
}

json OpenApiV2(const ResourceTypes& types) {
  json paths = json::object();
  for (const auto& [key, type] : types) {
    for (const std::string& v : type.versions) {
      paths[ItemPath(type, v)] = {{"patch", PatchOperation(type, v, false)}};
    }
  }
  return {{"swagger", "2.0"},
          {"info", {{"title", "Kubernetes"}, {"version", kFakeGitVersion}}},
          {"paths", paths},
          {"definitions", json::object()}};
}

json VersionInfo() {
  return {{"major", kFakeMajor},
          {"minor", kFakeMinor},
          {"gitVersion", kFakeGitVersion},
          {"gitCommit", "0000000000000000000000000000000000000000"},
          {"gitTreeState", "clean"},
          {"buildDate", "2024-01-01T00:00:00Z"},
          {"goVersion", "go1.21.5"},
          {"compiler", "gc"},
          {"platform", "linux/amd64"}};
}

json CoreApiVersions(const std::string& server_address) {
  return {{"kind", "APIVersions"},
          {"versions", json::array({"v1"})},
          {"serverAddressByClientCIDRs",
           json::array({{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", server_address}}})}};
}

json ApiGroupList(const ResourceTypes& types) {
  std::vector<std::string> groups;
  for (const auto& [key, type] : types) {
    if (!type.group.empty() &&
        std::find(groups.begin(), groups.end(), type.group) == groups.end()) {
      groups.push_back(type.group);
    }
  }
  json list = json::array();
  for (const std::string& g : groups) list.push_back(GroupJson(g, GroupVersions(types, g)));
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", list}};
}

std::optional<json> ApiGroup(const ResourceTypes& types, const std::string& group) {
  std::vector<std::string> versions = GroupVersions(types, group);
  if (group.empty() || versions.empty()) return std::nullopt;
  json g = GroupJson(group, versions);
  g["kind"] = "APIGroup";
  g["apiVersion"] = "v1";
  return g;
}

std::optional<json> ApiResourceList(const ResourceTypes& types, const std::string& group,
                                    const std::string& version) {
  json resources = json::array();
  for (const auto& [key, type] : types) {
    if (type.group != group || !type.Serves(version)) continue;
    json r = {{"name", type.plural},
              {"singularName", type.singular.empty() ? Lower(type.kind) : type.singular},
              {"namespaced", type.namespaced},
              {"kind", type.kind},
              {"verbs", Verbs()}};
    if (!type.short_names.empty()) r["shortNames"] = type.short_names;
    if (!type.categories.empty()) r["categories"] = type.categories;
    resources.push_back(std::move(r));
    if (type.has_status) {
      resources.push_back({{"name", type.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", type.namespaced},
                           {"kind", type.kind},
                           {"verbs", json::array({"get", "patch", "update"})}});
    }
  }
  if (resources.empty()) return std::nullopt;
  return json{{"kind", "APIResourceList"},
              {"apiVersion", "v1"},
              {"groupVersion", group.empty() ? version : group + "/" + version},
              {"resources", resources}};
}

json ToTable(const ResourceType& type, const json& object_or_list, IncludeObject include,
             std::time_t now) {
  json table = {{"kind", "Table"},
                {"apiVersion", "meta.k8s.io/v1"},
                {"metadata", json::object()},
                {"columnDefinitions", Columns(type)},
                {"rows", json::array()}};
  auto add_row = [&](const json& obj) {
    json row = {{"cells", Cells(type, obj, now)}};
    json o = RowObject(obj, include);
    if (!o.is_null()) row["object"] = std::move(o);
    table["rows"].push_back(std::move(row));
  };
  if (object_or_list.contains("items") && object_or_list["items"].is_array()) {
    // A list keeps its resourceVersion and continue token, so paging works
    // the same through Tables.
    if (object_or_list.contains("metadata")) table["metadata"] = object_or_list["metadata"];
    for (const json& item : object_or_list["items"]) add_row(item);
  } else {
    const json& md = object_or_list.contains("metadata") ? object_or_list["metadata"] : json();
    if (md.is_object() && md.contains("resourceVersion")) {
      table["metadata"]["resourceVersion"] = md["resourceVersion"];
    }
    add_row(object_or_list);
  }
  return table;
}

std::string HumanDuration(int64_t seconds) {
  // The rules of k8s.io/apimachinery/pkg/util/duration.HumanDuration.
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  auto n = [](int64_t v) { return std::to_string(v); };
  if (seconds < 60 * 2) return n(seconds) + "s";
  int64_t minutes = seconds / 60;
  if (minutes < 10) {
    int64_t s = seconds % 60;
    return s == 0 ? n(minutes) + "m" : n(minutes) + "m" + n(s) + "s";
  }
  if (minutes < 60 * 3) return n(minutes) + "m";
  int64_t hours = seconds / 3600;
  if (hours < 8) {
    int64_t m = minutes % 60;
    return m == 0 ? n(hours) + "h" : n(hours) + "h" + n(m) + "m";
  }
  if (hours < 48) return n(hours) + "h";
  if (hours < 24 * 8) {
    int64_t h = hours % 24;
    return h == 0 ? n(hours / 24) + "d" : n(hours / 24) + "d" + n(h) + "h";
  }
  if (hours < 24 * 365 * 2) return n(hours / 24) + "d";
  if (hours < 24 * 365 * 8) {
    int64_t d = (hours / 24) % 365;
    return d == 0 ? n(hours / 24 / 365) + "y" : n(hours / 24 / 365) + "y" + n(d) + "d";
  }
  return n(hours / 24 / 365) + "y";
}

}  // namespace meshload::fakeapi
