#include "controller/fakeapi/store.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <random>

#include "common/base64.h"
#include "controller/fakeapi/merge_patch.h"
#include "controller/fakeapi/schema.h"

namespace meshload::fakeapi {
namespace {

using nlohmann::json;

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::mt19937_64& Rng() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng;
}

std::string NewUid() {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    s += kHex[Rng()() % 16];
  }
  s[14] = '4';                  // version 4
  s[19] = "89ab"[Rng()() % 4];  // RFC 4122 variant
  return s;
}

// The alphabet and length of apimachinery's SimpleNameGenerator.
std::string RandomSuffix() {
  static const std::string kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string s;
  for (int i = 0; i < 5; ++i) s += kAlphabet[Rng()() % kAlphabet.size()];
  return s;
}

std::string Str(const json& obj, const char* key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

json& Meta(json& obj) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) obj["metadata"] = json::object();
  return obj["metadata"];
}
const json& MetaOf(const json& obj) {
  static const json kEmpty = json::object();
  auto it = obj.find("metadata");
  return it != obj.end() && it->is_object() ? *it : kEmpty;
}

std::string ObjectKey(const std::string& ns, const std::string& name) { return ns + "/" + name; }
std::string ObjectKeyOf(const json& obj) {
  const json& md = MetaOf(obj);
  return ObjectKey(Str(md, "namespace"), Str(md, "name"));
}

bool HasFinalizers(const json& obj) {
  const json& md = MetaOf(obj);
  auto it = md.find("finalizers");
  return it != md.end() && it->is_array() && !it->empty();
}

// The content whose change bumps metadata.generation: all but metadata, and
// all but status when status is a subresource (apiextensions' CR strategy).
json GenerationContent(const json& obj, bool has_status) {
  json copy = obj;
  copy.erase("metadata");
  if (has_status) copy.erase("status");
  return copy;
}

uint64_t ParseRv(const std::string& s, bool* ok) {
  *ok = !s.empty() && s.size() < 20 && std::all_of(s.begin(), s.end(), ::isdigit);
  return *ok ? std::stoull(s) : 0;
}

const char kContinueTooOld[] =
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list.";

}  // namespace

std::string ReasonForCode(int code) {
  switch (code) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 405:
      return "MethodNotAllowed";
    case 409:
      return "Conflict";
    case 410:
      return "Expired";
    case 415:
      return "UnsupportedMediaType";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return "Unknown";
  }
}

json StatusObject(int code, const std::string& reason, const std::string& message, json details) {
  json s = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
            {"status", "Failure"}, {"message", message}, {"reason", reason},
            {"code", code}};
  if (!details.is_null()) s["details"] = std::move(details);
  return s;
}

ApiResponse ErrorResponse(int code, const std::string& reason, const std::string& message,
                          json details) {
  return {code, StatusObject(code, reason, message, std::move(details))};
}

namespace {

json Details(const RequestTarget& t, const std::string& name) {
  json d = {{"name", name}, {"kind", t.type.plural}};
  if (!t.type.group.empty()) d["group"] = t.type.group;
  return d;
}

ApiResponse NotFoundFor(const RequestTarget& t, const std::string& name) {
  return ErrorResponse(404, "NotFound", t.type.QualifiedName() + " \"" + name + "\" not found",
                       Details(t, name));
}

ApiResponse ConflictFor(const RequestTarget& t, const std::string& name, const std::string& why) {
  return ErrorResponse(
      409, "Conflict",
      "Operation cannot be fulfilled on " + t.type.QualifiedName() + " \"" + name + "\": " + why,
      Details(t, name));
}

ApiResponse InvalidFor(const RequestTarget& t, const std::string& name, const std::string& field,
                       const std::string& why) {
  json d = {{"name", name}, {"kind", t.type.kind}};
  if (!t.type.group.empty()) d["group"] = t.type.group;
  d["causes"] =
      json::array({{{"reason", "FieldValueInvalid"}, {"message", why}, {"field", field}}});
  return ErrorResponse(422, "Invalid",
                       t.type.kind + " \"" + name + "\" is invalid: " + field + ": " + why, d);
}

// RFC 1123 subdomain: what most objects' names must be (metadata.name of
// ConfigMaps, Secrets, pods, custom resources). Namespaces need a label.
bool IsDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string part = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return false;
    for (size_t i = 0; i < part.size(); ++i) {
      const char c = part[i];
      const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
      if (!alnum && !(c == '-' && i > 0 && i + 1 < part.size())) return false;
    }
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

// A label value, or the name part of a label key: at most 63 characters of
// [A-Za-z0-9_.-], starting and ending with an alphanumeric (values may be
// empty).
bool IsLabelValue(const std::string& s) {
  if (s.size() > 63) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) continue;
    if ((c == '-' || c == '_' || c == '.') && i > 0 && i + 1 < s.size()) continue;
    return false;
  }
  return true;
}

