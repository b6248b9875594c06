/// \file
/// BatchLayout: where each local device's tensors sit inside a slot.
///
/// A slot holds one step's batch for one process: for each local device (in
/// the job's device order) one region, 256-byte aligned, holding a tensor
/// per field of the batch (in field order, each 256-byte aligned, what CUDA
/// and DLPack consumers expect). The formats whose sample is one tensor
/// (FixedRecord, TokenStream, Npy, MegatronIndexed, rows of concatenated
/// tokens) have one unnamed field; WebDataset and MDS have
/// spec.dataset.fields; packed rows have tokens, segment_ids and positions.
///
/// A dense field is a C-order tensor [samples per shard, *sample shape].
/// A ragged field (variable-size values: MegatronIndexed sequences, a
/// field's bytes as stored) is n + 1 int64 sample offsets (n samples per
/// shard; in elements of the dtype, offsets[0] = 0, sample k is
/// values[offsets[k], offsets[k+1])), then, 256-byte aligned, the values:
/// the samples' elements back to back. The values' room is the most bytes
/// any n samples of the dataset take together (DatasetIndex::LargestBytes of
/// whole samples: a field of a WebDataset or MDS sample is part of it), so
/// every step of every epoch fits; a step uses offsets[n] elements of it.
///
/// WebDataset and MDS samples are read whole (their tar members or MDS
/// row) into a host buffer of `record_room` bytes per device and then
/// decoded into the fields (`extracts`).
///
/// Thread safety: a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/shard_planner.h"

namespace meshload::sidecar::staging {

inline constexpr uint64_t kTensorAlignment = 256;

/// The fields of a batch of packed rows (spec.tokens.mode Pack): the rows'
/// tokens, then their segment ids and positions (int32).
inline constexpr std::string_view kTokensField = "tokens";
inline constexpr std::string_view kSegmentIdsField = "segment_ids";
inline constexpr std::string_view kPositionsField = "positions";

/// One field of the batch, the same for every device.
struct FieldLayout {
  std::string name;  // "" for the formats whose sample is one tensor
  formats::DType dtype = formats::DType::kUint8;
  bool ragged = false;
  std::vector<uint64_t> sample_shape;  // dense: one sample's shape (empty: a scalar)
  uint64_t sample_bytes = 0;           // dense: one sample's bytes
};

/// One device's tensor of one field.
struct FieldTensor {
  uint64_t offset = 0;           // bytes from the slot start; grows with the device (StepLoader relies on it)
  std::vector<int64_t> shape;    // ragged: [the values' room in elements]
  std::vector<int64_t> strides;  // elements
  uint64_t nbytes = 0;           // ragged: the values' room
  /// Ragged fields: where the n + 1 int64 sample offsets start, bytes from
  /// the slot start (before `offset`).
  uint64_t offsets_offset = 0;
};

struct DeviceTensor {
  int64_t device = 0;  // global device index
  /// The device's bytes in the slot, what a copy of its batch takes:
  /// [region_offset, region_offset + region_bytes).
  uint64_t region_offset = 0;
  uint64_t region_bytes = 0;
  std::vector<FieldTensor> fields;  // one per BatchLayout::fields
};

struct BatchLayout {
  std::vector<FieldLayout> fields;  // at least one
  uint64_t samples_per_device = 0;  // B / S
  uint64_t slot_bytes = 0;          // sum of aligned device regions
  std::vector<DeviceTensor> devices;
  /// WebDataset, MDS: samples are read whole into `record_room` bytes per
  /// device, then decoded into the fields.
  bool extracts = false;
  uint64_t record_room = 0;
  bool any_ragged() const {
    for (const FieldLayout& f : fields) {
      if (f.ragged) return true;
    }
    return false;
  }
};

/// What the step loader staged for one local device in a slot: the
/// checksum of its sample ids (protocol::SampleIdsChecksum), the samples
/// delivered (fewer than planned when some were skipped for a missing
/// field), and for each ragged field the bytes its values take this step.
struct StagedTensor {
  uint64_t ids_checksum = 0;
  uint64_t samples = 0;
  std::vector<uint64_t> values_bytes;  // per field (dense: samples × sample bytes)
};

/// The bytes of local device `device`'s region a copy of its batch takes:
/// the whole region, or when its last field is ragged and `staged` says
/// what it used, up to the end of that field's values this step.
uint64_t UsedRegionBytes(const BatchLayout& layout, size_t device, const StagedTensor* staged);

/// The layout for process `process` of `job`. Precondition: the sample size
/// is known (job.dataset.sample_bytes() > 0), or the samples are of
/// variable size and indexed; for WebDataset and MDS, `fields` says how
/// each field is delivered (formats::FieldDecoding, from the index).
BatchLayout ComputeBatchLayout(const planner::ResolvedJob& job, int64_t process);

}  // namespace meshload::sidecar::staging
