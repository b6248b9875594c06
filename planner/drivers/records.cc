// What the record formats (WebDataset, MDS, TFRecord) share: each file's
// index gives where its samples start and where the last one ends, and
// spec.dataset.fields say what a sample delivers.

#include <algorithm>

#include "planner/drivers/drivers.h"
#include "planner/spec_reader.h"

namespace meshload::planner::drivers {
namespace {

constexpr uint64_t kMaxFieldValues = uint64_t{1} << 24;  // spec.dataset.fields[].shape's product

}  // namespace

void RefuseSequenceLength(const DatasetSpec& ds, Diagnostics& d) {
  if (SequenceLengthGiven(ds)) d.Add("spec.dataset.sequenceLength", "is only used by format TokenStream; remove it");
}

FormatTraits RecordDriver::traits() const { return {.variable_size = true, .records = true}; }

void RecordDriver::CheckSpec(const DatasetSpec& ds, Diagnostics& d) const {
  const std::string format_name = name();
  RefuseSequenceLength(ds, d);
  if (RecordBytesGiven(ds)) {
    d.Add("spec.dataset.recordBytes",
          "is not used by format " + format_name + " (its index gives every sample's size); remove it");
  }
  if (ds.dtype) {
    d.Add("spec.dataset.dtype",
          "is not used by format " + format_name + "; give each field's dtype in spec.dataset.fields");
  }
  if (ds.fields.empty()) {
    AddOnce(d, "spec.dataset.fields",
            "required for format " + format_name +
                ": the fields each sample delivers, e.g. [{name: jpg}, {name: cls, dtype: int64}]");
  }
  for (size_t i = 0; i < ds.fields.size(); ++i) {
    const DatasetField& f = ds.fields[i];
    const std::string at = "spec.dataset.fields[" + std::to_string(i) + "]";
    if (f.name.empty() || f.name.size() > 128 || f.name.find('/') != std::string::npos) {
      d.Add(at + ".name", "'" + f.name + "' is not a field name (1 to 128 characters, no '/')");
    }
    for (size_t j = 0; j < i; ++j) {
      if (ds.fields[j].name == f.name) d.Add(at + ".name", "'" + f.name + "' is listed twice");
    }
    CheckField(f, at, d);
    if (f.max_bytes && (*f.max_bytes < kDatasetFieldMaxBytesMinimum || *f.max_bytes > kDatasetFieldMaxBytesMaximum)) {
      d.Add(at + ".maxBytes", "must be between " + std::to_string(kDatasetFieldMaxBytesMinimum) + " and " +
                                  std::to_string(kDatasetFieldMaxBytesMaximum) + ", got " +
                                  std::to_string(*f.max_bytes));
    } else if (f.max_bytes && format() != DatasetFormat::kParquet && format() != DatasetFormat::kArrow) {
      d.Add(at + ".maxBytes", "is only used by formats Parquet and Arrow (" + format_name +
                                  "'s index gives each sample's size); remove it");
    }
    if (f.shape_set) {
      // Each dimension's range is the declaration's check; their product's is this.
      uint64_t values = 1;
      bool each_in_range = true;
      for (int64_t dim : f.shape) {
        each_in_range = each_in_range && dim >= 1 && dim <= static_cast<int64_t>(kMaxFieldValues);
        if (each_in_range) values = std::min<uint64_t>(values * static_cast<uint64_t>(dim), kMaxFieldValues + 1);
      }
      if (each_in_range && values > kMaxFieldValues) {
        d.Add(at + ".shape",
              "holds more than 16777216 (2^24) values a sample; a larger list is a ragged field "
              "(leave shape out)");
      }
    }
  }
}

void RecordDriver::CheckField(const DatasetField& f, const std::string& at, Diagnostics& d) const {
  if (f.shape_set) {
    d.Add(at + ".shape",
          "is only used by format TFRecord (an MDS ndarray's shape comes from the shards; "
          "a WebDataset number is one value); remove it");
  }
}

bool RecordDriver::AddFile(const DatasetSpec&, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
                           Diagnostics& diags) const {
  Result<std::vector<uint64_t>>& r = facts.records;
  if (!r.ok()) {
    diags.Add(r.status());
    return false;
  }
  if (r->empty()) {
    diags.Add(f.path, "its index lists no offsets");
    return false;
  }
  IndexParts p = Parts(idx);
  f.count = r->size() - 1;
  p.offsets.reserve(p.offsets.size() + f.count);
  p.sizes.reserve(p.sizes.size() + f.count);
  for (uint64_t i = 0; i < f.count; ++i) {
    p.offsets.push_back((*r)[i]);
    p.sizes.push_back((*r)[i + 1] - (*r)[i]);
  }
  f.mds = std::move(facts.mds);
  f.stored = std::move(facts.stored);
  return true;
}

Status RecordDriver::Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics& diags) const {
  IndexParts p = Parts(idx);
  p.dtype = formats::DType::kUint8;
  p.missing_field = spec.missing_field;
  p.fields.clear();
  if (!ResolveFields(spec, idx, diags)) return InvalidArgument("the fields cannot be read", spec.uri);
  p.num_samples = total;
  p.sample_bytes = 0;
  return Status::Ok();
}

void RecordDriver::Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const {
  // Sizes and MDS column encodings come only from the shards.
  IndexParts p = Parts(idx);
  f.count = samples;
  p.missing_field = spec.missing_field;
  for (const DatasetField& field : spec.fields) p.fields.push_back(VirtualField(field));
}

}  // namespace meshload::planner::drivers