// apimachinery's ValidateObjectMeta, the parts a client can get wrong: the
// name (a DNS label for namespaces, a DNS subdomain otherwise) and every
// label key (optional DNS-subdomain prefix + "/" + name) and value.
std::optional<ApiResponse> ValidateMeta(const RequestTarget& t, const std::string& name, const json& md) {
  const bool label_name = t.type.Key() == "/namespaces";
  if (label_name ? (name.empty() || name.size() > 63 || !IsDnsSubdomain(name) || name.find('.') != std::string::npos)
                 : !IsDnsSubdomain(name)) {
    return InvalidFor(t, name, "metadata.name",
                      "Invalid value: \"" + name + "\": a lowercase RFC 1123 " +
                          (label_name ? "label" : "subdomain") +
                          " must consist of lower case alphanumeric characters, '-'" +
                          (label_name ? "" : " or '.'") +
                          ", and must start and end with an alphanumeric character");
  }
  if (!md.is_object() || !md.contains("labels") || md["labels"].is_null()) return std::nullopt;
  const json& labels = md["labels"];
  if (!labels.is_object()) return InvalidFor(t, name, "metadata.labels", "Invalid value: must be an object");
  for (auto it = labels.begin(); it != labels.end(); ++it) {
    const std::string& key = it.key();
    const size_t slash = key.find('/');
    const std::string prefix = slash == std::string::npos ? "" : key.substr(0, slash);
    const std::string kname = slash == std::string::npos ? key : key.substr(slash + 1);
    if ((slash != std::string::npos && !IsDnsSubdomain(prefix)) || kname.empty() || !IsLabelValue(kname)) {
      return InvalidFor(t, name, "metadata.labels",
                        "Invalid value: \"" + key + "\": name part must consist of alphanumeric characters, '-', "
                        "'_' or '.', and must start and end with an alphanumeric character (at most 63 characters), "
                        "with an optional DNS subdomain prefix and '/'");
    }
    if (!it.value().is_string()) {
      return InvalidFor(t, name, "metadata.labels", "Invalid value: the value of " + key + " must be a string");
    }
    const std::string value = it.value().get<std::string>();
    if (value.size() > 63) {
      return InvalidFor(t, name, "metadata.labels", "Invalid value: \"" + value + "\": must be no more than 63 characters");
    }
    if (!IsLabelValue(value)) {
      return InvalidFor(t, name, "metadata.labels",
                        "Invalid value: \"" + value + "\": a valid label must be an empty string or consist of "
                        "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                        "character");
    }
  }
  return std::nullopt;
}

// obj[key], or null (without inserting it).
json FieldOf(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? json() : *it;
}

// core/v1 Secret, as the real server treats it (pkg/apis/core/validation
// ValidateSecret and the registry's strategy): `stringData` is write-only,
// merged over `data` (base64-encoded) and dropped; `data` values must be
// base64 (the JSON of a []byte field) and keys valid config keys; the total
// is at most 1 MiB; `type` defaults to Opaque and never changes; with
// `immutable: true`, neither the data nor `immutable` may change any more.
// `stored` is the object being updated, or null on create.
std::optional<ApiResponse> PrepareSecret(const RequestTarget& t, const std::string& name, json* obj,
                                         const json* stored) {
  if (obj->contains("stringData")) {
    const json& sd = (*obj)["stringData"];
    if (!sd.is_null() && !sd.is_object()) return InvalidFor(t, name, "stringData", "Invalid value: must be an object");
    if (sd.is_object()) {
      if (!(*obj)["data"].is_object()) (*obj)["data"] = json::object();
      for (auto it = sd.begin(); it != sd.end(); ++it) {
        if (it.value().is_null()) {  // a Go string: "" when null
          (*obj)["data"][it.key()] = "";
          continue;
        }
        if (!it.value().is_string()) {
          return ErrorResponse(400, "BadRequest", "json: cannot unmarshal " + std::string(it.value().type_name()) +
                                                      " into Go struct field Secret.stringData of type string");
        }
        (*obj)["data"][it.key()] = Base64Encode(it.value().get<std::string>());
      }
    }
    obj->erase("stringData");
  }
  uint64_t total = 0;
  if (obj->contains("data") && !(*obj)["data"].is_null()) {
    const json& data = (*obj)["data"];
    if (!data.is_object()) return InvalidFor(t, name, "data", "Invalid value: must be an object");
    json canonical = json::object();
    for (auto it = data.begin(); it != data.end(); ++it) {
      const std::string& key = it.key();
      const bool key_ok = !key.empty() && key.size() <= 253 && key != "." && key.rfind("..", 0) != 0 &&
                          std::all_of(key.begin(), key.end(), [](unsigned char c) {
                            return std::isalnum(c) || c == '-' || c == '_' || c == '.';
                          });
      if (!key_ok) {
        return InvalidFor(t, name, "data[" + key + "]",
                          "Invalid value: \"" + key +
                              "\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'");
      }
      // A []byte in Go's JSON: standard base64 with padding, nothing else
      // (no line breaks); null is empty.
      std::optional<std::string> bytes;
      if (it.value().is_null()) {
        bytes = std::string();
      } else if (it.value().is_string()) {
        const std::string& text = it.value().get_ref<const std::string&>();
        const size_t body = text.find_last_not_of('=') + 1;
        const bool strict = text.size() % 4 == 0 && text.size() - (text.empty() ? 0 : body) <= 2 &&
                            std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(text.empty() ? 0 : body),
                                        [](unsigned char c) { return std::isalnum(c) || c == '+' || c == '/'; });
        if (strict) bytes = Base64Decode(text);
      }
      if (!bytes) {
        // The value itself is never echoed: it is a secret.
        return ErrorResponse(400, "BadRequest", "json: illegal base64 data in Secret.data[" + key + "]");
      }
      total += bytes->size();
      canonical[key] = Base64Encode(*bytes);
    }
    (*obj)["data"] = std::move(canonical);
  }
  if (total > (1u << 20)) return InvalidFor(t, name, "data", "Too long: must have at most 1048576 bytes");
  if (!(*obj)["type"].is_null() && !(*obj)["type"].is_string()) {
    return ErrorResponse(400, "BadRequest", "json: cannot unmarshal " + std::string((*obj)["type"].type_name()) +
                                                " into Go struct field Secret.type of type v1.SecretType");
  }
  if ((*obj)["type"].is_null() || (*obj)["type"].get<std::string>().empty()) (*obj)["type"] = "Opaque";
  if (stored != nullptr) {
    if (FieldOf(*stored, "type") != (*obj)["type"]) {
      return InvalidFor(t, name, "type", "Invalid value: " + (*obj)["type"].dump() + ": field is immutable");
    }
    if (FieldOf(*stored, "immutable") == true) {
      if (FieldOf(*obj, "immutable") != true) {
        return InvalidFor(t, name, "immutable", "Forbidden: field is immutable when `immutable` is set");
      }
      if (FieldOf(*obj, "data") != FieldOf(*stored, "data")) {
        return InvalidFor(t, name, "data", "Forbidden: field is immutable when `immutable` is set");
      }
    }
  }
  return std::nullopt;
}

