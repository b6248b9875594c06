/// \file
/// CudaProbe: finds out at run time whether CUDA devices can be used, with
/// no link-time dependency on the driver: libcuda is opened with dlopen and
/// its entry points taken with dlsym, so the same binary runs on machines
/// without a GPU or driver and falls back to host staging, saying why.
///
/// What it reports (driver version, devices by UUID) is what the device
/// staging and the handshake's UUID mapping build on.
///
/// Thread safety: ProbeCuda() may be called from any thread; it calls
/// cuInit, which is itself thread-safe. Call it before starting threads
/// that fork (the sidecar never forks).
#pragma once

#include <string>
#include <vector>

namespace meshload::staging {

struct CudaDevice {
  int ordinal = 0;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  std::string name;
};

struct CudaProbe {
  bool available = false;  // a driver answered and has at least one device
  std::string library;     // the library opened (or tried)
  std::string reason;      // why not, when not available
  int driver_version = 0;  // e.g. 13000
  std::vector<CudaDevice> devices;
};

/// Opens `library` (default: $MESHLOAD_CUDA_LIBRARY, else libcuda.so.1),
/// initialises the driver and lists the devices. Never fails: a missing
/// library, a stub, a driver error or no device is `available = false` with
/// the reason.
CudaProbe ProbeCuda(const std::string& library = {});

/// The 16 bytes of a CUDA UUID in nvidia-smi's form ("GPU-" + 8-4-4-4-12 hex).
std::string FormatGpuUuid(const unsigned char bytes[16]);

}  // namespace meshload::staging
