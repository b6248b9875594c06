#include "planner/mesh.h"

#include <algorithm>

namespace meshload::planner {

Result<DeviceMesh> DeviceMesh::Create(const MeshSpec& spec) {
  Diagnostics d;
  if (ValidateMeshSpec(spec, d) == 0) return d.ToStatus();

  DeviceMesh m;
  m.processes_ = spec.processes;
  m.devices_per_process_ = spec.devices_per_process;
  int64_t devices = 1;
  for (const auto& a : spec.axes) {
    m.axis_sizes_.push_back(a.size);
    devices *= a.size;
  }
  // For each batch axis (in batchAxes order): its mesh index.
  std::vector<size_t> batch_axis_index;
  for (const auto& name : EffectiveBatchAxes(spec)) {
    for (size_t i = 0; i < spec.axes.size(); ++i) {
      if (spec.axes[i].name == name) batch_axis_index.push_back(i);
    }
  }
  m.shards_ = 1;
  for (size_t i : batch_axis_index) m.shards_ *= spec.axes[i].size;

  m.shard_of_device_.resize(static_cast<size_t>(devices));
  m.processes_of_shard_.assign(static_cast<size_t>(m.shards_), {});
  m.shards_of_process_.assign(static_cast<size_t>(m.processes_), {});
  std::vector<int64_t> coord(spec.axes.size(), 0);
  for (int64_t d = 0; d < devices; ++d) {
    int64_t shard = 0;
    for (size_t i : batch_axis_index) shard = shard * spec.axes[i].size + coord[i];
    m.shard_of_device_[static_cast<size_t>(d)] = shard;
    const int64_t p = d / m.devices_per_process_;
    auto& procs = m.processes_of_shard_[static_cast<size_t>(shard)];
    if (procs.empty() || procs.back() != p) {
      // Devices are visited in process order, so `procs` stays sorted; a
      // process may revisit a shard after others, hence the final unique.
      procs.push_back(p);
    }
    m.shards_of_process_[static_cast<size_t>(p)].push_back(shard);
    // Advance the row-major coordinate (last axis fastest).
    for (size_t k = spec.axes.size(); k-- > 0;) {
      if (++coord[k] < spec.axes[k].size) break;
      coord[k] = 0;
    }
  }
  for (auto& v : m.processes_of_shard_) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  for (auto& v : m.shards_of_process_) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return m;
}

std::vector<int64_t> DeviceMesh::Coordinates(int64_t device) const {
  std::vector<int64_t> c(axis_sizes_.size());
  for (size_t k = axis_sizes_.size(); k-- > 0;) {
    c[k] = device % axis_sizes_[k];
    device /= axis_sizes_[k];
  }
  return c;
}

}  // namespace meshload::planner
