/// \file
/// BatchLayout: where each local device's tensor sits inside a slot.
///
/// A slot holds one step's batch for one process: for each local device (in
/// the job's device order) a C-order tensor of shape
/// [samples per shard, *sample shape] and the dataset's dtype, starting at a
/// 256-byte aligned offset (what CUDA and DLPack consumers expect).
///
/// Thread safety: a value.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/shard_planner.h"

namespace meshload::sidecar::staging {

inline constexpr uint64_t kTensorAlignment = 256;

struct DeviceTensor {
  int64_t device = 0;   // global device index
  uint64_t offset = 0;  // bytes from the slot start; grows with the device (StepLoader relies on it)
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  uint64_t nbytes = 0;
};

struct BatchLayout {
  formats::DType dtype = formats::DType::kUint8;
  uint64_t sample_bytes = 0;
  uint64_t samples_per_device = 0;  // B / S
  uint64_t slot_bytes = 0;          // sum of aligned tensors
  std::vector<DeviceTensor> devices;
};

/// The layout for process `process` of `job`. Precondition: the sample size
/// is known (job.dataset.sample_bytes() > 0).
BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process);

}  // namespace meshload::sidecar::staging
