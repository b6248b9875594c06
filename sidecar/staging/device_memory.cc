#include "sidecar/staging/device_memory.h"

#include <algorithm>
#include <set>

namespace meshload::sidecar::staging {

Result<std::unique_ptr<DeviceSlotMemory>> DeviceSlotMemory::Create(const cuda::Driver& driver, DeviceShare share,
                                                                   const BatchLayout& layout, std::vector<int> ordinals,
                                                                   std::vector<int64_t> shard_of, uint32_t slots,
                                                                   void* host_base, uint64_t host_bytes) {
  if (ordinals.size() != layout.devices.size() || shard_of.size() != layout.devices.size()) {
    return InvalidArgument("device staging needs one CUDA device per local device: the job has " +
                           std::to_string(layout.devices.size()) + ", given " + std::to_string(ordinals.size()));
  }
  const int visible = static_cast<int>(driver.devices().size());
  std::set<int> seen;
  for (int o : ordinals) {
    if (o < 0 || o >= visible) {
      return FailedPrecondition("CUDA device " + std::to_string(o) + " does not exist: this process sees " +
                                std::to_string(visible) + " device(s)");
    }
    if (!seen.insert(o).second) {
      return InvalidArgument("CUDA device " + std::to_string(o) + " is given to two local devices");
    }
  }
  std::unique_ptr<DeviceSlotMemory> m(new DeviceSlotMemory());
  m->driver_ = &driver;
  m->share_ = share;
  m->layout_ = layout;
  m->ordinals_ = std::move(ordinals);
  m->slots_ = slots;
  uint64_t largest = 1;
  for (const auto& t : layout.devices) largest = std::max(largest, t.region_bytes);
  m->alloc_bytes_ = largest;
  if (share == DeviceShare::kCudaVmm) {
    uint64_t g = 1;
    for (int o : m->ordinals_) {
      MESHLOAD_ASSIGN_OR_RETURN(uint64_t dg, driver.Granularity(o));
      g = std::max(g, dg);
    }
    m->alloc_bytes_ = (largest + g - 1) / g * g;
  } else {
    m->alloc_bytes_ = (largest + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  }
  for (size_t i = 0; i < m->ordinals_.size(); ++i) {
    int primary = static_cast<int>(i);
    for (size_t j = 0; j < i; ++j) {
      if (shard_of[j] == shard_of[i]) {
        primary = static_cast<int>(j);
        break;
      }
    }
    m->primary_.push_back(primary);
    m->uuids_.push_back(driver.devices()[m->ordinals_[i]].uuid);
    const int o = m->ordinals_[i];
    for (uint32_t s = 0; s < slots; ++s) {
      if (share == DeviceShare::kCudaVmm) {
        MESHLOAD_ASSIGN_OR_RETURN(auto a, driver.AllocateShareable(o, m->alloc_bytes_));
        MESHLOAD_ASSIGN_OR_RETURN(UniqueFd fd, a->Export());
        m->vmm_.push_back(std::move(a));
        m->exported_.push_back(std::move(fd));
      } else {
        MESHLOAD_ASSIGN_OR_RETURN(auto a, driver.AllocateIpc(o, m->alloc_bytes_));
        m->ipc_.push_back(std::move(a));
      }
    }
    MESHLOAD_ASSIGN_OR_RETURN(auto stream, driver.CreateStream(o, slots));
    m->streams_.push_back(std::move(stream));
  }
  // Replicas copy from their shard's first device, over the peer path:
  // their GPU gets access to its source's slots. Where the GPUs cannot reach
  // each other, the replica is copied from the host slot instead (the
  // source's bytes, also page-locked).
  m->via_host_.assign(m->ordinals_.size(), false);
  for (size_t i = 0; i < m->ordinals_.size(); ++i) {
    const int p = m->primary_[i];
    if (p == static_cast<int>(i)) continue;
    bool peer = driver.CanAccessPeer(m->ordinals_[i], m->ordinals_[p]);
    for (uint32_t s = 0; peer && s < slots && share == DeviceShare::kCudaVmm; ++s) {
      peer = m->vmm_[static_cast<size_t>(p) * slots + s]->GrantAccess(m->ordinals_[i]).ok();
    }
    if (!peer) {
      m->via_host_[i] = true;
      m->peer_access_ = false;
    }
  }
  if (host_base != nullptr && host_bytes > 0) {
    auto pinned = driver.RegisterHost(host_base, host_bytes, m->ordinals_[0]);
    if (pinned.ok()) {
      m->pinned_ = std::move(*pinned);
    } else {
      m->pin_error_ = pinned.status().message();
    }
  }
  return m;
}

DeviceSlotMemory::~DeviceSlotMemory() {
  // Copies may still be in flight (a stop during staging): wait for them
  // before the host pool is unregistered and the slots are freed.
  for (auto& s : streams_) (void)s->Synchronize();
}

std::vector<int> DeviceSlotMemory::fds() const {
  std::vector<int> out;
  for (const auto& fd : exported_) out.push_back(fd.get());
  return out;
}

std::vector<cuda::IpcHandle> DeviceSlotMemory::ipc_handles() const {
  std::vector<cuda::IpcHandle> out;
  for (const auto& a : ipc_) out.push_back(a->handle());
  return out;
}

cuda::DevicePtr DeviceSlotMemory::ptr(size_t device, uint32_t slot) const {
  const size_t k = device * slots_ + slot;
  return share_ == DeviceShare::kCudaVmm ? vmm_[k]->ptr() : ipc_[k]->ptr();
}

Status DeviceSlotMemory::Stage(uint32_t slot, const uint8_t* host_slot, const std::vector<StagedTensor>* staged) {
  if (slot >= slots_) return InvalidArgument("no slot " + std::to_string(slot));
  if (staged != nullptr && staged->size() != layout_.devices.size()) staged = nullptr;
  // First every shard's first device, from the host; then local replicas,
  // device to device, once their source is there.
  Status st = CopyAndFence(slot, host_slot, staged);
  if (!st.ok()) {
    // Nothing may be left in flight into a slot that is handed out again.
    for (auto& s : streams_) (void)s->Synchronize();
  }
  return st;
}

uint64_t DeviceSlotMemory::UsedBytes(size_t i, const std::vector<StagedTensor>* staged) const {
  // Ragged: the offsets, then the values this step's samples take (the
  // same for a replica as for its shard's first device).
  const size_t p = static_cast<size_t>(primary_[i]);
  return UsedRegionBytes(layout_, p, staged == nullptr ? nullptr : &(*staged)[p]);
}

Status DeviceSlotMemory::CopyAndFence(uint32_t slot, const uint8_t* host_slot,
                                      const std::vector<StagedTensor>* staged) {
  bool peer_replicas = false;
  for (size_t i = 0; i < ordinals_.size(); ++i) {
    const int p = primary_[i];
    if (p != static_cast<int>(i) && !via_host_[i]) {
      peer_replicas = true;
      continue;
    }
    // A shard's first device, or a replica that cannot reach it: from the
    // host slot (the first device's bytes; replicas are not assembled there).
    const auto& src = layout_.devices[static_cast<size_t>(p)];
    MESHLOAD_RETURN_IF_ERROR(
        streams_[i]->CopyToDevice(ptr(i, slot), host_slot + src.region_offset, UsedBytes(i, staged)));
    MESHLOAD_RETURN_IF_ERROR(streams_[i]->Record(slot));
  }
  for (size_t i = 0; i < ordinals_.size(); ++i) {
    if (primary_[i] == static_cast<int>(i) || via_host_[i]) MESHLOAD_RETURN_IF_ERROR(streams_[i]->Wait(slot));
  }
  if (!peer_replicas) return Status::Ok();
  for (size_t i = 0; i < ordinals_.size(); ++i) {
    const int p = primary_[i];
    if (p == static_cast<int>(i) || via_host_[i]) continue;
    MESHLOAD_RETURN_IF_ERROR(streams_[i]->CopyFromPeer(ptr(i, slot), ptr(p, slot), ordinals_[p], UsedBytes(i, staged)));
    MESHLOAD_RETURN_IF_ERROR(streams_[i]->Record(slot));
  }
  for (size_t i = 0; i < ordinals_.size(); ++i) {
    if (primary_[i] != static_cast<int>(i) && !via_host_[i]) MESHLOAD_RETURN_IF_ERROR(streams_[i]->Wait(slot));
  }
  return Status::Ok();
}

}  // namespace meshload::sidecar::staging
