#include "formats/saved_dataset.h"

#include <nlohmann/json.hpp>

namespace meshload::formats {
namespace {

Result<nlohmann::json> ParseJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss("is not JSON");
  if (!j.is_object()) return DataLoss("is not a JSON object");
  return j;
}

}  // namespace

Result<std::vector<std::string>> SavedDatasetSplits(std::string_view dataset_dict_json) {
  MESHLOAD_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(dataset_dict_json));
  auto splits = j.find("splits");
  if (splits == j.end() || !splits->is_array()) return DataLoss("has no list \"splits\"", "splits");
  std::vector<std::string> out;
  for (size_t i = 0; i < splits->size(); ++i) {
    const nlohmann::json& s = (*splits)[i];
    const std::string at = "splits[" + std::to_string(i) + "]";
    if (!s.is_string()) return DataLoss("is not a split's name", at);
    const std::string name = s.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return DataLoss("'" + name + "' is not a split's folder name", at);
    }
    out.push_back(name);
  }
  return out;
}

Result<std::vector<std::string>> SavedDatasetFiles(std::string_view state_json) {
  MESHLOAD_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(state_json));
  auto files = j.find("_data_files");
  if (files == j.end() || !files->is_array()) return DataLoss("has no list \"_data_files\"", "_data_files");
  std::vector<std::string> out;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& f = (*files)[i];
    const std::string at = "_data_files[" + std::to_string(i) + "]";
    auto name = f.is_object() ? f.find("filename") : f.end();
    if (!f.is_object() || name == f.end() || !name->is_string()) return DataLoss("has no string \"filename\"", at);
    const std::string n = name->get<std::string>();
    if (n.empty() || n.find('/') != std::string::npos || n.find('\\') != std::string::npos || n == "." || n == "..") {
      return DataLoss("'" + n + "' is not a file of the dataset's folder", at + ".filename");
    }
    out.push_back(n);
  }
  if (out.empty()) return DataLoss("lists no file", "_data_files");
  return out;
}

}  // namespace meshload::formats
