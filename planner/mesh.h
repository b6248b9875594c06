/// \file
/// DeviceMesh: the arithmetic of the device mesh and of batch sharding.
///
/// Devices are numbered in row-major order of their mesh coordinates (last
/// axis fastest); process p owns devices [p·L, (p+1)·L). A device's shard is
/// the row-major index of its coordinates restricted to batchAxes, in the
/// order batchAxes lists them (as in a JAX PartitionSpec). Devices with the
/// same shard form a replica group; its *owner* is the lowest-numbered
/// process that holds a device of the group (the reader under Broadcast).
///
/// Thread safety: immutable after construction; const methods thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "planner/spec.h"

namespace meshload::planner {

class DeviceMesh {
 public:
  /// Precondition: `mesh` passed ValidateJobSpec (sizes >= 1, consistent
  /// process count, batchAxes that name distinct existing axes); otherwise
  /// an InvalidArgument error.
  static Result<DeviceMesh> Create(const MeshSpec& mesh);

  int64_t devices() const { return static_cast<int64_t>(shard_of_device_.size()); }
  int64_t processes() const { return processes_; }
  int64_t devices_per_process() const { return devices_per_process_; }
  /// S: the number of distinct data shards.
  int64_t shards() const { return shards_; }

  int64_t ProcessOf(int64_t device) const { return device / devices_per_process_; }
  int64_t ShardOf(int64_t device) const { return shard_of_device_[static_cast<size_t>(device)]; }
  /// The coordinates of `device` along each mesh axis.
  std::vector<int64_t> Coordinates(int64_t device) const;

  /// Distinct processes holding a device of shard `s`, ascending.
  const std::vector<int64_t>& ProcessesOfShard(int64_t s) const { return processes_of_shard_[static_cast<size_t>(s)]; }
  /// The lowest-numbered process holding shard `s`.
  int64_t OwnerOf(int64_t s) const { return processes_of_shard_[static_cast<size_t>(s)].front(); }
  /// Distinct shards held by process `p`'s devices, ascending.
  const std::vector<int64_t>& ShardsOfProcess(int64_t p) const { return shards_of_process_[static_cast<size_t>(p)]; }

 private:
  int64_t processes_ = 0;
  int64_t devices_per_process_ = 0;
  int64_t shards_ = 0;
  std::vector<int64_t> axis_sizes_;
  std::vector<int64_t> shard_of_device_;
  std::vector<std::vector<int64_t>> processes_of_shard_;
  std::vector<std::vector<int64_t>> shards_of_process_;
};

}  // namespace meshload::planner
