/// \file
/// Files stored compressed (planner::StoredFile: a compressed MDS shard)
/// read as the bytes they decompress to.
///
/// ReadStored and ReadStoredHead read a stored object through its source
/// and decompress it (formats/compression.h): whole, or only its first
/// bytes (an index at the head of a shard, read without the rest).
/// DecodingSource stands in for a source whose dataset has such files: a
/// read of one decompresses its stored object whole once and keeps the
/// result in memory (least recently used first out, within a byte bound);
/// every other read goes to the source. The sidecar with a cache directory
/// decompresses into the block cache instead (sidecar/cache/cached_source.h);
/// DecodingSource serves the readers without one (`meshload` verifying what
/// a trainer got, a sidecar without --cache-dir).
///
/// Thread safety: Add() before the first read; then thread-safe. Two reads
/// of one file decompress it once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "planner/dataset_index.h"
#include "sidecar/source/kept_values.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {

/// Object `stored.path` read whole through `source` and decompressed into
/// exactly `size` bytes at `out`. Errors name the stored object (and the
/// compressed byte offset where the data is corrupt).
Status ReadStored(Source& source, const std::string& stored_name, const planner::StoredFile& stored, uint8_t* out,
                  uint64_t size);

/// The first `want` bytes that object `stored_name` decompresses to (fewer
/// when it is shorter), reading only as much of it as they need.
Result<std::string> ReadStoredHead(Source& source, const std::string& stored_name, const planner::StoredFile& stored,
                                   uint64_t want);

/// The bytes object `stored_name` decompresses to, counted by decoding it
/// whole a window at a time (nothing is kept). Errors as ReadStored's.
Result<uint64_t> DecompressedSize(Source& source, const std::string& stored_name, const planner::StoredFile& stored);

class DecodingSource final : public Source {
 public:
  /// `inner`: the source of the stored objects and of every other object;
  /// `capacity_bytes`: the decompressed files kept in memory (one is kept
  /// whatever its size while it is read).
  DecodingSource(Source& inner, uint64_t capacity_bytes) : inner_(inner), kept_(capacity_bytes, BytesOf) {}

  /// Reads of `name` (the name reads give) are the decompression of
  /// `stored` (its path in `stored_name` form: the name `inner` takes), of
  /// `size` bytes.
  void Add(const std::string& name, const std::string& stored_name, const planner::StoredFile& stored, uint64_t size);
  bool Decodes(const std::string& name) const { return files_.count(name) > 0; }

  Result<ObjectInfo> Stat(const std::string& uri) override;
  Result<std::vector<Listed>> List(const std::string& uri) override { return inner_.List(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override;
  void Prefetch(const std::string& uri, const Range* ranges, size_t count) override;
  bool LatencyBound() const override { return inner_.LatencyBound(); }
  uint64_t GapWorthReading() const override { return inner_.GapWorthReading(); }

  /// Stored objects decompressed so far (a file evicted and read again
  /// counts again).
  uint64_t decompressions() const { return kept_.made(); }

 private:
  struct File {
    std::string stored_name;
    planner::StoredFile stored;
    uint64_t size = 0;
  };
  static uint64_t BytesOf(const std::vector<uint8_t>& v) { return v.size(); }
  /// File `name`'s decompressed bytes (kept, or read and decompressed).
  Result<std::shared_ptr<const std::vector<uint8_t>>> Bytes(const std::string& name, const File& f);

  Source& inner_;
  std::unordered_map<std::string, File> files_;  // set before reads
  KeptValues<std::string, std::vector<uint8_t>> kept_;
};

/// For each file of `ds` stored compressed, a DecodingSource over its
/// source in `sources` (interposed there, so that For() gives it), keeping
/// `capacity_bytes` of decompressed files. The returned sources must
/// outlive the registry's use; empty when no file is stored compressed.
Result<std::vector<std::unique_ptr<DecodingSource>>> InstallDecoding(const planner::DatasetIndex& ds,
                                                                     SourceRegistry& sources, uint64_t capacity_bytes);

}  // namespace meshload::sidecar::source
