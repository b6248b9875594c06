// TFRecord: records framed with their masked CRC32C, by the offsets of each
// file's FILE.idx (DALI's tfrecord2idx format); a field is the
// tf.train.Example feature of its name. Files may be GZIP or ZLIB
// compressed as a whole (spec.dataset.compression).

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

// spec.dataset.fields[].shape, when given (CheckSpec checked each dimension).
std::optional<std::vector<uint64_t>> Shape(const DatasetField& field) {
  if (!field.shape_set) return std::nullopt;
  return std::vector<uint64_t>(field.shape.begin(), field.shape.end());
}

class TfRecordDecoder final : public RecordDecoder {
 public:
  explicit TfRecordDecoder(const DatasetIndex& ds) : ds_(ds) {}
  Status Decode(uint64_t id, std::string_view record, uint32_t file, const std::string& file_name, uint64_t offset,
                formats::FieldValues& values, std::string& key) const override {
    key = "record " + std::to_string(id - ds_.files()[file].first);
    return formats::TfRecordSampleValues(record, file_name, offset, ds_.fields(), values);
  }

 private:
  const DatasetIndex& ds_;
};

class TfRecordDriver final : public RecordDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kTFRecord; }
  FormatTraits traits() const override {
    FormatTraits t = RecordDriver::traits();
    t.file_compression = true;
    return t;
  }
  std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const override {
    return std::make_unique<TfRecordDecoder>(ds);
  }

 protected:
  void CheckField(const DatasetField& f, const std::string& at, Diagnostics& d) const override {
    if (f.dtype && *f.dtype != formats::DType::kInt64 && *f.dtype != formats::DType::kFloat32) {
      d.Add(at + ".dtype", std::string(formats::DTypeName(*f.dtype)) +
                               " is not a TFRecord feature's type: int64 (an int64_list), float32 (a "
                               "float_list), or no dtype for a bytes_list");
    }
    if (f.shape_set && !f.dtype) {
      d.Add(at + ".shape",
            "needs a dtype: int64 for an int64_list, float32 for a float_list (a bytes_list's "
            "value is ragged bytes)");
    }
  }

  // Each field is the feature of its name; its kind is checked record by
  // record (an Example has no schema).
  bool ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics& diags) const override {
    bool ok = true;
    for (size_t i = 0; i < spec.fields.size(); ++i) {
      auto d = formats::TfRecordFieldDecoding(spec.fields[i].name, spec.fields[i].dtype, Shape(spec.fields[i]));
      if (!d.ok()) {
        diags.Add("spec.dataset.fields[" + std::to_string(i) + "].dtype", d.status().message());
        ok = false;
        continue;
      }
      Parts(idx).fields.push_back(std::move(*d));
    }
    return ok;
  }

  // A list's values, ragged unless the field's shape says.
  formats::FieldDecoding VirtualField(const DatasetField& field) const override {
    auto tf = formats::TfRecordFieldDecoding(field.name, field.dtype, Shape(field));
    return tf.ok() ? std::move(*tf) : formats::WebDatasetFieldDecoding(field.name, field.dtype);
  }
};

}  // namespace

const FormatDriver& TFRecord() {
  static const TfRecordDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
