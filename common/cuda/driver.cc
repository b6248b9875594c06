#include "common/cuda/driver.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if MESHLOAD_WITH_CUDA
#include <cuda.h>
#endif

namespace meshload::cuda {

std::string FormatGpuUuid(const unsigned char b[16]) {
  char out[64];
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

Driver::~Driver() = default;

Status Driver::CheckOrdinal(int ordinal) const {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return InvalidArgument("no CUDA device " + std::to_string(ordinal));
  }
  return Status::Ok();
}

Result<const Driver*> Driver::Open() {
  static std::once_flag once;
  static Result<const Driver*>* opened = nullptr;
  std::call_once(once, [] {
    const char* env = std::getenv("MESHLOAD_CUDA_LIBRARY");
    auto d = Load(env && *env ? env : "libcuda.so.1");
    opened = d.ok() ? new Result<const Driver*>(d->release()) : new Result<const Driver*>(d.status());
  });
  return *opened;
}

int Driver::OrdinalOf(const std::string& uuid) const {
  for (const auto& d : devices_) {
    if (d.uuid == uuid) return d.ordinal;
  }
  return -1;
}

#if MESHLOAD_WITH_CUDA

// The entry points, by the names cuda.h maps them to (cuCtxPushCurrent is
// cuCtxPushCurrent_v2, and so on): dlsym must ask for the versioned symbol.
// clang-format off
#define ML_CUDA_API(X)                                                                                              \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetUuid) X(cuDeviceGetName)         \
  X(cuGetErrorString) X(cuGetErrorName) X(cuDevicePrimaryCtxRetain) X(cuCtxPushCurrent) X(cuCtxPopCurrent)          \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle)                    \
  X(cuMemImportFromShareableHandle) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)             \
  X(cuMemSetAccess) X(cuMemAlloc) X(cuMemFree) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)    \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuStreamCreate) X(cuStreamDestroy) X(cuEventCreate)                \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuMemcpyHtoDAsync) X(cuMemcpyPeerAsync)               \
  X(cuMemcpyDtoH) X(cuCtxSynchronize) X(cuStreamSynchronize) X(cuDeviceCanAccessPeer)                            \
  X(cuThreadExchangeStreamCaptureMode) X(cuMemGetAddressRange)
// clang-format on

#define ML_STR2(x) #x
#define ML_STR(x) ML_STR2(x)

struct Driver::Api {
#define ML_FIELD(fn) decltype(&::fn) fn = nullptr;
  ML_CUDA_API(ML_FIELD)
#undef ML_FIELD
};

namespace {

constexpr CUresult kStubLibrary = static_cast<CUresult>(34);  // CUDA_ERROR_STUB_LIBRARY

CUcontext Ctx(const Driver& d, int ordinal) { return static_cast<CUcontext>(d.Context(ordinal)); }

// Makes a device's primary context current for a scope.
// (A device whose primary context cannot be had: an EXCLUSIVE_PROCESS GPU
// already used by another process, say. The calls then fail with this.)
class ScopedContext {
 public:
  ScopedContext(const Driver& d, int ordinal) : api_(d.api()) {
    void* ctx = d.Context(ordinal);
    if (ctx == nullptr) {
      status_ = d.ContextError(ordinal);
      return;
    }
    const CUresult r = api_.cuCtxPushCurrent(static_cast<CUcontext>(ctx));
    pushed_ = r == CUDA_SUCCESS;
    if (!pushed_) status_ = Status(StatusCode::kInternal, "cuCtxPushCurrent failed: " + d.ErrorText(r));
  }
  ~ScopedContext() {
    if (pushed_) {
      CUcontext popped = nullptr;
      api_.cuCtxPopCurrent(&popped);
    }
  }
  const Status& status() const { return status_; }

 private:
  const Driver::Api& api_;
  bool pushed_ = false;
  Status status_;
};

// Calls that are not allowed while another thread captures a CUDA graph in
// the global mode (PyTorch's default) are made in the relaxed mode: the
// release path runs on threads the trainer does not control.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const Driver::Api& api) : api_(api) {
    mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    changed_ = api_.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCapture() {
    if (changed_) api_.cuThreadExchangeStreamCaptureMode(&mode_);
  }

