#include "tests/testing/yaml_json.h"

#include <regex>

namespace meshload::testing {

nlohmann::json YamlToJson(const YAML::Node& node) {
  using nlohmann::json;
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = YamlToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(YamlToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      std::string s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted
      if (s == "true") return true;
      if (s == "false") return false;
      if (s == "null" || s == "~") return nullptr;
      static const std::regex kInt("^-?[0-9]+$");
      static const std::regex kFloat("^-?[0-9]*\\.[0-9]+([eE][-+]?[0-9]+)?$");
      if (std::regex_match(s, kInt)) return std::stoll(s);
      if (std::regex_match(s, kFloat)) return std::stod(s);
      return s;
    }
    default: return nullptr;
  }
}

namespace {
std::vector<nlohmann::json> Documents(const std::vector<YAML::Node>& docs) {
  std::vector<nlohmann::json> out;
  for (const auto& doc : docs) {
    if (doc.IsNull()) continue;
    out.push_back(YamlToJson(doc));
  }
  return out;
}
}  // namespace

std::vector<nlohmann::json> LoadYamlDocuments(const std::string& path) {
  return Documents(YAML::LoadAllFromFile(path));
}

std::vector<nlohmann::json> ParseYamlDocuments(const std::string& text) { return Documents(YAML::LoadAll(text)); }

}  // namespace meshload::testing
