/// \file
/// libFuzzer target for Arrow IPC files through Arrow C++
/// (formats/arrow_ipc.h): the input as a whole file, its messages walked
/// through reads of odd sizes, and each record batch decoded from its
/// message's bytes. Nothing may crash; an error says where; what the index
/// says lies inside the file. (Arrow itself is not instrumented: the target
/// finds crashes in it, and drives meshload's own code with coverage.)
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/arrow_ipc.h"
#include "tests/fuzz/columnar_groups.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshload::formats;
  const std::string file(reinterpret_cast<const char*>(data), size);
  auto read = [&](uint64_t offset, uint64_t length) -> meshload::Result<std::string> {
    if (offset > file.size()) __builtin_trap();  // the walk reads inside the file
    return file.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
  };
  auto index = ArrowIpcFile::Index(read, file.size());
  if (!index.ok()) {
    if (index.status().location().rfind('@', 0) != 0) __builtin_trap();
    return 0;
  }
  uint64_t rows = 0;
  for (const ParquetRowGroup& g : index->row_groups()) {
    if (g.first_row != rows || g.columns.size() != 1) __builtin_trap();
    if (g.columns[0].offset + g.columns[0].bytes > size) __builtin_trap();
    rows += g.rows;
  }
  if (rows != index->rows()) __builtin_trap();
  std::vector<ParquetField> fields;
  for (const std::string& name : index->FieldNames()) {
    auto f = index->Field(name);
    if (f.ok()) fields.push_back(*f);
  }
  if (fields.empty()) return 0;
  auto owner = std::make_shared<std::string>(file);
  const std::vector<ParquetBytes> bytes = {{0, *owner, owner}};
  meshload::fuzz::CheckDecodedGroups(*index, fields, bytes);
  return 0;
}
