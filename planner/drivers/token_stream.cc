// TokenStream: the files' tokens are one stream; sample i is tokens
// [i·T, i·T + T + 1) of it, T = spec.dataset.sequenceLength.

#include "planner/drivers/drivers.h"
#include "planner/spec_reader.h"

namespace meshload::planner::drivers {
namespace {

class TokenStreamDriver final : public FormatDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kTokenStream; }
  FormatTraits traits() const override { return {.token_stream = true}; }

  void CheckSpec(const DatasetSpec& ds, Diagnostics& d) const override {
    if (!ds.dtype) {
      AddOnce(d, "spec.dataset.dtype", "required for format TokenStream: the token type, e.g. uint16 or uint32");
    } else if (!formats::IsIntegerDType(*ds.dtype)) {
      d.Add("spec.dataset.dtype",
            "TokenStream tokens must be an integer type, got " + std::string(formats::DTypeName(*ds.dtype)));
    }
    if (ds.sequence_length < 1) {
      AddOnce(d, "spec.dataset.sequenceLength",
              !SequenceLengthGiven(ds)
                  ? "required for format TokenStream: tokens per sample (T; a sample is T+1 tokens)"
                  : "must be >= 1, got " + std::to_string(ds.sequence_length));
    }
    if (RecordBytesGiven(ds)) {
      d.Add("spec.dataset.recordBytes",
            "is not used by format TokenStream (a sample is sequenceLength+1 tokens); remove it");
    }
  }

  bool AddFile(const DatasetSpec&, DatasetIndex::FileFacts&, DatasetFile& f, DatasetIndex& idx,
               Diagnostics& diags) const override {
    const formats::DType dtype = Parts(idx).dtype;
    const uint64_t tb = formats::DTypeSize(dtype);
    if (f.size % tb != 0) {
      diags.Add(f.path, "size " + std::to_string(f.size) + " is not a whole number of " +
                            std::string(formats::DTypeName(dtype)) + " tokens (" + std::to_string(tb) +
                            " bytes each); check spec.dataset.dtype");
    }
    f.count = f.size / tb;
    return true;
  }

  Status Finish(const DatasetSpec& spec, uint64_t total, DatasetIndex& idx, Diagnostics&) const override {
    Shape(spec, idx);
    IndexParts p = Parts(idx);
    p.num_samples = total >= 1 ? (total - 1) / p.sequence_length : 0;
    return Status::Ok();
  }

  void Virtual(const DatasetSpec& spec, uint64_t samples, DatasetFile& f, DatasetIndex& idx) const override {
    Shape(spec, idx);
    IndexParts p = Parts(idx);
    f.count = samples * p.sequence_length + 1;
    f.size = f.count * p.token_bytes;
  }

 private:
  static void Shape(const DatasetSpec& spec, DatasetIndex& idx) {
    IndexParts p = Parts(idx);
    p.token_bytes = formats::DTypeSize(p.dtype);
    p.sequence_length = static_cast<uint64_t>(spec.sequence_length);
    p.sample_bytes = (p.sequence_length + 1) * p.token_bytes;
    p.sample_shape = {p.sequence_length + 1};
  }
};

}  // namespace

const FormatDriver& TokenStream() {
  static const TokenStreamDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
