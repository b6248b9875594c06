#include "tools/child_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/unique_fd.h"

extern char** environ;

namespace meshload::tools {

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return std::filesystem::path(buf).parent_path().string();
}

std::string FindBinary(const std::string& name, const char* env) {
  if (const char* e = std::getenv(env); e && *e) return e;
  const std::string self = SelfDir();
  for (const std::string& candidate : {self + "/" + name, self + "/../sidecar/" + name}) {
    if (::access(candidate.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(candidate).string();
  }
  return name;  // rely on PATH
}

Result<Child> Spawn(const std::string& what, const std::vector<std::string>& argv, const std::string& log_path,
                    bool capture_stdout, int inherit_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears close-on-exec on the copy: only this socket is inherited
  // (from another descriptor number, since a dup2 onto itself would not).
  UniqueFd moved;
  if (inherit_fd == kPeerListenFd) {
    moved.Reset(::fcntl(inherit_fd, F_DUPFD_CLOEXEC, kPeerListenFd + 1));
    inherit_fd = moved.get();
  }
  if (inherit_fd >= 0) posix_spawn_file_actions_adddup2(&actions, inherit_fd, kPeerListenFd);
  int pipe_fds[2] = {-1, -1};
  if (capture_stdout) {
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return IoErrorFromErrno("pipe", what, errno);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (capture_stdout) ::close(pipe_fds[1]);
  if (rc != 0) {
    if (capture_stdout) ::close(pipe_fds[0]);
    return IoErrorFromErrno("cannot start " + argv[0], what, rc);
  }
  Child c;
  c.pid = pid;
  c.what = what;
  c.out_fd = capture_stdout ? pipe_fds[0] : -1;
  c.log = log_path;
  return c;
}

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

std::pair<uint64_t, uint64_t> ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t own = 0, file = 0;
  for (std::string l; std::getline(in, l);) {
    const size_t colon = l.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = l.substr(0, colon);
    if (key == "RssAnon" || key == "RssShmem") own += std::stoull(l.substr(colon + 1)) * 1024;
    if (key == "RssFile") file = std::stoull(l.substr(colon + 1)) * 1024;
  }
  return {own, file};
}

}  // namespace meshload::tools
