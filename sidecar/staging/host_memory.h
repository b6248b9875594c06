/// \file
/// HostSlotMemory: the host staging pool, one memfd holding every slot.
///
/// memfd instead of /dev/shm: Kubernetes gives /dev/shm 64 MiB by default,
/// and a memfd needs no file system at all. Its descriptor goes to the
/// trainer once (SCM_RIGHTS); both sides map it and tensors are byte
/// offsets into it. The memfd is sealed against shrinking and growing, so a
/// client holding the descriptor cannot truncate it under the sidecar.
///
/// Thread safety: immutable after creation; slot memory is written by the
/// producer of a slot that SlotPool hands to it alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace meshload::sidecar::staging {

class HostSlotMemory {
 public:
  /// `slot_bytes` is rounded up to the page size.
  static Result<std::unique_ptr<HostSlotMemory>> Create(uint32_t slots, uint64_t slot_bytes, const std::string& name);
  ~HostSlotMemory();
  HostSlotMemory(const HostSlotMemory&) = delete;
  HostSlotMemory& operator=(const HostSlotMemory&) = delete;

  int fd() const { return fd_.get(); }
  uint32_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t pool_bytes() const { return pool_bytes_; }
  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_bytes_; }

 private:
  HostSlotMemory() = default;
  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint32_t slots_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t pool_bytes_ = 0;
};

}  // namespace meshload::sidecar::staging
