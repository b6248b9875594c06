/// \file
/// libFuzzer target for Parquet through Arrow C++ (formats/parquet.h): the
/// input as a whole Parquet file: its footer located, parsed, and each row
/// group's columns decoded from the file's bytes. Nothing may crash; an
/// error says where; what a parsed footer says lies inside the file.
/// (libparquet itself is not instrumented: the target finds crashes in it,
/// and drives meshload's own code with coverage.)
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/parquet.h"
#include "tests/fuzz/columnar_groups.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshload::formats;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  if (size < kParquetTrailerBytes) return 0;
  auto place = LocateParquetFooter(file.substr(size - kParquetTrailerBytes), size);
  if (!place.ok()) {
    if (place.status().location().rfind('@', 0) != 0) __builtin_trap();
    return 0;
  }
  if (place->offset + place->length + kParquetTrailerBytes != size) __builtin_trap();
  auto footer = ParquetFooter::Parse(file.substr(place->offset, place->length), size);
  if (!footer.ok()) {
    if (footer.status().code() != meshload::StatusCode::kInvalidArgument &&
        footer.status().location().rfind("footer@", 0) != 0) {
      __builtin_trap();
    }
    return 0;
  }
  uint64_t rows = 0;
  for (const ParquetRowGroup& g : footer->row_groups()) {
    if (g.first_row != rows || g.columns.size() != footer->leaves()) __builtin_trap();
    rows += g.rows;
    for (const ParquetColumnChunk& c : g.columns) {
      if (c.offset + c.bytes > place->offset) __builtin_trap();
    }
  }
  if (rows != footer->rows()) __builtin_trap();
  std::vector<ParquetField> fields;
  for (const std::string& name : footer->FieldNames()) {
    auto f = footer->Field(name);
    if (f.ok()) fields.push_back(*f);
  }
  if (fields.empty() || rows > (1u << 16)) return 0;
  const std::vector<ParquetBytes> bytes = {{0, file, nullptr}};
  meshload::fuzz::CheckDecodedGroups(*footer, fields, bytes);
  return 0;
}