 private:
  const Driver::Api& api_;
  CUstreamCaptureMode mode_;
  bool changed_ = false;
};

CUmemAllocationProp ShareableProp(int ordinal) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc ReadWrite(int ordinal) {
  CUmemAccessDesc a;
  std::memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = ordinal;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

}  // namespace

std::string Driver::ErrorText(int code) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_ && api_->cuGetErrorName) api_->cuGetErrorName(static_cast<CUresult>(code), &name);
  if (api_ && api_->cuGetErrorString) api_->cuGetErrorString(static_cast<CUresult>(code), &text);
  std::string s = name ? name : "CUDA error " + std::to_string(code);
  if (text) s += std::string(" (") + text + ")";
  return s;
}

Status Driver::Check(int result, const char* call) const {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const StatusCode code = result == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kUnavailable : StatusCode::kInternal;
  return Status(code, std::string(call) + " failed: " + ErrorText(result));
}

#define ML_CU(call) Check(api_->call, ML_STR2(call))
#define ML_CU_RETURN(call) MESHLOAD_RETURN_IF_ERROR(Check(api_->call, ML_STR2(call)))

Result<std::unique_ptr<Driver>> Driver::Load(const std::string& library) {
  std::unique_ptr<Driver> d(new Driver());
  d->api_ = std::make_unique<Api>();
  d->library_ = library;
  auto fail = [](std::string why) { return Status(StatusCode::kUnavailable, std::move(why)); };
  // Kept open for the process's life, like the driver itself.
  void* h = ::dlopen(d->library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = ::dlerror();
    return fail("no CUDA driver: cannot open " + d->library_ + (err ? std::string(" (") + err + ")" : ""));
  }
  std::string missing;
#define ML_LOAD(fn)                                                        \
  d->api_->fn = reinterpret_cast<decltype(&::fn)>(::dlsym(h, ML_STR(fn))); \
  if (d->api_->fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + ML_STR(fn);
  ML_CUDA_API(ML_LOAD)
#undef ML_LOAD
  if (!missing.empty()) return fail(d->library_ + " lacks CUDA driver entry points: " + missing);
  const Api& api = *d->api_;
  if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NO_DEVICE) return fail("the CUDA driver sees no device");
    std::string why = "cuInit failed: " + d->ErrorText(r);
    if (r == kStubLibrary) why += ": " + d->library_ + " is the toolkit's stub, not a driver";
    return fail(why);
  }
  api.cuDriverGetVersion(&d->version_);
  int n = 0;
  MESHLOAD_RETURN_IF_ERROR(d->Check(api.cuDeviceGetCount(&n), "cuDeviceGetCount"));
  for (int i = 0; i < n; ++i) {
    CUdevice dev = 0;
    CUuuid u{};
    char name[256] = {};
    MESHLOAD_RETURN_IF_ERROR(d->Check(api.cuDeviceGet(&dev, i), "cuDeviceGet"));
    MESHLOAD_RETURN_IF_ERROR(d->Check(api.cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid"));
    api.cuDeviceGetName(name, sizeof name - 1, dev);
    d->devices_.push_back({i, FormatGpuUuid(reinterpret_cast<const unsigned char*>(u.bytes)), name});
  }
  if (d->devices_.empty()) return fail("the CUDA driver sees no device");
  {
    // Nobody else sees `d` yet; the lock costs nothing and lets the
    // analysis check every access to the vectors.
    MutexLock lock(d->contexts_mu_);
    d->contexts_.assign(d->devices_.size(), nullptr);
    d->retain_errors_.assign(d->devices_.size(), 0);
  }
  return d;
}

void* Driver::Context(int ordinal) const {
  // The primary context (the one CUDA runtimes such as PyTorch's and JAX's
  // use too), retained on first use: a device this process never touches
  // gets no context (each costs device memory).
  // contexts_ has one entry per device (Load()); devices_ is read-only.
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) return nullptr;
  MutexLock lock(contexts_mu_);
  if (contexts_[ordinal] == nullptr) {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUresult r = api_->cuDeviceGet(&dev, ordinal);
    if (r == CUDA_SUCCESS) r = api_->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS) {
      contexts_[ordinal] = ctx;
    } else {
      retain_errors_[ordinal] = r;
    }
  }
  return contexts_[ordinal];
}

