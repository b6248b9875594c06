/// \file
/// Arrow IPC files, read through Arrow C++'s IPC reader: the streaming
/// format `datasets.Dataset.save_to_disk` writes (`data-00000-of-00001.arrow`,
/// what `pyarrow.ipc.new_stream` writes) and the random-access file format
/// (Feather v2: "ARROW1", the same messages, then a footer).
///
/// A file is a sequence of messages: a schema, then record batches (and
/// dictionary batches for dictionary-typed columns), each an 8-byte prefix
/// (0xFFFFFFFF, then the metadata's length; 4 bytes without the 0xFFFFFFFF
/// in files from before Arrow 0.15), its metadata (a flatbuffer: the
/// message's type, its body's length and, for a record batch, its row
/// count and buffers) and its body; a prefix of length 0 ends the stream.
/// A sample is a row; the unit of reading is a record batch's message,
/// read whole and decoded by Arrow's reader (zero-copy where the body is
/// not compressed). The index is the messages' metadata, one read per batch
/// whose body is larger than a read's 64 KiB, fewer for small batches; the
/// bodies are not read.
///
/// Fields are columns by name, delivered as formats/columnar.h says (the
/// same types as Parquet's). A batch compressed with a codec this Arrow
/// cannot decompress is refused by name.
///
/// Pure: bytes in, facts and values out; the index is walked through a
/// callback the caller reads with. Errors name the byte offset.
///
/// Thread safety: an ArrowIpcFile is immutable once made and may be shared.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/columnar.h"

namespace meshload::formats {

/// What the index walk reads at a time (and what a message's metadata may
/// take at most: 64 MiB).
inline constexpr uint64_t kArrowIpcReadBytes = 64 << 10;
inline constexpr uint64_t kArrowIpcMaxMetadataBytes = 64 << 20;

/// One message of an IPC file.
struct ArrowIpcMessage {
  enum class Type { kSchema, kDictionaryBatch, kRecordBatch, kEnd, kOther };
  Type type = Type::kOther;
  uint64_t offset = 0;          // its prefix's first byte
  uint64_t prefix_bytes = 8;    // 4 in files from before Arrow 0.15
  uint64_t metadata_bytes = 0;  // the prefix and the metadata flatbuffer (padded)
  uint64_t body_bytes = 0;
  uint64_t rows = 0;                   // a record batch's
  std::string codec = "UNCOMPRESSED";  // a record batch's body compression: "ZSTD", "LZ4_FRAME"
  uint64_t end() const { return offset + metadata_bytes + body_bytes; }
};

/// The message at byte `offset` of a file of `file_size` bytes, from
/// `bytes` (the file's bytes from `offset` on). When `bytes` hold less than
/// its prefix and metadata, kOutOfRange and `needed` is how many bytes from
/// `offset` they take. kDataLoss naming the byte offset: a prefix that is
/// not one, metadata that does not verify as a message, a body past the
/// file's end.
Result<ArrowIpcMessage> ParseArrowIpcMessage(std::string_view bytes, uint64_t offset, uint64_t file_size,
                                             uint64_t& needed);

class ArrowIpcFile final : public ColumnarFile {
 public:
  /// Reads `length` bytes of the file from `offset` (fewer only at its end).
  using ReadAt = std::function<Result<std::string>(uint64_t offset, uint64_t length)>;
  /// The index of a file of `file_size` bytes: its messages walked from the
  /// first (after "ARROW1" in the file format) to the end of the stream,
  /// reading through `read`. kDataLoss naming the byte offset when a
  /// message does not parse, a record batch comes before the schema, or the
  /// file ends inside a message; kInvalidArgument naming the codec of a
  /// batch this Arrow cannot decompress; read's errors as they are.
  static Result<ArrowIpcFile> Index(const ReadAt& read, uint64_t file_size);

  std::string_view kind() const override { return "Arrow IPC"; }
  uint64_t rows() const override;
  /// One per record batch: its one "column chunk" is its whole message.
  const std::vector<ParquetRowGroup>& row_groups() const override;
  Result<ParquetField> Field(std::string_view name) const override;
  std::vector<std::string> FieldNames() const override;
  std::string Columns() const override;
  /// Decoded by Arrow's IPC reader from the batch's message (`bytes` must
  /// cover it); kDataLoss naming the batch when it does not decode.
  Result<ParquetRowGroupValues> DecodeGroup(int group, const std::vector<ParquetField>& fields,
                                            const std::vector<ParquetBytes>& bytes) const override;

  struct Impl;

 protected:
  std::vector<std::pair<std::string, std::string>> TypedColumns() const override;

 private:
  explicit ArrowIpcFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// Writing (`meshload run --generate-dataset`, tests): an Arrow IPC stream
/// of these columns (formats/parquet.h: ParquetColumnToWrite), as
/// `datasets` writes one, `rows_per_batch` rows a record batch.
struct ParquetColumnToWrite;
Result<std::string> ArrowIpcStreamBytes(const std::vector<ParquetColumnToWrite>& columns, uint64_t rows_per_batch);

}  // namespace meshload::formats
