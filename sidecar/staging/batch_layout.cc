#include "sidecar/staging/batch_layout.h"

namespace meshload::sidecar::staging {

BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process) {
  BatchLayout l;
  l.dtype = job.dataset.dtype();
  l.sample_bytes = job.dataset.sample_bytes();
  l.samples_per_device = job.global_batch / static_cast<uint64_t>(job.mesh.shards());
  std::vector<int64_t> shape = {static_cast<int64_t>(l.samples_per_device)};
  for (uint64_t d : job.dataset.sample_shape()) shape.push_back(static_cast<int64_t>(d));
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  const uint64_t nbytes = l.samples_per_device * l.sample_bytes;
  const uint64_t aligned = (nbytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  const int64_t L = job.mesh.devices_per_process();
  for (int64_t i = 0; i < L; ++i) {
    DeviceTensor t;
    t.device = process * L + i;
    t.offset = static_cast<uint64_t>(i) * aligned;
    t.shape = shape;
    t.strides = strides;
    t.nbytes = nbytes;
    l.devices.push_back(std::move(t));
  }
  l.slot_bytes = aligned * static_cast<uint64_t>(L);
  return l;
}

}  // namespace meshload::sidecar::staging
