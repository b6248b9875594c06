// Child processes of `meshload run --local`: started with posix_spawn (no
// fork after threads exist), a log file each, a trainer's stdout captured.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace meshload::tools {

/// The directory of this program (/proc/self/exe).
std::string SelfDir();

/// A program next to this one (or in ../sidecar/ of a build tree), `env`
/// when set, else `name` to be found on PATH.
std::string FindBinary(const std::string& name, const char* env);

struct Child {
  pid_t pid = -1;
  std::string what;
  int out_fd = -1;  // trainers: their stdout (JSON lines)
  std::string buffer;
  bool exited = false;
  int status = 0;
  std::string log;
};

/// The inherited peer socket lands on this descriptor in the sidecar.
inline constexpr int kPeerListenFd = 3;

/// Starts `argv` with stderr (and stdout, unless captured) appended to
/// `log_path`; `inherit_fd` >= 0 is passed as kPeerListenFd.
Result<Child> Spawn(const std::string& what, const std::vector<std::string>& argv, const std::string& log_path,
                    bool capture_stdout, int inherit_fd = -1);

/// The last `lines` lines of a file, indented for a report.
std::string Tail(const std::string& path, size_t lines);

/// A process's own resident memory (heap and staging slots: RssAnon +
/// RssShmem), and the page-cache pages it has mapped (RssFile: shared with
/// the page cache and reclaimable; mapped reads of small samples add them).
std::pair<uint64_t, uint64_t> ResidentBytes(pid_t pid);

}  // namespace meshload::tools
