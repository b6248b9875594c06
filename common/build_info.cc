#include "common/build_info.h"

#include "common/cuda/driver.h"

#ifndef MESHLOAD_VERSION
#error "MESHLOAD_VERSION must be defined by the build (common/CMakeLists.txt)"
#endif
#ifndef MESHLOAD_BUILD_TYPE
#define MESHLOAD_BUILD_TYPE ""
#endif

namespace meshload {

std::string_view Version() { return MESHLOAD_VERSION; }

std::string GpuStagingBuild() { return cuda::BuildDescription(); }

std::string CompilerBuild() {
#if defined(__clang__)
  std::string text = "Clang " __clang_version__;
#elif defined(__GNUC__)
  std::string text = "GNU " __VERSION__;
#else
  std::string text = "unknown compiler";
#endif
  // __clang_version__ may end in a space or carry the repository in parentheses.
  while (!text.empty() && text.back() == ' ') text.pop_back();
  text += ", C++" + std::to_string(__cplusplus / 100 % 100);
  if (std::string_view(MESHLOAD_BUILD_TYPE).size() > 0) text += std::string(", ") + MESHLOAD_BUILD_TYPE;
  return text;
}

std::string VersionText(std::string_view program, bool with_gpu_staging) {
  std::string text = std::string(program) + " " + std::string(Version()) + "\n";
  if (with_gpu_staging) text += "gpu-staging: " + GpuStagingBuild() + "\n";
  text += "build: " + CompilerBuild() + "\n";
  return text;
}

}  // namespace meshload
