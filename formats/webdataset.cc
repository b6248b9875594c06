#include "formats/webdataset.h"

#include <cctype>
#include <cstring>
#include <regex>

namespace meshload::formats {

bool SplitWebDatasetName(std::string_view name, std::string& key, std::string& extension) {
  // The pattern as webdataset and Energon write it, with the same
  // backtracking (a leading dot-free run may swallow slashes).
  static const std::regex pattern(R"(^((?:.*/|)[^.]+)[.]([^/]*)$)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(name.begin(), name.end(), m, pattern)) return false;
  key = m[1].str();
  extension = m[2].str();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return true;
}

bool IsWebDatasetMetadata(std::string_view name) {
  static const std::regex pattern(R"(^__[^/]*__($|/))");
  return std::regex_search(name.begin(), name.end(), pattern);
}

Status ShardSamples::Add(const TarMember& m) {
  if (!m.regular || IsWebDatasetMetadata(m.name)) return Status::Ok();
  std::string key, extension;
  if (!SplitWebDatasetName(m.name, key, extension)) return Status::Ok();
  if (samples_.empty() || samples_.back().key != key) {
    WebDatasetSample s;
    s.key = key;
    s.offset = m.offset;
    samples_.push_back(std::move(s));
  }
  auto [it, fresh] = samples_.back().fields.emplace(extension, WebDatasetField{m.data_offset, m.size});
  if (!fresh) {
    return InvalidArgument("sample '" + key + "' has the field '" + extension + "' twice (member '" + m.name + "')",
                           shard_ + "@" + std::to_string(m.offset));
  }
  return Status::Ok();
}

std::vector<uint64_t> ShardSamples::EnergonIndex(const std::vector<WebDatasetSample>& samples, uint64_t end_offset) {
  std::vector<uint64_t> out;
  out.reserve(samples.size() + 1);
  for (const WebDatasetSample& s : samples) out.push_back(s.offset);
  out.push_back(end_offset);
  return out;
}

Result<std::vector<uint64_t>> ParseEnergonTarIndex(std::string_view bytes, std::string_view name,
                                                   uint64_t shard_bytes) {
  auto at = [&](uint64_t offset) { return std::string(name) + "@" + std::to_string(offset); };
  if (bytes.size() % 8 != 0) {
    return InvalidArgument("an Energon index is 8-byte offsets; this one has " + std::to_string(bytes.size()) +
                               " bytes (a truncated index?)",
                           at(bytes.size() / 8 * 8));
  }
  if (bytes.empty()) return InvalidArgument("an Energon index has at least the shard's end offset", at(0));
  std::vector<uint64_t> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (i > 0 && out[i] < out[i - 1]) {
      return InvalidArgument(
          "offset " + std::to_string(out[i]) + " is below the one before it (" + std::to_string(out[i - 1]) + ")",
          at(8 * i));
    }
    if (out[i] > shard_bytes) {
      return InvalidArgument("offset " + std::to_string(out[i]) + " is past the end of the shard (" +
                                 std::to_string(shard_bytes) + " bytes): an index of another shard?",
                             at(8 * i));
    }
  }
  return out;
}

std::string EnergonTarIndexBytes(const std::vector<uint64_t>& offsets) {
  std::string out(offsets.size() * 8, '\0');
  if (!offsets.empty()) std::memcpy(out.data(), offsets.data(), out.size());
  return out;
}

}  // namespace meshload::formats
