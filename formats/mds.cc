#include "formats/mds.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace meshload::formats {
namespace {

using Json = nlohmann::json;

// streaming/base/format/mds/encodings.py's _encodings, with the fixed
// size of the scalar ones.
struct Known {
  std::string_view name;
  uint32_t scalar_size;  // 0: not a fixed-size scalar
};
constexpr Known kEncodings[] = {
    {"bytes", 0},      {"str", 0},       {"int", 8},        {"ndarray", 0},   {"uint8", 1},     {"uint16", 2},
    {"uint32", 4},     {"uint64", 8},    {"int8", 1},       {"int16", 2},     {"int32", 4},     {"int64", 8},
    {"float16", 2},    {"float32", 4},   {"float64", 8},    {"str_int", 0},   {"str_float", 0}, {"str_decimal", 0},
    {"pil", 0},        {"jpeg", 0},      {"jpeg_array", 0}, {"jpegarray", 0}, {"png", 0},       {"list[pil]", 0},
    {"list[jpeg]", 0}, {"list[png]", 0}, {"pkl", 0},        {"json", 0},
};

const Known* Find(std::string_view encoding) {
  const size_t colon = encoding.find(':');
  const std::string_view base = encoding.substr(0, colon);
  if (colon != std::string_view::npos && base != "ndarray") return nullptr;  // only ndarray takes a configuration
  for (const Known& k : kEncodings) {
    if (k.name == base) return &k;
  }
  return nullptr;
}

uint32_t LoadU32(std::string_view b, uint64_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

}  // namespace

bool IsMdsEncoding(std::string_view encoding) { return Find(encoding) != nullptr; }

std::optional<uint32_t> MdsScalarSize(std::string_view encoding) {
  const Known* k = Find(encoding);
  if (k == nullptr || k->scalar_size == 0) return std::nullopt;
  return k->scalar_size;
}

Result<std::vector<MdsShard>> ParseMdsIndex(std::string_view json, std::string_view name) {
  Json doc = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument("not JSON", std::string(name));
  auto error = [&](const std::string& path, const std::string& what) {
    return InvalidArgument(path + ": " + what, std::string(name));
  };
  if (!doc.is_object()) return error("(top)", "not a JSON object");
  if (!doc.contains("version") || doc["version"] != 2) {
    return error("version", "MDS index version " + (doc.contains("version") ? doc["version"].dump() : "(none)") +
                                "; version 2 is read");
  }
  if (!doc.contains("shards") || !doc["shards"].is_array()) return error("shards", "missing or not a list");
  std::vector<MdsShard> out;
  const Json& shards = doc["shards"];
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at = "shards[" + std::to_string(i) + "]";
    const Json& s = shards[i];
    if (!s.is_object()) return error(at, "not an object");
    auto str = [&](const char* key, std::string& v) -> Status {
      if (!s.contains(key) || !s[key].is_string()) return error(at + "." + key, "missing or not a string");
      v = s[key].get<std::string>();
      return Status::Ok();
    };
    std::string format;
    MESHLOAD_RETURN_IF_ERROR(str("format", format));
    if (format != "mds") {
      return error(at + ".format", "'" + format + "'; meshload reads MDS shards (xsv and json shards are not read)");
    }
    if (!s.contains("version") || s["version"] != 2) return error(at + ".version", "shard version is not 2");
    MdsShard shard;
    if (!s.contains("samples") || !s["samples"].is_number_unsigned()) {
      return error(at + ".samples", "missing or not a count");
    }
    shard.samples = s["samples"].get<uint64_t>();
    for (const char* key : {"column_names", "column_encodings", "column_sizes"}) {
      if (!s.contains(key) || !s[key].is_array()) return error(at + "." + key, "missing or not a list");
    }
    const Json &names = s["column_names"], &encodings = s["column_encodings"], &sizes = s["column_sizes"];
    if (names.size() != encodings.size() || names.size() != sizes.size()) {
      return error(at, "column_names, column_encodings and column_sizes differ in length (" +
                           std::to_string(names.size()) + ", " + std::to_string(encodings.size()) + ", " +
                           std::to_string(sizes.size()) + ")");
    }
    if (names.empty()) return error(at + ".column_names", "no columns");
    for (size_t c = 0; c < names.size(); ++c) {
      const std::string cat = "[" + std::to_string(c) + "]";
      if (!names[c].is_string()) return error(at + ".column_names" + cat, "not a string");
      if (!encodings[c].is_string()) return error(at + ".column_encodings" + cat, "not a string");
      MdsColumn col;
      col.name = names[c].get<std::string>();
      col.encoding = encodings[c].get<std::string>();
      if (!IsMdsEncoding(col.encoding)) {
        std::string known;
        for (const Known& k : kEncodings) known += (known.empty() ? "" : ", ") + std::string(k.name);
        return error(at + ".column_encodings" + cat,
                     "unknown MDS encoding '" + col.encoding + "' (column '" + col.name +
                         "'); meshload reads the encodings Streaming's MDSWriter writes (" + known +
                         ", and ndarray:<dtype>[:<shape>]): write the column with one of them");
      }
      if (!sizes[c].is_null()) {
        if (!sizes[c].is_number_unsigned() || sizes[c].get<uint64_t>() > UINT32_MAX) {
          return error(at + ".column_sizes" + cat, "not a size");
        }
        col.size = static_cast<uint32_t>(sizes[c].get<uint64_t>());
      }
      const std::optional<uint32_t> scalar = MdsScalarSize(col.encoding);
      const bool ndarray = col.encoding.rfind("ndarray", 0) == 0;
      if (scalar ? col.size != scalar : (!ndarray && col.size)) {
        return error(at + ".column_sizes" + cat,
                     (col.size ? std::to_string(*col.size) : std::string("null")) + " for encoding '" + col.encoding +
                         "', which is " + (scalar ? std::to_string(*scalar) + " bytes" : std::string("variable")));
      }
      shard.columns.push_back(std::move(col));
    }
    if (!s.contains("raw_data") || !s["raw_data"].is_object()) return error(at + ".raw_data", "missing");
    const Json& raw = s["raw_data"];
    if (!raw.contains("basename") || !raw["basename"].is_string()) {
      return error(at + ".raw_data.basename", "missing or not a string");
    }
    shard.basename = raw["basename"].get<std::string>();
    if (shard.basename.empty() || shard.basename.front() == '/' || shard.basename.find("..") != std::string::npos) {
      return error(at + ".raw_data.basename", "'" + shard.basename + "' is not a file in the dataset's folder");
    }
    if (!raw.contains("bytes") || !raw["bytes"].is_number_unsigned()) {
      return error(at + ".raw_data.bytes", "missing or not a size");
    }
    shard.bytes = raw["bytes"].get<uint64_t>();
    if (s.contains("compression") && !s["compression"].is_null()) {
      if (!s["compression"].is_string()) return error(at + ".compression", "not a string");
      shard.compression = s["compression"].get<std::string>();
      if (!s.contains("zip_data") || !s["zip_data"].is_object() || !s["zip_data"].contains("basename") ||
          !s["zip_data"]["basename"].is_string() || !s["zip_data"].contains("bytes") ||
          !s["zip_data"]["bytes"].is_number_unsigned()) {
        return error(at + ".zip_data", "a compressed shard without its file's basename and bytes");
      }
      shard.zip_basename = s["zip_data"]["basename"].get<std::string>();
      if (shard.zip_basename.empty() || shard.zip_basename.front() == '/' ||
          shard.zip_basename.find("..") != std::string::npos) {
        return error(at + ".zip_data.basename", "'" + shard.zip_basename + "' is not a file in the dataset's folder");
      }
      shard.zip_bytes = s["zip_data"]["bytes"].get<uint64_t>();
    }
    out.push_back(std::move(shard));
  }
  return out;
}

