/// \file
/// The formats the planner knows, one driver each (planner/format_driver.h),
/// and what their drivers share. FormatDrivers() registers them.
#pragma once

#include <string>

#include "planner/format_driver.h"

namespace meshload::planner::drivers {

const FormatDriver& FixedRecord();
const FormatDriver& TokenStream();
const FormatDriver& Npy();
const FormatDriver& MegatronIndexed();
const FormatDriver& WebDataset();
const FormatDriver& MDS();
const FormatDriver& TFRecord();
const FormatDriver& Parquet();
const FormatDriver& Arrow();

/// spec.dataset.recordBytes or sequenceLength given (set, or not 0).
inline bool RecordBytesGiven(const DatasetSpec& ds) { return ds.record_bytes_set || ds.record_bytes != 0; }
inline bool SequenceLengthGiven(const DatasetSpec& ds) { return ds.sequence_length_set || ds.sequence_length != 0; }

/// spec.dataset.sequenceLength, which only TokenStream uses, refused.
void RefuseSequenceLength(const DatasetSpec& ds, Diagnostics& d);

/// A format whose samples are records of named fields (WebDataset, MDS,
/// TFRecord): each file's index lists where its samples start and where the
/// last ends; spec.dataset.fields say what each sample delivers.
class RecordDriver : public FormatDriver {
 public:
  FormatTraits traits() const override;
  void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const override;
  bool AddFile(const DatasetSpec& spec, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
               Diagnostics& diags) const override;
  Status Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics& diags) const override;
  void Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const override;
  std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const override = 0;

 protected:
  /// The format's own check of field `i` (at "spec.dataset.fields[i]"):
  /// by default a shape is refused (only TFRecord's lists take one).
  /// A field's maxBytes is refused by RecordDriver::CheckSpec for every
  /// format but Parquet.
  virtual void CheckField(const DatasetField& field, const std::string& at, Diagnostics& d) const;
  /// How each field is decoded, from the spec and the files' facts (in
  /// `idx`); false when a problem went to `diags`.
  virtual bool ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics& diags) const = 0;
  /// How a field is taken in a virtual index (no files to say more).
  virtual formats::FieldDecoding VirtualField(const DatasetField& field) const = 0;
};

}  // namespace meshload::planner::drivers
