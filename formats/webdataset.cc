#include "formats/webdataset.h"

#include <charconv>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <regex>

namespace meshload::formats {

std::vector<std::string> ExpandShardPattern(std::string_view pattern) {
  const size_t open = pattern.find('{');
  const size_t close = open == std::string_view::npos ? open : pattern.find('}', open);
  if (close == std::string_view::npos) return {std::string(pattern)};
  const std::string_view body = pattern.substr(open + 1, close - open - 1);
  std::vector<std::string> choices;
  const size_t dots = body.find("..");
  auto digits = [](std::string_view t) {
    return !t.empty() && t.size() <= 18 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (dots != std::string_view::npos && digits(body.substr(0, dots)) && digits(body.substr(dots + 2))) {
    const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    const int64_t from = std::stoll(std::string(a)), to = std::stoll(std::string(b));
    const size_t width = a.size() > 1 && a[0] == '0' ? a.size() : 0;
    for (int64_t i = from;; i += from <= to ? 1 : -1) {
      std::string n = std::to_string(i);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      choices.push_back(std::move(n));
      if (i == to) break;
    }
  } else if (body.find(',') != std::string_view::npos) {
    size_t start = 0;
    for (size_t comma; (comma = body.find(',', start)) != std::string_view::npos; start = comma + 1) {
      choices.emplace_back(body.substr(start, comma - start));
    }
    choices.emplace_back(body.substr(start));
  } else {
    // Not a group braceexpand expands: kept, and the rest expanded.
    std::vector<std::string> out;
    for (std::string& rest : ExpandShardPattern(pattern.substr(close + 1))) {
      out.push_back(std::string(pattern.substr(0, close + 1)) + rest);
    }
    return out;
  }
  std::vector<std::string> out;
  const std::vector<std::string> rests = ExpandShardPattern(pattern.substr(close + 1));
  for (const std::string& c : choices) {
    for (const std::string& rest : rests) out.push_back(std::string(pattern.substr(0, open)) + c + rest);
  }
  return out;
}

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

Result<std::vector<uint64_t>> ParseDaliTarIndex(std::string_view text, std::string_view name, uint64_t shard_bytes) {
  auto at = [&](size_t offset) { return std::string(name) + "@" + std::to_string(offset); };
  // Whitespace-separated tokens of one line, with where each starts.
  std::vector<std::pair<std::string_view, size_t>> tokens;
  auto split = [&](size_t begin, size_t end) {
    tokens.clear();
    size_t i = begin;
    while (i < end) {
      while (i < end && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) ++i;
      const size_t start = i;
      while (i < end && text[i] != ' ' && text[i] != '\t' && text[i] != '\r') ++i;
      if (i > start) tokens.emplace_back(text.substr(start, i - start), start);
    }
  };
  auto number = [](std::string_view t, uint64_t& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && p == t.data() + t.size();
  };
  size_t line_end = std::min(text.find('\n'), text.size());
  split(0, line_end);
  uint64_t samples = 0;
  if (tokens.size() != 2 || !number(tokens[1].first, samples)) {
    return InvalidArgument("not a DALI WebDataset index: the first line is not 'v1.2 SAMPLES'", at(0));
  }
  if (tokens[0].first != "v1.2") {
    return InvalidArgument("DALI index version '" + std::string(tokens[0].first) +
                               "'; meshload reads version v1.2 (DALI's tools/wds2idx.py writes it)",
                           at(0));
  }
  std::vector<uint64_t> out;
  out.reserve(samples + 1);
  uint64_t end = 0;  // where the previous sample's members end (padded to a block)
  size_t pos = line_end + 1;
  for (uint64_t i = 0; i < samples; ++i) {
    if (pos >= text.size()) {
      return InvalidArgument("the index says " + std::to_string(samples) + " samples but lists " + std::to_string(i) +
                                 " (a truncated index?)",
                             at(text.size()));
    }
    line_end = std::min(text.find('\n', pos), text.size());
    split(pos, line_end);
    if (tokens.empty() || tokens.size() % 4 != 0) {
      return InvalidArgument("sample " + std::to_string(i) + ": " + std::to_string(tokens.size()) +
                                 " fields where each member has 4 (extension, data offset, size, name)",
                             at(pos));
    }
    // The sample starts where the one before ended: its first member's
    // headers (PAX and GNU ones included) come after that.
    out.push_back(end);
    for (size_t k = 0; k < tokens.size(); k += 4) {
      uint64_t data = 0, size = 0;
      if (!number(tokens[k + 1].first, data) || !number(tokens[k + 2].first, size)) {
        return InvalidArgument("member '" + std::string(tokens[k + 3].first) + "': its offset or size is not a number",
                               at(tokens[k + 1].second));
      }
      if (data % kTarBlock != 0 || data < end + kTarBlock || size > shard_bytes || data > shard_bytes - size) {
        return InvalidArgument("member '" + std::string(tokens[k + 3].first) + "' at " + std::to_string(data) + " (" +
                                   std::to_string(size) +
                                   " bytes) is not a member's data after the one before it "
                                   "inside the shard (" +
                                   std::to_string(shard_bytes) + " bytes): an index of another shard?",
                               at(tokens[k + 1].second));
      }
      end = (data + size + kTarBlock - 1) / kTarBlock * kTarBlock;
    }
    pos = line_end + 1;
  }
  out.push_back(end);
  return out;
}

std::string EnergonTarIndexBytes(const std::vector<uint64_t>& offsets) {
  std::string out(offsets.size() * 8, '\0');
  if (!offsets.empty()) std::memcpy(out.data(), offsets.data(), out.size());
  return out;
}

}  // namespace meshload::formats