Status Driver::ContextError(int ordinal) const {
  MESHLOAD_RETURN_IF_ERROR(CheckOrdinal(ordinal));
  MutexLock lock(contexts_mu_);
  return Status(StatusCode::kUnavailable,
                "cannot use CUDA device " + std::to_string(ordinal) + " (" + devices_[ordinal].uuid +
                    "): cuDevicePrimaryCtxRetain failed: " + ErrorText(retain_errors_[ordinal]) +
                    " (a GPU in EXCLUSIVE_PROCESS compute mode that another process already uses?)");
}

bool Driver::CanAccessPeer(int ordinal, int peer) const {
  int can = 0;
  return api_->cuDeviceCanAccessPeer(&can, ordinal, peer) == CUDA_SUCCESS && can != 0;
}

Status Driver::SynchronizeDevice(int ordinal) const {
  ScopedContext scope(*this, ordinal);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  RelaxedCapture relaxed(*api_);
  return ML_CU(cuCtxSynchronize());
}

Result<uint64_t> Driver::Granularity(int ordinal) const {
  const CUmemAllocationProp prop = ShareableProp(ordinal);
  size_t g = 0;
  ML_CU_RETURN(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return static_cast<uint64_t>(g == 0 ? 1 : g);
}

template <typename T>
std::unique_ptr<T> Driver::Make(int ordinal) const {
  std::unique_ptr<T> made(new T());
  made->driver_ = this;
  made->ordinal_ = ordinal;
  return made;
}

Result<std::unique_ptr<VmmAllocation>> Driver::AllocateShareable(int ordinal, uint64_t bytes) const {
  MESHLOAD_RETURN_IF_ERROR(CheckOrdinal(ordinal));
  MESHLOAD_ASSIGN_OR_RETURN(const uint64_t g, Granularity(ordinal));
  const uint64_t size = (std::max<uint64_t>(bytes, 1) + g - 1) / g * g;
  ScopedContext scope(*this, ordinal);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  const CUmemAllocationProp prop = ShareableProp(ordinal);
  std::unique_ptr<VmmAllocation> a = Make<VmmAllocation>(ordinal);
  CUmemGenericAllocationHandle h = 0;
  ML_CU_RETURN(cuMemCreate(&h, size, &prop, 0));
  a->handle_ = h;  // from here on the destructor releases what exists
  CUdeviceptr p = 0;
  ML_CU_RETURN(cuMemAddressReserve(&p, size, g, 0, 0));
  a->ptr_ = p;
  a->bytes_ = size;
  if (Status st = ML_CU(cuMemMap(p, size, 0, h, 0)); !st.ok()) {
    api_->cuMemAddressFree(p, size);
    a->ptr_ = 0;
    return st;
  }
  const CUmemAccessDesc access = ReadWrite(ordinal);
  ML_CU_RETURN(cuMemSetAccess(p, size, &access, 1));
  return a;
}

VmmAllocation::~VmmAllocation() {
  if (!driver_) return;
  const auto& api = driver_->api();
  if (ptr_) {
    api.cuMemUnmap(ptr_, bytes_);
    api.cuMemAddressFree(ptr_, bytes_);
  }
  if (handle_) api.cuMemRelease(handle_);
}

Result<UniqueFd> VmmAllocation::Export() const {
  int fd = -1;
  MESHLOAD_RETURN_IF_ERROR(driver_->Check(
      driver_->api().cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      "cuMemExportToShareableHandle"));
  return UniqueFd(fd);
}

Status VmmAllocation::GrantAccess(int other_ordinal) const {
  MESHLOAD_RETURN_IF_ERROR(driver_->CheckOrdinal(other_ordinal));
  const CUmemAccessDesc access[2] = {ReadWrite(ordinal_), ReadWrite(other_ordinal)};
  return driver_->Check(driver_->api().cuMemSetAccess(ptr_, bytes_, access, 2), "cuMemSetAccess");
}

Result<std::unique_ptr<ImportedAllocation>> Driver::Import(int ordinal, int fd, uint64_t bytes) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  CUmemGenericAllocationHandle h = 0;
  ML_CU_RETURN(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  std::unique_ptr<ImportedAllocation> a = Make<ImportedAllocation>(ordinal);
  auto g = Granularity(ordinal);
  CUdeviceptr p = 0;
  Status st = ML_CU(cuMemAddressReserve(&p, bytes, g.ok() ? *g : 0, 0, 0));
  if (st.ok()) {
    st = ML_CU(cuMemMap(p, bytes, 0, h, 0));
    if (!st.ok()) api_->cuMemAddressFree(p, bytes);
  }
  // The mapping keeps the memory alive; the handle is not needed any more.
  api_->cuMemRelease(h);
  MESHLOAD_RETURN_IF_ERROR(st);
  a->ptr_ = p;
  a->bytes_ = bytes;
  const CUmemAccessDesc access = ReadWrite(ordinal);
  ML_CU_RETURN(cuMemSetAccess(p, bytes, &access, 1));
  return a;
}

ImportedAllocation::~ImportedAllocation() {
  if (!driver_ || !ptr_) return;
  const auto& api = driver_->api();
  // Unmapping does not wait for kernels still reading the memory: wait
  // for the device first (this runs when a connection's last batch is gone).
  (void)driver_->SynchronizeDevice(ordinal_);
  RelaxedCapture relaxed(api);
  if (ipc_) {
    ScopedContext scope(*driver_, ordinal_);
    api.cuIpcCloseMemHandle(ptr_);
  } else {
    api.cuMemUnmap(ptr_, bytes_);
    api.cuMemAddressFree(ptr_, bytes_);
  }
}

Result<std::unique_ptr<IpcAllocation>> Driver::AllocateIpc(int ordinal, uint64_t bytes) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  std::unique_ptr<IpcAllocation> a = Make<IpcAllocation>(ordinal);
  CUdeviceptr p = 0;
  ML_CU_RETURN(cuMemAlloc(&p, std::max<uint64_t>(bytes, 1)));
  a->ptr_ = p;
  a->bytes_ = bytes;
  CUipcMemHandle h;
  ML_CU_RETURN(cuIpcGetMemHandle(&h, p));
  static_assert(sizeof h == sizeof(IpcHandle));
  std::memcpy(a->handle_.data(), &h, sizeof h);
  return a;
}

