// meshload-sidecar: stages the batches of one trainer process and hands them
// over a Unix socket. See sidecar/sidecar.h and docs/operations.md.

#include <signal.h>

#include <atomic>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <cctype>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "common/allocator.h"
#include <nlohmann/json.hpp>

#include "common/build_info.h"
#include "common/flags.h"
#include "common/logging.h"
#include "planner/job_files.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/sidecar.h"

namespace {

constexpr const char* kUsage = R"(usage: meshload-sidecar --job JOB.yaml --process P --socket PATH [options]

Stages the batches of trainer process P of a DataLoadJob and hands them to the
trainer over a Unix socket (protocol: docs/protocol.md). Each option may come
from the environment variable in brackets instead; the command line wins.
)";

// Read by the signal handler: atomic (and lock-free, so async-signal-safe).
std::atomic<meshload::sidecar::Sidecar*> g_sidecar{nullptr};
static_assert(std::atomic<meshload::sidecar::Sidecar*>::is_always_lock_free);

std::atomic<bool> g_stop_waiting{false};

void OnSignal(int) {
  g_stop_waiting.store(true);
  if (auto* s = g_sidecar.load()) s->RequestStop();
}

// The process index from a file the controller writes (a ConfigMap key,
// which appears in the mounted volume some seconds after the pod starts):
// waits for it, saying so every 10 s, until it exists or a signal arrives.
// The content is a decimal index, optionally followed by a newline.
meshload::Result<int64_t> WaitForProcessFile(const std::string& path) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto next_log = start;
  while (!g_stop_waiting.load()) {
    std::ifstream in(path);
    if (in) {
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
      int64_t v = 0;
      if (!meshload::ParseInt64(text, &v) || v < 0 || v > (1 << 22)) {
        return meshload::InvalidArgument(
            "expected a process index (a decimal integer), got '" + text.substr(0, 40) + "'", path);
      }
      return v;
    }
    if (steady_clock::now() >= next_log) {
      meshload::LogInfo(
          "waiting for the controller to assign this pod a process index",
          {{"file", path}, {"waited_seconds", duration_cast<seconds>(steady_clock::now() - start).count()}});
      next_log += seconds(10);
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
  return meshload::Status(meshload::StatusCode::kCancelled, "stopped while waiting for the process index", path);
}

// The peers in the controller's assignments.json (planner::Assignments),
// by process index; a process without a pod or an IP yet has an empty host.
// kNotFound: no file (yet).
meshload::Result<std::vector<meshload::sidecar::exchange::PeerAddress>> ReadAssignments(const std::string& path,
                                                                                        uint16_t port) {
  std::ifstream in(path);
  if (!in) return meshload::Status(meshload::StatusCode::kNotFound, "not there (yet)", path);
  std::stringstream text;
  text << in.rdbuf();
  MESHLOAD_ASSIGN_OR_RETURN(const auto assignments, meshload::planner::Assignments::Parse(text.str(), path));
  std::vector<meshload::sidecar::exchange::PeerAddress> peers(static_cast<size_t>(assignments.processes));
  for (const auto& [name, pod] : assignments.pods) peers[static_cast<size_t>(pod.index)].host = pod.ip;
  for (auto& p : peers) p.port = port;
  return peers;
}

// The peers from the controller's assignments: waits, saying so every 10 s,
// until every process has a pod with an IP (pods get theirs when they
// start), or a signal arrives.
meshload::Result<std::vector<meshload::sidecar::exchange::PeerAddress>> WaitForAssignments(const std::string& path,
                                                                                           uint16_t port) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto next_log = start;
  while (!g_stop_waiting.load()) {
    auto peers = ReadAssignments(path, port);
    std::string missing = "the file";
    if (!peers.ok() && peers.status().code() != meshload::StatusCode::kNotFound) return peers.status();
    if (peers.ok()) {
      missing.clear();
      for (size_t i = 0; i < peers->size(); ++i) {
        if ((*peers)[i].host.empty()) missing += (missing.empty() ? "" : ",") + std::to_string(i);
      }
      if (missing.empty()) return peers;
      missing = "the IPs of processes " + missing;
    }
    if (steady_clock::now() >= next_log) {
      meshload::LogInfo("waiting for the controller to publish every process's address",
                        {{"file", path},
                         {"missing", missing},
                         {"waited_seconds", duration_cast<seconds>(steady_clock::now() - start).count()}});
      next_log += seconds(10);
    }
    std::this_thread::sleep_for(milliseconds(500));
  }
  return meshload::Status(meshload::StatusCode::kCancelled, "stopped while waiting for the assignments", path);
}