// Defaults, then validates, a custom resource against its CRD version's
// openAPIV3Schema (schema.h), as apiextensions-apiserver does on create and
// update: a main-resource write checks everything but metadata (and status,
// when status is a subresource: it is kept from storage); a /status write
// checks status only. nullopt: valid, and `*obj` carries the defaults;
// otherwise a 422 Invalid Status listing every cause.
std::optional<ApiResponse> CheckSchema(const RequestTarget& t, const std::string& name, json* obj) {
  auto it = t.type.schemas.find(t.version);
  if (it == t.type.schemas.end()) return std::nullopt;
  std::vector<SchemaError> errors;
  if (t.status) {
    const json& root = it->second;
    if (!root.contains("properties") || !root["properties"].is_object() ||
        !root["properties"].contains("status") || !obj->contains("status")) {
      return std::nullopt;
    }
    const json& schema = root["properties"]["status"];
    ApplyDefaults(schema, (*obj)["status"]);
    errors = Validate(schema, (*obj)["status"], "status");
  } else {
    json schema = it->second;
    if (schema.contains("properties") && schema["properties"].is_object()) {
      // metadata is validated by the server's own rules, not by the schema.
      schema["properties"].erase("metadata");
      if (t.type.has_status) schema["properties"].erase("status");
    }
    if (t.type.has_status && schema.contains("required") && schema["required"].is_array()) {
      json& required = schema["required"];
      required.erase(std::remove(required.begin(), required.end(), json("status")),
                     required.end());
    }
    ApplyDefaults(schema, *obj);
    errors = Validate(schema, *obj, "");
  }
  if (errors.empty()) return std::nullopt;
  json causes = json::array();
  std::string list;
  for (const SchemaError& e : errors) {
    causes.push_back({{"reason", e.reason}, {"message", e.message}, {"field", e.field}});
    list += (list.empty() ? "" : ", ") + e.field + ": " + e.message;
  }
  // As errors.NewInvalid prints a field.ErrorList: one error bare, several in [].
  if (errors.size() > 1) list = "[" + list + "]";
  std::string qualified_kind = t.type.kind + (t.type.group.empty() ? "" : "." + t.type.group);
  json details = {{"name", name}, {"group", t.type.group}, {"kind", t.type.kind},
                  {"causes", causes}};
  return ErrorResponse(422, "Invalid", qualified_kind + " \"" + name + "\" is invalid: " + list,
                       details);
}

ApiResponse PageNotFound() {
  return ErrorResponse(404, "NotFound", "the server could not find the requested resource",
                       json::object());
}

const char kModified[] =
    "the object has been modified; please apply your changes to the latest version and try again";

}  // namespace

ObjectStore::ObjectStore(size_t history_limit) : history_limit_(history_limit) {
  // A real cluster starts with these namespaces; controllers assume "default".
  RequestTarget ns_target;
  ns_target.type = *registry_.FindByKey("/namespaces");
  ns_target.version = "v1";
  for (const char* name : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    (void)CreateLocked(ns_target, {{"metadata", {{"name", name}}}});
  }
}

std::optional<RequestTarget> ObjectStore::Resolve(const std::string& path,
                                                  ApiResponse* error) const {
  std::vector<std::string> seg;
  size_t start = 0;
  std::string p = path.substr(0, path.find('?'));
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    if (slash == std::string::npos) slash = p.size();
    if (slash > start) seg.push_back(p.substr(start, slash - start));
    start = slash + 1;
  }
  *error = PageNotFound();
  std::string group;
  std::string version;
  size_t rest;
  if (seg.size() >= 2 && seg[0] == "api") {
    version = seg[1];
    rest = 2;
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    group = seg[1];
    version = seg[2];
    rest = 3;
  } else {
    return std::nullopt;
  }
  std::vector<std::string> r(seg.begin() + static_cast<long>(rest), seg.end());
  std::lock_guard<std::mutex> lock(mu_);
  RequestTarget t;
  t.version = version;
  std::string sub;
  const ResourceType* type = nullptr;
  if (r.size() >= 3 && r.size() <= 5 && r[0] == "namespaces" &&
      (type = registry_.Find(group, version, r[2])) != nullptr && type->namespaced) {
    t.ns = r[1];
    if (r.size() >= 4) t.name = r[3];
    if (r.size() == 5) sub = r[4];
  } else if (r.size() >= 1 && r.size() <= 3 &&
             (type = registry_.Find(group, version, r[0])) != nullptr) {
    if (r.size() >= 2) {
      if (type->namespaced) return std::nullopt;  // a namespaced object needs its namespace
      t.name = r[1];
    }
    if (r.size() == 3) sub = r[2];
  } else {
    return std::nullopt;
  }
  t.type = *type;
  if (!sub.empty()) {
    if (sub != "status" || !type->has_status) return std::nullopt;
    t.status = true;
  }
  return t;
}

