/// \file
/// The dataset index: which files make up a dataset, how many samples it
/// has, and where each sample's bytes are. Only sizes and headers are read.
///
/// A dataset URI names one object, a directory or prefix (its non-hidden
/// objects), or a glob, of any storage scheme the sources serve (a local
/// path or file:// URI, http(s)://, s3://); the sources list them
/// (Source::List) and gather their facts. Several files form one dataset in
/// lexicographic (byte) order of their names:
///   FixedRecord  each file is a whole number of `recordBytes` records;
///   TokenStream  the files' tokens are concatenated into one stream, and
///                sample i is tokens [i·T, i·T+T+1) of it (it may span two
///                files); N = floor((tokens − 1) / T);
///   Npy          each file is a C-order .npy array with the same dtype and
///                trailing shape; samples run along axis 0.
///   MegatronIndexed  each PREFIX.bin with its PREFIX.idx (Megatron-LM's
///                indexed dataset); sample i of a file is its sequence i,
///                of the size and at the byte offset the .idx gives:
///                samples have variable sizes (variable_size()).
///   WebDataset   tar shards, each with its Energon SHARD.tar.idx; sample i
///                of a shard is the bytes [idx[i], idx[i+1]) (its members).
///   MDS          the raw shards index.json lists; sample i of a shard is
///                its row i, by the shard's offset table.
///   WebDataset and MDS samples are records of several values: the job's
///   fields (spec.dataset.fields) are decoded from each (fields()).
///
/// When the files are not reachable from where the plan is computed (another
/// machine's path, a bucket without credentials, the controller), a
/// *virtual* index stands in: the sample count comes from
/// spec.dataset.samples or --samples, and sample i lives at offset
/// i × sampleBytes of one virtual file.
///
/// Thread safety: immutable after construction; const methods thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "formats/dtype.h"
#include "formats/fields.h"
#include "formats/mds.h"
#include "formats/megatron_index.h"
#include "formats/npy.h"
#include "formats/parquet_record.h"
#include "planner/spec.h"
#include "planner/token_rows.h"

namespace meshload::formats {
class ColumnarFile;
}

