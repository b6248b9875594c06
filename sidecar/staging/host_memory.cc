#include "sidecar/staging/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace meshload::sidecar::staging {

Result<std::unique_ptr<HostSlotMemory>> HostSlotMemory::Create(uint32_t slots, uint64_t slot_bytes,
                                                               const std::string& name) {
  if (slots == 0 || slot_bytes == 0) return InvalidArgument("a pool needs at least one non-empty slot");
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::unique_ptr<HostSlotMemory> m(new HostSlotMemory());
  m->slots_ = slots;
  m->slot_bytes_ = (slot_bytes + page - 1) / page * page;
  m->pool_bytes_ = m->slot_bytes_ * slots;
  m->fd_.Reset(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!m->fd_.valid()) return IoErrorFromErrno("memfd_create", name, errno);
  if (::ftruncate(m->fd_.get(), static_cast<off_t>(m->pool_bytes_)) != 0) {
    return IoErrorFromErrno("ftruncate to " + std::to_string(m->pool_bytes_) + " bytes", name, errno);
  }
  if (::fcntl(m->fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return IoErrorFromErrno("seal memfd", name, errno);
  }
  void* p = ::mmap(nullptr, m->pool_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd_.get(), 0);
  if (p == MAP_FAILED) return IoErrorFromErrno("mmap " + std::to_string(m->pool_bytes_) + " bytes", name, errno);
  m->base_ = static_cast<uint8_t*>(p);
  return m;
}

HostSlotMemory::~HostSlotMemory() {
  if (base_) ::munmap(base_, pool_bytes_);
}

}  // namespace meshload::sidecar::staging
