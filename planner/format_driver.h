/// \file
/// A dataset format, as the planner sees it: one driver per format
/// (planner/drivers/), registered once (FormatDrivers()). A driver holds
/// everything the planner knows of its format: what kind of samples it has
/// (FormatTraits), its checks of spec.dataset, how the facts gathered from
/// its files (DatasetIndex::FileFacts: sizes, headers and indexes, read by
/// the sources; a driver does no I/O) become the dataset index, and the
/// virtual index that stands in for files the planner cannot reach.
///
/// The planner asks the registry; nothing outside planner/drivers/ switches
/// over formats. Adding a format is its value in the declaration
/// (planner/api/dataloadjob.yaml), its driver file, and one line in
/// FormatDrivers().
///
/// Thread safety: drivers are immutable singletons; every method is const
/// and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/dataset_index.h"
#include "planner/spec.h"

namespace meshload::planner {

/// How a record format's samples become the job's field values: made once
/// per job (FormatDriver::MakeDecoder), then called for each sample.
class RecordDecoder {
 public:
  virtual ~RecordDecoder() = default;
  /// Sample `id`'s wanted values from its `record` (the bytes the index
  /// gives it, read whole from file `file`, named `file_name` in messages, at
  /// byte `offset`): views into `record`, nullopt for a field the sample
  /// lacks; `key` names the sample in messages (a WebDataset key, an MDS
  /// row, a TFRecord record). Errors name the file and byte.
  virtual Status Decode(uint64_t id, std::string_view record, uint32_t file, const std::string& file_name,
                        uint64_t offset, formats::FieldValues& values, std::string& key) const = 0;
};

class FormatDriver {
 public:
  virtual ~FormatDriver() = default;

  virtual DatasetFormat format() const = 0;
  virtual FormatTraits traits() const = 0;
  std::string name() const { return std::string(ToString(format())); }

  /// The format's checks of spec.dataset (part of ValidateJobSpec): the
  /// fields it needs, the fields it does not use. The declaration checked
  /// each field's own range.
  virtual void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const = 0;

  /// One file of the dataset into the index being built (`idx`, which holds
  /// the files added before it): sets f.count (its samples, or tokens for a
  /// token stream) and, for variable-size formats, appends its samples'
  /// offsets and sizes. Returns false to leave the file out; every problem
  /// goes to `diags`, named by the file. Precondition: CheckSpec passed.
  virtual bool AddFile(const DatasetSpec& spec, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
                       Diagnostics& diags) const = 0;

  /// After the files (`total`: the sum of their counts): the samples' count,
  /// bytes, shape and fields. An error when the index cannot be used at all;
  /// other problems go to `diags`.
  virtual Status Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics& diags) const = 0;

  /// The virtual index of `samples` samples in the one file `f`: what can be
  /// known of them without the files (its count, size, fields).
  virtual void Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const = 0;

  /// A record format's decoder of `ds`'s samples (`ds`, an index this
  /// driver built, must outlive it); null for the other formats.
  virtual std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const {
    (void)ds;
    return nullptr;
  }

 protected:
  /// The parts of an index a driver builds (DatasetIndex lets drivers, and
  /// only them, set these).
  struct IndexParts {
    formats::DType& dtype;
    uint64_t& num_samples;
    uint64_t& sample_bytes;
    uint64_t& token_bytes;
    uint64_t& sequence_length;
    std::vector<uint64_t>& sample_shape;
    std::vector<formats::FieldDecoding>& fields;
    MissingFieldPolicy& missing_field;
    std::vector<DatasetFile>& files;
    std::vector<uint64_t>& offsets;
    std::vector<uint64_t>& sizes;
    bool& offsets_ascending;
  };
  static IndexParts Parts(DatasetIndex& idx);
};

/// Every registered format, in the declaration's order.
const std::vector<const FormatDriver*>& FormatDrivers();

/// The driver of `format`.
const FormatDriver& DriverOf(DatasetFormat format);

/// The formats with `trait`, for messages: "WebDataset, MDS or TFRecord"
/// (`last` joins the last two).
std::string FormatsWith(bool FormatTraits::*trait, std::string_view last = "or");

}  // namespace meshload::planner
