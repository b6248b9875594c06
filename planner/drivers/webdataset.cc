// WebDataset: tar shards, each with its Energon SHARD.tar.idx; sample i of a
// shard is the bytes [idx[i], idx[i+1]) (its members), a field a member's
// extension.

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

class WebDatasetDriver final : public RecordDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kWebDataset; }

 protected:
  void CheckField(const DatasetField& f, const std::string& at, Diagnostics& d) const override {
    if (f.dtype && (*f.dtype == formats::DType::kBool || *f.dtype == formats::DType::kBFloat16)) {
      d.Add(at + ".dtype", std::string(formats::DTypeName(*f.dtype)) +
                               " is not decoded from a WebDataset member's text; use an integer or float type, or "
                               "leave dtype out for the bytes");
    }
    if (f.shape_set) {
      d.Add(at + ".shape",
            "is only used by format TFRecord (an MDS ndarray's shape comes from the shards; "
            "a WebDataset number is one value); remove it");
    }
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
