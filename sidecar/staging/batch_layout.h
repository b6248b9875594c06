/// \file
/// BatchLayout: where each local device's tensor sits inside a slot.
///
/// A slot holds one step's batch for one process: for each local device (in
/// the job's device order) a C-order tensor of shape
/// [samples per shard, *sample shape] and the dataset's dtype, starting at a
/// 256-byte aligned offset (what CUDA and DLPack consumers expect).
///
/// Variable-size samples (DatasetIndex::variable_size()) make a *ragged*
/// layout: each device's region is n + 1 int64 sample offsets (n samples
/// per shard; in elements of the dtype, offsets[0] = 0, sample k is
/// values[offsets[k], offsets[k+1])), then, 256-byte aligned, the values:
/// the samples' elements back to back. The values' room is the most bytes
/// any n samples of the dataset take together (DatasetIndex::LargestBytes),
/// so every step of every epoch fits; a step uses offsets[n] elements of it.
///
/// Thread safety: a value.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/shard_planner.h"

namespace meshload::sidecar::staging {

inline constexpr uint64_t kTensorAlignment = 256;

struct DeviceTensor {
  int64_t device = 0;            // global device index
  uint64_t offset = 0;           // bytes from the slot start; grows with the device (StepLoader relies on it)
  std::vector<int64_t> shape;    // ragged: [the values' room in elements]
  std::vector<int64_t> strides;  // elements
  uint64_t nbytes = 0;           // ragged: the values' room
  /// Ragged layouts: where the n + 1 int64 sample offsets start, bytes
  /// from the slot start (before `offset`).
  uint64_t offsets_offset = 0;
  /// The device's bytes in the slot, what a copy of its batch takes:
  /// [region_offset, region_offset + region_bytes) (dense: the tensor;
  /// ragged: the offsets, then the values).
  uint64_t region_offset = 0;
  uint64_t region_bytes = 0;
};

struct BatchLayout {
  formats::DType dtype = formats::DType::kUint8;
  uint64_t sample_bytes = 0;        // 0 when ragged
  uint64_t samples_per_device = 0;  // B / S
  uint64_t slot_bytes = 0;          // sum of aligned device regions
  bool ragged = false;
  std::vector<DeviceTensor> devices;
};

/// What the step loader staged for one local device in a slot: the
/// checksum of its sample ids (protocol::SampleIdsChecksum) and, for a
/// ragged layout, the bytes its values take this step.
struct StagedTensor {
  uint64_t ids_checksum = 0;
  uint64_t values_bytes = 0;
};

/// The layout for process `process` of `job`. Precondition: the sample size
/// is known (job.dataset.sample_bytes() > 0), or the samples are of
/// variable size and indexed.
BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process);

}  // namespace meshload::sidecar::staging
