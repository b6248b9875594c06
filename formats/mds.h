/// \file
/// MosaicML Streaming's MDS format (streaming/base/format/mds/), version 2.
///
/// `index.json` lists the shards: {"version": 2, "shards": [{"format":
/// "mds", "version": 2, "column_names": [...], "column_encodings": [...],
/// "column_sizes": [n or null, ...], "compression": null or "zstd" (and
/// the others), "raw_data": {"basename", "bytes", "hashes"}, "zip_data":
/// null or the compressed file's, "samples": N, ...}, ...]}.
///
/// A raw shard file is, little-endian:
///
///   u32             N, its samples
///   u32[N + 1]      offsets: sample i is bytes [offsets[i], offsets[i+1])
///   ...             the shard's configuration as JSON
///   ...             the samples
///
/// and a sample is a u32 size for each column whose size is not fixed, in
/// column order, then each column's bytes in column order. Columns are
/// sorted by name (MDSWriter sorts them).
///
/// Pure: bytes in, facts out; every error names the file and the field
/// path or byte offset at fault.
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

struct MdsColumn {
  std::string name;
  std::string encoding;          // as written: "bytes", "int", "ndarray:int32:4", ...
  std::optional<uint32_t> size;  // fixed bytes per sample, or variable
};

struct MdsShard {
  std::string basename;  // the raw shard file
  uint64_t bytes = 0;    // its size
  uint64_t samples = 0;
  /// Empty when the shard is stored raw; else the compression ("zstd",
  /// "zstd:7", "gz", ...) and the compressed file.
  std::string compression;
  std::string zip_basename;
  uint64_t zip_bytes = 0;
  std::vector<MdsColumn> columns;
};

/// Whether `encoding` is one MDS knows (its name before any ':' one of
/// streaming's encodings, with a configuration only for ndarray), and the
/// fixed size of its scalar encodings (nullopt: variable, or given by the
/// column's size as for a fixed-shape ndarray).
bool IsMdsEncoding(std::string_view encoding);
std::optional<uint32_t> MdsScalarSize(std::string_view encoding);

/// Parses `index.json` (`name`, for messages). Errors name the field:
/// "index.json: shards[2].column_encodings[1]: unknown MDS encoding
/// 'foo'". Checks: version 2, format "mds", the three column lists of one
/// length with known encodings and sizes that fit them, a raw_data entry
/// with a basename that stays in the dataset's folder.
Result<std::vector<MdsShard>> ParseMdsIndex(std::string_view json, std::string_view name);

/// The bytes at the start of a raw shard that hold its sample offsets.
inline uint64_t MdsShardHeadBytes(uint64_t samples) { return 4 * (samples + 2); }
/// The sample offsets from a raw shard's first MdsShardHeadBytes bytes:
/// N + 1 of them. Checks the count against the index, and that the offsets
/// start after the head, never decrease and end at the shard's size.
Result<std::vector<uint64_t>> ParseMdsShardHead(std::string_view head, const MdsShard& shard);

/// Where each column's bytes are in one sample (`sample`, the bytes
/// [offsets[i], offsets[i+1]) of the shard; `at`, their offset, for
/// messages), relative to the sample's start, in column order.
struct MdsField {
  uint64_t offset = 0;
  uint64_t size = 0;
};
Result<std::vector<MdsField>> ParseMdsSample(std::string_view sample, const MdsShard& shard, uint64_t at);

}  // namespace meshload::formats
