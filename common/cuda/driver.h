/// \file
/// CudaDriver: the CUDA driver API, reached at run time.
///
/// libcuda is opened with dlopen ($MESHLOAD_CUDA_LIBRARY, else
/// libcuda.so.1) and every entry point is taken with dlsym, so nothing links
/// against the driver: the same binaries run on machines without a GPU or a
/// driver, and Open() says why it cannot be used. cuda.h (from the toolkit,
/// found at configure time) is needed to build the real thing; a build
/// without it compiles this file to "not in this build" answers.
///
/// What meshload needs, and nothing more, wrapped as values with owners:
///   - devices by UUID (the handshake maps UUIDs to each side's ordinals);
///   - a device's primary context (the one CUDA runtimes such as PyTorch's
///     use), made current for a scope;
///   - VMM allocations exported as POSIX file descriptors, and their import
///     in another process (cuMemCreate, cuMemExportToShareableHandle,
///     cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess);
///   - legacy cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle;
///   - pinned (registered) host memory, one stream per device, events, and
///     the copies host→device, device→device (peer) and device→host.
///
/// Thread safety: Driver is immutable after Open() but for the primary
/// contexts, retained on first use under a mutex, and its methods may be
/// called from any thread (the driver API is thread-safe; calls that need a
/// context make the device's primary context current themselves).
/// Allocation objects are owned by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"

namespace meshload::cuda {

/// A device address (CUdeviceptr).
using DevicePtr = uint64_t;

struct DeviceInfo {
  int ordinal = 0;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  std::string name;
};

/// cudaIpcMemHandle_t / CUipcMemHandle: 64 opaque bytes.
using IpcHandle = std::array<uint8_t, 64>;

class Driver;

/// What this build can do with a GPU, for version output and start-up logs:
/// "built in (CUDA 13.0 headers)" when cuda.h was found at configure time,
/// else "not built (no cuda.h at build time)".
std::string BuildDescription();

/// A VMM allocation on one device, mapped read-write for that device in this
/// process at `ptr()`. Freed (unmapped, address range released, handle
/// released) on destruction.
class VmmAllocation {
 public:
  ~VmmAllocation();
  VmmAllocation(const VmmAllocation&) = delete;
  VmmAllocation& operator=(const VmmAllocation&) = delete;
  DevicePtr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  int ordinal() const { return ordinal_; }
  /// A new POSIX file descriptor for the allocation (cuMemExportToShareableHandle),
  /// to send to another process with SCM_RIGHTS.
  Result<UniqueFd> Export() const;
  /// Lets another device of this process read and write it too (peer
  /// access), so device-to-device copies from it go over the peer path.
  /// Fails where the two devices cannot reach each other.
  Status GrantAccess(int other_ordinal) const;

 private:
  friend class Driver;
  VmmAllocation() = default;
  const Driver* driver_ = nullptr;
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle
  DevicePtr ptr_ = 0;
  uint64_t bytes_ = 0;
  int ordinal_ = 0;
};

/// Another process's VMM allocation, imported from its file descriptor and
/// mapped read-write for one of this process's devices. Unmapped on
/// destruction.
class ImportedAllocation {
 public:
  ~ImportedAllocation();
  ImportedAllocation(const ImportedAllocation&) = delete;
  ImportedAllocation& operator=(const ImportedAllocation&) = delete;
  DevicePtr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class Driver;
  ImportedAllocation() = default;
  const Driver* driver_ = nullptr;
  DevicePtr ptr_ = 0;
  uint64_t bytes_ = 0;
  bool ipc_ = false;  // opened with cuIpcOpenMemHandle (closed with cuIpcCloseMemHandle)
  int ordinal_ = 0;
};

/// Legacy device memory (cuMemAlloc), shareable with cuIpcGetMemHandle.
class IpcAllocation {
 public:
  ~IpcAllocation();
  IpcAllocation(const IpcAllocation&) = delete;
  IpcAllocation& operator=(const IpcAllocation&) = delete;
  DevicePtr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  const IpcHandle& handle() const { return handle_; }

 private:
  friend class Driver;
  IpcAllocation() = default;
  const Driver* driver_ = nullptr;
  DevicePtr ptr_ = 0;
  uint64_t bytes_ = 0;
  int ordinal_ = 0;
  IpcHandle handle_{};
};

/// Host memory registered with the driver (page-locked), so copies from it
/// are true DMA. Unregistered on destruction.
class PinnedRegistration {
 public:
  ~PinnedRegistration();
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;

 private:
  friend class Driver;
  PinnedRegistration() = default;
  const Driver* driver_ = nullptr;
  void* base_ = nullptr;
  int ordinal_ = 0;
};

/// A stream in a device's primary context, with one event per user-chosen
/// index (a slot): Record(i) after the copies of slot i, Wait(i) before
/// telling anyone they are done.
class Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  int ordinal() const { return ordinal_; }

  /// Enqueues a host-to-device copy.
  Status CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes);
  /// Enqueues a copy from another device's memory (a peer copy where the
  /// devices allow it, staged through the host by the driver otherwise).
  Status CopyFromPeer(DevicePtr dst, DevicePtr src, int src_ordinal, uint64_t bytes);
  /// Records event `index` after everything enqueued so far.
  Status Record(uint32_t index);
  /// Blocks until event `index` has completed: the fence before READY.
  Status Wait(uint32_t index);
  /// Blocks until everything queued on the stream is done.
  Status Synchronize();

 private:
  friend class Driver;
  Stream() = default;
  const Driver* driver_ = nullptr;
  int ordinal_ = 0;
  void* stream_ = nullptr;     // CUstream
  std::vector<void*> events_;  // CUevent
};

