/// \file
/// What a meshload program is and what is built into it, for `--version`,
/// the start-up log line and the images' checks.
///
/// Thread safety: the functions are pure; call them from any thread.
#pragma once

#include <string>
#include <string_view>

namespace meshload {

/// The project's version (the top-level CMakeLists.txt), e.g. "0.1.0".
std::string_view Version();

/// Whether GPU staging (and the trainer's CUDA import) is in this build:
/// "built in (CUDA 13.0 headers)" or "not built (no cuda.h at build time)".
std::string GpuStagingBuild();

/// The compiler and build type, e.g. "GNU 12.2.0, C++20, Release".
std::string CompilerBuild();

/// `--version` text: "<program> <version>\n", then "gpu-staging: ..." when
/// `with_gpu_staging` (the sidecar and the CLI), then "build: ...".
std::string VersionText(std::string_view program, bool with_gpu_staging);

}  // namespace meshload
