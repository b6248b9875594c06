// `meshload run --local`: the whole data path on one machine. One sidecar
// process per job process and one demo trainer per sidecar, each trainer
// verifying what it receives; a progress line every second and a report.
//
// The orchestrator is single-threaded and starts every child with
// posix_spawn before anything else runs, so nothing forks after threads
// exist (lesson 000 of the seeds).

#include "tools/run_command.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <openssl/rand.h>

#include "common/cuda_driver.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <map>
#include <sstream>

#include "common/flags.h"
#include "common/logging.h"
#include "common/loopback.h"
#include "common/unique_fd.h"
#include "sidecar/source/dataset_facts.h"
#include "planner/shard_planner.h"
#include "tools/latency_histogram.h"
#include "tools/synthetic_dataset.h"

extern char** environ;

namespace meshload::cli {
namespace {

constexpr const char* kRunUsage = R"(usage: meshload run --local -f JOB.yaml [options]

Runs the whole data path on this machine: one meshload-sidecar per job
process and one demo trainer per sidecar. Each trainer checks every batch
against its own plan (sample ids, and every byte of a synthetic dataset).

options:
  -f, --file PATH            the DataLoadJob manifest
  --local                    run on this machine (the only mode of `run`)
  --steps N                  steps per trainer (default: until interrupted)
  --generate-dataset DIR     first write a synthetic dataset of the job's format
                             into DIR (bytes encode each sample's index) and use it
  --samples N                samples to generate (default: spec.dataset.samples,
                             else 64 global batches)
  --files K                  files to split the generated dataset into (default 2)
  --verify MODE              bytes (default), ids or none
  --delay-ms D               each trainer step takes D ms (a slow consumer)
  --reader-threads N         storage reader threads per sidecar (default: the
                             sidecar's, 4 for local files, 16 for remote data)
  --run-dir DIR              where sockets, logs and the job go (default: a new
                             temporary directory, removed afterwards)

exit codes: 0 every batch verified; 1 an error or a mismatch; 2 usage
)";

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

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

struct Child {
  pid_t pid = -1;
  std::string what;
  int out_fd = -1;  // trainers: their stdout (JSON lines)
  std::string buffer;
  bool exited = false;
  int status = 0;
  std::string log;
};

// The inherited peer socket lands on this descriptor in the sidecar.
constexpr int kPeerListenFd = 3;

Result<Child> Spawn(const std::string& what, const std::vector<std::string>& argv, const std::string& log_path,
                    bool capture_stdout, int inherit_fd = -1) {
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

// The sidecar's own resident memory (heap and staging slots: RssAnon +
// RssShmem), and the page-cache pages it has mapped (RssFile: shared with
// the page cache and reclaimable; mapped reads of small samples add them).
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

std::string Human(double v, const char* unit) {
  char b[64];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2f G%s", v / 1e9, unit);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2f M%s", v / 1e6, unit);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.2f k%s", v / 1e3, unit);
  else std::snprintf(b, sizeof b, "%.0f %s", v, unit);
  return b;
}

std::string Duration(double s) {
  char b[64];
  if (s < 1e-3) std::snprintf(b, sizeof b, "%.0f µs", s * 1e6);
  else if (s < 1) std::snprintf(b, sizeof b, "%.1f ms", s * 1e3);
  else std::snprintf(b, sizeof b, "%.2f s", s);
  return b;
}

// Rewrites the job's dataset to the generated one.
Result<std::string> RewriteJob(const std::string& job_path, const std::string& uri, const std::string& out_path) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAllFromFile(job_path);
    for (auto& d : docs) {
      if (d.IsMap() && d["kind"] && d["kind"].as<std::string>() == "DataLoadJob") {
        d["spec"]["dataset"]["uri"] = uri;
        d["spec"]["dataset"].remove("samples");
        YAML::Emitter e;
        e << d;
        std::ofstream out(out_path);
        out << e.c_str() << "\n";
        if (!out) return IoErrorFromErrno("write", out_path, errno);
        return out_path;
      }
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(e.what(), job_path);
  }
  return InvalidArgument("no DataLoadJob document", job_path);
}

}  // namespace

int RunRun(const std::vector<std::string>& args) {
  std::string file, generate_dir, verify = "bytes", run_dir_flag;
  bool local = false;
  int64_t steps = -1, files = 2, delay_ms = 0, reader_threads = 0;
  std::optional<int64_t> samples;
  FlagParser flags("run", kRunUsage);
  flags.String({"-f", "--file"}, &file);
  flags.Bool({"--local"}, &local);
  flags.Int({"--steps"}, &steps);
  flags.String({"--generate-dataset"}, &generate_dir);
  flags.OptionalInt({"--samples"}, &samples);
  flags.Int({"--files"}, &files);
  flags.String({"--verify"}, &verify);
  flags.Int({"--delay-ms"}, &delay_ms);
  flags.Int({"--reader-threads"}, &reader_threads);
  flags.String({"--run-dir"}, &run_dir_flag);
  if (int rc = flags.Parse(args); rc >= 0) return rc;
  if (!local) return UsageError("run: only --local is available here; in a cluster the controller starts the sidecars");
  if (file.empty()) return UsageError("run: -f JOB.yaml is required");
  if (verify != "bytes" && verify != "ids" && verify != "none") return UsageError("--verify: expected bytes, ids or none");
  if (steps == 0 || steps < -1) return UsageError("--steps: expected a positive number of steps");
  if (reader_threads < 0 || reader_threads > 256) {
    return UsageError("--reader-threads: expected 1 to 256 (or 0: the sidecar's default), got " +
                      std::to_string(reader_threads));
  }

  // The run directory: sockets (0700: only this user reaches them), logs, job.
  std::string run_dir = run_dir_flag;
  const bool temp_dir = run_dir.empty();
  if (temp_dir) {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/meshload-run-XXXXXX";
    if (!::mkdtemp(tmpl.data())) return UsageError("cannot create a run directory: " + std::string(std::strerror(errno)));
    run_dir = tmpl;
  } else {
    std::filesystem::create_directories(run_dir);
  }
  ::chmod(run_dir.c_str(), 0700);
  struct Cleanup {
    std::string dir;
    bool remove;
    ~Cleanup() {
      std::error_code ec;
      if (remove) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{run_dir, temp_dir};

  Diagnostics diags;
  auto job = LoadDataLoadJobFile(file, diags);
  if (!job.ok()) {
    std::cerr << "meshload run: " << job.status().ToString() << "\n";
    return 1;
  }
  std::string job_path = file;
  if (!generate_dir.empty()) {
    ValidateJobSpec(job->spec, diags);
    if (!diags.ok()) {
      std::cerr << file << ": invalid DataLoadJob:\n" << diags.ToString();
      return 2;
    }
    const uint64_t n = samples ? static_cast<uint64_t>(*samples)
                               : job->spec.dataset.samples ? static_cast<uint64_t>(*job->spec.dataset.samples)
                                                           : static_cast<uint64_t>(job->spec.batch.global_batch_size) * 64;
    const auto t0 = Clock::now();
    auto uri = synthetic::Generate(job->spec.dataset, generate_dir, n, static_cast<int>(files));
    if (!uri.ok()) {
      std::cerr << "meshload run: cannot generate the dataset: " << uri.status().ToString() << "\n";
      return 1;
    }
    std::printf("generated %" PRIu64 " %s samples in %s (%.1f s)\n", n,
                std::string(ToString(job->spec.dataset.format)).c_str(), generate_dir.c_str(),
                std::chrono::duration<double>(Clock::now() - t0).count());
    auto rewritten = RewriteJob(file, std::filesystem::absolute(*uri).string(), run_dir + "/job.yaml");
    if (!rewritten.ok()) {
      std::cerr << "meshload run: " << rewritten.status().ToString() << "\n";
      return 1;
    }
    job_path = *rewritten;
    Diagnostics d2;
    job = LoadDataLoadJobFile(job_path, d2);
    if (!job.ok()) {
      std::cerr << "meshload run: " << job.status().ToString() << "\n";
      return 1;
    }
  }
  diags = Diagnostics();
  auto resolved = source::ResolveReadingDataset(job->spec, {}, source::Unreachable::kFail, diags);
  if (!resolved.ok()) {
    std::cerr << job_path << ": invalid DataLoadJob (" << diags.problems().size() << " problems):\n";
    for (const auto& p : diags.problems()) std::cerr << "  " << p.ToString() << "\n";
    if (diags.ok()) std::cerr << "  " << resolved.status().ToString() << "\n";
    return 2;
  }
  const ResolvedJob& rj = *resolved;
  const int64_t P = rj.mesh.processes();
  const uint64_t batch_bytes_per_process =
      rj.global_batch / static_cast<uint64_t>(rj.mesh.shards()) * rj.dataset.sample_bytes() *
      static_cast<uint64_t>(rj.mesh.devices_per_process());
  std::printf("job %s: %" PRId64 " processes x %" PRId64 " devices, %s/%s, global batch %" PRIu64
              ", %" PRIu64 " samples x %" PRIu64 " B, %s per process per step\n",
              job->name.c_str(), P, rj.mesh.devices_per_process(), std::string(ToString(rj.spec.strategy)).c_str(),
              std::string(ToString(rj.spec.replication.fanout)).c_str(), rj.global_batch, rj.samples,
              rj.dataset.sample_bytes(), Human(static_cast<double>(batch_bytes_per_process), "B").c_str());

  const std::string self = SelfDir() + "/meshload";
  const std::string meshload_bin = ::access(self.c_str(), X_OK) == 0 ? self : "meshload";
  const std::string sidecar_bin = FindBinary("meshload-sidecar", "MESHLOAD_SIDECAR_BIN");

  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const auto start = Clock::now();
  const double start_mono = std::chrono::duration<double>(start.time_since_epoch()).count();
  std::vector<Child> sidecars, trainers;
  auto stop_all = [&](int sig) {
    for (auto* group : {&trainers, &sidecars}) {
      for (auto& c : *group) {
        if (!c.exited && c.pid > 0) ::kill(c.pid, sig);
      }
    }
  };
  auto fail = [&](const std::string& msg) {
    stop_all(SIGKILL);
    for (auto* group : {&trainers, &sidecars}) {
      for (auto& c : *group) {
        if (!c.exited && c.pid > 0) ::waitpid(c.pid, nullptr, 0);
      }
    }
    std::cerr << "meshload run: " << msg << "\n";
    return 1;
  };
  // Plans that move samples between processes get their sidecars
  // connected over loopback TCP.
  ShardPlanner planner(rj);
  bool moves = false;
  for (int64_t p = 0; p < P && !moves; ++p) moves = !planner.TransfersFrom(p, planner.DefaultLoading()).empty();
  std::vector<UniqueFd> peer_fds;
  std::string peer_list;
  for (int64_t p = 0; moves && p < P; ++p) {
    auto l = ListenLoopback();
    if (!l.ok()) return fail(l.status().ToString());
    peer_list += (p ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(l->second);
    peer_fds.push_back(std::move(l->first));
  }
  // The sidecars authenticate each other with a secret of this run's.
  const std::string secret_path = run_dir + "/peer-secret";
  if (moves) {
    std::printf("samples move between processes: sidecars exchange them over TCP (%s), authenticated\n",
                peer_list.c_str());
    uint8_t raw[32];
    if (RAND_bytes(raw, sizeof raw) != 1) return fail("cannot make a peer secret: no randomness");
    std::string hex;
    for (uint8_t b : raw) {
      static const char* digits = "0123456789abcdef";
      hex += digits[b >> 4];
      hex += digits[b & 15];
    }
    const int sfd = ::open(secret_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (sfd < 0 || ::write(sfd, hex.data(), hex.size()) != static_cast<ssize_t>(hex.size())) {
      if (sfd >= 0) ::close(sfd);
      return fail("cannot write " + secret_path + ": " + std::strerror(errno));
    }
    ::close(sfd);
  }
  // GPUs: with one for every device of the mesh, process p stages on its
  // own (p × devicesPerProcess + i); otherwise each sidecar takes the
  // first devicesPerProcess it sees (sharing them), or stages on the host
  // when there are fewer (the sidecar logs why).
  const int64_t dpp = rj.mesh.devices_per_process();
  int64_t gpus = 0;
  if (auto driver = cuda::Driver::Open(); driver.ok()) gpus = static_cast<int64_t>((*driver)->devices().size());
  const bool gpu_per_device = gpus >= P * dpp;
  if (gpus > 0) {
    std::printf("CUDA sees %" PRId64 " GPU(s): %s\n", gpus,
                gpu_per_device ? "each process stages on its own"
                : gpus >= dpp  ? "the processes share them"
                               : "fewer than the devices of one process, so the sidecars stage on the host");
  }
  for (int64_t p = 0; p < P; ++p) {
    const std::string sock = run_dir + "/sidecar-" + std::to_string(p) + ".sock";
    std::vector<std::string> argv = {sidecar_bin, "--job", job_path, "--process", std::to_string(p), "--socket", sock,
                                     "--metrics-port", "0", "--metrics-address", "127.0.0.1"};
    if (reader_threads > 0) argv.insert(argv.end(), {"--reader-threads", std::to_string(reader_threads)});
    if (moves) {
      argv.insert(argv.end(), {"--peers", peer_list, "--peer-listen-fd", std::to_string(kPeerListenFd),
                               "--peer-secret-file", secret_path});
    }
    if (gpu_per_device) {
      std::string list;
      for (int64_t i = 0; i < dpp; ++i) list += (i ? "," : "") + std::to_string(p * dpp + i);
      argv.insert(argv.end(), {"--cuda-devices", list});
    }
    auto c = Spawn("sidecar " + std::to_string(p), argv, run_dir + "/sidecar-" + std::to_string(p) + ".log", false,
                   moves ? peer_fds[static_cast<size_t>(p)].get() : -1);
    if (!c.ok()) return fail(c.status().ToString());
    sidecars.push_back(std::move(*c));
  }
  peer_fds.clear();  // the sidecars hold them now
  for (int64_t p = 0; p < P; ++p) {
    const std::string sock = run_dir + "/sidecar-" + std::to_string(p) + ".sock";
    std::vector<std::string> argv = {meshload_bin, "demo-trainer", "--job", job_path, "--process", std::to_string(p),
                                     "--socket", sock, "--verify", verify, "--delay-ms", std::to_string(delay_ms)};
    if (steps > 0) {
      argv.push_back("--steps");
      argv.push_back(std::to_string(steps));
    }
    auto c = Spawn("trainer " + std::to_string(p), argv, run_dir + "/trainer-" + std::to_string(p) + ".log", true);
    if (!c.ok()) return fail(c.status().ToString());
    trainers.push_back(std::move(*c));
  }

  // Poll the trainers' JSON lines; print progress about once a second.
  std::vector<nlohmann::json> last(static_cast<size_t>(P)), finals(static_cast<size_t>(P));
  auto last_print = Clock::now();
  uint64_t last_samples = 0, last_bytes = 0;
  bool interrupted_sent = false;
  std::vector<uint64_t> sidecar_peak(static_cast<size_t>(P), 0), sidecar_file(static_cast<size_t>(P), 0);
  auto sample_memory = [&] {
    for (size_t p = 0; p < sidecars.size(); ++p) {
      if (sidecars[p].exited) continue;
      const auto [own, file] = ResidentBytes(sidecars[p].pid);
      sidecar_peak[p] = std::max(sidecar_peak[p], own);
      sidecar_file[p] = std::max(sidecar_file[p], file);
    }
  };
  int64_t running = P;
  while (running > 0) {
    if (g_interrupted && !interrupted_sent) {
      std::printf("\ninterrupted: stopping the trainers\n");
      for (auto& t : trainers) {
        if (!t.exited) ::kill(t.pid, SIGTERM);
      }
      interrupted_sent = true;
    }
    std::vector<pollfd> fds;
    for (auto& t : trainers) fds.push_back({t.out_fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < trainers.size(); ++i) {
      Child& t = trainers[i];
      if (t.out_fd < 0) continue;
      if (fds[i].revents & (POLLIN | POLLHUP)) {
        char buf[65536];
        const ssize_t n = ::read(t.out_fd, buf, sizeof buf);
        if (n > 0) {
          t.buffer.append(buf, static_cast<size_t>(n));
          size_t nl;
          while ((nl = t.buffer.find('\n')) != std::string::npos) {
            auto j = nlohmann::json::parse(t.buffer.substr(0, nl), nullptr, false);
            t.buffer.erase(0, nl + 1);
            if (j.is_discarded() || !j.contains("type")) continue;
            (j["type"] == "final" ? finals[i] : last[i]) = j;
            if (j["type"] == "final") last[i] = j;
          }
        } else if (n == 0) {
          ::close(t.out_fd);
          t.out_fd = -1;
        }
      }
    }
    // Reap exited children.
    for (auto* group : {&trainers, &sidecars}) {
      for (auto& c : *group) {
        if (c.exited) continue;
        int status = 0;
        if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.exited = true;
          c.status = status;
          if (group == &trainers) {
            --running;
          } else if (!g_interrupted) {
            return fail(c.what + " exited unexpectedly (" +
                        (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                           : "signal " + std::to_string(WTERMSIG(status))) +
                        "); its log:\n" + Tail(c.log, 15));
          }
        }
      }
    }
    for (auto& t : trainers) {
      if (t.exited && WIFEXITED(t.status) && WEXITSTATUS(t.status) != 0 && WEXITSTATUS(t.status) != 3 && !g_interrupted) {
        return fail(t.what + " failed; its log:\n" + Tail(t.log, 15));
      }
    }
    sample_memory();
    const auto now = Clock::now();
    if (now - last_print >= std::chrono::seconds(1)) {
      uint64_t total_samples = 0, total_bytes = 0;
      int64_t min_steps = -1;
      double wait99 = 0;
      for (const auto& j : last) {
        if (j.is_null()) continue;
        total_samples += j.value("samples", uint64_t{0});
        total_bytes += j.value("bytes", uint64_t{0});
        const int64_t s = j.value("steps", int64_t{0});
        min_steps = min_steps < 0 ? s : std::min(min_steps, s);
        wait99 = std::max(wait99, j.value("wait_p99", 0.0));
      }
      const double dt = std::chrono::duration<double>(now - last_print).count();
      std::printf("step %6" PRId64 "  %12s samples/s  %10s/s  trainer wait p99 %s\n", std::max<int64_t>(min_steps, 0),
                  Human(static_cast<double>(total_samples - last_samples) / dt, "").c_str(),
                  Human(static_cast<double>(total_bytes - last_bytes) / dt, "B").c_str(), Duration(wait99).c_str());
      std::fflush(stdout);
      last_samples = total_samples;
      last_bytes = total_bytes;
      last_print = now;
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  sample_memory();
  for (auto& s : sidecars) {
    if (!s.exited) ::kill(s.pid, SIGTERM);
  }
  for (auto& s : sidecars) {
    if (!s.exited) ::waitpid(s.pid, &s.status, 0);
    s.exited = true;
  }
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;

  // The report.
  LatencyHistogram waits;
  uint64_t total_steps = 0, total_samples = 0, total_bytes = 0, mismatches = 0, reconnects = 0;
  double first_batch = 0, finish = 0;
  std::string errors;
  std::set<std::string> staging_modes;
  uint64_t gpu_checked = 0;
  for (size_t p = 0; p < finals.size(); ++p) {
    const auto& j = finals[p];
    if (j.is_null()) {
      errors += "  trainer " + std::to_string(p) + " sent no report; its log:\n" + Tail(trainers[p].log, 10);
      continue;
    }
    if (!j.value("error", std::string()).empty()) errors += "  trainer " + std::to_string(p) + ": " + j["error"].get<std::string>() + "\n";
    total_steps = p == 0 ? j.value("steps", uint64_t{0}) : std::min(total_steps, j.value("steps", uint64_t{0}));
    total_samples += j.value("samples", uint64_t{0});
    total_bytes += j.value("bytes", uint64_t{0});
    mismatches += j.value("mismatches", uint64_t{0});
    reconnects += j.value("reconnects", uint64_t{0});
    staging_modes.insert(j.value("staging", std::string("host")));
    gpu_checked += j.value("gpu_tensors_checked", uint64_t{0});
    first_batch = std::max(first_batch, j.value("first_batch_at", 0.0) - start_mono);
    finish = std::max(finish, j.value("finished_at", 0.0) - start_mono);
    if (j.contains("wait_hist")) waits.Merge(j["wait_hist"].get<std::vector<uint64_t>>());
  }
  const double stream = std::max(1e-9, finish - first_batch);
  uint64_t peak = 0, mapped = 0;
  for (uint64_t v : sidecar_peak) peak = std::max(peak, v);
  for (uint64_t v : sidecar_file) mapped = std::max(mapped, v);
  const uint64_t bound = static_cast<uint64_t>(rj.spec.batch.prefetch) * batch_bytes_per_process + (64ull << 20);
  std::printf("\n== meshload run --local report\n");
  std::printf("  steps                %" PRIu64 " per process (%" PRId64 " processes)\n", total_steps, P);
  std::printf("  samples/s            %s  (%" PRIu64 " samples in %.2f s after the first batch)\n",
              Human(static_cast<double>(total_samples) / stream, "").c_str(), total_samples, stream);
  std::printf("  throughput           %s/s\n", Human(static_cast<double>(total_bytes) / stream, "B").c_str());
  std::printf("  time to first batch  %s (from launch, sidecar start-up included)\n", Duration(first_batch).c_str());
  std::printf("  trainer wait         p50 %s, p99 %s (%" PRIu64 " batches)\n", Duration(waits.Quantile(0.5)).c_str(),
              Duration(waits.Quantile(0.99)).c_str(), waits.count());
  std::printf("  CPU                  %.2f s per GB delivered (%.2f CPU s in all, %.2f s wall)\n",
              total_bytes ? cpu / (static_cast<double>(total_bytes) / 1e9) : 0.0, cpu, elapsed);
  std::printf("  peak memory          sidecar %s own (heap + slots; bound prefetch x batch + 64 MiB = %s),\n"
              "                       %s of mapped page cache (shared, reclaimable)\n",
              Human(static_cast<double>(peak), "B").c_str(), Human(static_cast<double>(bound), "B").c_str(),
              Human(static_cast<double>(mapped), "B").c_str());
  std::string staging;
  for (const auto& m : staging_modes) staging += (staging.empty() ? "" : ", ") + m;
  std::printf("  staging              %s%s\n", staging.c_str(),
              gpu_checked ? (" (" + std::to_string(gpu_checked) + " GPU tensors copied back and checked)").c_str()
                          : staging == "host" ? " (see the sidecar log's staging_reason)" : "");
  std::printf("  verified             %s, %" PRIu64 " mismatches, %" PRIu64 " reconnects\n", verify.c_str(), mismatches,
              reconnects);
  if (!errors.empty()) std::printf("  errors:\n%s", errors.c_str());
  if (!temp_dir) std::printf("  logs                 %s\n", run_dir.c_str());
  const bool ok = mismatches == 0 && errors.empty() && (g_interrupted || total_steps > 0);
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace meshload::cli
