/// \file
/// libFuzzer target for the MDS parsers: the same bytes as an index.json
/// and as a raw shard of the fixtures' columns. They must never crash,
/// errors must say where, and what they accept must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "formats/mds.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto index = meshload::formats::ParseMdsIndex(bytes, "f.json");
  if (!index.ok()) {
    if (index.status().location() != "f.json") __builtin_trap();
  } else {
    for (const auto& s : *index) {
      if (s.columns.empty() || s.basename.empty() || s.basename.find("..") != std::string::npos) __builtin_trap();
      for (const auto& c : s.columns) {
        if (!meshload::formats::IsMdsEncoding(c.encoding)) __builtin_trap();
      }
    }
  }
  // As a raw shard with the fixtures' columns (tests/formats/data/mds/raw).
  if (size < 4) return 0;
  meshload::formats::MdsShard shard;
  shard.basename = "f.mds";
  shard.bytes = size;
  uint32_t n;
  std::memcpy(&n, data, 4);
  shard.samples = n;
  shard.columns = {
      {"box", "ndarray:uint16:4", 8}, {"image", "bytes", std::nullopt}, {"label", "int", 8},
      {"score", "float32", 4},        {"text", "str", std::nullopt},    {"tokens", "ndarray:int32", std::nullopt}};
  const uint64_t head = meshload::formats::MdsShardHeadBytes(shard.samples);
  auto offsets = meshload::formats::ParseMdsShardHead(bytes.substr(0, head), shard);
  if (!offsets.ok()) {
    if (offsets.status().location().rfind("f.mds@", 0) != 0) __builtin_trap();
    return 0;
  }
  if (offsets->size() != shard.samples + 1 || offsets->back() != size || offsets->front() < head) __builtin_trap();
  for (uint64_t i = 0; i < shard.samples; ++i) {
    const auto sample = bytes.substr((*offsets)[i], (*offsets)[i + 1] - (*offsets)[i]);
    auto fields = meshload::formats::ParseMdsSample(sample, shard, (*offsets)[i]);
    if (!fields.ok()) continue;
    uint64_t end = 0;
    for (const auto& f : *fields) {
      if (f.offset < end || f.offset + f.size > sample.size()) __builtin_trap();
      end = f.offset + f.size;
    }
    if (end != sample.size()) __builtin_trap();
  }
  return 0;
}
