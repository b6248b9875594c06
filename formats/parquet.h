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
/// between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/columnar.h"
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

/// A parsed footer: the file's row groups and columns (formats/columnar.h).
class ParquetFooter final : public ColumnarFile {
 public:
  /// The footer's bytes (`footer`: what ParquetFooterPlace locates; the
  /// file's size `file_size` bounds every column chunk). kDataLoss when it
  /// does not parse or describes bytes the file does not have (a column
  /// chunk past the footer, row counts that do not add up), naming the row
  /// group and column; kInvalidArgument for an encrypted file or a codec
  /// this libparquet cannot decompress, by name.
  static Result<ParquetFooter> Parse(std::string_view footer, uint64_t file_size);

  std::string_view kind() const override { return "Parquet"; }
  uint64_t rows() const override;
  const std::vector<ParquetRowGroup>& row_groups() const override;
  size_t leaves() const;
  /// A leaf column's dotted path in the Parquet schema ("input_ids.list.element").
  std::string LeafPath(size_t leaf) const;
  /// Whether the writer stored the page index (column and offset indexes).
  bool has_page_index() const;
  /// The writer, as the footer names it ("parquet-cpp-arrow version 26.0.1").
  std::string created_by() const;

  Result<ParquetField> Field(std::string_view name) const override;
  std::vector<std::string> FieldNames() const override;
  std::string Columns() const override;
  /// Decoded by libparquet from the column chunks of the fields' leaves;
  /// kDataLoss naming the row group and column when a page does not decode.
  Result<ParquetRowGroupValues> DecodeGroup(int group, const std::vector<ParquetField>& fields,
                                            const std::vector<ParquetBytes>& bytes) const override;

  struct Impl;

 protected:
  std::vector<std::pair<std::string, std::string>> TypedColumns() const override;

 private:
  explicit ParquetFooter(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
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
