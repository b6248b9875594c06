// The CUDA driver loader against what this machine has: no library, the
// toolkit's stub, and the real driver when there is one (GPU machines).
// The GPU code paths themselves: device_staging_test.cc.
#include "common/cuda/driver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace meshload::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaDriver, FormatsUuidsLikeNvidiaSmi) {
  const unsigned char b[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
                               0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  EXPECT_EQ(FormatGpuUuid(b), "GPU-12345678-9abc-def0-0123-456789abcdef");
}

TEST(CudaDriver, AMissingDriverIsUnavailableWithTheReason) {
  auto d = Driver::Load("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
#if MESHLOAD_WITH_CUDA
  EXPECT_THAT(d.status().message(), HasSubstr("no CUDA driver: cannot open /nonexistent/libcuda.so.1"))
      << d.status().ToString();
#endif
}

TEST(CudaDriver, TheToolkitsStubLibraryIsNotADriver) {
  const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (::access(stub, R_OK) != 0) GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  // In a child process: the stub's soname is libcuda.so.1, so once loaded
  // it would be what every later dlopen("libcuda.so.1") of this process gets
  // (the real driver's test below, on a GPU machine).
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        auto d = Driver::Load(stub);
        if (d.ok()) {
          std::fprintf(stderr, "the stub loaded as a driver\n");
          std::_Exit(1);
        }
        std::fprintf(stderr, "%s\n", d.status().message().c_str());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), MESHLOAD_WITH_CUDA ? "cuInit failed" : "");
}

TEST(CudaDriver, TheSystemDriverIsDescribedEitherWay) {
  auto d = Driver::Load("libcuda.so.1");
  if (!d.ok()) {
    EXPECT_FALSE(d.status().message().empty());
    GTEST_SKIP() << "no CUDA device here (" << d.status().message() << "); the device half of this test needs a GPU";
  }
  EXPECT_GT((*d)->version(), 0);
  ASSERT_FALSE((*d)->devices().empty());
  for (const DeviceInfo& dev : (*d)->devices()) {
    EXPECT_EQ(dev.uuid.rfind("GPU-", 0), 0u) << dev.uuid;
    EXPECT_EQ(dev.uuid.size(), 40u) << dev.uuid;
    EXPECT_FALSE(dev.name.empty());
    EXPECT_EQ((*d)->OrdinalOf(dev.uuid), dev.ordinal);
  }
  EXPECT_EQ((*d)->OrdinalOf("GPU-00000000-0000-0000-0000-000000000000"), -1);
}

}  // namespace
}  // namespace meshload::cuda
