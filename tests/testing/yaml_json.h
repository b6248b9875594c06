/// \file
/// YAML -> JSON as kubectl converts a manifest: quoted scalars stay strings;
/// plain ones become null, booleans, integers or floats when they read as
/// such.
///
/// Thread safety: pure functions.
#pragma once

#include <vector>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>

namespace meshload::testing {

nlohmann::json YamlToJson(const YAML::Node& node);
/// Every document of a YAML file, skipping empty ones; throws
/// YAML::Exception on bad YAML.
std::vector<nlohmann::json> LoadYamlDocuments(const std::string& path);
/// The same for YAML text (e.g. what `helm template` printed).
std::vector<nlohmann::json> ParseYamlDocuments(const std::string& text);

}  // namespace meshload::testing
