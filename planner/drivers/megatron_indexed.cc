// MegatronIndexed: each PREFIX.bin with its PREFIX.idx (Megatron-LM's indexed
// dataset); sample i of a file is its sequence i, of the size and at the
// offset the .idx gives.

#include "formats/megatron_index.h"
#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

class MegatronIndexedDriver final : public FormatDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kMegatronIndexed; }
  FormatTraits traits() const override { return {.variable_size = true, .documents = true}; }

  void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const override {
    RefuseSequenceLength(ds, d);
    if (RecordBytesGiven(ds)) {
      d.Add("spec.dataset.recordBytes",
            "is not used by format MegatronIndexed (the .idx gives every sample's size); remove it");
    }
    if (ds.dtype && !formats::IsMegatronDType(*ds.dtype)) {
      d.Add("spec.dataset.dtype", std::string(formats::DTypeName(*ds.dtype)) +
                                      " is not a Megatron indexed dataset type (uint8, int8, int16, uint16, int32, "
                                      "int64, float32, float64); leave it out to take the .idx's");
    }
  }

  bool AddFile(const DatasetSpec& spec, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
               Diagnostics& diags) const override {
    const std::string& p = f.path;
    Result<formats::MegatronIndex>& m = facts.megatron;
    if (!m.ok()) {
      diags.Add(m.status());
      return false;
    }
    if (Status st = formats::CheckMegatronData(*m, p, f.size); !st.ok()) {
      diags.Add(st);
      return false;
    }
    IndexParts parts = Parts(idx);
    const formats::DType dt = formats::ToDType(m->dtype);
    // The dtype is the .idx's code at byte 17 (formats/megatron_index.h).
    const std::string dtype_at =
        (p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0 ? p.substr(0, p.size() - 4) + ".idx" : p) + "@17";
    if (spec.dtype && *spec.dtype != dt) {
      diags.Add(dtype_at, "the index says its dtype is " + std::string(m->dtype.name) + " but spec.dataset.dtype is " +
                              std::string(formats::DTypeName(*spec.dtype)));
    }
    if (!parts.files.empty() && parts.dtype != dt) {
      diags.Add(dtype_at, "holds " + std::string(m->dtype.name) + " elements, but " + parts.files.front().path +
                              " holds " + std::string(formats::DTypeName(parts.dtype)) +
                              "; every file of a dataset must agree");
      return false;
    }
    parts.dtype = dt;
    f.count = m->sequences();
    parts.offsets.reserve(parts.offsets.size() + f.count);
    parts.sizes.reserve(parts.sizes.size() + f.count);
    for (uint64_t i = 0; i < f.count; ++i) {
      const uint64_t at = static_cast<uint64_t>(m->pointers[i]);
      if (i > 0 && at < parts.offsets.back()) parts.offsets_ascending = false;
      parts.offsets.push_back(at);
      parts.sizes.push_back(m->SequenceBytes(i));
    }
    return true;
  }

  Status Finish(const DatasetSpec&, uint64_t total, DatasetIndex& idx, Diagnostics&) const override {
    Parts(idx).num_samples = total;
    return Status::Ok();
  }

  void Virtual(const DatasetSpec&, uint64_t samples, DatasetFile& f, DatasetIndex&) const override {
    f.count = samples;  // sizes come only from the index: unknown here
  }
};

}  // namespace

const FormatDriver& MegatronIndexed() {
  static const MegatronIndexedDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