// Every flag of the binary: what goes into the sidecar's options as it is,
// and what CheckFlags turns into them.
struct Flags {
  meshload::sidecar::SidecarOptions opt;
  meshload::sidecar::exchange::ExchangeOptions exchange;
  int64_t process = -1, peer_port = 7441;
  std::string process_file, peers, assignments, peer_secret_file, log_level, log_format;
};

// A comma-separated list of integers from `min` to `max`.
bool ParseIntList(const std::string& text, int64_t min, int64_t max, std::vector<int64_t>& out, std::string& err) {
  out.clear();
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    int64_t v = 0;
    if (!meshload::FlagParser::ParseIntIn(text.substr(at, comma - at), min, max, &v, err)) return false;
    out.push_back(v);
    at = comma + 1;
  }
  return true;
}

// A number of seconds from `min` to `max`, into a duration.
template <typename Duration>
std::function<bool(const std::string&, std::string&)> Seconds(Duration* out, int64_t min, int64_t max) {
  return [out, min, max](const std::string& v, std::string& err) {
    int64_t x = 0;
    if (!meshload::FlagParser::ParseIntIn(v, min, max, &x, err)) return false;
    *out = std::chrono::seconds(x);
    return true;
  };
}

void BindFlags(meshload::FlagParser& p, Flags& f) {
  using meshload::FlagParser;
  meshload::sidecar::SidecarOptions& o = f.opt;
  p.Section("options:");
  p.Text({{"--job"}, "PATH", "the DataLoadJob (in a pod: the mounted ConfigMap)", "MESHLOAD_JOB"}, &o.job_path);
  p.Integer({{"--process"}, "P", "this pod's process index", "MESHLOAD_PROCESS"}, &f.process, 0, 1 << 22);
  p.Text({{"--process-file"},
          "PATH",
          "read the index from PATH instead, waiting until it exists: the\n"
          "controller's ConfigMap key process.<pod name>, mounted\n"
          "(e.g. /etc/meshload/job/process.$(POD_NAME))",
          "MESHLOAD_PROCESS_FILE"},
         &f.process_file);
  p.Text({{"--socket"}, "PATH", "the socket the trainer connects to", "MESHLOAD_SOCKET"}, &o.socket_path);
  p.Add({{"--socket-mode"}, "MODE", "octal permissions of the socket (default 0660)", "MESHLOAD_SOCKET_MODE"},
        [&o](const std::string& v, std::string& err) {
          char* end = nullptr;
          const long m = std::strtol(v.c_str(), &end, 8);
          if (v.empty() || *end != '\0' || m < 0 || m > 0777) {
            err = "expected octal like 0660, got '" + v + "'";
            return false;
          }
          o.socket_mode = static_cast<mode_t>(m);
          return true;
        });
  p.Add({{"--allow-uids"},
         "LIST",
         "comma-separated uids allowed to connect (default: the\nsidecar's own uid)",
         "MESHLOAD_ALLOW_UIDS"},
        [&o](const std::string& v, std::string& err) {
          std::vector<int64_t> uids;
          if (!ParseIntList(v, 0, UINT32_MAX - 1, uids, err)) return false;
          o.allowed_uids.assign(uids.begin(), uids.end());
          return true;
        });
  p.Integer({{"--metrics-port"},
             "N",
             "serve /metrics, /healthz, /readyz, /progress (0: any free\nport; default: off)",
             "MESHLOAD_METRICS_PORT"},
            &o.metrics_port, 0, 65535);
  p.Text({{"--metrics-address"}, "A", "address to serve them on (default 0.0.0.0)", "MESHLOAD_METRICS_ADDRESS"},
         &o.metrics_address);
  p.Add({{"--progress-window"}, "S", "seconds /progress reports rates over (default 15)", "MESHLOAD_PROGRESS_WINDOW"},
        Seconds(&o.progress_window, 1, 3600));
  p.Add({{"--start-step"},
         "T",
         "first step to stage before the trainer connects (default: the\nresume file's step, else spec.resume.step)",
         "MESHLOAD_START_STEP"},
        [&o](const std::string& v, std::string& err) {
          int64_t x = 0;
          if (!FlagParser::ParseIntIn(v, 0, INT64_MAX, &x, err)) return false;
          o.start_step = x;
          return true;
        });
  p.Text({{"--resume-file"},
          "PATH",
          "the controller's resume.json: start at its step while\n"
          "spec.resume.step is the one it was recorded for (default:\n"
          "resume.json beside --job when --job is a ConfigMap's job.json)",
          "MESHLOAD_RESUME_FILE"},
         &o.resume_file);
  p.Text({{"--cache-dir"},
          "DIR",
          "the node-local block cache of a remote dataset\n"
          "(spec.dataset.cache; in a pod: the injected cache volume);\n"
          "default: none, reads go to the source",
          "MESHLOAD_CACHE_DIR"},
         &o.cache_dir);
  p.Integer({{"--reader-threads"},
             "N",
             "storage reader threads (default 4 for local files, 16 for\nhttp(s):// and s3:// datasets)",
             "MESHLOAD_READER_THREADS"},
            &o.reader_threads, 1, 256);
  p.Add({{"--mmap-resident-limit-mib"},
         "N",
         "page-cache pages of local files mapped into the sidecar stay\n"
         "within N MiB (default 4096, 16 to 1048576); dropped and\n"
         "refaulted beyond it",
         "MESHLOAD_MMAP_RESIDENT_LIMIT_MIB"},
        [&o](const std::string& v, std::string& err) {
          int64_t x = 0;
          if (!FlagParser::ParseIntIn(v, 16, 1 << 20, &x, err)) return false;
          o.source_options.mmap_resident_limit = static_cast<uint64_t>(x) << 20;
          return true;
        });
  p.Integer({{"--staging-threads"},
             "N",
             "steps staged in parallel (default 2, at most the job's prefetch)",
             "MESHLOAD_STAGING_THREADS"},
            &o.staging_threads, 1, 64);
  p.Add({{"--staging-sched"},
         "S",
         "scheduling class of the staging, reader and server threads:\n"
         "batch (default: their wake-ups do not preempt the trainer)\n"
         "or normal",
         "MESHLOAD_STAGING_SCHED"},
        [&o](const std::string& v, std::string& err) {
          auto sched = meshload::ParseThreadSched(v);
          if (!sched.ok()) {
            err = sched.status().message();
            return false;
          }
          o.thread_sched = *sched;
          return true;
        });
  p.Text({{"--staging"},
          "MODE",
          "auto (GPU when CUDA and the devices are there, host otherwise,\n"
          "logged), host, cuda (VMM, fds over SCM_RIGHTS; an error without\n"
          "CUDA) or cuda-ipc (legacy IPC handles; needs\n"
          "shareProcessNamespace)",
          "MESHLOAD_STAGING"},
         &o.staging);
  p.Add({{"--cuda-devices"},
         "LIST",
         "CUDA ordinal of each local device, in the job's local device\norder (default 0,1,...)",
         "MESHLOAD_CUDA_DEVICES"},
        [&o](const std::string& v, std::string& err) {
          std::vector<int64_t> list;
          if (!ParseIntList(v, 0, 1023, list, err)) return false;
          o.cuda_devices.assign(list.begin(), list.end());
          return true;
        });
  p.Section("samples between processes (Broadcast, LoadAndReshard):");
  p.Text({{"--peers"}, "LIST", "HOST:PORT of every process's sidecar, in process order", "MESHLOAD_PEERS"}, &f.peers);
  p.Text({{"--assignments"},
          "PATH",
          "read the peers from the controller's assignments.json instead\n"
          "(pod IPs; waits until every process has one), with --peer-port",
          "MESHLOAD_ASSIGNMENTS"},
         &f.assignments);
  p.Integer({{"--peer-port"},
             "N",
             "the port every sidecar listens on for its peers (default 7441;\nwith --assignments)",
             "MESHLOAD_PEER_PORT"},
            &f.peer_port, 1, 65535);
  p.Text({{"--peer-listen-address"},
          "ADDR",
          "the local address to listen for peers on (default 0.0.0.0:\nevery interface)",
          "MESHLOAD_PEER_LISTEN_ADDRESS"},
         &f.exchange.listen_address);
  p.Add({{"--peer-timeout"}, "S", "a peer silent this long is lost (default 30)", "MESHLOAD_PEER_TIMEOUT"},
        Seconds(&f.exchange.peer_timeout, 1, 3600));
  p.Add({{"--peer-reconnect-timeout"},
         "S",
         "how long a lost peer (a restarted sidecar) has to come back\n"
         "before the steps that need it fail (default 120; 0: fail at once)",
         "MESHLOAD_PEER_RECONNECT_TIMEOUT"},
        Seconds(&f.exchange.reconnect_timeout, 0, 86400));
  p.Text({{"--peer-secret-file"},
          "PATH",
          "the job's peer secret (at least 16 bytes): peers prove they\n"
          "hold it before samples move; every sidecar of the job needs\n"
          "the same one",
          "MESHLOAD_PEER_SECRET_FILE"},
         &f.peer_secret_file);
  p.Integer({{"--peer-listen-fd"}, "N", "listen for peers on this inherited socket (meshload run --local)"},
            &f.exchange.listen_fd, 3, 65535);
  p.Section("logging:");
  p.Text({{"--log-level"}, "LEVEL", "debug, info, warn, error (default info)", "MESHLOAD_LOG_LEVEL"}, &f.log_level);
  p.Text({{"--log-format"}, "FORMAT", "json or kv (default json)", "MESHLOAD_LOG_FORMAT"}, &f.log_format);
  p.Version(meshload::VersionText("meshload-sidecar", /*with_gpu_staging=*/true));
}