/// An event recorded on a stream: Wait() blocks until the work queued on
/// the stream before it is done. Destroyed with the object.
class Fence {
 public:
  ~Fence();
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;
  Status Wait();

 private:
  friend class Driver;
  Fence() = default;
  const Driver* driver_ = nullptr;
  void* event_ = nullptr;  // CUevent
  int ordinal_ = 0;
};

class Driver {
 public:
  /// The process's driver, opened and initialised once (later calls return
  /// the same object, or the same error). kUnavailable says why not: no
  /// library, the toolkit's stub, no device, a build without cuda.h.
  static Result<const Driver*> Open();
  /// Opens a given library (not cached; Open() uses it). For tests and tools.
  static Result<std::unique_ptr<Driver>> Load(const std::string& library);
  ~Driver();

  const std::string& library() const { return library_; }
  int version() const { return version_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  /// The ordinal of the device with this UUID; -1 when this process cannot
  /// see it.
  int OrdinalOf(const std::string& uuid) const;

  /// The VMM allocation granularity of a device (sizes are rounded to it).
  Result<uint64_t> Granularity(int ordinal) const;
  /// A shareable (POSIX fd) VMM allocation of at least `bytes` on a device.
  Result<std::unique_ptr<VmmAllocation>> AllocateShareable(int ordinal, uint64_t bytes) const;
  /// Imports an exported allocation of `bytes` and maps it for `ordinal`.
  /// The caller still owns `fd` (close it once imported).
  Result<std::unique_ptr<ImportedAllocation>> Import(int ordinal, int fd, uint64_t bytes) const;

  /// Legacy: cuMemAlloc on a device, with its IPC handle.
  Result<std::unique_ptr<IpcAllocation>> AllocateIpc(int ordinal, uint64_t bytes) const;
  /// Legacy: opens another process's IPC handle in `ordinal`'s context.
  Result<std::unique_ptr<ImportedAllocation>> OpenIpc(int ordinal, const IpcHandle& handle, uint64_t bytes) const;

  /// Page-locks host memory, registered in `ordinal`'s context (portable:
  /// usable for copies to every device).
  Result<std::unique_ptr<PinnedRegistration>> RegisterHost(void* base, uint64_t bytes, int ordinal) const;
  Result<std::unique_ptr<Stream>> CreateStream(int ordinal, uint32_t events) const;

  /// Records an event on a stream of `ordinal`'s primary context, without
  /// waiting: Wait() on it blocks until the work queued so far is done.
  /// `stream` is a CUstream, or 1 / 2 for the legacy / per-thread default
  /// stream, as DLPack's __dlpack__(stream=...) numbers them.
  Result<std::unique_ptr<Fence>> RecordFence(int ordinal, uintptr_t stream) const;

  /// Synchronous device-to-host copy (for checks, not the data path).
  Status CopyToHost(void* dst, DevicePtr src, uint64_t bytes, int ordinal) const;

  /// The driver's name for an error code, e.g. "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  std::string ErrorText(int code) const;

  struct Api;
  const Api& api() const { return *api_; }
  /// A device's primary context (a CUcontext), retained on first use; null
  /// when it cannot be had (ContextError() says why).
  void* Context(int ordinal) const MESHLOAD_EXCLUDES(contexts_mu_);
  Status ContextError(int ordinal) const MESHLOAD_EXCLUDES(contexts_mu_);
  /// Whether `ordinal` can read `peer`'s memory directly (cuDeviceCanAccessPeer).
  bool CanAccessPeer(int ordinal, int peer) const;
  /// Waits until everything queued on the device's primary context is done.
  Status SynchronizeDevice(int ordinal) const;

 private:
  Driver() = default;
  Status CheckOrdinal(int ordinal) const;
  // Turns a CUresult into a Status naming the call.
  Status Check(int result, const char* call) const;
  // A new object of one of the classes above (their constructors are
  // private), made by this driver for device `ordinal`.
  template <typename T>
  std::unique_ptr<T> Make(int ordinal) const;
  friend class VmmAllocation;
  friend class ImportedAllocation;
  friend class IpcAllocation;
  friend class PinnedRegistration;
  friend class Stream;
  friend class Fence;

  // Set by Load() before the Driver is shared, then read-only.
  std::string library_;
  int version_ = 0;
  std::vector<DeviceInfo> devices_;
  std::unique_ptr<Api> api_;

  mutable Mutex contexts_mu_;
  // One per device (sized by Load()): the primary context, retained on
  // first use and kept for the process's life; the CUresult when retaining
  // failed.
  mutable std::vector<void*> contexts_ MESHLOAD_GUARDED_BY(contexts_mu_);
  mutable std::vector<int> retain_errors_ MESHLOAD_GUARDED_BY(contexts_mu_);
};

/// The 16 bytes of a CUDA UUID in nvidia-smi's form ("GPU-" + 8-4-4-4-12 hex).
std::string FormatGpuUuid(const unsigned char bytes[16]);

}  // namespace meshload::cuda
