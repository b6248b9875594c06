/// \file
/// libFuzzer target for the tar walker, the WebDataset grouping and the
/// Energon index parser: they read untrusted shards, so they must never
/// crash, every error must name the file and a byte inside it, and what
/// they accept must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/tar.h"
#include "formats/webdataset.h"

namespace {

void CheckLocated(const meshload::Status& s, std::string_view file, size_t size) {
  const std::string loc = s.location();
  if (loc.rfind(std::string(file) + "@", 0) != 0) __builtin_trap();
  if (std::stoull(loc.substr(file.size() + 1)) > size) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  meshload::formats::TarWalker walker("f.tar", size);
  meshload::formats::ShardSamples samples("f.tar");
  uint64_t last_offset = 0;
  bool failed = false;
  while (!walker.done()) {
    const auto need = walker.next();
    if (need.offset + need.bytes > size || need.offset < last_offset) __builtin_trap();
    last_offset = need.offset;
    auto m = walker.Feed(bytes.substr(need.offset, need.bytes));
    if (!m.ok()) {
      CheckLocated(m.status(), "f.tar", size);
      failed = true;
      break;
    }
    if (*m) {
      if ((*m)->data_offset + (*m)->size > size || (*m)->offset >= (*m)->data_offset) __builtin_trap();
      meshload::Status added = samples.Add(**m);
      if (!added.ok()) {
        CheckLocated(added, "f.tar", size);
        failed = true;
        break;
      }
    }
  }
  if (!failed) {
    const auto found = samples.Finish();
    if (walker.end_offset() > size) __builtin_trap();
    for (size_t i = 1; i < found.size(); ++i) {
      if (found[i].offset <= found[i - 1].offset) __builtin_trap();
    }
    const auto index = meshload::formats::ShardSamples::EnergonIndex(found, walker.end_offset());
    auto again = meshload::formats::ParseEnergonTarIndex(meshload::formats::EnergonTarIndexBytes(index), "f.idx", size);
    if (!again.ok() || *again != index) __builtin_trap();
  }
  // The same bytes as an Energon index of a shard of their own size.
  auto idx = meshload::formats::ParseEnergonTarIndex(bytes, "f.idx", size);
  if (!idx.ok()) CheckLocated(idx.status(), "f.idx", size);
  return 0;
}
