/// \file
/// WebDataset shards: tar files whose members, in order, form samples. A
/// member's name splits into a key and an extension as webdataset and
/// Energon split it (`^((?:.*/|)[^.]+)[.]([^/]*)$`: the key is the path up
/// to the first dot of the last component, the extension the rest,
/// lower-cased); consecutive members with the same key are one sample, one
/// field per extension. Members that are not regular files, names that do
/// not split, and metadata (`__…__` at the start of the name) are not part
/// of any sample.
///
/// DALI's text index beside a shard, `SHARD.idx` (tools/wds2idx.py), is
/// read too, as Energon's offsets (ParseDaliTarIndex).
///
/// Energon's index beside a shard, `SHARD.tar.idx`
/// (megatron/energon/flavors/webdataset/itar.py), is little-endian u64s:
/// each sample's offset (its first member's first header), then where the
/// members end. Sample i is bytes [idx[i], idx[i+1]) of the shard.
///
/// Pure: the caller reads the shard (TarWalker says what to read).
///
/// Thread safety: a ShardSamples is one caller's; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/tar.h"

namespace meshload::formats {

/// A shard list as webdataset writes it, braces expanded as braceexpand
/// does for the forms shard names use: `{000000..000127}` (numbers, with
/// the first bound's zero padding; descending too) and `{a,b,c}`, several
/// groups giving every combination in order. A pattern without braces, or
/// with unbalanced ones, is itself.
std::vector<std::string> ExpandShardPattern(std::string_view pattern);

/// Splits a member's name as webdataset's base_plus_ext does; false when
/// it does not split (the member belongs to no sample). The extension is
/// lower-cased, as webdataset's group_by_keys does.
bool SplitWebDatasetName(std::string_view name, std::string& key, std::string& extension);
/// webdataset's and Energon's metadata members (`__…__` at the start).
bool IsWebDatasetMetadata(std::string_view name);

struct WebDatasetField {
  uint64_t data_offset = 0;
  uint64_t size = 0;
};
struct WebDatasetSample {
  std::string key;
  uint64_t offset = 0;                            // its first member's first header
  std::map<std::string, WebDatasetField> fields;  // by extension
};

/// Groups a shard's members into samples, in the order the walker gives
/// them.
class ShardSamples {
 public:
  explicit ShardSamples(std::string shard) : shard_(std::move(shard)) {}
  /// The next member. An extension twice in one sample is an error naming
  /// the member (webdataset refuses it too).
  Status Add(const TarMember& m);
  /// The samples, once the walker is done.
  std::vector<WebDatasetSample> Finish() { return std::move(samples_); }
  /// Energon's index of what Finish returned.
  static std::vector<uint64_t> EnergonIndex(const std::vector<WebDatasetSample>& samples, uint64_t end_offset);

 private:
  std::string shard_;
  std::vector<WebDatasetSample> samples_;
};

/// Reads an Energon `.tar.idx` (`name`, for messages) of a shard of
/// `shard_bytes` bytes: its length a multiple of 8, at least one entry,
/// the offsets never decreasing, the last within the shard. Errors name the
/// byte offset.
Result<std::vector<uint64_t>> ParseEnergonTarIndex(std::string_view bytes, std::string_view name, uint64_t shard_bytes);
/// Reads DALI's text index of a shard (`name`, for messages) of
/// `shard_bytes` bytes, as DALI's tools/wds2idx.py writes it beside
/// `SHARD.tar` as `SHARD.idx`: a line "v1.2 N", then a line per sample
/// listing its members as "extension data_offset size name". Returned as
/// Energon's offsets: sample i starts where sample i - 1's members end
/// (its first member's headers come after that; sample 0 at 0), and the
/// last entry is where the last sample's members end. Errors name the line
/// or field's byte offset: another version, a count that disagrees with the
/// lines, a member's data that is not block-aligned, overlaps the one
/// before it, or runs past the shard.
Result<std::vector<uint64_t>> ParseDaliTarIndex(std::string_view text, std::string_view name, uint64_t shard_bytes);

/// The bytes of an Energon `.tar.idx` holding `offsets`.
std::string EnergonTarIndexBytes(const std::vector<uint64_t>& offsets);

}  // namespace meshload::formats