ApiResponse ObjectStore::CheckTypeMeta(const RequestTarget& t, json* obj) const {
  std::string want_api = t.type.ApiVersion(t.version);
  std::string api = Str(*obj, "apiVersion");
  std::string kind = Str(*obj, "kind");
  if (!api.empty() && api != want_api) {
    return ErrorResponse(400, "BadRequest",
                         "the API version in the data (" + api +
                             ") does not match the expected API version (" + want_api + ")");
  }
  if (!kind.empty() && kind != t.type.kind) {
    return ErrorResponse(400, "BadRequest",
                         "the kind in the data (" + kind + ") does not match the expected kind (" +
                             t.type.kind + ")");
  }
  // A body without kind/apiVersion decodes with the URL's defaults, as on a real server.
  (*obj)["apiVersion"] = want_api;
  (*obj)["kind"] = t.type.kind;
  std::string ns = Str(MetaOf(*obj), "namespace");
  if (t.type.namespaced && !ns.empty() && ns != t.ns) {
    return ErrorResponse(400, "BadRequest",
                         "the namespace of the provided object does not match the namespace sent "
                         "on the request");
  }
  return {200, nullptr};
}

json ObjectStore::Output(const RequestTarget& t, json obj) const {
  // Conversion strategy None: every served version has the same shape.
  obj["apiVersion"] = t.type.ApiVersion(t.version);
  return obj;
}

void ObjectStore::Record(const std::string& type_key, const std::string& type, const json& object,
                         const json& old) {
  history_.push_back({rv_, type_key, type, object, old});
  while (history_.size() > history_limit_) {
    oldest_valid_rv_ = history_.front().rv;
    history_.pop_front();
  }
  cv_.notify_all();
}

ApiResponse ObjectStore::Create(const RequestTarget& target, const std::string& body) {
  if (!target.name.empty() || target.status) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the "
                         "requested resource");
  }
  if (target.type.namespaced && target.ns.empty()) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the "
                         "requested resource");
  }
  json obj = json::parse(body, nullptr, false);
  if (obj.is_discarded() || !obj.is_object()) {
    return ErrorResponse(400, "BadRequest", "the request body is not a JSON object");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return CreateLocked(target, std::move(obj));
}

ApiResponse ObjectStore::CreateLocked(const RequestTarget& t, json obj) {
  ApiResponse check = CheckTypeMeta(t, &obj);
  if (!check.ok()) return check;
  json& md = Meta(obj);
  if (!Str(md, "resourceVersion").empty()) {
    return ErrorResponse(400, "BadRequest",
                         "resourceVersion should not be set on objects to be "
                         "created");
  }
  if (t.type.namespaced) {
    md["namespace"] = t.ns;
    auto& namespaces = objects_["/namespaces"];
    auto ns_it = namespaces.find(ObjectKey("", t.ns));
    if (ns_it == namespaces.end()) {
      return ErrorResponse(404, "NotFound", "namespaces \"" + t.ns + "\" not found",
                           {{"name", t.ns}, {"kind", "namespaces"}});
    }
    if (MetaOf(ns_it->second).contains("deletionTimestamp")) {
      return ErrorResponse(403, "Forbidden",
                           t.type.QualifiedName() + " \"" + Str(md, "name") +
                               "\" is forbidden: unable to create new content in namespace " +
                               t.ns + " because it is being terminated");
    }
  } else {
    md.erase("namespace");
  }
  ObjectMap& objects = objects_[t.type.Key()];
  std::string name = Str(md, "name");
  if (name.empty()) {
    std::string prefix = Str(md, "generateName");
    if (prefix.empty()) {
      return InvalidFor(t, "", "metadata.name", "Required value: name or generateName is required");
    }
    do {
      name = prefix + RandomSuffix();
    } while (objects.count(ObjectKey(t.ns, name)) > 0);
    md["name"] = name;
  }
  // Validated before the name is looked up: a real server answers 422
  // before it would answer 409.
  if (std::optional<ApiResponse> invalid = ValidateMeta(t, name, md)) return *invalid;
  std::string key = ObjectKey(t.type.namespaced ? t.ns : "", name);
  if (objects.count(key) > 0) {
    return ErrorResponse(409, "AlreadyExists",
                         t.type.QualifiedName() + " \"" + name + "\" already exists",
                         Details(t, name));
  }
  std::optional<ResourceType> crd_type;
  if (t.type.Key() == "apiextensions.k8s.io/customresourcedefinitions") {
    std::string why;
    crd_type = ResourceTypeFromCrd(obj, &why);
    if (!crd_type) return InvalidFor(t, name, "spec", why);
    if (name != crd_type->plural + "." + crd_type->group) {
      return InvalidFor(
          t, name, "metadata.name",
          "Invalid value: \"" + name + "\": must be spec.names.plural+\".\"" + "+spec.group");
    }
  }
  // Server-owned fields: whatever the client sent is replaced (rest.BeforeCreate).
  md.erase("deletionTimestamp");
  md.erase("deletionGracePeriodSeconds");
  md["uid"] = NewUid();
  md["creationTimestamp"] = NowRfc3339();
  if (t.type.has_generation) {
    md["generation"] = 1;
  } else {
    md.erase("generation");
  }
  if (t.type.has_status) obj.erase("status");  // status is written through /status only
  if (!t.type.builtin) {
    if (std::optional<ApiResponse> invalid = CheckSchema(t, name, &obj)) return *invalid;
  }
  if (t.type.Key() == "/secrets") {
    if (std::optional<ApiResponse> invalid = PrepareSecret(t, name, &obj, nullptr)) return *invalid;
  }
  if (t.type.Key() == "/pods") obj["status"] = {{"phase", "Pending"}};
  if (t.type.Key() == "/namespaces") obj["status"] = {{"phase", "Active"}};
  if (crd_type) {
    // No CRD controller runs here: the names are accepted and established at once.
    obj["status"] = {
        {"acceptedNames", obj["spec"]["names"]},
        {"storedVersions", json::array({crd_type->versions.front()})},
        {"conditions",
         json::array(
             {{{"type", "NamesAccepted"}, {"status", "True"}, {"reason", "NoConflicts"}},
              {{"type", "Established"}, {"status", "True"}, {"reason", "InitialNamesAccepted"}}})}};
    registry_.Add(*crd_type);
  }
  md["resourceVersion"] = std::to_string(NextRv());
  objects[key] = obj;
  Record(t.type.Key(), "ADDED", obj, nullptr);
  return {201, Output(t, obj)};
}