// What no flag alone can check, and the options that follow; the message
// names the flag (the secret itself never reaches it).
std::string CheckFlags(Flags& f) {
  meshload::sidecar::SidecarOptions& o = f.opt;
  if (o.job_path.empty()) return "--job (or MESHLOAD_JOB) is required";
  if (o.socket_path.empty()) return "--socket (or MESHLOAD_SOCKET) is required";
  if (f.process < 0 && f.process_file.empty()) {
    return "--process or --process-file (or MESHLOAD_PROCESS / MESHLOAD_PROCESS_FILE) is required";
  }
  if (f.process >= 0 && !f.process_file.empty()) return "give --process or --process-file, not both";
  o.process = f.process;
  if (o.resume_file.empty()) {
    // The ConfigMap's keys are files side by side: job.json, resume.json.
    const auto slash = o.job_path.rfind('/');
    const std::string base = slash == std::string::npos ? o.job_path : o.job_path.substr(slash + 1);
    if (base == "job.json") o.resume_file = o.job_path.substr(0, o.job_path.size() - base.size()) + "resume.json";
  }
  if (!f.peers.empty() && !f.assignments.empty()) return "give --peers or --assignments, not both";
  if (!f.peers.empty()) {
    auto list = meshload::sidecar::exchange::ParsePeerList(f.peers);
    if (!list.ok()) return "--peers: " + list.status().message();
    f.exchange.peers = *list;
  }
  if (!f.peer_secret_file.empty()) {
    std::ifstream in(f.peer_secret_file, std::ios::binary);
    if (!in) return "--peer-secret-file " + f.peer_secret_file + ": cannot read it (" + std::strerror(errno) + ")";
    std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
    if (secret.size() < 16) {
      return "--peer-secret-file " + f.peer_secret_file + ": the secret must be at least 16 bytes, this one has " +
             std::to_string(secret.size());
    }
    f.exchange.secret = std::move(secret);
  }
  if (!f.peers.empty() || !f.assignments.empty()) o.peers = f.exchange;
  return "";
}

