/// \file
/// A Parquet row as meshload's readers see it: a record of fixed size, so
/// that a Parquet file is read as the file of its rows' records (the
/// sidecar's ParquetRowSource decodes row groups through Arrow C++ and
/// writes the rows asked for; formats/parquet.h), and a row's record is
/// decoded into the job's fields like any record format's.
///
/// A record is, per field in the job's order, a u32 (little-endian) giving
/// the value's length in bytes (0xFFFFFFFF: null, the row lacks the field),
/// then `room` bytes holding the value from their start: exactly the
/// value's bytes for a dense field (a number, a fixed-size list), at most
/// `room` for a ragged one (bytes, a list of numbers), the rest unused. A
/// ragged field's room is what the job allows a row's value
/// (spec.dataset.fields[].maxBytes): a Parquet footer says how many values a
/// row group holds, not how large each row's is.
///
/// Pure; thread-safe (a layout is a value).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/fields.h"

namespace meshload::formats {

/// How a column's values become a field of the batch.
enum class ParquetValueKind {
  kBytes,      // binary or string: the bytes, ragged uint8
  kScalar,     // a number (or bool) per row: dense, one element
  kList,       // a list of numbers: its values, ragged
  kFixedList,  // a fixed-size list of numbers (nested too): dense, `shape`
};

/// A column asked for as a field.
struct ParquetField {
  std::string name;  // as asked: "input_ids", "image.bytes"
  std::string type;  // its Arrow type, for messages ("list<element: int32>")
  ParquetValueKind kind = ParquetValueKind::kBytes;
  DType dtype = DType::kUint8;
  std::vector<uint64_t> shape;  // kFixedList: one value's shape
  std::vector<int> leaves;      // the leaf columns that hold it (one for every kind delivered)
  bool ragged() const { return kind == ParquetValueKind::kBytes || kind == ParquetValueKind::kList; }
  /// Dense kinds: bytes of one row's value.
  uint64_t row_bytes() const;
};

/// The length word of a null value.
inline constexpr uint32_t kParquetNullValue = 0xFFFFFFFFu;

struct ParquetRecordLayout {
  std::vector<uint64_t> room;  // per field: the most bytes its value takes
  std::vector<uint64_t> at;    // per field: where its length word is
  uint64_t bytes = 0;          // one record's size

  /// The layout of fields with these rooms, each below 4 GiB.
  static ParquetRecordLayout Make(const std::vector<uint64_t>& rooms);
};

/// Writes a row's `values` (one per field, nullopt for a null) into
/// `record` (layout.bytes). A value longer than its room is not written:
/// kOutOfRange, and `field` says which.
Status EncodeParquetRecord(const ParquetRecordLayout& layout, const FieldValues& values, uint8_t* record,
                           size_t& field);

/// The values of `record` (layout.bytes of them): views into it, nullopt
/// for a null. kDataLoss naming the field's byte in the record when a
/// length word is more than its room.
Status ParquetRecordValues(const ParquetRecordLayout& layout, std::string_view record, FieldValues& out);

}  // namespace meshload::formats
