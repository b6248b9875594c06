#include "sidecar/staging/batch_layout.h"

#include <algorithm>

namespace meshload::sidecar::staging {
namespace {

uint64_t Aligned(uint64_t n) { return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

// The fields of `job`'s batch: the dataset's one tensor, or (WebDataset,
// MDS) each field as the index decodes it.
std::vector<FieldLayout> Fields(const planner::DatasetIndex& ds) {
  std::vector<FieldLayout> out;
  const planner::TokenRows* rows = ds.token_rows();
  if (rows && rows->mode() == planner::TokensMode::kPack) {
    // Packed rows: the tokens, and the segment ids and positions an
    // attention mask is made from (token_rows.h).
    const uint64_t T = rows->row_tokens();
    out.push_back({std::string(kTokensField), ds.dtype(), false, {T}, T * formats::DTypeSize(ds.dtype())});
    out.push_back({std::string(kSegmentIdsField), formats::DType::kInt32, false, {T}, T * sizeof(int32_t)});
    out.push_back({std::string(kPositionsField), formats::DType::kInt32, false, {T}, T * sizeof(int32_t)});
    return out;
  }
  if (!ds.record_format()) {
    FieldLayout f;
    f.dtype = ds.dtype();
    f.ragged = ds.variable_size();
    f.sample_shape = ds.sample_shape();
    f.sample_bytes = ds.sample_bytes();
    out.push_back(std::move(f));
    return out;
  }
  for (const formats::FieldDecoding& d : ds.fields()) {
    FieldLayout f;
    f.name = d.name;
    f.dtype = d.dtype;
    f.ragged = d.ragged();
    if (!f.ragged) {
      f.sample_shape = d.shape;
      f.sample_bytes = d.sample_bytes();
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace

uint64_t UsedRegionBytes(const BatchLayout& layout, size_t device, const StagedTensor* staged) {
  const DeviceTensor& d = layout.devices[device];
  if (staged == nullptr || !layout.fields.back().ragged || staged->values_bytes.size() != layout.fields.size()) {
    return d.region_bytes;
  }
  const uint64_t end = d.fields.back().offset - d.region_offset + staged->values_bytes.back();
  return std::min(d.region_bytes, end);
}

BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process) {
  BatchLayout l;
  const planner::DatasetIndex& ds = job.dataset;
  l.fields = Fields(ds);
  l.samples_per_device = job.global_batch / static_cast<uint64_t>(job.mesh.shards());
  l.extracts = ds.record_format();
  const uint64_t n = l.samples_per_device;
  // What any n samples take together: the room of a ragged field's values
  // (a field of a record is part of its bytes) and of the records read.
  const uint64_t largest = ds.variable_size() ? ds.LargestBytes(n) : 0;
  if (l.extracts) l.record_room = Aligned(largest);

  // One device's region: each field's tensor, relative to the region.
  std::vector<FieldTensor> tensors;
  uint64_t region = 0;
  for (size_t fi = 0; fi < l.fields.size(); ++fi) {
    const FieldLayout& f = l.fields[fi];
    FieldTensor t;
    if (f.ragged) {
      const uint64_t expansion = l.extracts ? ds.fields()[fi].expansion() : 1;
      const uint64_t es = formats::DTypeSize(f.dtype);
      // A field decoded from the record can take more than its bytes there
      // (a TFRecord int64 varint of one byte is 8).
      const uint64_t values = largest * expansion / es * es;
      t.offsets_offset = region;
      region += Aligned((n + 1) * sizeof(int64_t));
      t.offset = region;
      t.shape = {static_cast<int64_t>(values / es)};
      t.strides = {1};
      t.nbytes = values;
    } else {
      t.offset = region;
      t.shape = {static_cast<int64_t>(n)};
      for (uint64_t d : f.sample_shape) t.shape.push_back(static_cast<int64_t>(d));
      t.strides.assign(t.shape.size(), 1);
      for (size_t i = t.shape.size() - 1; i-- > 0;) t.strides[i] = t.strides[i + 1] * t.shape[i + 1];
      t.nbytes = n * f.sample_bytes;
    }
    region += Aligned(t.nbytes);
    tensors.push_back(std::move(t));
  }
  // A single dense tensor keeps its exact size (no padding after the last
  // device's), as before fields existed.
  const int64_t L = job.mesh.devices_per_process();
  for (int64_t i = 0; i < L; ++i) {
    DeviceTensor d;
    d.device = process * L + i;
    d.region_offset = static_cast<uint64_t>(i) * region;
    d.region_bytes = region;
    if (l.fields.size() == 1 && !l.fields[0].ragged) d.region_bytes = tensors[0].nbytes;
    for (const FieldTensor& t : tensors) {
      FieldTensor at = t;
      at.offset += d.region_offset;
      at.offsets_offset += d.region_offset;
      d.fields.push_back(std::move(at));
    }
    l.devices.push_back(std::move(d));
  }
  l.slot_bytes = region * static_cast<uint64_t>(L);
  return l;
}

}  // namespace meshload::sidecar::staging