ApiResponse ObjectStore::Get(const RequestTarget& t) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto type_it = objects_.find(t.type.Key());
  if (type_it != objects_.end()) {
    auto it = type_it->second.find(ObjectKey(t.ns, t.name));
    if (it != type_it->second.end()) return {200, Output(t, it->second)};
  }
  return NotFoundFor(t, t.name);
}

ApiResponse ObjectStore::List(const RequestTarget& t, const ListOptions& options) const {
  std::string why;
  std::optional<LabelSelector> labels = LabelSelector::Parse(options.label_selector, &why);
  if (!labels) return ErrorResponse(400, "BadRequest", why);
  std::optional<FieldSelector> fields = FieldSelector::Parse(options.field_selector, &why);
  if (!fields) return ErrorResponse(400, "BadRequest", why);
  if (options.limit < 0) return ErrorResponse(400, "BadRequest", "limit must not be negative");

  std::lock_guard<std::mutex> lock(mu_);
  uint64_t list_rv = rv_;
  std::string start_after;
  ObjectMap snapshot;
  auto type_it = objects_.find(t.type.Key());
  if (type_it != objects_.end()) snapshot = type_it->second;
  if (!options.continue_token.empty()) {
    std::optional<std::string> decoded = Base64Decode(options.continue_token);
    json token = decoded ? json::parse(*decoded, nullptr, false) : json();
    if (token.is_discarded() || !token.is_object() || !token.contains("rv") ||
        !token["rv"].is_number_unsigned() || Str(token, "start").empty()) {
      return ErrorResponse(400, "BadRequest", "continue key is not valid: malformed token");
    }
    list_rv = token["rv"].get<uint64_t>();
    start_after = Str(token, "start");
    if (list_rv < oldest_valid_rv_ || list_rv > rv_) {
      return ErrorResponse(410, "Expired", kContinueTooOld);
    }
    // A consistent snapshot at the token's RV, as etcd serves it: undo the
    // later writes, newest first.
    for (auto it = history_.rbegin(); it != history_.rend() && it->rv > list_rv; ++it) {
      if (it->type_key != t.type.Key()) continue;
      if (it->type == "ADDED") {
        snapshot.erase(ObjectKeyOf(it->object));
      } else {
        snapshot[ObjectKeyOf(it->old)] = it->old;
      }
    }
  }
  json items = json::array();
  std::string last_key;
  bool more = false;
  for (auto it = start_after.empty() ? snapshot.begin() : snapshot.upper_bound(start_after);
       it != snapshot.end(); ++it) {
    const json& obj = it->second;
    if (t.type.namespaced && !t.ns.empty() && Str(MetaOf(obj), "namespace") != t.ns) continue;
    if (!labels->Matches(obj) || !fields->Matches(obj)) continue;
    if (options.limit > 0 && static_cast<int64_t>(items.size()) == options.limit) {
      more = true;
      break;
    }
    json item = Output(t, obj);
    if (t.type.builtin) {
      // Typed lists encode items without TypeMeta on a real server.
      item.erase("kind");
      item.erase("apiVersion");
    }
    items.push_back(std::move(item));
    last_key = it->first;
  }
  json md = {{"resourceVersion", std::to_string(list_rv)}};
  if (more) {
    json token = {{"v", "meta.k8s.io/v1"}, {"rv", list_rv}, {"start", last_key}};
    md["continue"] = Base64Encode(token.dump());
  }
  return {200,
          {{"kind", t.type.kind + "List"},
           {"apiVersion", t.type.ApiVersion(t.version)},
           {"metadata", md},
           {"items", std::move(items)}}};
}

ApiResponse ObjectStore::Update(const RequestTarget& t, const std::string& body) {
  if (t.name.empty()) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the requested resource");
  }
  json obj = json::parse(body, nullptr, false);
  if (obj.is_discarded() || !obj.is_object()) {
    return ErrorResponse(400, "BadRequest", "the request body is not a JSON object");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return UpdateLocked(t, std::move(obj));
}

