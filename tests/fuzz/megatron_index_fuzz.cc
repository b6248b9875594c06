/// \file
/// libFuzzer target for ParseMegatronIndex: the parser reads untrusted
/// files, so it must never crash, every error must name the file and a byte
/// inside it, and whatever it accepts must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/megatron_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  meshload::Result<meshload::formats::MegatronIndex> r = meshload::formats::ParseMegatronIndex(bytes, "f.idx");
  if (!r.ok()) {
    const std::string loc = r.status().location();
    if (loc.rfind("f.idx@", 0) != 0) __builtin_trap();
    if (std::stoull(loc.substr(6)) > size) __builtin_trap();
    return 0;
  }
  const meshload::formats::MegatronIndex& x = *r;
  if (x.pointers.size() != x.lengths.size()) __builtin_trap();
  if (x.document_indices.empty() || x.document_indices.front() != 0) __builtin_trap();
  if (static_cast<uint64_t>(x.document_indices.back()) != x.sequences()) __builtin_trap();
  for (size_t d = 1; d < x.document_indices.size(); ++d) {
    if (x.document_indices[d] < x.document_indices[d - 1]) __builtin_trap();
  }
  uint64_t needed = 0;
  for (uint64_t i = 0; i < x.sequences(); ++i) {
    if (x.lengths[i] < 0 || x.pointers[i] < 0) __builtin_trap();
    uint64_t end = 0;
    if (__builtin_add_overflow(static_cast<uint64_t>(x.pointers[i]), x.SequenceBytes(i), &end)) __builtin_trap();
    if (end > needed) needed = end;
  }
  if (needed != x.data_bytes_needed) __builtin_trap();
  // The whole file was read: 34 header bytes and the three arrays.
  if (34 + 12 * x.sequences() + 8 * x.document_indices.size() != size) __builtin_trap();
  if (!meshload::formats::CheckMegatronData(x, "f.bin", needed).ok()) __builtin_trap();
  if (needed > 0 && meshload::formats::CheckMegatronData(x, "f.bin", needed - 1).ok()) __builtin_trap();
  return 0;
}
