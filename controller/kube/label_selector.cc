#include "controller/kube/label_selector.h"

#include <algorithm>
#include <optional>
#include <string>

#include "controller/kube/json_fields.h"

namespace meshload::controller::kube {

using nlohmann::json;

bool SelectorMatches(const planner::LabelSelector& selector, const StringMap& labels) {
  auto label = [&](const std::string& key) -> std::optional<std::string> {
    auto it = labels.find(key);
    if (it == labels.end()) return std::nullopt;
    return it->second;
  };
  for (const auto& [key, value] : selector.match_labels) {
    if (label(key) != value) return false;
  }
  for (const auto& e : selector.match_expressions) {
    auto v = label(e.key);
    const bool in = v && std::find(e.values.begin(), e.values.end(), *v) != e.values.end();
    if (e.op == "In" && !in) return false;
    if (e.op == "NotIn" && in) return false;
    if (e.op == "Exists" && !v) return false;
    if (e.op == "DoesNotExist" && v) return false;
    if (e.op != "In" && e.op != "NotIn" && e.op != "Exists" && e.op != "DoesNotExist") return false;
  }
  return true;
}

bool SelectorMatches(const json& selector, const StringMap& labels) {
  // The selector as the declaration types it (a value of the wrong type
  // matches nothing, as before).
  planner::LabelSelector typed;
  const json& ml = Field(selector, "matchLabels");
  if (ml.is_object()) {
    for (auto it = ml.begin(); it != ml.end(); ++it) {
      if (!it.value().is_string()) return false;
      typed.match_labels[it.key()] = it.value().get<std::string>();
    }
  }
  const json& me = Field(selector, "matchExpressions");
  if (me.is_array()) {
    for (const auto& e : me) {
      planner::LabelSelectorRequirement r{Str(e, "key"), Str(e, "operator"), {}};
      const json& values = Field(e, "values");
      if (values.is_array()) {
        for (const auto& x : values) {
          if (x.is_string()) r.values.push_back(x.get<std::string>());
        }
      }
      typed.match_expressions.push_back(std::move(r));
    }
  }
  return SelectorMatches(typed, labels);
}

}  // namespace meshload::controller::kube