namespace meshload::planner {

/// Where a file's bytes are stored when they are not stored as they are
/// read: the decompression of object `path` (`size` bytes) with
/// `compression` (formats/compression.h's names). A compressed MDS shard
/// is read as its raw shard, whose name index.json gives but which no
/// storage holds.
struct StoredFile {
  std::string path;
  uint64_t size = 0;
  std::string compression;
};

/// A columnar file (a Parquet file, or an Arrow IPC file of format Arrow;
/// formats/columnar.h) read as its rows' records
/// (formats/parquet_record.h): DatasetFile::size is then its rows' records'
/// bytes, and this says what the stored object is.
struct ParquetFile {
  uint64_t stored_size = 0;  // the stored object's bytes
  uint64_t rows = 0;
  /// spec.dataset.fields' columns, in their order (the same in every file).
  std::vector<formats::ParquetField> fields;
  formats::ParquetRecordLayout layout;
  /// Its row groups (an Arrow file's record batches), in order: a read of
  /// any of a group's rows decodes the whole group, fetching its wanted
  /// column chunks (the fields' leaves; an Arrow batch's whole message).
  struct RowGroup {
    uint64_t first_row = 0;
    uint64_t rows = 0;
    uint64_t chunk_bytes = 0;    // the wanted column chunks' stored bytes
    uint64_t decoded_bytes = 0;  // and their bytes decompressed (about what the decoded group holds)
  };
  std::vector<RowGroup> row_groups;
  /// The footer (an Arrow file's index) as the gatherer parsed it
  /// (formats/columnar.h; only what links Arrow makes one), so that the
  /// sidecar's reader of the rows does not read it again; null when these
  /// facts came from elsewhere.
  std::shared_ptr<const formats::ColumnarFile> footer;
};

struct DatasetFile {
  std::string path;
  uint64_t size = 0;         // bytes on disk
  uint64_t data_offset = 0;  // bytes before the sample data (the .npy header)
  uint64_t first = 0;        // first sample (record formats) or first token (TokenStream)
  uint64_t count = 0;        // samples (record formats) or tokens (TokenStream) in this file
  std::optional<formats::NpyHeader> npy;
  std::optional<formats::MdsShard> mds;  // MDS: the shard's columns
  /// MDS: per field of fields(), its column in this shard (-1: none, so
  /// every row lacks it).
  std::vector<int> mds_columns;
  /// What the storage said of the stored object's bytes when the dataset
  /// was indexed (an S3 ETag; "" when it said nothing): a cache keys its
  /// blocks by it without asking again.
  std::string version;
  /// Set when the file is stored compressed: `path` and `size` are then
  /// the decompressed file's.
  std::optional<StoredFile> stored;
  /// Parquet and Arrow: the file's rows as records.
  std::optional<ParquetFile> parquet;
};

/// What kind of samples a format has (its driver's, planner/format_driver.h).
struct FormatTraits {
  /// Samples differ in size; each one's comes from the format's index, and
  /// a batch is ragged.
  bool variable_size = false;
  /// A sample is a record of named values, decoded into spec.dataset.fields.
  bool records = false;
  /// Samples are windows of one stream of tokens over all the files (one may
  /// span two files).
  bool token_stream = false;
  /// Samples are documents whose index gives their tokens: spec.tokens can
  /// cut them into rows.
  bool documents = false;
  /// Each file may be stored compressed as a whole (spec.dataset.compression).
  bool file_compression = false;
  /// The URI may name a folder of splits (spec.dataset.split) that gives
  /// the files: a Hugging Face Hub repository, a saved DatasetDict.
  bool splits = false;
  /// Those splits are a Hugging Face Hub repository's, of configs
  /// (spec.dataset.config).
  bool hub_repository = false;
};

class FormatDriver;

/// A byte range of one file.
struct Extent {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class DatasetIndex {
 public:
  /// What the index needs to know of one file (an object of any storage
  /// scheme), gathered through the storage sources
  /// (sidecar/source/dataset_facts.h): the planner itself does no I/O.
  struct FileFacts {
    std::string path;
    uint64_t size = 0;
    Result<formats::NpyHeader> npy = Status(StatusCode::kNotFound, "header not read");  // Npy only
    /// MegatronIndexed: `path` is PREFIX.bin (`size` its bytes), and this
    /// is its PREFIX.idx, parsed (or why it could not be).
    Result<formats::MegatronIndex> megatron = Status(StatusCode::kNotFound, "index not read");
    /// WebDataset, MDS: where each sample starts in the file, then where
    /// the last one ends (N + 1 offsets: the Energon index, the MDS offset
    /// table), or why they could not be read.
    Result<std::vector<uint64_t>> records = Status(StatusCode::kNotFound, "index not read");
    /// MDS: the shard as index.json describes it.
    std::optional<formats::MdsShard> mds;
    /// The stored object's version (DatasetFile::version).
    std::string version;
    /// Set when `path` (of `size` bytes) is the decompression of another
    /// object (see DatasetFile::stored).
    std::optional<StoredFile> stored;
    /// Parquet: what the footer says, or why it could not be read (`size`
    /// is then the rows' records' bytes).
    Result<ParquetFile> parquet = Status(StatusCode::kNotFound, "footer not read");
  };
  /// Builds the index from facts about files, in the order given (callers
  /// sort them). Every problem (sizes that are not whole records or tokens,
  /// npy headers that disagree or did not parse, spec.dataset.samples
  /// contradicting the files) goes to `diags`; the result is an error only
  /// when nothing usable was found. Precondition: the format-specific
  /// fields passed ValidateJobSpec.
  static Result<DatasetIndex> FromFiles(const DatasetSpec& spec, std::vector<FileFacts> files, Diagnostics& diags);

