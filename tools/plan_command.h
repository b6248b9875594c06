/// \file
/// `meshload plan`: preview and explain a DataLoadJob's plan (see
/// docs/plan-json.md for its options, exit codes and JSON contract).
#pragma once

#include <string>
#include <vector>

namespace meshload::tools {

/// Runs `meshload plan` with the arguments after "plan". Returns the exit
/// code: 0 ok, 1 runtime error, 2 invalid spec or arguments.
int RunPlan(const std::vector<std::string>& args);

}  // namespace meshload::tools
