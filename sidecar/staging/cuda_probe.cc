#include "sidecar/staging/cuda_probe.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace meshload::staging {
namespace {

// The few driver API types and entry points the probe needs, declared here
// so that the build needs neither cuda.h nor libcuda (ABI of the CUDA driver
// API: CUresult and CUdevice are int, CUuuid is 16 bytes).
using CUresult = int;
using CUdevice = int;
struct CUuuid {
  unsigned char bytes[16];
};
using InitFn = CUresult (*)(unsigned int);
using DriverGetVersionFn = CUresult (*)(int*);
using DeviceGetCountFn = CUresult (*)(int*);
using DeviceGetFn = CUresult (*)(CUdevice*, int);
using DeviceGetUuidFn = CUresult (*)(CUuuid*, CUdevice);
using DeviceGetNameFn = CUresult (*)(char*, int, CUdevice);
using GetErrorStringFn = CUresult (*)(CUresult, const char**);

constexpr CUresult kSuccess = 0;
constexpr CUresult kNoDevice = 100;
constexpr CUresult kStubLibrary = 34;

}  // namespace

std::string FormatGpuUuid(const unsigned char b[16]) {
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

CudaProbe ProbeCuda(const std::string& library) {
  CudaProbe p;
  p.library = library;
  if (p.library.empty()) {
    const char* env = std::getenv("MESHLOAD_CUDA_LIBRARY");
    p.library = env && *env ? env : "libcuda.so.1";
  }
  // Kept open for the process's life: device staging will use the driver.
  void* h = ::dlopen(p.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = ::dlerror();
    p.reason = "no CUDA driver: cannot open " + p.library + (err ? std::string(" (") + err + ")" : "");
    return p;
  }
  auto sym = [&](const char* name) { return ::dlsym(h, name); };
  auto init = reinterpret_cast<InitFn>(sym("cuInit"));
  auto version = reinterpret_cast<DriverGetVersionFn>(sym("cuDriverGetVersion"));
  auto count = reinterpret_cast<DeviceGetCountFn>(sym("cuDeviceGetCount"));
  auto get = reinterpret_cast<DeviceGetFn>(sym("cuDeviceGet"));
  auto uuid = reinterpret_cast<DeviceGetUuidFn>(sym("cuDeviceGetUuid_v2"));
  if (uuid == nullptr) uuid = reinterpret_cast<DeviceGetUuidFn>(sym("cuDeviceGetUuid"));
  auto name = reinterpret_cast<DeviceGetNameFn>(sym("cuDeviceGetName"));
  auto error_string = reinterpret_cast<GetErrorStringFn>(sym("cuGetErrorString"));
  if (!init || !version || !count || !get || !uuid || !name) {
    p.reason = p.library + " lacks the CUDA driver entry points (cuInit, cuDeviceGetUuid, ...)";
    return p;
  }
  auto describe = [&](const char* call, CUresult r) {
    const char* text = nullptr;
    if (error_string) error_string(r, &text);
    std::string s = std::string(call) + " failed with CUDA error " + std::to_string(r);
    if (text) s += " (" + std::string(text) + ")";
    if (r == kStubLibrary) s += ": " + p.library + " is the toolkit's stub, not a driver";
    return s;
  };
  if (CUresult r = init(0); r != kSuccess) {
    p.reason = r == kNoDevice ? "the CUDA driver sees no device" : describe("cuInit", r);
    return p;
  }
  version(&p.driver_version);
  int n = 0;
  if (CUresult r = count(&n); r != kSuccess) {
    p.reason = describe("cuDeviceGetCount", r);
    return p;
  }
  for (int i = 0; i < n; ++i) {
    CUdevice d = 0;
    CUuuid u{};
    char buf[256] = {};
    if (CUresult r = get(&d, i); r != kSuccess) {
      p.reason = describe("cuDeviceGet", r);
      p.devices.clear();
      return p;
    }
    if (CUresult r = uuid(&u, d); r != kSuccess) {
      p.reason = describe("cuDeviceGetUuid", r);
      p.devices.clear();
      return p;
    }
    name(buf, sizeof buf - 1, d);
    p.devices.push_back({i, FormatGpuUuid(u.bytes), buf});
  }
  if (p.devices.empty()) {
    p.reason = "the CUDA driver sees no device";
    return p;
  }
  p.available = true;
  return p;
}

}  // namespace meshload::staging
