/// \file
/// Label and field selectors as the Kubernetes API parses them from the
/// `labelSelector` and `fieldSelector` query parameters.
///
/// Label selectors: comma-separated requirements, all of which must hold:
/// `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a` (exists), `!a`
/// (does not exist). As on a real server, `a!=b` and `notin` also match
/// objects without the label.
/// Field selectors: `metadata.name` and `metadata.namespace` with `=`, `==`,
/// `!=`; any other field is rejected (a real server answers 400 for fields a
/// resource does not index, and a fake that accepted them would hide that).
///
/// Thread safety: selectors are immutable values after parsing.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace meshload::fakeapi {

class LabelSelector {
 public:
  /// nullopt with `*error` set when `text` is malformed. Empty text selects everything.
  static std::optional<LabelSelector> Parse(const std::string& text, std::string* error);
  bool Matches(const nlohmann::json& object) const;

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::set<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  static std::optional<FieldSelector> Parse(const std::string& text, std::string* error);
  bool Matches(const nlohmann::json& object) const;

 private:
  struct Requirement {
    std::string field;  // "metadata.name" or "metadata.namespace"
    bool equals;
    std::string value;
  };
  std::vector<Requirement> requirements_;
};

}  // namespace meshload::fakeapi
