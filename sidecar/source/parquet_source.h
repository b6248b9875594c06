/// \file
/// Parquet files read as the files of their rows' records
/// (formats/parquet_record.h): row r of a file is bytes [r × R, (r + 1) × R)
/// of a file of rows × R bytes, R the record's size, so the step loader
/// reads a Parquet row like any record format's sample and decodes it into
/// the job's fields.
///
/// A read of rows decodes the row groups holding them through Arrow C++
/// (formats/parquet.h): the column chunks of the wanted fields' leaves,
/// read through the inner source (the block cache's, when the sidecar has
/// one: the Parquet file's bytes are cached as stored), decoded once and
/// kept in memory (least recently used first out, within a byte bound) for
/// the other rows of the group. Every other read goes to the inner source.
///
/// Thread safety: Add() before the first read; then thread-safe. Two reads
/// of one row group decode it once.
#pragma once

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/arrow_ipc.h"
#include "formats/parquet.h"
#include "formats/parquet_record.h"
#include "planner/dataset_index.h"
#include "sidecar/source/kept_values.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {

class ParquetRowSource final : public Source {
 public:
  /// `inner`: the source of the Parquet objects and of every other object;
  /// `capacity_bytes`: the decoded row groups kept in memory (one is kept
  /// whatever its size while it is read).
  ParquetRowSource(Source& inner, uint64_t capacity_bytes) : inner_(inner), kept_(capacity_bytes, BytesOf) {}

  /// One Parquet object read as its rows' records.
  struct File {
    std::string stored_name;                              // the object, as `inner` names it
    std::shared_ptr<const formats::ColumnarFile> footer;  // a Parquet footer or an Arrow file's index
    std::vector<formats::ParquetField> fields;            // the job's, in order
    formats::ParquetRecordLayout layout;                  // of those fields
  };
  /// Reads of `name` are the records of `file`'s rows.
  void Add(const std::string& name, File file);
  bool Decodes(const std::string& name) const { return files_.count(name) > 0; }

  Result<ObjectInfo> Stat(const std::string& uri) override;
  Result<std::vector<Listed>> List(const std::string& uri) override { return inner_.List(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override;
  void Prefetch(const std::string& uri, const Range* ranges, size_t count) override;
  bool LatencyBound() const override { return inner_.LatencyBound(); }
  uint64_t GapWorthReading() const override { return inner_.GapWorthReading(); }

  /// Row groups decoded so far (one evicted and read again counts again),
  /// and the bytes of column chunks read for them.
  uint64_t decodes() const { return kept_.made(); }
  uint64_t chunk_bytes_read() const { return chunk_bytes_.load(); }

 private:
  using Key = std::pair<const File*, int>;  // a file's row group
  static uint64_t BytesOf(const formats::ParquetRowGroupValues& v) { return v.bytes(); }
  Result<std::shared_ptr<const formats::ParquetRowGroupValues>> Decode(const File& f, int g);
  /// The row group holding row `row` of `f`.
  static int GroupOf(const File& f, uint64_t row);

  Source& inner_;
  std::unordered_map<std::string, File> files_;  // set before reads
  KeptValues<Key, formats::ParquetRowGroupValues> kept_;
  std::atomic<uint64_t> chunk_bytes_{0};
};

/// The footer of Parquet object `name` of `source` (of `size` bytes): its
/// last 64 KiB read, and the rest of the footer when it is longer. Errors
/// name the object (and the byte offset).
Result<formats::ParquetFooter> ReadParquetFooter(Source& source, const std::string& name, uint64_t size);

/// The index of Arrow IPC object `name` of `source` (of `size` bytes): its
/// messages' metadata, read 64 KiB at a time (formats/arrow_ipc.h). Errors
/// name the object (and the byte offset).
Result<formats::ArrowIpcFile> ReadArrowIpcIndex(Source& source, const std::string& name, uint64_t size);

/// The columnar file `name` of `source` (of `size` bytes) as `format`
/// stores it: an Arrow IPC file's index for format Arrow, else a Parquet
/// footer.
Result<std::shared_ptr<const formats::ColumnarFile>> ReadColumnarFile(planner::DatasetFormat format, Source& source,
                                                                      const std::string& name, uint64_t size);

/// For each Parquet (or Arrow) file of `ds` (DatasetFile::parquet), a ParquetRowSource
/// over its source in `sources` (interposed there, so that For() gives it),
/// keeping `capacity_bytes` of decoded row groups; each file read with the
/// footer the index holds (ParquetFile::footer), else its footer read again
/// (16 at a time over the network) and checked against the index
/// (kDataLoss naming the file when its rows or columns changed since the
/// job was resolved). The returned sources must outlive the registry's
/// use; empty when the dataset has no Parquet file.
Result<std::vector<std::unique_ptr<ParquetRowSource>>> InstallParquetRows(const planner::DatasetIndex& ds,
                                                                          SourceRegistry& sources,
                                                                          uint64_t capacity_bytes);

}  // namespace meshload::sidecar::source
