// meshload: the command-line tool. Subcommands: plan, index, run --local,
// demo-trainer, version.

#include <iostream>
#include <string>
#include <vector>

#include "common/allocator.h"
#include "common/build_info.h"
#include "common/logging.h"
#include "tools/demo_trainer.h"
#include "tools/index_command.h"
#include "tools/plan_command.h"
#include "tools/run_command.h"

namespace {

constexpr const char* kUsage = R"(usage: meshload <command> [options]

commands:
  plan          show which device holds which samples, who reads what, and the I/O cost
  index         write the .tar.idx index each WebDataset shard needs (Energon's format)
  run --local   run the whole data path on this machine, verifying every batch
  demo-trainer  consume and verify batches from one sidecar (used by run --local)
  version       print the version and whether GPU staging is built in (also --version)

Run 'meshload <command> --help' for a command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  meshload::KeepHeapForReuse();
  if (auto st = meshload::ConfigureLoggingFromEnv(); !st.ok()) {
    std::cerr << "meshload: " << st.ToString() << "\n";
    return 2;
  }
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "plan") return meshload::tools::RunPlan(args);
  if (cmd == "index") return meshload::tools::RunIndex(args);
  if (cmd == "run") return meshload::tools::RunRun(args);
  if (cmd == "demo-trainer") return meshload::tools::RunDemoTrainer(args);
  if (cmd == "version" || cmd == "--version") {
    std::cout << meshload::VersionText("meshload", /*with_gpu_staging=*/true);
    return 0;
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "meshload: unknown command '" << cmd << "'\n\n" << kUsage;
  return 2;
}
