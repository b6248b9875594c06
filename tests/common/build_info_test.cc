#include "common/build_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/flags.h"

namespace meshload {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(BuildInfo, VersionTextNamesTheProgramAndTheProjectVersion) {
  auto lines = Lines(VersionText("meshload-sidecar", /*with_gpu_staging=*/true));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "meshload-sidecar " + std::string(Version()));
  EXPECT_EQ(lines[1], "gpu-staging: " + GpuStagingBuild());
  EXPECT_EQ(lines[2], "build: " + CompilerBuild());
  EXPECT_THAT(CompilerBuild(), HasSubstr("C++20"));
}

TEST(BuildInfo, TheControllerHasNoGpuStagingLine) {
  auto lines = Lines(VersionText("meshload-controller", /*with_gpu_staging=*/false));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[1], StartsWith("build: "));
}

TEST(BuildInfo, GpuStagingSaysWhetherCudaHeadersWereThere) {
#if MESHLOAD_TEST_WITH_CUDA
  EXPECT_THAT(GpuStagingBuild(), StartsWith("built in (CUDA "));
  EXPECT_THAT(GpuStagingBuild(), HasSubstr(" headers)"));
#else
  EXPECT_EQ(GpuStagingBuild(), "not built (no cuda.h at build time)");
#endif
}

TEST(Flags, VersionPrintsTheTextAndStopsLikeHelp) {
  std::string job;
  FlagParser flags("", "usage: x\n", "x");
  flags.String({"--job"}, &job);
  flags.Version("x 1.2.3\n");
  testing::internal::CaptureStdout();
  EXPECT_EQ(flags.Parse({"--job", "a.yaml", "--version", "--unknown"}), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "x 1.2.3\n");
}

TEST(Flags, WithoutAVersionTextVersionIsAnUnknownFlag) {
  FlagParser flags("plan", "usage: x\n", "x");
  testing::internal::CaptureStderr();
  EXPECT_EQ(flags.Parse({"--version"}), 2);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("--version"));
}

}  // namespace
}  // namespace meshload