  /// A mixture's datasets (spec.mixture) as one index: dataset d's samples
  /// are ids [parts()[d].first, parts()[d].first + parts()[d].samples), its
  /// files follow dataset d−1's. The datasets must agree on what a sample
  /// is (dtype, sample shape, fields); a disagreement goes to `diags`,
  /// named by `paths[d]` ("spec.mixture.datasets[d]"). All indexed or all
  /// virtual. TokenStream datasets each keep their own token stream (a
  /// sample never spans two datasets): between two datasets' ids a gap of
  /// an id or two may be unused.
  static Result<DatasetIndex> Combine(std::vector<DatasetIndex> datasets, const std::vector<std::string>& names,
                                      const std::vector<std::string>& paths, Diagnostics& diags);

  /// One dataset of a mixture (one part for a single dataset).
  struct Part {
    std::string name;
    uint64_t first = 0;    // its first sample id
    uint64_t samples = 0;  // N_d
  };
  const std::vector<Part>& parts() const { return parts_; }
  /// The part holding sample `i`.
  size_t PartOf(uint64_t i) const;

  /// The rows of tokens (spec.tokens) of `documents`, an index of a
  /// MegatronIndexed dataset or mixture, as an index whose samples are the
  /// rows (token_rows()): dataset d's rows are parts()[d], each row a dense
  /// sample of TokenRows::row_tokens() tokens. Problems (tokens that do not
  /// fit the dtype, documents longer than the job allows, a dataset that
  /// makes no row) go to `diags`, by field path. Precondition: `spec`
  /// passed ValidateJobSpec and has `tokens`; `documents` is indexed.
  static Result<DatasetIndex> CutIntoRows(DatasetIndex documents, const JobSpec& spec, Diagnostics& diags);

  /// With spec.tokens, the rows (null otherwise).
  const TokenRows* token_rows() const { return rows_.get(); }
  /// With spec.tokens: the documents the rows are cut from (ids of the
  /// documents' index; a mixture's in its datasets' order), and each
  /// dataset's.
  uint64_t documents() const { return rows_ ? documents_ : num_samples_; }
  const std::vector<Part>& document_parts() const { return rows_ ? document_parts_ : parts_; }
  /// With spec.tokens: the bytes of `tokens` tokens of document `doc` from
  /// its token `offset`.
  Extent DocumentExtent(uint64_t doc, uint64_t offset, uint64_t tokens) const;
  /// With spec.tokens: the tokens of document `doc`.
  uint64_t DocumentTokens(uint64_t doc) const { return sizes_[doc] / token_bytes_; }
  /// With spec.tokens: brings what DocumentExtent and DocumentTokens read
  /// for rows `ids` into the CPU's cache ahead of a step's lookups
  /// (TokenRows::Prefetch, then the documents' offsets and sizes).
  void PrefetchRows(const uint64_t* ids, size_t n) const {
    if (!rows_) return;
    rows_->Prefetch(ids, n, [this](uint64_t doc) {
      __builtin_prefetch(&offsets_[doc]);
      __builtin_prefetch(&sizes_[doc]);
    });
  }
  /// "sequence S of FILE" for document `doc` (a Megatron index's), for messages.
  std::string DescribeDocument(uint64_t doc) const;
  /// Bytes per token (TokenStream, and rows of tokens).
  uint64_t token_bytes() const { return token_bytes_; }

  /// An index of `samples` samples in one virtual file, for data that the
  /// planner cannot reach. sampleBytes is known for FixedRecord and
  /// TokenStream, and for Npy only when spec.recordBytes gives it.
  static DatasetIndex Virtual(const DatasetSpec& spec, uint64_t samples);