// Prints why the sidecar cannot start (log and stderr); returns `code`.
int CannotStart(const std::string& why, int code) {
  meshload::LogError("sidecar cannot start", {{"error", why}});
  std::cerr << "meshload-sidecar: " << why << (why.empty() || why.back() != '\n' ? "\n" : "");
  return code;
}

// Before the sidecar exists: the process index from the controller's file,
// and the peers from its assignments (only when the job moves samples
// between processes). Returns -1 to go on, else the exit code (0 when a
// signal stopped the wait).
int WaitForPlace(Flags& f, const meshload::planner::ValidJob& job) {
  using namespace meshload;
  sidecar::SidecarOptions& opt = f.opt;
  if (!f.process_file.empty() || !f.assignments.empty()) {
    // A signal while waiting stops the wait (the sidecar does not exist yet).
    struct sigaction wait_sa {};
    wait_sa.sa_handler = OnSignal;
    sigemptyset(&wait_sa.sa_mask);
    ::sigaction(SIGTERM, &wait_sa, nullptr);
    ::sigaction(SIGINT, &wait_sa, nullptr);
  }
  if (!f.process_file.empty()) {
    auto index = WaitForProcessFile(f.process_file);
    if (!index.ok()) {
      return index.status().code() == StatusCode::kCancelled ? 0 : CannotStart(index.status().ToString(), 2);
    }
    opt.process = *index;
    LogInfo("process index assigned", {{"process", opt.process}, {"file", f.process_file}});
  }
  if (!f.assignments.empty() && !planner::MovesSamplesBetweenProcesses(job.spec())) {
    // Only a Broadcast fan-out or LoadAndReshard moves samples between
    // processes; other jobs need no peers and do not wait for their IPs.
    LogInfo("no samples move between this job's processes: the peer exchange is off",
            {{"strategy", std::string(ToString(job.spec().strategy))}});
    opt.peers.reset();
    f.assignments.clear();
  }
  if (opt.peers && opt.peers->secret.empty()) {
    LogWarn(
        "peer connections are not authenticated: anyone who can reach the peer port can feed this job "
        "samples; give every sidecar of the job the same --peer-secret-file",
        {});
  }
  if (!f.assignments.empty()) {
    const auto port = static_cast<uint16_t>(f.peer_port);
    auto list = WaitForAssignments(f.assignments, port);
    if (!list.ok()) {
      return list.status().code() == StatusCode::kCancelled ? 0 : CannotStart(list.status().ToString(), 2);
    }
    opt.peers->peers = *list;
    // A replaced pod comes back with another IP: a lost peer is looked up
    // again before each dial (the kubelet refreshes the mounted ConfigMap).
    opt.peers->address_of = [path = f.assignments,
                             port](int64_t process) -> std::optional<sidecar::exchange::PeerAddress> {
      auto now = ReadAssignments(path, port);
      if (!now.ok() || process < 0 || static_cast<size_t>(process) >= now->size()) return std::nullopt;
      return (*now)[static_cast<size_t>(process)];
    };
  }
  return -1;
}