ApiResponse ObjectStore::UpdateLocked(const RequestTarget& t, json obj) {
  ApiResponse check = CheckTypeMeta(t, &obj);
  if (!check.ok()) return check;
  json& md = Meta(obj);
  if (Str(md, "name") != t.name) {
    return ErrorResponse(400, "BadRequest",
                         "the name of the object (" + Str(md, "name") +
                             ") does not match the name on the URL (" + t.name + ")");
  }
  ObjectMap& objects = objects_[t.type.Key()];
  std::string key = ObjectKey(t.ns, t.name);
  auto it = objects.find(key);
  if (it == objects.end()) {
    if (t.type.allow_create_on_update && !t.status) {
      md.erase("resourceVersion");
      return CreateLocked(t, std::move(obj));
    }
    return NotFoundFor(t, t.name);
  }
  const json& stored = it->second;
  const json& stored_md = MetaOf(stored);
  std::string rv = Str(md, "resourceVersion");
  if (!rv.empty() && rv != Str(stored_md, "resourceVersion"))
    return ConflictFor(t, t.name, kModified);

  json updated;
  if (t.status) {
    // statusStrategy.PrepareForUpdate: everything but status comes from the stored object.
    updated = stored;
    if (obj.contains("status")) {
      updated["status"] = obj["status"];
    } else {
      updated.erase("status");
    }
  } else {
    updated = std::move(obj);
    json& umd = Meta(updated);
    for (const char* field : {"uid", "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds", "generation", "namespace"}) {
      if (stored_md.contains(field)) {
        umd[field] = stored_md[field];
      } else {
        umd.erase(field);
      }
    }
    if (t.type.has_status) {
      if (stored.contains("status")) {
        updated["status"] = stored["status"];
      } else {
        updated.erase("status");
      }
    }
    if (stored_md.contains("deletionTimestamp")) {
      // A terminating object may lose finalizers but never gain one.
      const json& old_f =
          stored_md.contains("finalizers") ? stored_md["finalizers"] : json::array();
      if (umd.contains("finalizers") && umd["finalizers"].is_array()) {
        for (const json& f : umd["finalizers"]) {
          if (std::find(old_f.begin(), old_f.end(), f) == old_f.end()) {
            return InvalidFor(t, t.name, "metadata.finalizers",
                              "Forbidden: no new finalizers can be added if the object is being "
                              "deleted, found new finalizers " +
                                  f.dump());
          }
        }
      }
    }
  }
  if (!t.status) {
    if (std::optional<ApiResponse> invalid = ValidateMeta(t, t.name, MetaOf(updated))) return *invalid;
  }
  if (!t.type.builtin) {
    if (std::optional<ApiResponse> invalid = CheckSchema(t, t.name, &updated)) return *invalid;
  }
  if (t.type.Key() == "/secrets") {
    if (std::optional<ApiResponse> invalid = PrepareSecret(t, t.name, &updated, &stored)) return *invalid;
  }
  std::optional<ResourceType> crd_type;
  if (t.type.Key() == "apiextensions.k8s.io/customresourcedefinitions" && !t.status) {
    std::string why;
    crd_type = ResourceTypeFromCrd(updated, &why);
    if (!crd_type) return InvalidFor(t, t.name, "spec", why);
    if (t.name != crd_type->plural + "." + crd_type->group) {
      return InvalidFor(t, t.name, "metadata.name", "Invalid value: must match spec");
    }
  }
  json& umd = Meta(updated);
  umd["resourceVersion"] = stored_md["resourceVersion"];
  if (t.type.has_generation && GenerationContent(updated, t.type.has_status) !=
                                   GenerationContent(stored, t.type.has_status)) {
    umd["generation"] = stored_md.value("generation", int64_t{0}) + 1;
  }
  if (updated == stored) return {200, Output(t, stored)};  // a no-op write changes nothing
  if (crd_type) registry_.Add(*crd_type);
  if (umd.contains("deletionTimestamp") && !HasFinalizers(updated)) {
    return RemoveLocked(t, key, std::move(updated));
  }
  umd["resourceVersion"] = std::to_string(NextRv());
  json old = stored;
  it->second = updated;
  Record(t.type.Key(), "MODIFIED", updated, old);
  return {200, Output(t, updated)};
}

ApiResponse ObjectStore::RemoveLocked(const RequestTarget& t, const std::string& key, json obj) {
  ObjectMap& objects = objects_[t.type.Key()];
  json old = objects[key];
  objects.erase(key);
  if (t.type.Key() == "apiextensions.k8s.io/customresourcedefinitions") {
    // Simplification: a real server finalizes CRs first; here they vanish with DELETED events.
    std::string why;
    if (std::optional<ResourceType> cr = ResourceTypeFromCrd(old, &why)) {
      for (auto& [cr_key, cr_obj] : objects_[cr->Key()]) {
        json gone = cr_obj;
        Meta(gone)["resourceVersion"] = std::to_string(NextRv());
        Record(cr->Key(), "DELETED", gone, cr_obj);
      }
      objects_.erase(cr->Key());
      registry_.Remove(cr->Key());
    }
  }
  if (t.type.Key() == "/namespaces") {
    // Simplification: no namespace controller; contents go at once, finalizers ignored.
    std::string ns = Str(MetaOf(old), "name");
    for (auto& [type_key, map] : objects_) {
      const ResourceType* type = registry_.FindByKey(type_key);
      if (type == nullptr || !type->namespaced) continue;
      for (auto obj_it = map.begin(); obj_it != map.end();) {
        if (Str(MetaOf(obj_it->second), "namespace") != ns) {
          ++obj_it;
          continue;
        }
        json gone = obj_it->second;
        Meta(gone)["resourceVersion"] = std::to_string(NextRv());
        Record(type_key, "DELETED", gone, obj_it->second);
        obj_it = map.erase(obj_it);
      }
    }
  }
  Meta(obj)["resourceVersion"] = std::to_string(NextRv());
  Record(t.type.Key(), "DELETED", obj, old);
  return {200, Output(t, obj)};
}

