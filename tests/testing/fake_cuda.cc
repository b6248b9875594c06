// A stand-in for libcuda.so.1 in tests on machines without a GPU
// (MESHLOAD_CUDA_LIBRARY=.../libmeshload_fake_cuda.so).
//
// It implements the driver API entry points meshload uses, with the real
// signatures from cuda.h, on host memory: "device memory" is a memfd, a VMM
// export is a dup() of it, an import maps the received descriptor, and a
// legacy IPC handle names the exporter's pid and descriptor, opened through
// /proc/<pid>/fd (which, like CUDA IPC in a pod, needs the exporter's pid
// to be visible). Copies are memcpy and finish before they return.
//
// What it checks like the real driver: sizes that are not a multiple of the
// granularity, memory used before cuMemSetAccess (PROT_NONE: a fault),
// calls that need a current context, an export of an allocation not made
// shareable, opening an IPC handle in the process that made it, devices
// that do not exist. It is a test double for the plumbing (allocation once,
// fds over SCM_RIGHTS, import and mapping caches, UUID mapping, fences in
// the right order); scripts/gpu-check runs the same code on a real GPU.
//
// Devices: $MESHLOAD_FAKE_CUDA_DEVICES, a comma-separated list of UUIDs
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"); unset means one device; set
// and empty means a driver that sees no device.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr size_t kGranularity = 2 << 20;

struct Alloc {
  int fd = -1;
  size_t size = 0;
  int device = 0;
  bool shareable = false;
};

struct State {
  std::mutex mu;
  bool initialised = false;
  std::vector<CUuuid> devices;
  std::map<uint64_t, Alloc> handles;  // VMM handles
  uint64_t next_handle = 1;
  std::map<uintptr_t, Alloc> linear;       // cuMemAlloc'd, by address
  std::map<uintptr_t, size_t> ipc_opened;  // cuIpcOpenMemHandle'd, by address
  std::map<uintptr_t, size_t> registered;  // cuMemHostRegister'd
};

State& S() {
  static State* s = new State();
  return *s;
}

thread_local std::vector<CUcontext> tls_ctx;
std::atomic<uint64_t> g_imports{0};  // imports made in this process (tests check "once per slot")

CUcontext ContextOf(int device) { return reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x1000 + device)); }

bool HaveContext() { return !tls_ctx.empty(); }

bool ParseUuid(const std::string& s, CUuuid* out) {
  std::string hex;
  for (char c : s.substr(s.rfind("GPU-", 0) == 0 ? 4 : 0)) {
    if (c != '-') hex += c;
  }
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; ++i) {
    out->bytes[i] = static_cast<char>(std::strtoul(hex.substr(2 * i, 2).c_str(), nullptr, 16));
  }
  return true;
}

int NewMemfd(size_t size) {
  int fd = static_cast<int>(::memfd_create("meshload-fake-cuda", MFD_CLOEXEC));
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Streams and events are heap ints (an event's int counts its records);
// creating one needs a current context, as with the real driver.
template <typename Handle>
CUresult NewHandle(Handle* h) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  *h = reinterpret_cast<Handle>(new int(0));
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult DeleteHandle(Handle h) {
  delete reinterpret_cast<int*>(h);
  return CUDA_SUCCESS;
}

struct FakeIpcHandle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t size;
};
constexpr uint32_t kIpcMagic = 0x4b414646;  // "FFAK"

}  // namespace

