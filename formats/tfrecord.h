/// \file
/// TFRecord files of tf.train.Example records, as TensorFlow's
/// TFRecordWriter writes them (a file compressed with its GZIP or ZLIB
/// option is decompressed whole first: formats/compression.h; its index
/// gives offsets in the decompressed bytes).
///
/// A file is records back to back, each, little-endian:
///
///   u64   n, the payload's length
///   u32   the masked CRC32C of those 8 bytes
///   u8[n] the payload: a serialized tf.train.Example
///   u32   the masked CRC32C of the payload
///
/// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8). The index is DALI's
/// tfrecord2idx format: a text line "OFFSET LENGTH" per record, LENGTH the
/// whole record (n + 16), as DALI's tools/tfrecord2idx and the `tfrecord`
/// package write it.
///
/// An Example is features by name: Features{ map<string, Feature> feature
/// = 1 }, a Feature one of bytes_list = 1 (BytesList{ repeated bytes value =
/// 1 }), float_list = 2 (FloatList{ repeated float value = 1 }, packed or
/// not), int64_list = 3 (Int64List{ repeated int64 value = 1 }, packed or
/// not), read with protobuf's wire format here (no generated code).
///
/// Pure: bytes in, facts out; every error names the file and the byte
/// offset.
///
/// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshload::formats {

/// CRC32C (Castagnoli) of `n` bytes, and TFRecord's mask of it.
uint32_t Crc32c(const void* data, size_t n);
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/// The smallest record: its framing around an empty payload.
constexpr uint64_t kTfRecordFramingBytes = 16;

/// The record offsets of a DALI tfrecord2idx index (`text`; `name` for
/// messages) of a file of `file_bytes` bytes: N + 1 offsets, the last the
/// file's end. Checks that each line is two decimal numbers, that records
/// follow each other from byte 0 without a gap, are at least 16 bytes, and
/// end at the file's end (else the index is not this file's). A compressed
/// file's index (offsets in its decompressed bytes) is parsed with
/// `file_bytes` nullopt: the records' end is then the decompressed size,
/// checked when the file is decompressed.
Result<std::vector<uint64_t>> ParseTfRecordIndex(std::string_view text, std::string_view name,
                                                 std::optional<uint64_t> file_bytes);

/// The compression a TFRecord file's first bytes suggest when it was read
/// as uncompressed and its first frame did not parse: "GZIP" for a gzip
/// member's magic (1f 8b), "ZLIB" for a zlib header (RFC 1950: deflate,
/// a header checksum), "" otherwise. For messages only.
std::string_view TfRecordCompressionHint(std::string_view head);

/// The payload length a record's first 12 bytes give (`header`; the record
/// at byte `offset` of file `name`), its length CRC checked.
Result<uint64_t> TfRecordLength(std::string_view header, std::string_view name, uint64_t offset);

/// The record offsets of a whole file by walking its frames (what
/// `meshload index` writes an index from), each frame's length CRC checked.
Result<std::vector<uint64_t>> ScanTfRecords(std::string_view file, std::string_view name);

/// The DALI index text of those offsets.
std::string TfRecordIndexText(const std::vector<uint64_t>& offsets);

/// The payload of one record (`record`: its bytes, at byte `offset` of file
/// `file`), both CRCs checked: a view into `record`. kDataLoss naming
/// file@offset on a bad CRC or a length that does not fill the record.
Result<std::string_view> TfRecordPayload(std::string_view record, const std::string& file, uint64_t offset);

/// One feature of an Example: its kind and its list message's bytes (a view
/// into the Example), decoded by the functions below.
struct TfFeature {
  enum class Kind { kBytes, kFloat, kInt64 };
  Kind kind = Kind::kBytes;
  std::string_view list;  // the BytesList, FloatList or Int64List message
};
std::string_view TfFeatureKindName(TfFeature::Kind kind);  // "bytes_list", "float_list", "int64_list"

/// The features `names` of an Example (`example`, the payload of the record
/// at `offset` of `file`): out[i] the feature names[i], nullopt when the
/// Example has none. Errors (a malformed message) name file@offset.
Status TfExampleFeatures(std::string_view example, const std::vector<std::string>& names,
                         std::vector<std::optional<TfFeature>>& out, const std::string& file, uint64_t offset);

/// The values of a BytesList: views into the list.
Status TfBytesValues(std::string_view list, std::vector<std::string_view>& out);
/// The values of an Int64List or FloatList, appended to `out` (packed or
/// not). Errors on a malformed list.
Status TfInt64Values(std::string_view list, std::vector<int64_t>& out);
Status TfFloatValues(std::string_view list, std::vector<float>& out);

/// Writing (`meshload run --generate-dataset`, tests): one record's framing
/// around `payload`, and an Example of features in the order added.
std::string TfRecordFrame(std::string_view payload);
class TfExampleWriter {
 public:
  void AddBytes(std::string_view name, std::string_view value);
  void AddInt64s(std::string_view name, const std::vector<int64_t>& values);
  void AddFloats(std::string_view name, const std::vector<float>& values);
  /// The serialized tf.train.Example.
  std::string Serialize() const;

 private:
  void AddFeature(std::string_view name, int kind, const std::string& list);
  std::string features_;  // Features' map entries
};

}  // namespace meshload::formats