IpcAllocation::~IpcAllocation() {
  if (!driver_ || !ptr_) return;
  ScopedContext scope(*driver_, ordinal_);
  driver_->api().cuMemFree(ptr_);
}

Result<std::unique_ptr<ImportedAllocation>> Driver::OpenIpc(int ordinal, const IpcHandle& handle,
                                                            uint64_t bytes) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  CUipcMemHandle h;
  std::memcpy(&h, handle.data(), sizeof h);
  CUdeviceptr p = 0;
  ML_CU_RETURN(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  // The handle's allocation must hold the bytes the peer says it does, or
  // tensors "inside" the slot would be read past its end.
  CUdeviceptr base = 0;
  size_t size = 0;
  Status range = ML_CU(cuMemGetAddressRange(&base, &size, p));
  if (range.ok() && (p < base || p - base > size || size - (p - base) < bytes)) {
    range = InvalidArgument("the IPC handle's allocation holds " + std::to_string(size - (p - base)) +
                            " bytes; the sidecar says a slot has " + std::to_string(bytes));
  }
  if (!range.ok()) {
    (void)ML_CU(cuIpcCloseMemHandle(p));
    return range;
  }
  std::unique_ptr<ImportedAllocation> a = Make<ImportedAllocation>(ordinal);
  a->ptr_ = p;
  a->bytes_ = bytes;
  a->ipc_ = true;
  return a;
}

