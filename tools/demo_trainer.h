/// \file
/// `meshload demo-trainer`: consumes and verifies batches (see demo_trainer.cc).
#pragma once

#include <string>
#include <vector>

namespace meshload::tools {

/// Exit codes: 0 ok, 1 error, 2 usage, 3 verification mismatches.
int RunDemoTrainer(const std::vector<std::string>& args);

}  // namespace meshload::tools
