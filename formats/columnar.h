/// \file
/// A file of rows stored by column, in groups of rows, read through Arrow
/// C++: a Parquet file (formats/parquet.h: row groups, described by its
/// footer) or an Arrow IPC file (formats/arrow_ipc.h: record batches, as
/// `datasets.Dataset.save_to_disk` writes them, described by their
/// messages' headers). Both give the same facts to a plan (the groups, their
/// rows and where their bytes are) and decode a group's bytes into the same
/// values, so the planner and the sidecar read either the same way.
///
/// Fields are columns by name (formats/parquet_record.h: ParquetField says
/// how a column's type is delivered; a struct's member by its dotted path).
///
/// Pure: bytes in, facts and values out, no I/O. Thread safety: a
/// ColumnarFile is immutable once made and may be shared between threads;
/// ParquetRowGroupValues likewise once decoded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/parquet_record.h"

namespace meshload::formats {

/// One group's bytes of one leaf column (Parquet: a column chunk); an Arrow
/// IPC record batch is one chunk, its message, whatever the column.
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

/// A group of rows: a Parquet row group, an Arrow record batch.
struct ParquetRowGroup {
  uint64_t rows = 0;
  uint64_t first_row = 0;                   // of the file
  std::vector<ParquetColumnChunk> columns;  // one per leaf column
};

/// Bytes of a file the caller read: `bytes` are the file's bytes from
/// `offset` on; `owner` keeps them alive (the decoded values may point into
/// them).
struct ParquetBytes {
  uint64_t offset = 0;
  std::string_view bytes;
  std::shared_ptr<const void> owner;
};

class ParquetRowGroupValues;

class ColumnarFile {
 public:
  virtual ~ColumnarFile() = default;

  /// "Parquet", "Arrow IPC": for messages.
  virtual std::string_view kind() const = 0;
  virtual uint64_t rows() const = 0;
  virtual const std::vector<ParquetRowGroup>& row_groups() const = 0;

  /// The field named `name`: a top-level column, or a struct's member by
  /// its dotted path. kInvalidArgument naming the column and its type when
  /// meshload cannot deliver it, and listing the columns when there is none
  /// of that name.
  virtual Result<ParquetField> Field(std::string_view name) const = 0;
  /// The top-level columns' names, in the schema's order.
  virtual std::vector<std::string> FieldNames() const = 0;
  /// The top-level columns and their Arrow types, for messages:
  /// "text: string, input_ids: list<element: int32>".
  virtual std::string Columns() const = 0;
  /// "" when `other` (another file of the same dataset) has the same
  /// schema; else what differs, naming the first column that does
  /// ("column input_ids: list<element: int32> here, list<element: int64>
  /// there"; "column label: missing there").
  std::string SchemaDifference(const ColumnarFile& other) const;

  /// Group `group`'s values of `fields` (from Field), decoded from `bytes`,
  /// which must cover each of their leaves' chunks in that group (see
  /// ParquetRowGroupValues::Decode).
  virtual Result<ParquetRowGroupValues> DecodeGroup(int group, const std::vector<ParquetField>& fields,
                                                    const std::vector<ParquetBytes>& bytes) const = 0;

 protected:
  /// The top-level columns' names and Arrow types (ToString), in order.
  virtual std::vector<std::pair<std::string, std::string>> TypedColumns() const = 0;
};

/// One group's values of the wanted fields, decoded by Arrow C++.
class ParquetRowGroupValues {
 public:
  /// Group `group` of `file`, the values of `fields` (from file.Field),
  /// decoded from `bytes`, which must cover each of their leaves' chunks
  /// (ParquetColumnChunk offset and bytes) in that group. kDataLoss naming
  /// the group and column when a page or a batch does not decode (a bad
  /// header, a corrupt compressed page, fewer values than the file says),
  /// or when a list holds a null number; kOutOfRange naming the byte range
  /// when `bytes` lack a part the reader needed.
  static Result<ParquetRowGroupValues> Decode(const ColumnarFile& file, int group,
                                              const std::vector<ParquetField>& fields,
                                              const std::vector<ParquetBytes>& bytes) {
    return file.DecodeGroup(group, fields, bytes);
  }

  uint64_t rows() const { return rows_; }
  /// Row `row`'s value of fields[f] (row within the group): its bytes, as
  /// the field delivers them (a scalar's or a list's elements in the
  /// field's dtype, little-endian), valid while this object lives; nullopt
  /// for a null.
  std::optional<std::string_view> Value(size_t f, uint64_t row) const;
  /// The memory its values take.
  uint64_t bytes() const { return bytes_; }

  /// One field's decoded arrays (formats/arrow_columns.h).
  struct Column;
  /// The values of `rows` rows, one column per field (the files' decoders).
  ParquetRowGroupValues(uint64_t rows, uint64_t bytes, std::vector<std::shared_ptr<const Column>> columns)
      : rows_(rows), bytes_(bytes), columns_(std::move(columns)) {}

 private:
  uint64_t rows_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<const Column>> columns_;
};

}  // namespace meshload::formats