Result<std::unique_ptr<PinnedRegistration>> Driver::RegisterHost(void* base, uint64_t bytes, int ordinal) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  ML_CU_RETURN(cuMemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE));
  std::unique_ptr<PinnedRegistration> r = Make<PinnedRegistration>(ordinal);
  r->base_ = base;
  return r;
}

PinnedRegistration::~PinnedRegistration() {
  if (!driver_ || !base_) return;
  ScopedContext scope(*driver_, ordinal_);
  driver_->api().cuMemHostUnregister(base_);
}

Result<std::unique_ptr<Stream>> Driver::CreateStream(int ordinal, uint32_t events) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  std::unique_ptr<Stream> s = Make<Stream>(ordinal);
  CUstream cs = nullptr;
  ML_CU_RETURN(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  s->stream_ = cs;
  for (uint32_t i = 0; i < events; ++i) {
    CUevent e = nullptr;
    // Blocking sync: the staging thread sleeps on the fence instead of
    // spinning on a core the trainer may need.
    ML_CU_RETURN(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
    s->events_.push_back(e);
  }
  return s;
}

Status Stream::Synchronize() {
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return driver_->Check(driver_->api().cuStreamSynchronize(static_cast<CUstream>(stream_)), "cuStreamSynchronize");
}

Stream::~Stream() {
  if (!driver_) return;
  const auto& api = driver_->api();
  ScopedContext scope(*driver_, ordinal_);
  if (stream_) api.cuStreamSynchronize(static_cast<CUstream>(stream_));
  for (void* e : events_) api.cuEventDestroy(static_cast<CUevent>(e));
  if (stream_) api.cuStreamDestroy(static_cast<CUstream>(stream_));
}

Status Stream::CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) {
  const auto& api = driver_->api();
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return driver_->Check(api.cuMemcpyHtoDAsync(dst, src, bytes, static_cast<CUstream>(stream_)), "cuMemcpyHtoDAsync");
}

Status Stream::CopyFromPeer(DevicePtr dst, DevicePtr src, int src_ordinal, uint64_t bytes) {
  const auto& api = driver_->api();
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return driver_->Check(api.cuMemcpyPeerAsync(dst, Ctx(*driver_, ordinal_), src, Ctx(*driver_, src_ordinal), bytes,
                                              static_cast<CUstream>(stream_)),
                        "cuMemcpyPeerAsync");
}

Status Stream::Record(uint32_t index) {
  if (index >= events_.size()) return InvalidArgument("no event " + std::to_string(index));
  const auto& api = driver_->api();
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return driver_->Check(api.cuEventRecord(static_cast<CUevent>(events_[index]), static_cast<CUstream>(stream_)),
                        "cuEventRecord");
}

Status Stream::Wait(uint32_t index) {
  if (index >= events_.size()) return InvalidArgument("no event " + std::to_string(index));
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return driver_->Check(driver_->api().cuEventSynchronize(static_cast<CUevent>(events_[index])), "cuEventSynchronize");
}

Result<std::unique_ptr<Fence>> Driver::RecordFence(int ordinal, uintptr_t stream) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  // 1 and 2 (DLPack's legacy and per-thread default streams) are fenced on
  // the legacy stream, which waits for every blocking stream, per-thread
  // default streams included: a per-thread stream here would be this
  // thread's, not the trainer's.
  CUstream s = stream == 1 || stream == 2 ? CU_STREAM_LEGACY : reinterpret_cast<CUstream>(stream);
  RelaxedCapture relaxed(*api_);
  std::unique_ptr<Fence> f = Make<Fence>(ordinal);
  CUevent e = nullptr;
  ML_CU_RETURN(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
  f->event_ = e;
  ML_CU_RETURN(cuEventRecord(e, s));
  return f;
}

Status Fence::Wait() {
  ScopedContext scope(*driver_, ordinal_);
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  RelaxedCapture relaxed(driver_->api());
  return driver_->Check(driver_->api().cuEventSynchronize(static_cast<CUevent>(event_)), "cuEventSynchronize");
}

