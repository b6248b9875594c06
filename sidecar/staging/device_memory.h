/// \file
/// DeviceSlotMemory: the GPU staging pool, one allocation per (local
/// device, slot), made once at start-up.
///
/// The StepLoader assembles a step in the host pool (HostSlotMemory,
/// registered with the driver so the copies are DMA from page-locked
/// memory); Stage() then copies each device's tensor to that device on the
/// device's stream (cuMemcpyHtoDAsync), gives local replicas a
/// device-to-device copy from the first device holding their shard
/// (cuMemcpyPeerAsync, where the GPUs can reach each other; from the host
/// slot where they cannot) instead of assembling them on the host, records the slot's
/// event and waits for it: when Stage() returns, the bytes are on the
/// devices, so READY can go out and the trainer's stream needs to wait on
/// nothing.
///
/// Two ways to share the memory with the trainer:
///   - kCudaVmm (default): cuMemCreate with the POSIX file descriptor handle
///     type, sizes rounded to the allocation granularity; each allocation is
///     exported once (cuMemExportToShareableHandle) and its descriptor sent
///     to every trainer connection with SCM_RIGHTS;
///   - kCudaIpc (legacy fallback): cuMemAlloc + cuIpcGetMemHandle; the
///     64-byte handles travel in SERVER_HELLO. The trainer must see the
///     sidecar's pid (a pod with shareProcessNamespace: true).
/// Nothing is allocated, exported or imported per batch.
///
/// Thread safety: Stage() may be called by several producers at once for
/// different slots (the driver API is thread-safe; each slot has its own
/// events). Everything else is immutable after Create().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda/driver.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "sidecar/staging/batch_layout.h"

namespace meshload::sidecar::staging {

enum class DeviceShare { kCudaVmm, kCudaIpc };

class DeviceSlotMemory {
 public:
  /// `ordinals[i]` is the CUDA device of the layout's local device i;
  /// `shard_of[i]` its shard (devices with equal shards are replicas).
  /// `host_base`/`host_bytes`: the host pool, registered (pinned) here when
  /// the driver allows it.
  static Result<std::unique_ptr<DeviceSlotMemory>> Create(const cuda::Driver& driver, DeviceShare share,
                                                          const BatchLayout& layout, std::vector<int> ordinals,
                                                          std::vector<int64_t> shard_of, uint32_t slots,
                                                          void* host_base, uint64_t host_bytes);

  ~DeviceSlotMemory();
  DeviceSlotMemory(const DeviceSlotMemory&) = delete;
  DeviceSlotMemory& operator=(const DeviceSlotMemory&) = delete;

  DeviceShare share() const { return share_; }
  uint32_t slots() const { return slots_; }
  /// Bytes of each (device, slot) allocation (a multiple of the granularity
  /// for VMM); tensors start at offset 0 of their allocation.
  uint64_t alloc_bytes() const { return alloc_bytes_; }
  /// Device memory held, all devices together.
  uint64_t total_bytes() const { return alloc_bytes_ * slots_ * ordinals_.size(); }
  const std::vector<int>& ordinals() const { return ordinals_; }
  /// The UUID of each local device's GPU, in layout order.
  const std::vector<std::string>& uuids() const { return uuids_; }
  /// Whether the host pool is page-locked (false: copies from pageable memory).
  bool host_pinned() const { return pinned_ != nullptr; }
  std::string host_pin_error() const { return pin_error_; }
  /// Whether every replica's device may read its source's slots directly
  /// (false: some replica copies go through the host).
  bool peer_access() const { return peer_access_; }

  /// kCudaVmm: one descriptor per (device, slot), device-major
  /// (index = device * slots + slot). Owned here; sending dups them.
  std::vector<int> fds() const;
  /// kCudaIpc: one handle per (device, slot), device-major.
  std::vector<cuda::IpcHandle> ipc_handles() const;

  /// Copies slot `slot` of the host pool (at `host_slot`) to the devices and
  /// waits until the copies are done.
  /// `staged` (the step loader's, one per local device), for a ragged
  /// layout: only the offsets and the values the step uses are copied, not
  /// each device's whole room. Null: every device's whole region.
  Status Stage(uint32_t slot, const uint8_t* host_slot, const std::vector<StagedTensor>* staged = nullptr);

  /// Device address of (device i, slot): for tests and checks.
  cuda::DevicePtr ptr(size_t device, uint32_t slot) const;

 private:
  DeviceSlotMemory() = default;
  Status CopyAndFence(uint32_t slot, const uint8_t* host_slot, const std::vector<StagedTensor>* staged);
  // The bytes of local device `i`'s region a step fills (its source's, for
  // a replica).
  uint64_t UsedBytes(size_t i, const std::vector<StagedTensor>* staged) const;
  const cuda::Driver* driver_ = nullptr;
  DeviceShare share_ = DeviceShare::kCudaVmm;
  BatchLayout layout_;
  std::vector<int> ordinals_;
  std::vector<int> primary_;    // per device: the first device with its shard (itself if none before)
  std::vector<bool> via_host_;  // per device: a replica whose GPU cannot reach its source's (copied from the host)
  std::vector<std::string> uuids_;
  uint32_t slots_ = 0;
  uint64_t alloc_bytes_ = 0;
  std::vector<std::unique_ptr<cuda::VmmAllocation>> vmm_;  // device-major
  std::vector<UniqueFd> exported_;
  std::vector<std::unique_ptr<cuda::IpcAllocation>> ipc_;
  std::vector<std::unique_ptr<cuda::Stream>> streams_;  // per local device, one event per slot
  std::unique_ptr<cuda::PinnedRegistration> pinned_;
  std::string pin_error_;
  bool peer_access_ = true;
};

}  // namespace meshload::sidecar::staging
