#include "sidecar/staging/batch_layout.h"

namespace meshload::sidecar::staging {
namespace {

uint64_t Aligned(uint64_t n) { return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

}  // namespace

BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process) {
  BatchLayout l;
  l.dtype = job.dataset.dtype();
  l.sample_bytes = job.dataset.sample_bytes();
  l.samples_per_device = job.global_batch / static_cast<uint64_t>(job.mesh.shards());
  l.ragged = job.dataset.variable_size();
  const int64_t L = job.mesh.devices_per_process();
  if (l.ragged) {
    const uint64_t es = formats::DTypeSize(l.dtype);
    const uint64_t values = job.dataset.LargestBytes(l.samples_per_device);
    const uint64_t offsets = Aligned((l.samples_per_device + 1) * sizeof(int64_t));
    const uint64_t region = offsets + Aligned(values);
    for (int64_t i = 0; i < L; ++i) {
      DeviceTensor t;
      t.device = process * L + i;
      t.region_offset = static_cast<uint64_t>(i) * region;
      t.region_bytes = region;
      t.offsets_offset = t.region_offset;
      t.offset = t.region_offset + offsets;
      t.shape = {static_cast<int64_t>(values / es)};
      t.strides = {1};
      t.nbytes = values;
      l.devices.push_back(std::move(t));
    }
    l.slot_bytes = region * static_cast<uint64_t>(L);
    return l;
  }
  std::vector<int64_t> shape = {static_cast<int64_t>(l.samples_per_device)};
  for (uint64_t d : job.dataset.sample_shape()) shape.push_back(static_cast<int64_t>(d));
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  const uint64_t nbytes = l.samples_per_device * l.sample_bytes;
  const uint64_t aligned = Aligned(nbytes);
  for (int64_t i = 0; i < L; ++i) {
    DeviceTensor t;
    t.device = process * L + i;
    t.offset = static_cast<uint64_t>(i) * aligned;
    t.shape = shape;
    t.strides = strides;
    t.nbytes = nbytes;
    t.region_offset = t.offset;
    t.region_bytes = nbytes;
    l.devices.push_back(std::move(t));
  }
  l.slot_bytes = aligned * static_cast<uint64_t>(L);
  return l;
}

}  // namespace meshload::sidecar::staging