extern "C" {

// Not a driver entry point: the tests' window into the stand-in.
uint64_t meshload_fake_cuda_imports() { return g_imports.load(); }

CUresult cuInit(unsigned int) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (s.initialised) return CUDA_SUCCESS;
  const char* env = std::getenv("MESHLOAD_FAKE_CUDA_DEVICES");
  std::string list = env ? env : "GPU-6d657368-6c6f-6164-0000-000000000000";
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    CUuuid u{};
    if (!ParseUuid(list.substr(at, comma - at), &u)) return CUDA_ERROR_INVALID_VALUE;
    s.devices.push_back(u);
    at = comma + 1;
  }
  if (s.devices.empty()) return CUDA_ERROR_NO_DEVICE;
  s.initialised = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
  if (!S().initialised) return CUDA_ERROR_NOT_INITIALIZED;
  *n = static_cast<int>(S().devices.size());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!S().initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= static_cast<int>(S().devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid* u, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(S().devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  *u = S().devices[d];
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(S().devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "meshload fake GPU %d", d);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "no error" : "fake driver error";
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (d < 0 || d >= static_cast<int>(S().devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  *c = ContextOf(d);
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext c) {
  tls_ctx.push_back(c);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* c) {
  if (tls_ctx.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = tls_ctx.back();
  tls_ctx.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long) {
  State& s = S();
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
      prop->location.id >= static_cast<int>(s.devices.size())) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  const int fd = NewMemfd(size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(s.mu);
  *h = s.next_handle++;
  s.handles[*h] = {fd, size, prop->location.id,
                   (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0};
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.handles.find(h);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
  ::close(it->second.fd);  // mappings keep the memory, as the real driver's do
  s.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                      unsigned long long) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.handles.find(h);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !it->second.shareable) return CUDA_ERROR_INVALID_VALUE;
  *static_cast<int*>(out) = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* os_handle,
                                        CUmemAllocationHandleType type) {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat st {};
  if (::fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_HANDLE;
  State& s = S();
  std::lock_guard lock(s.mu);
  *h = s.next_handle++;
  s.handles[*h] = {::fcntl(fd, F_DUPFD_CLOEXEC, 0), static_cast<size_t>(st.st_size), 0, true};
  g_imports++;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  void* m = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(m);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  return ::munmap(reinterpret_cast<void*>(p), size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.handles.find(h);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (offset + size > it->second.size) return CUDA_ERROR_INVALID_VALUE;
  // Mapped, but not accessible until cuMemSetAccess (as on a GPU).
  void* m = ::mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, it->second.fd,
                   static_cast<off_t>(offset));
  return m == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  void* m = ::mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
  return m == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.id < 0 || desc[i].location.id >= static_cast<int>(S().devices.size())) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    const int prot = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                     : desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                         : PROT_NONE;
    if (::mprotect(reinterpret_cast<void*>(p), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr* p, size_t size) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  const int fd = NewMemfd(size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  State& s = S();
  std::lock_guard lock(s.mu);
  *p = reinterpret_cast<CUdeviceptr>(m);
  s.linear[*p] = {fd, size, 0, true};
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.linear.find(p);
  if (it == s.linear.end()) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(p), it->second.size);
  ::close(it->second.fd);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.linear.find(p);
  if (it == s.linear.end()) return CUDA_ERROR_INVALID_VALUE;
  std::memset(h, 0, sizeof *h);
  const FakeIpcHandle f{kIpcMagic, static_cast<int32_t>(::getpid()), it->second.fd, it->second.size};
  std::memcpy(h->reserved, &f, sizeof f);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* p, CUipcMemHandle h, unsigned int) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  FakeIpcHandle f{};
  std::memcpy(&f, h.reserved, sizeof f);
  if (f.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
  if (f.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // not in the exporting process
  const std::string path = "/proc/" + std::to_string(f.pid) + "/fd/" + std::to_string(f.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter's pid is not visible here
  void* m = ::mmap(nullptr, f.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return CUDA_ERROR_INVALID_HANDLE;
  State& s = S();
  std::lock_guard lock(s.mu);
  *p = reinterpret_cast<CUdeviceptr>(m);
  s.ipc_opened[*p] = f.size;
  g_imports++;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.ipc_opened.find(p);
  if (it == s.ipc_opened.end()) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(p), it->second);
  s.ipc_opened.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  State& s = S();
  std::lock_guard lock(s.mu);
  // The cuMemAlloc'd and IPC-opened allocations (the ones meshload asks about).
  auto contains = [&](uintptr_t start, size_t bytes) {
    if (p < start || p - start >= bytes) return false;
    if (base) *base = start;
    if (size) *size = bytes;
    return true;
  };
  for (const auto& [start, a] : s.linear) {
    if (contains(start, a.size)) return CUDA_SUCCESS;
  }
  for (const auto& [start, bytes] : s.ipc_opened) {
    if (contains(start, bytes)) return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult cuMemHostRegister(void* p, size_t size, unsigned int) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!s.registered.emplace(reinterpret_cast<uintptr_t>(p), size).second) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  State& s = S();
  std::lock_guard lock(s.mu);
  return s.registered.erase(reinterpret_cast<uintptr_t>(p)) ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult cuStreamCreate(CUstream* st, unsigned int) { return NewHandle(st); }

CUresult cuStreamDestroy(CUstream st) { return DeleteHandle(st); }

CUresult cuEventCreate(CUevent* e, unsigned int) { return NewHandle(e); }

CUresult cuEventDestroy(CUevent e) { return DeleteHandle(e); }

CUresult cuEventRecord(CUevent e, CUstream) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  ++*reinterpret_cast<int*>(e);
  return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }

CUresult cuStreamSynchronize(CUstream) { return HaveContext() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

// MESHLOAD_FAKE_CUDA_CTX_SYNC_MS=N: a device synchronization takes N ms (a
// GPU still busy with the trainer's work), read at each call.
CUresult cuCtxSynchronize() {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (const char* ms = std::getenv("MESHLOAD_FAKE_CUDA_CTX_SYNC_MS")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice d, CUdevice peer) {
  const int n = static_cast<int>(S().devices.size());
  if (d < 0 || d >= n || peer < 0 || peer >= n) return CUDA_ERROR_INVALID_DEVICE;
  // MESHLOAD_FAKE_CUDA_NO_PEER=1: GPUs that cannot reach each other.
  const char* no_peer = std::getenv("MESHLOAD_FAKE_CUDA_NO_PEER");
  *can = d != peer && !(no_peer && *no_peer == '1');
  return CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  thread_local CUstreamCaptureMode current = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::swap(current, *mode);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n, CUstream) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  if (!HaveContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

}  // extern "C"