// Creates the sidecar and serves until a signal; the exit code.
int Serve(meshload::planner::ValidJob job, const meshload::sidecar::SidecarOptions& opt) {
  using namespace meshload;
  auto sidecar = sidecar::Sidecar::Create(std::move(job), opt);
  if (!sidecar.ok()) {
    return CannotStart(sidecar.status().ToString(), sidecar.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
  }
  g_sidecar = sidecar->get();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  // A signal that came while the sidecar was being created (with the
  // waiting handler installed) found no sidecar to stop: stop it now.
  if (g_stop_waiting.load()) (*sidecar)->RequestStop();
  const int rc = (*sidecar)->Run();
  g_sidecar = nullptr;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace meshload;
  KeepHeapForReuse();
  if (Status st = ConfigureLoggingFromEnv(); !st.ok()) return UsageError(st.ToString(), "meshload-sidecar");
  Flags f;
  FlagParser parser("", kUsage, "meshload-sidecar");
  BindFlags(parser, f);
  if (int rc = parser.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  if (Status st = ConfigureLoggingFromFlags(f.log_level, f.log_format); !st.ok()) {
    return UsageError(st.message(), "meshload-sidecar");
  }
  LogInfo("meshload-sidecar",
          {{"version", std::string(Version())}, {"gpu_staging", GpuStagingBuild()}, {"build", CompilerBuild()}});
  if (std::string why = CheckFlags(f); !why.empty()) return UsageError(why, "meshload-sidecar");
  // The job, loaded and validated once: everything below receives it.
  Diagnostics diags;
  auto job = planner::LoadJobFile(f.opt.job_path, diags);
  if (!job.ok()) {
    return CannotStart(diags.ok() ? job.status().ToString() : diags.Report(f.opt.job_path + ": invalid DataLoadJob"),
                       job.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
  }
  // The sidecar never forks. SIGPIPE is ignored before any thread starts;
  // SIGTERM/SIGINT are handled while it waits and once it exists (before,
  // the default action, exiting, is right).
  ::signal(SIGPIPE, SIG_IGN);
  if (int rc = WaitForPlace(f, *job); rc >= 0) return rc;
  return Serve(std::move(*job), f.opt);
}
