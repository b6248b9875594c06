/// \file
/// Reading Kubernetes objects as JSON without throwing: a member that is
/// missing or of another type reads as null (Field), "" (Str), 0 (Int) or
/// false (Bool), so a
/// malformed object from the API server or an admission request is handled
/// as absent, never as a crash.
///
///   const json& labels = Field(Field(pod, "metadata"), "labels");
///   std::string name = Str(Field(pod, "metadata"), "name");
///
/// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace meshload::controller::kube {

/// obj[key], or null when obj is not an object or has no such member.
inline const nlohmann::json& Field(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

/// obj[key] when it is a string, else "".
inline std::string Str(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = Field(obj, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

/// obj[key] when it is an integer, else 0.
inline int64_t Int(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = Field(obj, key);
  return v.is_number_integer() ? v.get<int64_t>() : 0;
}

/// obj[key] when it is a boolean, else false.
inline bool Bool(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = Field(obj, key);
  return v.is_boolean() && v.get<bool>();
}

}  // namespace meshload::controller::kube
