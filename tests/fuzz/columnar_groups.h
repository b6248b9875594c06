/// \file
/// What the columnar fuzz targets (parquet_footer, arrow_ipc) check of a
/// parsed file's groups: each of the first 8 decoded from `bytes` (the
/// whole input), its rows as the file says, every value of a dense field
/// its row's size, every value read. A decode may fail; nothing may crash.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/columnar.h"

namespace meshload::fuzz {

inline void CheckDecodedGroups(const formats::ColumnarFile& file, const std::vector<formats::ParquetField>& fields,
                               const std::vector<formats::ParquetBytes>& bytes) {
  for (size_t g = 0; g < file.row_groups().size() && g < 8; ++g) {
    if (file.row_groups()[g].rows > (1u << 16)) continue;
    auto values = formats::ParquetRowGroupValues::Decode(file, static_cast<int>(g), fields, bytes);
    if (!values.ok()) continue;
    if (values->rows() != file.row_groups()[g].rows) __builtin_trap();
    uint64_t sum = 0;
    for (uint64_t r = 0; r < values->rows(); ++r) {
      for (size_t f = 0; f < fields.size(); ++f) {
        auto v = values->Value(f, r);
        if (v && !v->empty()) sum += static_cast<unsigned char>((*v)[0]) + static_cast<unsigned char>(v->back());
        if (v && !fields[f].ragged() && v->size() != fields[f].row_bytes()) __builtin_trap();
      }
    }
    if (sum == UINT64_MAX) __builtin_trap();
  }
}

}  // namespace meshload::fuzz