Result<std::vector<uint64_t>> ParseMdsShardHead(std::string_view head, const MdsShard& shard) {
  auto error = [&](uint64_t at, const std::string& what) {
    return InvalidArgument(what, shard.basename + "@" + std::to_string(at));
  };
  const uint64_t need = MdsShardHeadBytes(shard.samples);
  if (shard.bytes < need) {
    return error(0, "the index gives " + std::to_string(shard.samples) + " samples, whose offsets alone take " +
                        std::to_string(need) + " bytes, but the shard has " + std::to_string(shard.bytes));
  }
  if (head.size() < need) return error(head.size(), "the shard's head is cut short");
  if (const uint32_t n = LoadU32(head, 0); n != shard.samples) {
    return error(0,
                 "the shard holds " + std::to_string(n) + " samples; the index says " + std::to_string(shard.samples));
  }
  std::vector<uint64_t> offsets(shard.samples + 1);
  for (uint64_t i = 0; i <= shard.samples; ++i) {
    offsets[i] = LoadU32(head, 4 * (i + 1));
    const uint64_t lower = i == 0 ? need : offsets[i - 1];
    if (offsets[i] < lower) {
      return error(4 * (i + 1), "sample offset " + std::to_string(offsets[i]) + " is below " + std::to_string(lower) +
                                    (i == 0 ? " (the end of the offsets)" : " (the one before)"));
    }
  }
  if (offsets.back() != shard.bytes) {
    return error(4 * (shard.samples + 1), "the samples end at " + std::to_string(offsets.back()) +
                                              " but the shard has " + std::to_string(shard.bytes) + " bytes");
  }
  return offsets;
}

Result<std::vector<MdsField>> ParseMdsSample(std::string_view sample, const MdsShard& shard, uint64_t at) {
  auto error = [&](uint64_t offset, const std::string& what) {
    return InvalidArgument(what, shard.basename + "@" + std::to_string(at + offset));
  };
  uint64_t pos = 0;
  std::vector<uint64_t> sizes;
  sizes.reserve(shard.columns.size());
  for (const MdsColumn& c : shard.columns) {
    if (c.size) {
      sizes.push_back(*c.size);
      continue;
    }
    if (sample.size() - pos < 4) return error(pos, "the sample ends in the size of column '" + c.name + "'");
    sizes.push_back(LoadU32(sample, pos));
    pos += 4;
  }
  std::vector<MdsField> fields;
  fields.reserve(sizes.size());
  for (size_t c = 0; c < sizes.size(); ++c) {
    if (sizes[c] > sample.size() - pos) {
      return error(pos, "column '" + shard.columns[c].name + "' is " + std::to_string(sizes[c]) +
                            " bytes but the sample has " + std::to_string(sample.size() - pos) + " left");
    }
    fields.push_back({pos, sizes[c]});
    pos += sizes[c];
  }
  if (pos != sample.size()) {
    return error(pos, std::to_string(sample.size() - pos) + " bytes after the sample's last column");
  }
  return fields;
}

}  // namespace meshload::formats
