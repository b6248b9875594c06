// Npy: each file a C-order .npy array of one dtype and trailing shape;
// samples run along axis 0.

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

class NpyDriver final : public FormatDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kNpy; }
  FormatTraits traits() const override { return {}; }

  void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const override {
    RefuseSequenceLength(ds, d);
    if (RecordBytesGiven(ds) && ds.record_bytes < 1) {
      d.Add("spec.dataset.recordBytes", "must be >= 1, got " + std::to_string(ds.record_bytes));
    }
  }

  bool AddFile(const DatasetSpec& spec, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
               Diagnostics& diags) const override {
    const std::string& p = f.path;
    Result<formats::NpyHeader>& h = facts.npy;
    if (!h.ok()) {
      diags.Add(h.status());
      return false;
    }
    if (h->shape.empty()) {
      diags.Add(p, "holds a 0-dimensional array; samples run along axis 0, so it needs at least 1 dimension");
      return false;
    }
    if (spec.dtype && *spec.dtype != h->dtype) {
      diags.Add(p, "dtype is " + std::string(formats::DTypeName(h->dtype)) + " ('" + h->descr +
                       "') but spec.dataset.dtype is " + std::string(formats::DTypeName(*spec.dtype)));
    }
    const std::vector<DatasetFile>& files = Parts(idx).files;
    if (!files.empty() && files.front().npy) {
      const formats::NpyHeader& first = *files.front().npy;
      std::vector<uint64_t> a(first.shape.begin() + 1, first.shape.end());
      std::vector<uint64_t> b(h->shape.begin() + 1, h->shape.end());
      if (a != b || first.dtype != h->dtype) {
        diags.Add(p, "holds samples of shape " + ShapeString(b) + " and dtype " +
                         std::string(formats::DTypeName(h->dtype)) + ", but " + files.front().path + " holds " +
                         ShapeString(a) + " " + std::string(formats::DTypeName(first.dtype)) +
                         "; every file of a dataset must agree");
      }
    }
    if (f.size != h->data_offset + h->data_bytes) {
      diags.Add(p, "size " + std::to_string(f.size) + " does not match its npy header, which says " +
                       std::to_string(h->data_offset) + " header bytes + " + std::to_string(h->data_bytes) +
                       " data bytes = " + std::to_string(h->data_offset + h->data_bytes) +
                       (f.size < h->data_offset + h->data_bytes ? " (truncated)" : " (trailing bytes)"));
    }
    f.data_offset = h->data_offset;
    f.count = h->shape[0];
    f.npy = std::move(*h);
    return true;
  }

  Status Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics& diags) const override {
    IndexParts p = Parts(idx);
    const formats::NpyHeader& h = *p.files.front().npy;
    p.dtype = h.dtype;
    p.num_samples = total;
    p.sample_shape.assign(h.shape.begin() + 1, h.shape.end());
    uint64_t elements = 1;
    for (uint64_t dim : p.sample_shape) elements *= dim;
    p.sample_bytes = elements * formats::DTypeSize(h.dtype);
    if (spec.record_bytes > 0 && static_cast<uint64_t>(spec.record_bytes) != p.sample_bytes) {
      diags.Add("spec.dataset.recordBytes",
                std::to_string(spec.record_bytes) + " disagrees with the npy files, whose samples are " +
                    std::to_string(p.sample_bytes) + " bytes (shape " + ShapeString(p.sample_shape) + ", " +
                    std::string(formats::DTypeName(h.dtype)) + ")");
    }
    return Status::Ok();
  }

  void Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const override {
    IndexParts p = Parts(idx);
    p.sample_bytes = spec.record_bytes > 0 ? static_cast<uint64_t>(spec.record_bytes) : 0;
    if (p.sample_bytes) p.sample_shape = {p.sample_bytes / formats::DTypeSize(p.dtype)};
    f.count = samples;
    f.size = samples * p.sample_bytes;
  }
};

}  // namespace

const FormatDriver& Npy() {
  static const NpyDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