ApiResponse ObjectStore::Patch(const RequestTarget& t, const std::string& content_type,
                               const std::string& body) {
  std::string media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && media.back() == ' ') media.pop_back();
  // As on a real server, strategic merge patch exists only for built-in
  // kinds: a custom resource has no Go struct carrying patch merge keys.
  bool merge = media == "application/merge-patch+json";
  bool strategic = media == "application/strategic-merge-patch+json" && t.type.builtin;
  bool json_patch = media == "application/json-patch+json";
  if (!merge && !strategic && !json_patch) {
    return ErrorResponse(
        415, "UnsupportedMediaType",
        std::string("the body of the request was in an unknown format - accepted media types "
                    "include: application/json-patch+json, application/merge-patch+json") +
            (t.type.builtin ? ", application/strategic-merge-patch+json" : ""));
  }
  if (t.name.empty()) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the requested resource");
  }
  json patch = json::parse(body, nullptr, false);
  if (json_patch ? (patch.is_discarded() || !patch.is_array())
                 : (patch.is_discarded() || !patch.is_object())) {
    return ErrorResponse(400, "BadRequest",
                         json_patch ? "the request body is not a JSON patch array"
                                    : "the request body is not a JSON merge patch object");
  }
  std::lock_guard<std::mutex> lock(mu_);
  ObjectMap& objects = objects_[t.type.Key()];
  auto it = objects.find(ObjectKey(t.ns, t.name));
  if (it == objects.end()) return NotFoundFor(t, t.name);
  // A resourceVersion inside the patch becomes a precondition; without one
  // the patch applies to whatever is stored.
  json patched;
  if (merge) {
    patched = ApplyMergePatch(Output(t, it->second), patch);
  } else if (strategic) {
    patched = ApplyStrategicMergePatch(Output(t, it->second), patch);
  } else {
    patched = Output(t, it->second);
    std::string error;
    if (!ApplyJsonPatch(&patched, patch, &error)) {
      // A real server answers a failed `test` or a missing path as 422.
      return ErrorResponse(422, "Invalid", "the JSON patch could not be applied: " + error);
    }
  }
  return UpdateLocked(t, std::move(patched));
}

ApiResponse ObjectStore::Delete(const RequestTarget& t, const std::string& body) {
  if (t.name.empty() || t.status) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the requested resource");
  }
  json options = body.empty() ? json::object() : json::parse(body, nullptr, false);
  if (options.is_discarded() || !options.is_object()) {
    return ErrorResponse(400, "BadRequest", "the request body is not valid DeleteOptions");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return DeleteLocked(t, options);
}

ApiResponse ObjectStore::DeleteLocked(const RequestTarget& t, const json& options) {
  ObjectMap& objects = objects_[t.type.Key()];
  std::string key = ObjectKey(t.ns, t.name);
  auto it = objects.find(key);
  if (it == objects.end()) return NotFoundFor(t, t.name);
  const json& md = MetaOf(it->second);
  if (options.contains("preconditions") && options["preconditions"].is_object()) {
    const json& pre = options["preconditions"];
    std::string uid = Str(pre, "uid");
    std::string rv = Str(pre, "resourceVersion");
    if (!uid.empty() && uid != Str(md, "uid")) {
      return ConflictFor(t, t.name,
                         "Precondition failed: UID in precondition: " + uid +
                             ", UID in object meta: " + Str(md, "uid"));
    }
    if (!rv.empty() && rv != Str(md, "resourceVersion")) {
      return ConflictFor(t, t.name,
                         "Precondition failed: ResourceVersion in precondition: " + rv +
                             ", ResourceVersion in object meta: " + Str(md, "resourceVersion"));
    }
  }
  if (!HasFinalizers(it->second)) return RemoveLocked(t, key, it->second);
  // Finalizers pending: the object stays, marked; 202 says "not deleted yet".
  if (md.contains("deletionTimestamp")) return {202, Output(t, it->second)};
  json old = it->second;
  json& umd = Meta(it->second);
  umd["deletionTimestamp"] = NowRfc3339();
  umd["deletionGracePeriodSeconds"] = 0;
  if (t.type.has_generation) umd["generation"] = umd.value("generation", int64_t{0}) + 1;
  umd["resourceVersion"] = std::to_string(NextRv());
  Record(t.type.Key(), "MODIFIED", it->second, old);
  return {202, Output(t, it->second)};
}

ApiResponse ObjectStore::DeleteCollection(const RequestTarget& t, const ListOptions& list, const std::string& body) {
  if (!t.name.empty() || t.status) {
    return ErrorResponse(405, "MethodNotAllowed",
                         "the server does not allow this method on the requested resource");
  }
  json options = body.empty() ? json::object() : json::parse(body, nullptr, false);
  if (options.is_discarded() || !options.is_object()) {
    return ErrorResponse(400, "BadRequest", "the request body is not valid DeleteOptions");
  }
  std::string why;
  std::optional<LabelSelector> labels = LabelSelector::Parse(list.label_selector, &why);
  if (!labels) return ErrorResponse(400, "BadRequest", why);
  std::optional<FieldSelector> fields = FieldSelector::Parse(list.field_selector, &why);
  if (!fields) return ErrorResponse(400, "BadRequest", why);
  std::lock_guard<std::mutex> lock(mu_);
  // As the registry does: list what matches, then delete each (finalizers
  // and all); the answer is the list of what was deleted or marked.
  std::vector<std::pair<std::string, std::string>> matched;  // (namespace, name)
  for (const auto& [key, obj] : objects_[t.type.Key()]) {
    const json& md = MetaOf(obj);
    if (t.type.namespaced && !t.ns.empty() && Str(md, "namespace") != t.ns) continue;
    if (labels->Matches(obj) && fields->Matches(obj)) matched.emplace_back(Str(md, "namespace"), Str(md, "name"));
  }
  json items = json::array();
  for (const auto& [ns, name] : matched) {
    RequestTarget one = t;
    one.ns = ns;
    one.name = name;
    ApiResponse r = DeleteLocked(one, options);
    if (!r.ok()) return r;
    items.push_back(r.body);
  }
  json out = {{"kind", t.type.kind + "List"},
              {"apiVersion", t.type.ApiVersion(t.version)},
              {"metadata", {{"resourceVersion", std::to_string(rv_)}}},
              {"items", items}};
  return {200, out};
}

