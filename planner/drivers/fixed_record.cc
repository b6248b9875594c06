// FixedRecord: each file is a whole number of spec.dataset.recordBytes records.

#include "planner/drivers/drivers.h"
#include "planner/spec_reader.h"

namespace meshload::planner::drivers {
namespace {

class FixedRecordDriver final : public FormatDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kFixedRecord; }
  FormatTraits traits() const override { return {}; }

  void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const override {
    if (ds.record_bytes < 1) {
      AddOnce(d, "spec.dataset.recordBytes",
              !RecordBytesGiven(ds) ? "required for format FixedRecord: the bytes of one record"
                                    : "must be >= 1, got " + std::to_string(ds.record_bytes));
    } else if (ds.dtype && ds.record_bytes % static_cast<int64_t>(formats::DTypeSize(*ds.dtype)) != 0) {
      d.Add("spec.dataset.recordBytes", std::to_string(ds.record_bytes) + " is not a whole number of " +
                                            std::string(formats::DTypeName(*ds.dtype)) + " elements (" +
                                            std::to_string(formats::DTypeSize(*ds.dtype)) + " bytes each)");
    }
    RefuseSequenceLength(ds, d);
  }

  bool AddFile(const DatasetSpec& spec, DatasetIndex::FileFacts&, DatasetFile& f, DatasetIndex&,
               Diagnostics& diags) const override {
    const uint64_t rb = static_cast<uint64_t>(spec.record_bytes);
    if (f.size % rb != 0) {
      diags.Add(f.path, "size " + std::to_string(f.size) + " is not a whole number of " + std::to_string(rb) +
                            "-byte records (" + std::to_string(f.size / rb) + " records and " +
                            std::to_string(f.size % rb) + " bytes left over); check spec.dataset.recordBytes");
    }
    f.count = f.size / rb;
    return true;
  }

  Status Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics&) const override {
    Shape(spec, idx);
    Parts(idx).num_samples = total;
    return Status::Ok();
  }

  void Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const override {
    Shape(spec, idx);
    f.count = samples;
    f.size = samples * idx.sample_bytes();
  }

 private:
  static void Shape(const DatasetSpec& spec, DatasetIndex& idx) {
    IndexParts p = Parts(idx);
    p.sample_bytes = static_cast<uint64_t>(spec.record_bytes);
    p.sample_shape = {p.sample_bytes / formats::DTypeSize(p.dtype)};
  }
};

}  // namespace

const FormatDriver& FixedRecord() {
  static const FixedRecordDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
