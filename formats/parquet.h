/// \file
/// Parquet files, read through Arrow C++ (libparquet, the reference
/// implementation; cmake/MeshloadArrow.cmake).
///
/// A file ends with its footer: the Thrift FileMetaData, its length (u32,
/// little-endian) and the magic "PAR1". The footer says everything a plan
/// needs: the schema, the row groups with their row counts, and where each
/// column chunk (a row group's values of one leaf column: an optional
/// dictionary page, then data pages, each compressed by the chunk's codec)
/// is in the file. A sample is a row; the unit of reading is a row group's
/// column chunks of the wanted fields, decoded together.
///
/// Fields are columns by name, as pyarrow and Hugging Face `datasets` write
/// them (the Arrow schema the writer stored in the footer is applied):
///   - binary and string columns (large or not): the value's bytes, ragged;
///   - integer, floating-point and boolean columns: one value per row, dense;
///   - lists of numbers (`list<int32>`: tokenized `input_ids`): the list's
///     values, ragged;
///   - fixed-size lists of numbers (nested too): dense rows of that shape;
///   - a struct's member by a dotted name (`image.bytes` of the Hub's
///     `Image` feature).
/// Other types (timestamps, decimals, maps, lists of strings, dictionary
/// types, unions) are refused by name, as are codecs this libparquet cannot
/// decompress and encrypted files.
///
/// Pure: bytes in, facts and values out, no I/O (the sources read the bytes).
/// Errors name the byte offset or the row group and column; callers prefix
/// the file.
///
/// Thread safety: a ParquetFooter is immutable once parsed and may be shared
/// between threads; ParquetRowGroupValues likewise once decoded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/dtype.h"
#include "formats/parquet_record.h"

namespace meshload::formats {

/// The footer's length (u32) and the magic after it.
inline constexpr uint64_t kParquetTrailerBytes = 8;
/// What a reader asks of a file's end first: the footer of most files fits,
/// so one ranged read gives it (ParquetFooterPlace says when it did not).
inline constexpr uint64_t kParquetTailBytes = 64 << 10;

/// Where the footer (the serialized FileMetaData) is in a file of
/// `file_size` bytes, from `tail`, the file's last bytes (at least 8).
struct ParquetFooterPlace {
  uint64_t offset = 0;
  uint64_t length = 0;
};
/// kDataLoss naming the byte offset: a file shorter than a Parquet file, no
/// "PAR1" at its end, a footer length past the file's start. An encrypted
/// footer ("PARE") is refused by name (kInvalidArgument).
Result<ParquetFooterPlace> LocateParquetFooter(std::string_view tail, uint64_t file_size);

/// One row group's column chunk of one leaf column.
struct ParquetColumnChunk {
  uint64_t offset = 0;  // its first byte: the dictionary page's, else the first data page's
  uint64_t bytes = 0;   // as stored (compressed, page headers included)
  uint64_t uncompressed_bytes = 0;
  uint64_t values = 0;  // level entries: values, nulls and empty lists
  /// The BYTE_ARRAY values' bytes, decoded (the size statistics writers
  /// store since Parquet 2.10); nullopt when the file has none.
  std::optional<uint64_t> unencoded_bytes;
  std::string codec;  // "SNAPPY", "ZSTD", "UNCOMPRESSED", ...
};

struct ParquetRowGroup {
  uint64_t rows = 0;
  uint64_t first_row = 0;                   // of the file
  std::vector<ParquetColumnChunk> columns;  // one per leaf column
};

/// A parsed footer.
class ParquetFooter {
 public:
  /// The footer's bytes (`footer`: what ParquetFooterPlace locates; the
  /// file's size `file_size` bounds every column chunk). kDataLoss when it
  /// does not parse or describes bytes the file does not have (a column
  /// chunk past the footer, row counts that do not add up), naming the row
  /// group and column; kInvalidArgument for an encrypted file or a codec
  /// this libparquet cannot decompress, by name.
  static Result<ParquetFooter> Parse(std::string_view footer, uint64_t file_size);

