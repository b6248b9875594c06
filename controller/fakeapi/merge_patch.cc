#include "controller/fakeapi/merge_patch.h"

namespace meshload::fakeapi {

nlohmann::json ApplyMergePatch(nlohmann::json target, const nlohmann::json& patch) {
  // nlohmann's merge_patch() implements RFC 7386 exactly; this wrapper keeps
  // the by-value contract that the store relies on (stored copy untouched).
  target.merge_patch(patch);
  return target;
}

}  // namespace meshload::fakeapi

namespace meshload::fakeapi {
namespace {

bool IsDirective(const std::string& key) { return !key.empty() && key[0] == '$'; }

// Merges `patch` into `target` per RFC 7386 while interpreting the strategic
// merge patch directives that change what a key means.
void StrategicMerge(nlohmann::json& target, const nlohmann::json& patch) {
  if (!patch.is_object()) {
    target = patch;
    return;
  }
  if (patch.contains("$patch") && patch["$patch"] == "replace") {
    target = nlohmann::json::object();
  } else if (!target.is_object()) {
    target = nlohmann::json::object();
  }
  for (const auto& [key, value] : patch.items()) {
    if (IsDirective(key)) continue;
    if (value.is_null()) {
      target.erase(key);
    } else if (value.is_object() && value.contains("$patch") && value["$patch"] == "delete") {
      target.erase(key);
    } else {
      StrategicMerge(target[key], value);
    }
  }
}

}  // namespace

nlohmann::json ApplyStrategicMergePatch(nlohmann::json target, const nlohmann::json& patch) {
  StrategicMerge(target, patch);
  return target;
}

bool ApplyJsonPatch(nlohmann::json* target, const nlohmann::json& patch, std::string* error) {
  if (!patch.is_array()) {
    *error = "a JSON patch must be an array of operations";
    return false;
  }
  // nlohmann's patch() implements RFC 6902 (test included) but reports
  // failures as exceptions; the server answers them as 422 instead.
  try {
    *target = target->patch(patch);
  } catch (const nlohmann::json::exception& e) {
    *error = e.what();
    return false;
  }
  return true;
}

}  // namespace meshload::fakeapi
