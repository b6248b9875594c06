/// \file
/// `meshload run --local`: the whole data path on one machine (see
/// run_command.cc and docs/operations.md).
#pragma once

#include <string>
#include <vector>

namespace meshload::tools {

/// Exit codes: 0 every batch verified, 1 an error or mismatch, 2 usage.
int RunRun(const std::vector<std::string>& args);

}  // namespace meshload::tools