  DatasetFormat format() const { return format_; }
  /// The format's traits (FormatDriver::traits()).
  const FormatTraits& traits() const { return traits_; }
  formats::DType dtype() const { return dtype_; }
  uint64_t num_samples() const { return num_samples_; }
  /// Bytes of one sample as delivered to the trainer (TokenStream: (T+1)
  /// tokens). 0 when unknown (a virtual Npy index without recordBytes) or
  /// when samples differ in size (variable_size()).
  uint64_t sample_bytes() const { return sample_bytes_; }
  /// True for formats whose samples differ in size (MegatronIndexed): each
  /// sample's size comes from SampleBytes(i), and a batch is ragged.
  /// Rows of tokens (token_rows()) are dense samples of one size.
  bool variable_size() const { return !rows_ && traits_.variable_size; }
  /// WebDataset, MDS and TFRecord: a sample is a record of several values,
  /// read whole and decoded into fields().
  bool record_format() const { return traits_.records; }
  /// record_format(): how each of spec.dataset.fields is decoded, in order
  /// (for MDS, from the shards' column encodings).
  const std::vector<formats::FieldDecoding>& fields() const { return fields_; }
  MissingFieldPolicy missing_field() const { return missing_field_; }
  /// Bytes of sample `i` (a variable-size sample's from the index; 0 when
  /// not known: a virtual index of a variable-size format). Precondition:
  /// i < num_samples().
  uint64_t SampleBytes(uint64_t i) const {
    if (!variable_size()) return sample_bytes_;
    return sizes_.empty() ? 0 : sizes_[i];
  }
  /// The bytes of samples `ids` together.
  uint64_t BytesOf(const uint64_t* ids, size_t count) const;
  /// The most bytes any `k` samples can hold together: the sum of the `k`
  /// largest (k × sample_bytes() for fixed-size formats). What a slot
  /// holding `k` samples of any step must be able to take.
  uint64_t LargestBytes(uint64_t k) const;
  /// Variable-size formats: the smallest, mean and largest sample (bytes);
  /// all 0 for a virtual index.
  uint64_t min_sample_bytes() const { return min_sample_bytes_; }
  uint64_t max_sample_bytes() const { return max_sample_bytes_; }
  double mean_sample_bytes() const { return mean_sample_bytes_; }
  /// Shape of one sample in elements of dtype() (variable-size formats:
  /// empty, a sample is a run of elements).
  const std::vector<uint64_t>& sample_shape() const { return sample_shape_; }
  /// True when the files were read; false for a virtual index.
  bool indexed() const { return indexed_; }
  const std::vector<DatasetFile>& files() const { return files_; }

  /// Appends the byte ranges holding sample `i` (one range, or more when a
  /// TokenStream sample spans files). Precondition: i < num_samples().
  void AppendExtents(uint64_t i, std::vector<Extent>& out) const;

  /// The coalesced read ranges of a set of samples, in file and offset order:
  /// touching or overlapping ranges of one file merge (TokenStream
  /// neighbours share a token). Returns their total bytes. `ids` is sorted
  /// in place (radix sort: linear in the number of samples).
  uint64_t CoalescedExtents(std::vector<uint64_t>& ids, std::vector<Extent>& out) const;

 private:
  friend class FormatDriver;  // a format's driver builds the index

  DatasetFormat format_ = DatasetFormat::kFixedRecord;
  FormatTraits traits_;
  formats::DType dtype_ = formats::DType::kUint8;
  uint64_t num_samples_ = 0;
  uint64_t sample_bytes_ = 0;
  uint64_t token_bytes_ = 0;      // TokenStream: bytes per token
  uint64_t sequence_length_ = 0;  // TokenStream: T
  std::vector<uint64_t> sample_shape_;
  std::vector<formats::FieldDecoding> fields_;
  MissingFieldPolicy missing_field_ = MissingFieldPolicy::kError;
  bool indexed_ = false;
  std::vector<DatasetFile> files_;
  std::vector<Part> parts_;  // one, or a mixture's datasets
  // Variable-size formats, per sample: the byte offset in its file and the
  // bytes (empty for a virtual index).
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> sizes_;
  bool offsets_ascending_ = true;  // within each file, by sample
  // spec.tokens: the rows; offsets_ and sizes_ stay the documents'.
  std::shared_ptr<const TokenRows> rows_;
  uint64_t documents_ = 0;
  std::vector<Part> document_parts_;
  uint64_t min_sample_bytes_ = 0;
  uint64_t max_sample_bytes_ = 0;
  double mean_sample_bytes_ = 0;
};

/// Sorts in place in O(n) passes of up to 12-bit digits (as many as the largest
/// value needs).
void RadixSort(std::vector<uint64_t>& v);

/// Merges extents that touch or overlap within the same file (sorting them by
/// file and offset first). Returns the total bytes of the merged ranges.
uint64_t CoalesceExtents(std::vector<Extent>& extents);

}  // namespace meshload::planner
