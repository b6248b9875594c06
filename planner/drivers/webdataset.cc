// WebDataset: tar shards, each with its Energon SHARD.tar.idx; sample i of a
// shard is the bytes [idx[i], idx[i+1]) (its members), a field a member's
// extension.

#include <cctype>

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

class WebDatasetDecoder final : public RecordDecoder {
 public:
  // The fields' names as member extensions (lower-cased, as webdataset
  // splits names).
  explicit WebDatasetDecoder(const DatasetIndex& ds) {
    for (const formats::FieldDecoding& f : ds.fields()) {
      std::string ext = f.name;
      for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      extensions_.push_back(std::move(ext));
    }
  }
  Status Decode(uint64_t, std::string_view record, uint32_t, const std::string& file_name, uint64_t offset,
                formats::FieldValues& values, std::string& key) const override {
    return formats::WebDatasetSampleValues(record, file_name, offset, extensions_, values, key);
  }

 private:
  std::vector<std::string> extensions_;
};

class WebDatasetDriver final : public RecordDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kWebDataset; }
  std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const override {
    return std::make_unique<WebDatasetDecoder>(ds);
  }

 protected:
  void CheckField(const DatasetField& f, const std::string& at, Diagnostics& d) const override {
    if (f.dtype && (*f.dtype == formats::DType::kBool || *f.dtype == formats::DType::kBFloat16)) {
      d.Add(at + ".dtype", std::string(formats::DTypeName(*f.dtype)) +
                               " is not decoded from a WebDataset member's text; use an integer or float type, or "
                               "leave dtype out for the bytes");
    }
    RecordDriver::CheckField(f, at, d);
  }

  bool ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics&) const override {
    for (const DatasetField& field : spec.fields) Parts(idx).fields.push_back(VirtualField(field));
    return true;
  }

  formats::FieldDecoding VirtualField(const DatasetField& field) const override {
    return formats::WebDatasetFieldDecoding(field.name, field.dtype);
  }
};

}  // namespace

const FormatDriver& WebDataset() {
  static const WebDatasetDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