  uint64_t rows() const;
  const std::vector<ParquetRowGroup>& row_groups() const;
  size_t leaves() const;
  /// A leaf column's dotted path in the Parquet schema ("input_ids.list.element").
  std::string LeafPath(size_t leaf) const;
  /// Whether the writer stored the page index (column and offset indexes).
  bool has_page_index() const;
  /// The writer, as the footer names it ("parquet-cpp-arrow version 26.0.1").
  std::string created_by() const;

  /// The field named `name`: a top-level column, or a struct's member by
  /// its dotted path. kInvalidArgument naming the column and its type when
  /// meshload cannot deliver it, and listing the columns when there is none
  /// of that name.
  Result<ParquetField> Field(std::string_view name) const;
  /// The top-level columns' names, in the schema's order.
  std::vector<std::string> FieldNames() const;
  /// The top-level columns and their Arrow types, for messages:
  /// "text: string, input_ids: list<element: int32>".
  std::string Columns() const;
  /// "" when `other` (another file of the same dataset) has the same
  /// schema; else what differs, naming the first column that does
  /// ("column input_ids: list<element: int32> here, list<element: int64>
  /// there"; "column label: missing there").
  std::string SchemaDifference(const ParquetFooter& other) const;

  struct Impl;

 private:
  explicit ParquetFooter(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class ParquetRowGroupValues;
};

/// Bytes of a Parquet file the caller read: `bytes` are the file's bytes
/// from `offset` on; `owner` keeps them alive (the decoded values may point
/// into them).
struct ParquetBytes {
  uint64_t offset = 0;
  std::string_view bytes;
  std::shared_ptr<const void> owner;
};

/// One row group's values of the wanted fields, decoded by libparquet from
/// the column chunks of their leaves.
class ParquetRowGroupValues {
 public:
  /// Row group `group` of the file whose footer is `footer`, the values of
  /// `fields` (from footer.Field), decoded from `bytes`, which must cover
  /// each of their leaves' column chunks (ParquetColumnChunk offset and
  /// bytes) in that row group. kDataLoss naming the row group and column
  /// when a page does not decode (a bad header, a corrupt compressed page,
  /// fewer values than the footer says), or when a list holds a null
  /// number; kOutOfRange naming the byte range when `bytes` lack a part the
  /// reader needed.
  static Result<ParquetRowGroupValues> Decode(const ParquetFooter& footer, int group,
                                              const std::vector<ParquetField>& fields,
                                              const std::vector<ParquetBytes>& bytes);

  uint64_t rows() const { return rows_; }
  /// Row `row`'s value of fields[f] (row within the group): its bytes, as
  /// the field delivers them (a scalar's or a list's elements in the
  /// field's dtype, little-endian), valid while this object lives; nullopt
  /// for a null.
  std::optional<std::string_view> Value(size_t f, uint64_t row) const;
  /// The memory its values take.
  uint64_t bytes() const { return bytes_; }

  struct Column;

 private:
  uint64_t rows_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<const Column>> columns_;
};

/// Writing (`meshload run --generate-dataset`, tests): a Parquet file of
/// these columns, written by libparquet (snappy pages, dictionary encoding
/// where it pays, as pyarrow writes by default), `rows_per_group` rows a
/// row group. Each column's `values` hold one row's value each: bytes as
/// they are (kBytes), one number (kScalar; a bool one byte), or a list's
/// numbers back to back (kList), little-endian in `dtype`.
struct ParquetColumnToWrite {
  std::string name;
  ParquetValueKind kind = ParquetValueKind::kBytes;
  DType dtype = DType::kUint8;
  std::vector<std::string> values;
};
Result<std::string> ParquetFileBytes(const std::vector<ParquetColumnToWrite>& columns, uint64_t rows_per_group);

}  // namespace meshload::formats
