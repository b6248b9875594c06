#include "sidecar/staging/cuda_probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace meshload::staging {
namespace {

TEST(CudaProbe, FormatsUuidsLikeNvidiaSmi) {
  const unsigned char b[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
                               0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  EXPECT_EQ(FormatGpuUuid(b), "GPU-12345678-9abc-def0-0123-456789abcdef");
}

TEST(CudaProbe, AMissingDriverIsHostStagingWithTheReason) {
  CudaProbe p = ProbeCuda("/nonexistent/libcuda.so.1");
  EXPECT_FALSE(p.available);
  EXPECT_TRUE(p.devices.empty());
  EXPECT_NE(p.reason.find("no CUDA driver: cannot open /nonexistent/libcuda.so.1"), std::string::npos) << p.reason;
}

TEST(CudaProbe, TheToolkitsStubLibraryIsNotADriver) {
  const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (::access(stub, R_OK) != 0) GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  CudaProbe p = ProbeCuda(stub);
  EXPECT_FALSE(p.available);
  EXPECT_FALSE(p.reason.empty());
  EXPECT_NE(p.reason.find("cuInit failed"), std::string::npos) << p.reason;
}

TEST(CudaProbe, TheDefaultDriverIsDescribedEitherWay) {
  CudaProbe p = ProbeCuda();
  if (!p.available) {
    EXPECT_FALSE(p.reason.empty());
    GTEST_SKIP() << "no CUDA device here (" << p.reason << "); the device half of this test needs a GPU";
  }
  EXPECT_GT(p.driver_version, 0);
  for (const CudaDevice& d : p.devices) {
    EXPECT_EQ(d.uuid.rfind("GPU-", 0), 0u) << d.uuid;
    EXPECT_EQ(d.uuid.size(), 40u) << d.uuid;
    EXPECT_FALSE(d.name.empty());
  }
}

}  // namespace
}  // namespace meshload::staging