json ObjectStore::ExpiredWatchEvent(uint64_t rv) const {
  return {{"type", "ERROR"},
          {"object", StatusObject(410, "Expired",
                                  "too old resource version: " + std::to_string(rv) + " (" +
                                      std::to_string(oldest_valid_rv_ + 1) + ")")}};
}

std::optional<json> ObjectStore::FilterEvent(const WatchCursor& c, const Event& e) const {
  if (e.type_key != c.target.type.Key()) return std::nullopt;
  auto passes = [&](const json& obj) {
    if (obj.is_null()) return false;
    if (c.target.type.namespaced && !c.target.ns.empty() &&
        Str(MetaOf(obj), "namespace") != c.target.ns) {
      return false;
    }
    return c.labels.Matches(obj) && c.fields.Matches(obj);
  };
  bool cur = passes(e.object);
  bool old = e.type != "ADDED" && passes(e.old);
  std::string type;
  json obj = e.object;
  if (e.type == "DELETED") {
    if (!old) return std::nullopt;
    type = "DELETED";
  } else if (cur && old) {
    type = "MODIFIED";
  } else if (cur) {
    type = "ADDED";
  } else if (old) {
    // The object left the selection: the cacher reports its old state as DELETED.
    type = "DELETED";
    obj = e.old;
    Meta(obj)["resourceVersion"] = std::to_string(e.rv);
  } else {
    return std::nullopt;
  }
  return json{{"type", type}, {"object", Output(c.target, obj)}};
}

std::optional<WatchCursor> ObjectStore::BeginWatch(const RequestTarget& t,
                                                   const WatchOptions& options,
                                                   std::vector<json>* initial, ApiResponse* error) {
  std::string why;
  std::optional<LabelSelector> labels = LabelSelector::Parse(options.label_selector, &why);
  std::optional<FieldSelector> fields =
      labels ? FieldSelector::Parse(options.field_selector, &why) : std::nullopt;
  if (!labels || !fields) {
    *error = ErrorResponse(400, "BadRequest", why);
    return std::nullopt;
  }
  WatchCursor c{t, *labels, *fields, 0, 0};
  std::lock_guard<std::mutex> lock(mu_);
  c.close_generation = close_generation_;
  ++watches_begun_;  // counted once the cursor would be ended by CloseAllWatches()
  const std::string& rv_text = options.resource_version;
  if (rv_text.empty() || rv_text == "0") {
    c.rv = rv_;
    auto type_it = objects_.find(t.type.Key());
    if (type_it != objects_.end()) {
      for (const auto& [key, obj] : type_it->second) {
        std::optional<json> ev = FilterEvent(c, {rv_, t.type.Key(), "ADDED", obj, nullptr});
        if (ev) initial->push_back(std::move(*ev));
      }
    }
    return c;
  }
  bool ok;
  uint64_t rv = ParseRv(rv_text, &ok);
  if (!ok) {
    *error = ErrorResponse(400, "BadRequest", "invalid resource version: " + rv_text);
    return std::nullopt;
  }
  if (rv < oldest_valid_rv_) {
    // client-go's reflector expects the 410 inside the stream, then relists.
    initial->push_back(ExpiredWatchEvent(rv));
    return std::nullopt;
  }
  c.rv = rv;
  return c;
}

ObjectStore::WaitResult ObjectStore::WaitForEvents(WatchCursor* c,
                                                   std::chrono::steady_clock::time_point deadline,
                                                   std::vector<json>* events) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutdown_) return WaitResult::kShutdown;
    if (close_generation_ != c->close_generation) return WaitResult::kClosed;
    if (c->rv < oldest_valid_rv_) {
      events->push_back(ExpiredWatchEvent(c->rv));
      return WaitResult::kExpired;
    }
    if (rv_ > c->rv) {
      for (const Event& e : history_) {
        if (e.rv <= c->rv) continue;
        std::optional<json> ev = FilterEvent(*c, e);
        if (ev) events->push_back(std::move(*ev));
      }
      c->rv = rv_;
      if (!events->empty()) return WaitResult::kEvents;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      // Pick up what arrived with the timeout before reporting it.
      if (rv_ == c->rv || shutdown_ || close_generation_ != c->close_generation) {
        return WaitResult::kTimeout;
      }
    }
  }
}

json ObjectStore::Bookmark(const WatchCursor& c) const {
  return {{"type", "BOOKMARK"},
          {"object",
           {{"kind", c.target.type.kind},
            {"apiVersion", c.target.type.ApiVersion(c.target.version)},
            {"metadata", {{"resourceVersion", std::to_string(c.rv)}}}}}};
}

uint64_t ObjectStore::watches_begun() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watches_begun_;
}

void ObjectStore::CloseAllWatches() {
  std::lock_guard<std::mutex> lock(mu_);
  ++close_generation_;
  cv_.notify_all();
}

void ObjectStore::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
}

void ObjectStore::CompactHistory() {
  std::lock_guard<std::mutex> lock(mu_);
  history_.clear();
  oldest_valid_rv_ = rv_;
  cv_.notify_all();
}

std::map<std::string, ResourceType> ObjectStore::ResourceTypes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_.all();
}

std::string ObjectStore::CurrentResourceVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::to_string(rv_);
}

}  // namespace meshload::fakeapi
