/// \file
/// The fields of a WebDataset or MDS sample, as a job asks for them
/// (spec.dataset.fields): where each field's value is in a sample's bytes,
/// and how it is decoded into a batch tensor.
///
/// A sample of these formats is a record of several values (a tar member
/// per extension; an MDS row of columns). The sidecar reads each sample's
/// bytes whole, then, per wanted field:
///   - no dtype: the value's bytes as stored (an encoded image, a JSON
///     document, a string): a ragged uint8 field;
///   - WebDataset with a dtype: the member's text is one number, as
///     webdataset writes `cls` (`str(int)`): a dense field of one value per
///     sample;
///   - MDS with a dtype: the column's values, of that dtype: a scalar
///     column (`int` is int64) or an `ndarray:<dtype>:<shape>` is dense, an
///     ndarray of variable shape is ragged (its elements, flattened).
///
/// Pure: bytes in, values out; errors name the file (shard) and the byte
/// offset.
///
/// Thread safety: pure functions; values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/dtype.h"
#include "formats/mds.h"

namespace meshload::formats {

struct FieldDecoding {
  enum class Kind {
    kBytes,            // the value as stored
    kText,             // WebDataset: a number written as text
    kScalar,           // MDS: a fixed-size scalar column
    kNdarrayFixed,     // MDS: ndarray:<dtype>:<shape>
    kNdarrayVariable,  // MDS: ndarray:<dtype> or ndarray (shape, and maybe dtype, in each value)
    kTfInt64List,      // TFRecord: an Int64List's values (int64)
    kTfFloatList,      // TFRecord: a FloatList's values (float32)
    kValues,           // Parquet: a list's numbers, little-endian in the dtype (ragged)
  };
  std::string name;
  Kind kind = Kind::kBytes;
  DType dtype = DType::kUint8;
  std::vector<uint64_t> shape;  // kNdarrayFixed: one sample's shape
  bool dtype_in_value = false;  // kNdarrayVariable of a bare `ndarray` column: each value names its dtype
  /// kTfInt64List, kTfFloatList: every record's list has shape's values
  /// (the shape may be [], one value): a dense field.
  bool fixed_list = false;
  bool ragged() const {
    return kind == Kind::kBytes || kind == Kind::kNdarrayVariable || kind == Kind::kValues ||
           ((kind == Kind::kTfInt64List || kind == Kind::kTfFloatList) && !fixed_list);
  }
  /// A ragged field's decoded bytes per byte of the record, at most: an
  /// Int64List's varint of one byte decodes to 8.
  uint64_t expansion() const { return kind == Kind::kTfInt64List ? 8 : 1; }
  /// Dense kinds: bytes of one sample's value.
  uint64_t sample_bytes() const;
  bool operator==(const FieldDecoding&) const = default;
};

/// A WebDataset field: the bytes, or (with `dtype`) a number from text.
FieldDecoding WebDatasetFieldDecoding(const std::string& name, std::optional<DType> dtype);

/// An MDS field from its column (`column`, its encoding as `index.json`
/// gives it). Errors name the field and the encoding: a dtype asked of a
/// column that does not hold numbers of that dtype.
Result<FieldDecoding> MdsFieldDecoding(const std::string& name, std::optional<DType> dtype, const MdsColumn& column);

/// A TFRecord field: a bytes_list's one value as stored (no dtype), an
/// int64_list's values (int64) or a float_list's (float32): ragged, or
/// (with `shape`, tf.io.FixedLenFeature's) dense, every record's list of
/// exactly the shape's values. Errors name the field and the dtype: another
/// dtype, or a shape without one.
Result<FieldDecoding> TfRecordFieldDecoding(const std::string& name, std::optional<DType> dtype,
                                            const std::optional<std::vector<uint64_t>>& shape = std::nullopt);

/// One sample's wanted values, in the order of the fields asked for: a view
/// into the sample's bytes, or nullopt when the sample lacks the field.
using FieldValues = std::vector<std::optional<std::string_view>>;

/// The members of a WebDataset sample: `record` is bytes [offset, offset +
/// record.size()) of shard `shard` (one sample by its index: its members,
/// all of one key). `extensions` are the wanted fields; `key` gets the
/// sample's key. Errors name the shard and byte: a damaged header, members
/// of two keys (an index that does not match the shard), an extension twice.
Status WebDatasetSampleValues(std::string_view record, const std::string& shard, uint64_t offset,
                              const std::vector<std::string>& extensions, FieldValues& out, std::string& key);

/// The columns of an MDS row (`record`, at byte `offset` of shard file
/// `shard`), for the wanted columns (indices into shard.columns; -1: the
/// shard has no such column, so every row lacks it).
Status MdsSampleValues(std::string_view record, const MdsShard& shard_info, const std::string& shard, uint64_t offset,
                       const std::vector<int>& columns, FieldValues& out);

/// The features of a TFRecord record (`record`: its framing and its
/// Example, at byte `offset` of file `file`; both CRCs checked) for the
/// wanted `fields`: a bytes_list's single value, or an int64_list's or
/// float_list's list message, which DecodeFieldValue decodes. Errors name
/// the file and byte: a bad CRC, a malformed Example, a feature of another
/// kind than its field's, a bytes_list of more or fewer than one value.
Status TfRecordSampleValues(std::string_view record, const std::string& file, uint64_t offset,
                            const std::vector<FieldDecoding>& fields, FieldValues& out);

/// Decodes `value` (at byte `offset` of `file`, for messages) into `dest`:
/// the bytes a ragged field takes (at most `room`; `written` says how many)
/// or one dense sample (sample_bytes()). Errors name the file and byte:
/// text that is not a number of the dtype, a value of the wrong size, an
/// ndarray header that disagrees with its bytes or dtype.
Status DecodeFieldValue(const FieldDecoding& field, std::string_view value, uint8_t* dest, uint64_t room,
                        uint64_t& written, const std::string& file, uint64_t offset);

/// Where an MDS ndarray value of variable shape keeps its elements: the
/// bytes after its header, and their dtype (the column's, or the value's own
/// code). Errors name the file and byte.
Result<std::pair<DType, std::string_view>> MdsNdarrayElements(const FieldDecoding& field, std::string_view value,
                                                              const std::string& file, uint64_t offset);

}  // namespace meshload::formats