Fence::~Fence() {
  if (driver_ && event_) {
    ScopedContext scope(*driver_, ordinal_);
    driver_->api().cuEventDestroy(static_cast<CUevent>(event_));
  }
}

Status Driver::CopyToHost(void* dst, DevicePtr src, uint64_t bytes, int ordinal) const {
  ScopedContext scope(*this, ordinal);  // reports a bad ordinal too
  MESHLOAD_RETURN_IF_ERROR(scope.status());
  return ML_CU(cuMemcpyDtoH(dst, src, bytes));
}

std::string BuildDescription() {
  return "built in (CUDA " + std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10) +
         " headers)";
}

#else  // !MESHLOAD_WITH_CUDA: built without cuda.h; every answer is "not in this build".

std::string BuildDescription() { return "not built (no cuda.h at build time)"; }

struct Driver::Api {};

Result<std::unique_ptr<Driver>> Driver::Load(const std::string&) {
  return Status(StatusCode::kUnavailable, "this build has no CUDA support (cuda.h was not found at configure time)");
}
std::string Driver::ErrorText(int code) const { return "CUDA error " + std::to_string(code); }
Status Driver::Check(int, const char* call) const {
  return Status(StatusCode::kUnavailable, std::string(call) + ": no CUDA in this build");
}
Result<uint64_t> Driver::Granularity(int) const { return Check(1, "Granularity"); }
Result<std::unique_ptr<VmmAllocation>> Driver::AllocateShareable(int, uint64_t) const {
  return Check(1, "cuMemCreate");
}
Result<std::unique_ptr<ImportedAllocation>> Driver::Import(int, int, uint64_t) const { return Check(1, "cuMemImport"); }
Result<std::unique_ptr<IpcAllocation>> Driver::AllocateIpc(int, uint64_t) const { return Check(1, "cuMemAlloc"); }
Result<std::unique_ptr<ImportedAllocation>> Driver::OpenIpc(int, const IpcHandle&, uint64_t) const {
  return Check(1, "cuIpcOpenMemHandle");
}
void* Driver::Context(int) const { return nullptr; }
Status Driver::ContextError(int) const { return Check(1, "cuDevicePrimaryCtxRetain"); }
bool Driver::CanAccessPeer(int, int) const { return false; }
Status Driver::SynchronizeDevice(int) const { return Check(1, "cuCtxSynchronize"); }
Status Stream::Synchronize() { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }
Result<std::unique_ptr<PinnedRegistration>> Driver::RegisterHost(void*, uint64_t, int) const {
  return Check(1, "cuMemHostRegister");
}
Result<std::unique_ptr<Stream>> Driver::CreateStream(int, uint32_t) const { return Check(1, "cuStreamCreate"); }
Status Driver::CopyToHost(void*, DevicePtr, uint64_t, int) const { return Check(1, "cuMemcpyDtoH"); }
Result<std::unique_ptr<Fence>> Driver::RecordFence(int, uintptr_t) const { return Check(1, "cuEventRecord"); }
Fence::~Fence() = default;
Status Fence::Wait() { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }
VmmAllocation::~VmmAllocation() = default;
Result<UniqueFd> VmmAllocation::Export() const { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }
Status VmmAllocation::GrantAccess(int) const { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }
ImportedAllocation::~ImportedAllocation() = default;
IpcAllocation::~IpcAllocation() = default;
PinnedRegistration::~PinnedRegistration() = default;
Stream::~Stream() = default;
Status Stream::CopyToDevice(DevicePtr, const void*, uint64_t) {
  return Status(StatusCode::kUnavailable, "no CUDA in this build");
}
Status Stream::CopyFromPeer(DevicePtr, DevicePtr, int, uint64_t) {
  return Status(StatusCode::kUnavailable, "no CUDA in this build");
}
Status Stream::Record(uint32_t) { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }
Status Stream::Wait(uint32_t) { return Status(StatusCode::kUnavailable, "no CUDA in this build"); }

#endif

}  // namespace meshload::cuda
