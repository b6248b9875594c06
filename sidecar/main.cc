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
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/sidecar.h"

namespace {

constexpr const char* kUsage = R"(usage: meshload-sidecar --job JOB.yaml --process P --socket PATH [options]

Stages the batches of trainer process P of a DataLoadJob and hands them to the
trainer over a Unix socket (protocol: docs/protocol.md).

options (each also read from the environment variable named after it):
  --job PATH             the DataLoadJob (in a pod: the mounted ConfigMap)   MESHLOAD_JOB
  --process P            this pod's process index                             MESHLOAD_PROCESS
  --process-file PATH    read the index from PATH instead, waiting until it   MESHLOAD_PROCESS_FILE
                         exists: the controller's ConfigMap key
                         process.<pod name>, mounted (e.g.
                         /etc/meshload/job/process.$(POD_NAME))
  --socket PATH          the socket the trainer connects to                   MESHLOAD_SOCKET
  --socket-mode MODE     octal permissions of the socket (default 0660)       MESHLOAD_SOCKET_MODE
  --allow-uids LIST      comma-separated uids allowed to connect              MESHLOAD_ALLOW_UIDS
                         (default: the sidecar's own uid)
  --metrics-port N       serve /metrics, /healthz, /readyz, /progress (0: any MESHLOAD_METRICS_PORT
                         free port; default: off)
  --metrics-address A    address to serve them on (default 0.0.0.0)           MESHLOAD_METRICS_ADDRESS
  --progress-window S    seconds /progress reports rates over (default 15)    MESHLOAD_PROGRESS_WINDOW
  --start-step T         first step to stage before the trainer connects      MESHLOAD_START_STEP
                         (default: the resume file's step, else
                         spec.resume.step)
  --resume-file PATH     the controller's resume.json: start at its step      MESHLOAD_RESUME_FILE
                         while spec.resume.step is the one it was recorded
                         for (default: resume.json beside --job when --job
                         is a ConfigMap's job.json)
  --reader-threads N     storage reader threads (default 4 for local files,   MESHLOAD_READER_THREADS
                         16 for http(s):// and s3:// datasets)
  --mmap-resident-limit-mib N                                                 MESHLOAD_MMAP_RESIDENT_LIMIT_MIB
                         page-cache pages of local files mapped into the
                         sidecar stay within N MiB (default 4096, 16 to
                         1048576); dropped and refaulted beyond it
  --staging-threads N    steps staged in parallel (default 2, at most the     MESHLOAD_STAGING_THREADS
                         job's prefetch)
  --staging-sched S      scheduling class of the staging, reader and server   MESHLOAD_STAGING_SCHED
                         threads: batch (default: their wake-ups do not
                         preempt the trainer) or normal
  --staging MODE         auto (GPU when CUDA and the devices are there, host  MESHLOAD_STAGING
                         otherwise, logged), host, cuda (VMM, fds over
                         SCM_RIGHTS; an error without CUDA) or cuda-ipc
                         (legacy IPC handles; needs shareProcessNamespace)
  --cuda-devices LIST    CUDA ordinal of each local device, in the job's      MESHLOAD_CUDA_DEVICES
                         local device order (default 0,1,...)
  --peers LIST           HOST:PORT of every process's sidecar, in process     MESHLOAD_PEERS
                         order (for Broadcast and LoadAndReshard, which move
                         samples between processes)
  --assignments PATH     read the peers from the controller's                 MESHLOAD_ASSIGNMENTS
                         assignments.json instead (pod IPs; waits until every
                         process has one), with --peer-port
  --peer-port N          the port every sidecar listens on for its peers      MESHLOAD_PEER_PORT
                         (default 7441; with --assignments)
  --peer-listen-address ADDR                                                  MESHLOAD_PEER_LISTEN_ADDRESS
                         the local address to listen for peers on (default
                         0.0.0.0: every interface)
  --peer-timeout S       a peer silent this long is lost (default 30)         MESHLOAD_PEER_TIMEOUT
  --peer-reconnect-timeout S                                                  MESHLOAD_PEER_RECONNECT_TIMEOUT
                         how long a lost peer (a restarted sidecar) has to
                         come back before the steps that need it fail
                         (default 120; 0: fail at once)
  --peer-secret-file PATH                                                     MESHLOAD_PEER_SECRET_FILE
                         the job's peer secret (at least 16 bytes): peers
                         prove they hold it before samples move; every
                         sidecar of the job needs the same one
  --peer-listen-fd N     listen for peers on this inherited socket (meshload
                         run --local)
  --log-level LEVEL      debug, info, warn, error                             MESHLOAD_LOG_LEVEL
  --log-format FORMAT    json or kv                                           MESHLOAD_LOG_FORMAT
  --version              print the version and whether GPU staging is built in
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

// The peers in the controller's assignments.json ({"processes": P,
// "pods": {name: {"index": i, "ip": "10.1.2.3"}}}), by process index; a
// process without a pod or an IP yet has an empty host. kNotFound: no file
// (yet).
meshload::Result<std::vector<meshload::sidecar::exchange::PeerAddress>> ReadAssignments(const std::string& path,
                                                                                        uint16_t port) {
  std::ifstream in(path);
  if (!in) return meshload::Status(meshload::StatusCode::kNotFound, "not there (yet)", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("processes") || !j["processes"].is_number_integer() ||
      !j.contains("pods") || !j["pods"].is_object()) {
    return meshload::InvalidArgument("expected the controller's assignments (processes, pods)", path);
  }
  const int64_t n = j["processes"].get<int64_t>();
  if (n < 1 || n > (1 << 22)) return meshload::InvalidArgument("processes: out of range", path);
  std::vector<meshload::sidecar::exchange::PeerAddress> peers(static_cast<size_t>(n));
  for (const auto& [name, pod] : j["pods"].items()) {
    if (!pod.is_object() || !pod.contains("index") || !pod["index"].is_number_integer()) {
      return meshload::InvalidArgument("pods." + name + ".index: expected an integer", path);
    }
    const int64_t i = pod["index"].get<int64_t>();
    if (i < 0 || i >= n) return meshload::InvalidArgument("pods." + name + ".index: out of range", path);
    if (pod.contains("ip") && pod["ip"].is_string()) peers[static_cast<size_t>(i)].host = pod["ip"].get<std::string>();
  }
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

}  // namespace

int main(int argc, char** argv) {
  using namespace meshload;
  KeepHeapForReuse();
  if (Status st = ConfigureLoggingFromEnv(); !st.ok()) {
    std::cerr << "meshload-sidecar: " << st.ToString() << "\n";
    return 2;
  }
  sidecar::SidecarOptions opt;
  std::string process = Env("MESHLOAD_PROCESS"), metrics_port = Env("MESHLOAD_METRICS_PORT");
  std::string progress_window = Env("MESHLOAD_PROGRESS_WINDOW");
  std::string resume_file = Env("MESHLOAD_RESUME_FILE");
  std::string start_step = Env("MESHLOAD_START_STEP"), reader_threads = Env("MESHLOAD_READER_THREADS");
  std::string resident_limit = Env("MESHLOAD_MMAP_RESIDENT_LIMIT_MIB");
  std::string staging_threads = Env("MESHLOAD_STAGING_THREADS"), staging_sched = Env("MESHLOAD_STAGING_SCHED");
  std::string staging = Env("MESHLOAD_STAGING"), cuda_devices = Env("MESHLOAD_CUDA_DEVICES");
  std::string process_file = Env("MESHLOAD_PROCESS_FILE");
  std::string allow = Env("MESHLOAD_ALLOW_UIDS"), mode = Env("MESHLOAD_SOCKET_MODE");
  std::string log_level, log_format;
  std::string peers = Env("MESHLOAD_PEERS"), assignments = Env("MESHLOAD_ASSIGNMENTS");
  std::string peer_port = Env("MESHLOAD_PEER_PORT"), peer_timeout = Env("MESHLOAD_PEER_TIMEOUT"), peer_fd;
  std::string peer_reconnect = Env("MESHLOAD_PEER_RECONNECT_TIMEOUT");
  std::string peer_secret_file = Env("MESHLOAD_PEER_SECRET_FILE");
  std::string peer_listen_address = Env("MESHLOAD_PEER_LISTEN_ADDRESS");
  opt.job_path = Env("MESHLOAD_JOB");
  opt.socket_path = Env("MESHLOAD_SOCKET");
  if (!Env("MESHLOAD_METRICS_ADDRESS").empty()) opt.metrics_address = Env("MESHLOAD_METRICS_ADDRESS");

  FlagParser flags("", kUsage, "meshload-sidecar");
  flags.String({"--job"}, &opt.job_path);
  flags.String({"--process"}, &process);
  flags.String({"--process-file"}, &process_file);
  flags.String({"--socket"}, &opt.socket_path);
  flags.String({"--socket-mode"}, &mode);
  flags.String({"--allow-uids"}, &allow);
  flags.String({"--metrics-port"}, &metrics_port);
  flags.String({"--progress-window"}, &progress_window);
  flags.String({"--resume-file"}, &resume_file);
  flags.String({"--metrics-address"}, &opt.metrics_address);
  flags.String({"--start-step"}, &start_step);
  flags.String({"--reader-threads"}, &reader_threads);
  flags.String({"--mmap-resident-limit-mib"}, &resident_limit);
  flags.String({"--staging-threads"}, &staging_threads);
  flags.String({"--staging-sched"}, &staging_sched);
  flags.String({"--staging"}, &staging);
  flags.String({"--cuda-devices"}, &cuda_devices);
  flags.String({"--peers"}, &peers);
  flags.String({"--assignments"}, &assignments);
  flags.String({"--peer-port"}, &peer_port);
  flags.String({"--peer-timeout"}, &peer_timeout);
  flags.String({"--peer-reconnect-timeout"}, &peer_reconnect);
  flags.String({"--peer-secret-file"}, &peer_secret_file);
  flags.String({"--peer-listen-address"}, &peer_listen_address);
  flags.String({"--peer-listen-fd"}, &peer_fd);
  flags.String({"--log-level"}, &log_level);
  flags.String({"--log-format"}, &log_format);
  flags.Version(VersionText("meshload-sidecar", /*with_gpu_staging=*/true));
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;

  auto usage = [](const std::string& msg) { return UsageError(msg, "meshload-sidecar"); };
  // A value from a flag or its environment variable, within [min, max].
  auto int_flag = [&](const std::string& text, const char* name, int64_t min, int64_t max, int64_t* out) {
    if (!meshload::ParseInt64(text, out) || *out < min || *out > max) {
      usage(std::string(name) + ": expected an integer from " + std::to_string(min) + " to " + std::to_string(max) +
            ", got '" + text + "'");
      return false;
    }
    return true;
  };
  if (Status st = ConfigureLoggingFromFlags(log_level, log_format); !st.ok()) return usage(st.message());
  LogInfo("meshload-sidecar",
          {{"version", std::string(Version())}, {"gpu_staging", GpuStagingBuild()}, {"build", CompilerBuild()}});
  if (opt.job_path.empty()) return usage("--job (or MESHLOAD_JOB) is required");
  if (opt.socket_path.empty()) return usage("--socket (or MESHLOAD_SOCKET) is required");
  if (process.empty() && process_file.empty()) {
    return usage("--process or --process-file (or MESHLOAD_PROCESS / MESHLOAD_PROCESS_FILE) is required");
  }
  if (!process.empty() && !process_file.empty()) return usage("give --process or --process-file, not both");
  if (!process.empty() && !int_flag(process, "--process", 0, 1 << 22, &opt.process)) return 2;
  if (resume_file.empty()) {
    // The ConfigMap's keys are files side by side: job.json, resume.json.
    const auto slash = opt.job_path.rfind('/');
    const std::string base = slash == std::string::npos ? opt.job_path : opt.job_path.substr(slash + 1);
    if (base == "job.json") resume_file = opt.job_path.substr(0, opt.job_path.size() - base.size()) + "resume.json";
  }
  opt.resume_file = resume_file;
  int64_t v = 0;
  if (!progress_window.empty()) {
    if (!int_flag(progress_window, "--progress-window", 1, 3600, &v)) return 2;
    opt.progress_window = std::chrono::seconds(v);
  }
  if (!metrics_port.empty()) {
    if (!int_flag(metrics_port, "--metrics-port", 0, 65535, &v)) return 2;
    opt.metrics_port = static_cast<int>(v);
  }
  if (!start_step.empty()) {
    if (!int_flag(start_step, "--start-step", 0, INT64_MAX, &v)) return 2;
    opt.start_step = v;
  }
  if (!reader_threads.empty()) {
    if (!int_flag(reader_threads, "--reader-threads", 1, 256, &v)) return 2;
    opt.reader_threads = static_cast<int>(v);
  }
  if (!resident_limit.empty()) {
    if (!int_flag(resident_limit, "--mmap-resident-limit-mib", 16, 1 << 20, &v)) return 2;
    opt.source_options.mmap_resident_limit = static_cast<uint64_t>(v) << 20;
  }
  if (!staging_threads.empty()) {
    if (!int_flag(staging_threads, "--staging-threads", 1, 64, &v)) return 2;
    opt.staging_threads = static_cast<int>(v);
  }
  if (!staging_sched.empty()) {
    auto sched = ParseThreadSched(staging_sched);
    if (!sched.ok()) return usage("--staging-sched: " + sched.status().message());
    opt.thread_sched = *sched;
  }
  if (!staging.empty()) opt.staging = staging;  // checked by the sidecar, which names the flag
  if (!cuda_devices.empty()) {
    size_t at = 0;
    while (at <= cuda_devices.size()) {
      size_t comma = cuda_devices.find(',', at);
      if (comma == std::string::npos) comma = cuda_devices.size();
      if (!int_flag(cuda_devices.substr(at, comma - at), "--cuda-devices", 0, 1023, &v)) return 2;
      opt.cuda_devices.push_back(static_cast<int>(v));
      at = comma + 1;
    }
  }
  sidecar::exchange::ExchangeOptions xo;
  int64_t port_number = 7441;
  if (!peers.empty() && !assignments.empty()) return usage("give --peers or --assignments, not both");
  if (!peers.empty()) {
    auto list = sidecar::exchange::ParsePeerList(peers);
    if (!list.ok()) return usage("--peers: " + list.status().message());
    xo.peers = *list;
  }
  if (!peer_port.empty() && !int_flag(peer_port, "--peer-port", 1, 65535, &port_number)) return 2;
  if (!peer_timeout.empty()) {
    if (!int_flag(peer_timeout, "--peer-timeout", 1, 3600, &v)) return 2;
    xo.peer_timeout = std::chrono::seconds(v);
  }
  if (!peer_reconnect.empty()) {
    if (!int_flag(peer_reconnect, "--peer-reconnect-timeout", 0, 86400, &v)) return 2;
    xo.reconnect_timeout = std::chrono::seconds(v);
  }
  if (!peer_listen_address.empty()) xo.listen_address = peer_listen_address;  // checked when the exchange listens
  if (!peer_secret_file.empty()) {
    // The secret never reaches a log line: errors name the file and the size.
    std::ifstream in(peer_secret_file, std::ios::binary);
    if (!in) return usage("--peer-secret-file " + peer_secret_file + ": cannot read it (" + std::strerror(errno) + ")");
    std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
    if (secret.size() < 16) {
      return usage("--peer-secret-file " + peer_secret_file + ": the secret must be at least 16 bytes, this one has " +
                   std::to_string(secret.size()));
    }
    xo.secret = std::move(secret);
  }
  if (!peer_fd.empty()) {
    if (!int_flag(peer_fd, "--peer-listen-fd", 3, 65535, &v)) return 2;
    xo.listen_fd = static_cast<int>(v);
  }
  if (!peers.empty() || !assignments.empty()) opt.peers = xo;
  if (!mode.empty()) {
    char* end = nullptr;
    const long m = std::strtol(mode.c_str(), &end, 8);
    if (*end != '\0' || m < 0 || m > 0777) return usage("--socket-mode: expected octal like 0660, got '" + mode + "'");
    opt.socket_mode = static_cast<mode_t>(m);
  }
  if (!allow.empty()) {
    std::stringstream ss(allow);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!int_flag(item, "--allow-uids", 0, UINT32_MAX - 1, &v)) return 2;
      opt.allowed_uids.push_back(static_cast<uid_t>(v));
    }
  }

  // The job, loaded and validated once: everything below receives it.
  Diagnostics job_diags;
  auto job = planner::LoadJobFile(opt.job_path, job_diags);
  if (!job.ok()) {
    const std::string why =
        job_diags.ok() ? job.status().ToString() : job_diags.Report(opt.job_path + ": invalid DataLoadJob");
    LogError("sidecar cannot start", {{"error", why}});
    std::cerr << "meshload-sidecar: " << why << (job_diags.ok() ? "\n" : "");
    return job.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }

  // The sidecar never forks. SIGPIPE is ignored before any thread starts;
  // SIGTERM/SIGINT are handled once the sidecar exists (before, the default
  // action, exiting, is right).
  ::signal(SIGPIPE, SIG_IGN);
  if (!process_file.empty() || !assignments.empty()) {
    // A signal while waiting stops the wait (the sidecar does not exist yet).
    struct sigaction wait_sa {};
    wait_sa.sa_handler = OnSignal;
    sigemptyset(&wait_sa.sa_mask);
    ::sigaction(SIGTERM, &wait_sa, nullptr);
    ::sigaction(SIGINT, &wait_sa, nullptr);
  }
  if (!process_file.empty()) {
    auto index = WaitForProcessFile(process_file);
    if (!index.ok()) {
      if (index.status().code() == StatusCode::kCancelled) return 0;
      LogError("sidecar cannot start", {{"error", index.status().ToString()}});
      std::cerr << "meshload-sidecar: " << index.status().ToString() << "\n";
      return 2;
    }
    opt.process = *index;
    LogInfo("process index assigned", {{"process", opt.process}, {"file", process_file}});
  }
  if (!assignments.empty() && !planner::MovesSamplesBetweenProcesses(job->spec())) {
    // Only a Broadcast fan-out or LoadAndReshard moves samples between
    // processes; other jobs need no peers and do not wait for their IPs.
    LogInfo("no samples move between this job's processes: the peer exchange is off",
            {{"strategy", std::string(ToString(job->spec().strategy))}});
    opt.peers.reset();
    assignments.clear();
  }
  if (opt.peers && opt.peers->secret.empty()) {
    LogWarn(
        "peer connections are not authenticated: anyone who can reach the peer port can feed this job "
        "samples; give every sidecar of the job the same --peer-secret-file",
        {});
  }
  if (!assignments.empty()) {
    auto list = WaitForAssignments(assignments, static_cast<uint16_t>(port_number));
    if (!list.ok()) {
      if (list.status().code() == StatusCode::kCancelled) return 0;
      LogError("sidecar cannot start", {{"error", list.status().ToString()}});
      std::cerr << "meshload-sidecar: " << list.status().ToString() << "\n";
      return 2;
    }
    opt.peers->peers = *list;
    // A replaced pod comes back with another IP: a lost peer is looked up
    // again before each dial (the kubelet refreshes the mounted ConfigMap).
    opt.peers->address_of = [path = assignments, port = static_cast<uint16_t>(port_number)](
                                int64_t process) -> std::optional<sidecar::exchange::PeerAddress> {
      auto now = ReadAssignments(path, port);
      if (!now.ok() || process < 0 || static_cast<size_t>(process) >= now->size()) return std::nullopt;
      return (*now)[static_cast<size_t>(process)];
    };
  }
  auto sidecar = sidecar::Sidecar::Create(std::move(*job), opt);
  if (!sidecar.ok()) {
    LogError("sidecar cannot start", {{"error", sidecar.status().ToString()}});
    std::cerr << "meshload-sidecar: " << sidecar.status().ToString() << "\n";
    return sidecar.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
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
