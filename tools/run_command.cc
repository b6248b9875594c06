// `meshload run --local`: the whole data path on one machine. One sidecar
// process per job process and one demo trainer per sidecar, each trainer
// verifying what it receives; a progress line every second and a report.
//
// The orchestrator is single-threaded and starts every child with
// posix_spawn before anything else runs, so nothing forks after threads
// exist (lesson 000 of the seeds).

#include "tools/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <openssl/rand.h>
#include <optional>
#include <set>

#include "common/cuda/driver.h"
#include "common/flags.h"
#include "common/loopback.h"
#include "common/unique_fd.h"
#include "planner/shard_planner.h"
#include "sidecar/source/dataset_facts.h"
#include "tools/child_process.h"
#include "tools/latency_histogram.h"
#include "tools/synthetic_dataset.h"

namespace meshload::tools {
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
  --dataset PATH             use the dataset at PATH (a file, directory or glob
                             on this machine, or an s3:// URI)
  --samples N                samples to generate (default: spec.dataset.samples,
                             else 64 global batches; at most 256 MiB of data
                             unless given)
  --files K                  files to split the generated dataset into (default 2)

Any DataLoadJob manifest runs as it is: with --generate-dataset or --dataset,
that dataset replaces the manifest's (spec.dataset.uri, and the volume and
S3 settings that describe where the pods find it; one line says so). With
neither, the manifest's own dataset is read: a local path, or an s3:// URI
with the credentials and endpoint of the usual AWS variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, AWS_REGION).
  --verify MODE              bytes (default), ids or none
  --delay-ms D               each trainer step takes D ms (a slow consumer)
  --reader-threads N         storage reader threads per sidecar (default: the
                             sidecar's, 4 for local files, 16 for remote data)
  --run-dir DIR              where sockets, logs and the job go (default: a new
                             temporary directory, removed afterwards)
  --cache-dir DIR            the block cache the sidecars share for a remote
                             (s3://, http(s)://) dataset, kept across runs
                             (default: the run directory's, removed with it)

exit codes: 0 every batch verified; 1 an error or a mismatch; 2 usage
)";

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

std::string Human(double v, const char* unit) {
  char b[64];
  if (v >= 1e9)
    std::snprintf(b, sizeof b, "%.2f G%s", v / 1e9, unit);
  else if (v >= 1e6)
    std::snprintf(b, sizeof b, "%.2f M%s", v / 1e6, unit);
  else if (v >= 1e3)
    std::snprintf(b, sizeof b, "%.2f k%s", v / 1e3, unit);
  else
    std::snprintf(b, sizeof b, "%.0f %s", v, unit);
  return b;
}

std::string Duration(double s) {
  char b[64];
  if (s < 1e-3)
    std::snprintf(b, sizeof b, "%.0f µs", s * 1e6);
  else if (s < 1)
    std::snprintf(b, sizeof b, "%.1f ms", s * 1e3);
  else
    std::snprintf(b, sizeof b, "%.2f s", s);
  return b;
}

// Rewrites the job's dataset to `uri`: the URI, and without the fields that
// say where the pods find the manifest's own dataset (its volume; its S3
// settings, unless `uri` is on S3 too) or how many samples it has. Returns
// what was replaced or dropped, for the one line the run prints.
Result<std::string> RewriteJob(const std::string& job_path, const std::string& uri, const std::string& out_path) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAllFromFile(job_path);
    for (auto& d : docs) {
      if (d.IsMap() && d["kind"] && d["kind"].as<std::string>() == "DataLoadJob") {
        YAML::Node ds = d["spec"]["dataset"];
        std::string what = "spec.dataset.uri '" + (ds["uri"] ? ds["uri"].as<std::string>() : std::string()) + "'";
        std::vector<std::string> dropped;
        for (const char* key : {"volume", "s3", "samples"}) {
          if (std::string(key) == "s3" && uri.rfind("s3://", 0) == 0) continue;
          if (ds[key]) dropped.push_back(std::string("spec.dataset.") + key);
          ds.remove(key);
        }
        ds["uri"] = uri;
        if (YAML::Node mix = d["spec"]["mixture"]; mix && mix["datasets"] && mix["datasets"].IsSequence()) {
          // A mixture's datasets: each under the new root, in a folder of its name.
          for (YAML::Node m : mix["datasets"]) {
            if (m["name"]) m["uri"] = m["name"].as<std::string>();
            m.remove("samples");
          }
          what += " and each spec.mixture.datasets[].uri (the folder of its name under it)";
        }
        YAML::Emitter e;
        e << d;
        std::ofstream out(out_path);
        out << e.c_str() << "\n";
        if (!out) return IoErrorFromErrno("write", out_path, errno);
        for (size_t i = 0; i < dropped.size(); ++i) {
          what += (i == 0 ? " (without " : i + 1 == dropped.size() ? " and " : ", ") + dropped[i];
        }
        return what + (dropped.empty() ? "" : ")");
      }
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(e.what(), job_path);
  }
  return InvalidArgument("no DataLoadJob document", job_path);
}

struct RunOptions {
  std::string file, generate_dir, dataset, verify = "bytes", run_dir, cache_dir;
  bool local = false;
  int64_t steps = -1, files = 2, delay_ms = 0, reader_threads = 0;
  std::optional<int64_t> samples;
};

// A step that ends the run returns its exit code; kGoOn lets the run go on.
constexpr int kGoOn = -1;

// One run: each step of RunRun is a method, in the order Run() calls them.
class LocalRun {
 public:
  explicit LocalRun(RunOptions o) : o_(std::move(o)) {}
  ~LocalRun() {
    std::error_code ec;
    if (temp_dir_) std::filesystem::remove_all(run_dir_, ec);
  }

  int Run() {
    for (int (LocalRun::*step)() : {&LocalRun::MakeRunDir, &LocalRun::LoadJob, &LocalRun::Resolve}) {
      if (int rc = (this->*step)(); rc != kGoOn) return rc;
    }
    CatchSignals();
    start_ = Clock::now();
    for (int (LocalRun::*step)() :
         {&LocalRun::ConnectPeers, &LocalRun::StartSidecars, &LocalRun::StartTrainers, &LocalRun::Supervise}) {
      if (int rc = (this->*step)(); rc != kGoOn) return rc;
    }
    StopSidecars();
    return Report();
  }

 private:
  int MakeRunDir();
  int LoadJob();
  // Writes the synthetic dataset of --generate-dataset; returns its URI.
  Result<std::string> Generate(const planner::JobSpec& spec);
  int Resolve();
  void CatchSignals();
  int ConnectPeers();
  int StartSidecars();
  int StartTrainers();
  int Supervise();
  // The remote dataset's reads, from each sidecar's last log line: the
  // cache's mode and its fetched and delivered bytes.
  void PrintStorage() const;
  // Waits up to `timeout` for the trainers' output and reads it; a line at
  // a time, the last one and the final report of each kept.
  void ReadTrainers(std::chrono::milliseconds timeout);
  // Reaps exited children; a sidecar that exits, or a trainer that fails,
  // ends the run (its exit code), else kGoOn.
  int Reap();
  void SampleMemory();
  void PrintProgress(Clock::time_point now);
  void StopSidecars();
  int Report();
  // Kills every child, waits for them, says why: exit code 1.
  int Fail(const std::string& msg);

  const RunOptions o_;
  std::string run_dir_;
  bool temp_dir_ = false;
  std::optional<planner::ValidJob> job_;
  std::string job_path_;
  std::optional<planner::ResolvedJob> rj_;
  int64_t P_ = 0;
  uint64_t batch_bytes_per_process_ = 0;
  Clock::time_point start_;
  std::vector<Child> sidecars_, trainers_;
  bool moves_ = false;
  std::vector<UniqueFd> peer_fds_;
  std::string peer_list_, secret_path_;
  // From the trainers' JSON lines: the last of each, and its final report.
  std::vector<nlohmann::json> last_, finals_;
  std::vector<uint64_t> sidecar_peak_, sidecar_file_;
  Clock::time_point last_print_;
  uint64_t last_samples_ = 0, last_bytes_ = 0;
  double elapsed_ = 0;
};

int LocalRun::MakeRunDir() {
  // The run directory: sockets (0700: only this user reaches them), logs, job.
  run_dir_ = o_.run_dir;
  if (run_dir_.empty()) {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/meshload-run-XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      return UsageError("cannot create a run directory: " + std::string(std::strerror(errno)));
    run_dir_ = tmpl;
    temp_dir_ = true;
  } else {
    std::filesystem::create_directories(run_dir_);
  }
  ::chmod(run_dir_.c_str(), 0700);
  return kGoOn;
}

int LocalRun::LoadJob() {
  // The manifest, loaded and validated once: it must be valid as written,
  // before its dataset is replaced.
  Diagnostics diags;
  auto job = planner::LoadJobFile(o_.file, diags);
  if (!job.ok()) {
    if (diags.ok()) {
      std::cerr << "meshload run: " << job.status().ToString() << "\n";
      return job.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::cerr << diags.Report(o_.file + ": invalid DataLoadJob");
    return 2;
  }
  job_path_ = o_.file;
  if (o_.generate_dir.empty() && o_.dataset.empty()) {
    job_ = std::move(*job);
    return kGoOn;
  }
  std::string uri = o_.dataset, how = "given";
  if (!o_.generate_dir.empty()) {
    auto generated = Generate(job->spec());
    if (!generated.ok()) {
      std::cerr << "meshload run: cannot generate the dataset: " << generated.status().ToString() << "\n";
      return 1;
    }
    uri = std::move(*generated);
    how = "generated";
  }
  if (uri.find("://") == std::string::npos) uri = std::filesystem::absolute(uri).lexically_normal().string();
  auto replaced = RewriteJob(o_.file, uri, run_dir_ + "/job.yaml");
  if (!replaced.ok()) {
    std::cerr << "meshload run: " << replaced.status().ToString() << "\n";
    return 1;
  }
  std::printf("dataset: the %s %s replaces %s\n", how.c_str(), uri.c_str(), replaced->c_str());
  // The job the sidecars and trainers load: the manifest with that dataset.
  job_path_ = run_dir_ + "/job.yaml";
  job = planner::LoadJobFile(job_path_, diags);
  if (!job.ok()) {
    std::cerr << (diags.ok() ? "meshload run: " + job.status().ToString() + "\n"
                             : diags.Report(o_.file + " (its dataset replaced): invalid DataLoadJob"));
    return 2;
  }
  job_ = std::move(*job);
  return kGoOn;
}

Result<std::string> LocalRun::Generate(const planner::JobSpec& spec) {
  // As many samples as asked for; else the manifest's count, or 64 global
  // batches, but no more than 256 MiB of data (a cluster manifest may
  // count a corpus).
  constexpr uint64_t kDefaultLimit = 256ull << 20;
  const uint64_t global = static_cast<uint64_t>(spec.batch.global_batch_size);
  uint64_t n = o_.samples             ? static_cast<uint64_t>(*o_.samples)
               : spec.dataset.samples ? static_cast<uint64_t>(*spec.dataset.samples)
                                      : global * 64;
  std::string capped;
  const uint64_t per_sample = tools::SyntheticSampleBytes(spec.dataset);
  if (!o_.samples && n * per_sample > kDefaultLimit) {
    const uint64_t fit = std::max<uint64_t>(global, kDefaultLimit / per_sample / global * global);
    capped = "; the job's " + std::to_string(n) + " samples would take " +
             Human(static_cast<double>(n * per_sample), "B") + ": --samples N generates more";
    n = fit;
  }
  const auto t0 = Clock::now();
  if (spec.mixture) {
    // Each dataset of the mixture in a folder of its name (RewriteJob points
    // the mixture there), as many samples as asked for, else its own count,
    // else the default, within the same budget.
    uint64_t total = 0;
    for (const planner::MixtureDataset& m : spec.mixture->datasets) {
      uint64_t nd = o_.samples  ? static_cast<uint64_t>(*o_.samples)
                    : m.samples ? static_cast<uint64_t>(*m.samples)
                                : global * 64;
      if (!o_.samples)
        nd = std::max<uint64_t>(1, std::min(nd, kDefaultLimit / spec.mixture->datasets.size() / per_sample));
      MESHLOAD_RETURN_IF_ERROR(
          tools::GenerateSyntheticDataset(spec.dataset, o_.generate_dir + "/" + m.name, nd, static_cast<int>(o_.files))
              .status());
      total += nd;
    }
    std::printf("generated %" PRIu64 " %s samples in %zu datasets under %s (%.1f s)\n", total,
                std::string(ToString(spec.dataset.format)).c_str(), spec.mixture->datasets.size(),
                o_.generate_dir.c_str(), std::chrono::duration<double>(Clock::now() - t0).count());
    return o_.generate_dir;
  }
  MESHLOAD_ASSIGN_OR_RETURN(
      std::string uri, tools::GenerateSyntheticDataset(spec.dataset, o_.generate_dir, n, static_cast<int>(o_.files)));
  std::printf("generated %" PRIu64 " %s samples in %s (%.1f s%s)\n", n,
              std::string(ToString(spec.dataset.format)).c_str(), o_.generate_dir.c_str(),
              std::chrono::duration<double>(Clock::now() - t0).count(), capped.c_str());
  return uri;
}

int LocalRun::Resolve() {
  Diagnostics diags;
  auto resolved = sidecar::source::ResolveReadingDataset(*job_, {}, sidecar::source::Unreachable::kFail, diags);
  if (!resolved.ok() || !diags.ok()) {
    if (diags.ok()) diags.Add(resolved.status());
    const bool replaced = job_path_ != o_.file;
    const std::string file = o_.file + (replaced ? " (its dataset replaced)" : "");
    if (!resolved.ok() && resolved.status().code() != StatusCode::kInvalidArgument) {
      std::cerr << diags.Report(file + ": the dataset cannot be read");
      return 1;
    }
    std::cerr << diags.Report(file + ": invalid DataLoadJob");
    return 2;
  }
  rj_ = std::move(*resolved);
  const planner::ResolvedJob& rj = *rj_;
  P_ = rj.mesh.processes();
  // What a slot holds per process (variable-size samples: the room for
  // the largest batch a device can get).
  const uint64_t per_device = rj.global_batch / static_cast<uint64_t>(rj.mesh.shards());
  batch_bytes_per_process_ = rj.dataset.LargestBytes(per_device) * static_cast<uint64_t>(rj.mesh.devices_per_process());
  const std::string sample_size = rj.dataset.variable_size()
                                      ? std::to_string(rj.dataset.min_sample_bytes()) + ".." +
                                            std::to_string(rj.dataset.max_sample_bytes()) + " B (mean " +
                                            Human(rj.dataset.mean_sample_bytes(), "B") + ")"
                                      : std::to_string(rj.dataset.sample_bytes()) + " B";
  std::printf("job %s: %" PRId64 " processes x %" PRId64 " devices, %s/%s, global batch %" PRIu64 ", %" PRIu64
              " samples x %s, %s per process per step%s\n",
              job_->name().c_str(), P_, rj.mesh.devices_per_process(), std::string(ToString(rj.spec.strategy)).c_str(),
              std::string(ToString(rj.spec.replication.fanout)).c_str(), rj.global_batch, rj.samples,
              sample_size.c_str(), Human(static_cast<double>(batch_bytes_per_process_), "B").c_str(),
              rj.dataset.variable_size() ? " at most" : "");
  return kGoOn;
}

void LocalRun::CatchSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int LocalRun::Fail(const std::string& msg) {
  for (auto* group : {&trainers_, &sidecars_}) {
    for (auto& c : *group) {
      if (!c.exited && c.pid > 0) ::kill(c.pid, SIGKILL);
    }
  }
  for (auto* group : {&trainers_, &sidecars_}) {
    for (auto& c : *group) {
      if (!c.exited && c.pid > 0) ::waitpid(c.pid, nullptr, 0);
    }
  }
  std::cerr << "meshload run: " << msg << "\n";
  return 1;
}

int LocalRun::ConnectPeers() {
  // Plans that move samples between processes get their sidecars
  // connected over loopback TCP.
  planner::ShardPlanner planner(*rj_);
  for (int64_t p = 0; p < P_ && !moves_; ++p) moves_ = !planner.TransfersFrom(p, planner.DefaultLoading()).empty();
  for (int64_t p = 0; moves_ && p < P_; ++p) {
    auto l = ListenLoopback();
    if (!l.ok()) return Fail(l.status().ToString());
    peer_list_ += (p ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(l->second);
    peer_fds_.push_back(std::move(l->first));
  }
  // The sidecars authenticate each other with a secret of this run's.
  secret_path_ = run_dir_ + "/peer-secret";
  if (!moves_) return kGoOn;
  std::printf("samples move between processes: sidecars exchange them over TCP (%s), authenticated\n",
              peer_list_.c_str());
  uint8_t raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) return Fail("cannot make a peer secret: no randomness");
  std::string hex;
  for (uint8_t b : raw) {
    static const char* digits = "0123456789abcdef";
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  const int sfd = ::open(secret_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (sfd < 0 || ::write(sfd, hex.data(), hex.size()) != static_cast<ssize_t>(hex.size())) {
    if (sfd >= 0) ::close(sfd);
    return Fail("cannot write " + secret_path_ + ": " + std::strerror(errno));
  }
  ::close(sfd);
  return kGoOn;
}

int LocalRun::StartSidecars() {
  const std::string sidecar_bin = FindBinary("meshload-sidecar", "MESHLOAD_SIDECAR_BIN");
  // GPUs: with one for every device of the mesh, process p stages on its
  // own (p × devicesPerProcess + i); otherwise each sidecar takes the
  // first devicesPerProcess it sees (sharing them), or stages on the host
  // when there are fewer (the sidecar logs why).
  const int64_t dpp = rj_->mesh.devices_per_process();
  int64_t gpus = 0;
  if (auto driver = cuda::Driver::Open(); driver.ok()) gpus = static_cast<int64_t>((*driver)->devices().size());
  const bool gpu_per_device = gpus >= P_ * dpp;
  if (gpus > 0) {
    std::printf("CUDA sees %" PRId64 " GPU(s): %s\n", gpus,
                gpu_per_device ? "each process stages on its own"
                : gpus >= dpp  ? "the processes share them"
                               : "fewer than the devices of one process, so the sidecars stage on the host");
  }
  for (int64_t p = 0; p < P_; ++p) {
    const std::string sock = run_dir_ + "/sidecar-" + std::to_string(p) + ".sock";
    std::vector<std::string> argv = {sidecar_bin, "--job", job_path_,        "--process", std::to_string(p),
                                     "--socket",  sock,    "--metrics-port", "0",         "--metrics-address",
                                     "127.0.0.1"};
    if (o_.reader_threads > 0) argv.insert(argv.end(), {"--reader-threads", std::to_string(o_.reader_threads)});
    // The sidecars of this machine share one block cache, as the pods of a
    // node do with the chart's shared cache; a local dataset ignores it.
    argv.insert(argv.end(), {"--cache-dir", o_.cache_dir.empty() ? run_dir_ + "/cache" : o_.cache_dir});
    if (moves_) {
      argv.insert(argv.end(), {"--peers", peer_list_, "--peer-listen-fd", std::to_string(kPeerListenFd),
                               "--peer-secret-file", secret_path_});
    }
    if (gpu_per_device) {
      std::string list;
      for (int64_t i = 0; i < dpp; ++i) list += (i ? "," : "") + std::to_string(p * dpp + i);
      argv.insert(argv.end(), {"--cuda-devices", list});
    }
    auto c = Spawn("sidecar " + std::to_string(p), argv, run_dir_ + "/sidecar-" + std::to_string(p) + ".log", false,
                   moves_ ? peer_fds_[static_cast<size_t>(p)].get() : -1);
    if (!c.ok()) return Fail(c.status().ToString());
    sidecars_.push_back(std::move(*c));
  }
  peer_fds_.clear();  // the sidecars hold them now
  return kGoOn;
}

int LocalRun::StartTrainers() {
  const std::string self = SelfDir() + "/meshload";
  const std::string meshload_bin = ::access(self.c_str(), X_OK) == 0 ? self : "meshload";
  for (int64_t p = 0; p < P_; ++p) {
    const std::string sock = run_dir_ + "/sidecar-" + std::to_string(p) + ".sock";
    std::vector<std::string> argv = {meshload_bin, "demo-trainer",    "--job",      job_path_,
                                     "--process",  std::to_string(p), "--socket",   sock,
                                     "--verify",   o_.verify,         "--delay-ms", std::to_string(o_.delay_ms)};
    if (o_.steps > 0) {
      argv.push_back("--steps");
      argv.push_back(std::to_string(o_.steps));
    }
    auto c = Spawn("trainer " + std::to_string(p), argv, run_dir_ + "/trainer-" + std::to_string(p) + ".log", true);
    if (!c.ok()) return Fail(c.status().ToString());
    trainers_.push_back(std::move(*c));
  }
  return kGoOn;
}

void LocalRun::SampleMemory() {
  for (size_t p = 0; p < sidecars_.size(); ++p) {
    if (sidecars_[p].exited) continue;
    const auto [own, file] = ResidentBytes(sidecars_[p].pid);
    sidecar_peak_[p] = std::max(sidecar_peak_[p], own);
    sidecar_file_[p] = std::max(sidecar_file_[p], file);
  }
}

void LocalRun::ReadTrainers(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  for (auto& t : trainers_) fds.push_back({t.out_fd, POLLIN, 0});  // a closed pipe (-1) is skipped by poll
  ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  for (size_t i = 0; i < trainers_.size(); ++i) {
    Child& t = trainers_[i];
    if (t.out_fd < 0) continue;
    if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
    char buf[65536];
    const ssize_t n = ::read(t.out_fd, buf, sizeof buf);
    if (n > 0) {
      t.buffer.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = t.buffer.find('\n')) != std::string::npos) {
        auto j = nlohmann::json::parse(t.buffer.substr(0, nl), nullptr, false);
        t.buffer.erase(0, nl + 1);
        if (j.is_discarded() || !j.contains("type")) continue;
        (j["type"] == "final" ? finals_[i] : last_[i]) = j;
        if (j["type"] == "final") last_[i] = j;
      }
    } else if (n == 0) {
      ::close(t.out_fd);
      t.out_fd = -1;
    }
  }
}

int LocalRun::Reap() {
  for (auto* group : {&trainers_, &sidecars_}) {
    for (auto& c : *group) {
      if (c.exited) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.exited = true;
      c.status = status;
      if (group == &sidecars_ && !g_interrupted) {
        return Fail(c.what + " exited unexpectedly (" +
                    (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                       : "signal " + std::to_string(WTERMSIG(status))) +
                    "); its log:\n" + Tail(c.log, 15));
      }
    }
  }
  for (auto& t : trainers_) {
    if (t.exited && WIFEXITED(t.status) && WEXITSTATUS(t.status) != 0 && WEXITSTATUS(t.status) != 3 && !g_interrupted) {
      return Fail(t.what + " failed; its log:\n" + Tail(t.log, 15));
    }
  }
  return kGoOn;
}

void LocalRun::PrintProgress(Clock::time_point now) {
  uint64_t total_samples = 0, total_bytes = 0;
  int64_t min_steps = -1;
  double wait99 = 0;
  for (const auto& j : last_) {
    if (j.is_null()) continue;
    total_samples += j.value("samples", uint64_t{0});
    total_bytes += j.value("bytes", uint64_t{0});
    const int64_t s = j.value("steps", int64_t{0});
    min_steps = min_steps < 0 ? s : std::min(min_steps, s);
    wait99 = std::max(wait99, j.value("wait_p99", 0.0));
  }
  const double dt = std::chrono::duration<double>(now - last_print_).count();
  std::printf("step %6" PRId64 "  %12s samples/s  %10s/s  trainer wait p99 %s\n", std::max<int64_t>(min_steps, 0),
              Human(static_cast<double>(total_samples - last_samples_) / dt, "").c_str(),
              Human(static_cast<double>(total_bytes - last_bytes_) / dt, "B").c_str(), Duration(wait99).c_str());
  std::fflush(stdout);
  last_samples_ = total_samples;
  last_bytes_ = total_bytes;
  last_print_ = now;
}

int LocalRun::Supervise() {
  // Poll the trainers' JSON lines; print progress about once a second.
  last_.assign(static_cast<size_t>(P_), nlohmann::json());
  finals_.assign(static_cast<size_t>(P_), nlohmann::json());
  sidecar_peak_.assign(static_cast<size_t>(P_), 0);
  sidecar_file_.assign(static_cast<size_t>(P_), 0);
  last_print_ = Clock::now();
  bool interrupted_sent = false;
  auto running = [&] {
    int64_t n = 0;
    for (const auto& t : trainers_) n += t.exited ? 0 : 1;
    return n;
  };
  while (running() > 0) {
    if (g_interrupted && !interrupted_sent) {
      std::printf("\ninterrupted: stopping the trainers\n");
      for (auto& t : trainers_) {
        if (!t.exited) ::kill(t.pid, SIGTERM);
      }
      interrupted_sent = true;
    }
    ReadTrainers(std::chrono::milliseconds(100));
    if (int rc = Reap(); rc != kGoOn) return rc;
    SampleMemory();
    const auto now = Clock::now();
    if (now - last_print_ >= std::chrono::seconds(1)) PrintProgress(now);
  }
  // A trainer may write its final report and exit between a poll and the
  // reap that ends the loop: read what its pipe still holds, up to its end.
  const auto drain_until = Clock::now() + std::chrono::seconds(5);
  auto open = [&] {
    for (const auto& t : trainers_) {
      if (t.out_fd >= 0) return true;
    }
    return false;
  };
  while (open() && Clock::now() < drain_until) ReadTrainers(std::chrono::milliseconds(100));
  elapsed_ = std::chrono::duration<double>(Clock::now() - start_).count();
  SampleMemory();
  return kGoOn;
}

void LocalRun::StopSidecars() {
  for (auto& s : sidecars_) {
    if (!s.exited) ::kill(s.pid, SIGTERM);
  }
  for (auto& s : sidecars_) {
    if (!s.exited) ::waitpid(s.pid, &s.status, 0);
    s.exited = true;
  }
}

void LocalRun::PrintStorage() const {
  std::string mode, reason;
  uint64_t fetched = 0, delivered = 0, hits = 0, misses = 0, corrupt = 0, refused = 0, found = 0;
  uint64_t parquet_groups = 0, parquet_bytes = 0;
  bool any = false;
  for (int64_t p = 0; p < P_; ++p) {
    std::ifstream in(run_dir_ + "/sidecar-" + std::to_string(p) + ".log");
    std::string line;
    nlohmann::json last;
    while (std::getline(in, line)) {
      if (line.find("\"sidecar stopping\"") == std::string::npos) continue;
      last = nlohmann::json::parse(line, nullptr, false);
    }
    if (!last.is_object()) continue;
    parquet_groups += last.value("parquet_row_groups_decoded", uint64_t{0});
    parquet_bytes += last.value("parquet_chunk_bytes", uint64_t{0});
    if (last.value("cache_mode", std::string("none")) == "none") continue;
    any = true;
    mode = last.value("cache_mode", std::string());
    reason = last.value("cache_reason", std::string());
    fetched += last.value("cache_fetched_bytes", uint64_t{0});
    delivered += last.value("cache_delivered_bytes", uint64_t{0});
    hits += last.value("cache_hits", uint64_t{0});
    misses += last.value("cache_misses", uint64_t{0});
    corrupt += last.value("cache_corrupt_blocks", uint64_t{0});
    found += last.value("cache_found_blocks", uint64_t{0});
    refused += last.value("cache_write_errors", uint64_t{0});
  }
  if (parquet_groups > 0 && rj_ && rj_->spec.dataset.format == planner::DatasetFormat::kArrow) {
    std::printf("  Arrow record batches %" PRIu64 " decoded, %s of their messages fetched\n", parquet_groups,
                Human(static_cast<double>(parquet_bytes), "B").c_str());
  } else if (parquet_groups > 0) {
    std::printf("  Parquet row groups   %" PRIu64 " decoded, %s of their column chunks fetched\n", parquet_groups,
                Human(static_cast<double>(parquet_bytes), "B").c_str());
  }
  if (!any) return;
  // Local files reach the cache only when they are stored compressed.
  const bool remote =
      rj_ && sidecar::source::ReadsOverNetwork(rj_->spec, *sidecar::source::SourceRegistry::WithBuiltins({}));
  if (mode == "blocks") {
    std::printf(
        "  %s through the block cache: %s fetched for %s delivered (amplification %.2f), "
        "%" PRIu64 " block hits, %" PRIu64 " misses%s%s\n",
        remote ? "remote storage      " : "compressed files    ", Human(static_cast<double>(fetched), "B").c_str(),
        Human(static_cast<double>(delivered), "B").c_str(),
        delivered ? static_cast<double>(fetched) / static_cast<double>(delivered) : 0.0, hits, misses,
        found ? (", " + std::to_string(found) + " blocks found in the cache directory (not fetched by their reader)")
                    .c_str()
              : "",
        corrupt || refused ? (", " + std::to_string(corrupt) + " corrupt blocks fetched again, " +
                              std::to_string(refused) + " refused by the disk")
                                 .c_str()
                           : "");
  } else {
    std::printf("  %s read directly: %s\n", remote ? "remote storage      " : "compressed files    ", reason.c_str());
  }
}

int LocalRun::Report() {
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  const double start_mono = std::chrono::duration<double>(start_.time_since_epoch()).count();
  LatencyHistogram waits;
  uint64_t total_steps = 0, total_samples = 0, total_bytes = 0, mismatches = 0, reconnects = 0;
  double first_batch = 0, finish = 0;
  std::string errors;
  std::set<std::string> staging_modes;
  uint64_t gpu_checked = 0;
  for (size_t p = 0; p < finals_.size(); ++p) {
    const auto& j = finals_[p];
    if (j.is_null()) {
      errors += "  trainer " + std::to_string(p) + " sent no report; its log:\n" + Tail(trainers_[p].log, 10);
      continue;
    }
    if (!j.value("error", std::string()).empty())
      errors += "  trainer " + std::to_string(p) + ": " + j["error"].get<std::string>() + "\n";
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
  for (uint64_t v : sidecar_peak_) peak = std::max(peak, v);
  for (uint64_t v : sidecar_file_) mapped = std::max(mapped, v);
  const uint64_t bound = static_cast<uint64_t>(rj_->spec.batch.prefetch) * batch_bytes_per_process_ + (64ull << 20);
  std::printf("\n== meshload run --local report\n");
  std::printf("  steps                %" PRIu64 " per process (%" PRId64 " processes)\n", total_steps, P_);
  std::printf("  samples/s            %s  (%" PRIu64 " samples in %.2f s after the first batch)\n",
              Human(static_cast<double>(total_samples) / stream, "").c_str(), total_samples, stream);
  std::printf("  throughput           %s/s\n", Human(static_cast<double>(total_bytes) / stream, "B").c_str());
  std::printf("  time to first batch  %s (from launch, sidecar start-up included)\n", Duration(first_batch).c_str());
  std::printf("  trainer wait         p50 %s, p99 %s (%" PRIu64 " batches)\n", Duration(waits.Quantile(0.5)).c_str(),
              Duration(waits.Quantile(0.99)).c_str(), waits.count());
  std::printf("  CPU                  %.2f s per GB delivered (%.2f CPU s in all, %.2f s wall)\n",
              total_bytes ? cpu / (static_cast<double>(total_bytes) / 1e9) : 0.0, cpu, elapsed_);
  std::printf(
      "  peak memory          sidecar %s own (heap + slots; bound prefetch x batch + 64 MiB = %s),\n"
      "                       %s of mapped page cache (shared, reclaimable)\n",
      Human(static_cast<double>(peak), "B").c_str(), Human(static_cast<double>(bound), "B").c_str(),
      Human(static_cast<double>(mapped), "B").c_str());
  std::string staging;
  for (const auto& m : staging_modes) staging += (staging.empty() ? "" : ", ") + m;
  std::printf("  staging              %s%s\n", staging.c_str(),
              gpu_checked ? (" (" + std::to_string(gpu_checked) + " GPU tensors copied back and checked)").c_str()
              : staging == "host" ? " (see the sidecar log's staging_reason)"
                                  : "");
  std::printf("  verified             %s, %" PRIu64 " mismatches, %" PRIu64 " reconnects\n", o_.verify.c_str(),
              mismatches, reconnects);
  PrintStorage();
  if (!errors.empty()) std::printf("  errors:\n%s", errors.c_str());
  if (!temp_dir_) std::printf("  logs                 %s\n", run_dir_.c_str());
  const bool ok = mismatches == 0 && errors.empty() && (g_interrupted || total_steps > 0);
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int RunRun(const std::vector<std::string>& args) {
  RunOptions o;
  FlagParser flags("run", kRunUsage);
  flags.String({"-f", "--file"}, &o.file);
  flags.Bool({"--local"}, &o.local);
  flags.Int({"--steps"}, &o.steps);
  flags.String({"--generate-dataset"}, &o.generate_dir);
  flags.String({"--dataset"}, &o.dataset);
  flags.OptionalInt({"--samples"}, &o.samples);
  flags.Int({"--files"}, &o.files);
  flags.String({"--verify"}, &o.verify);
  flags.Int({"--delay-ms"}, &o.delay_ms);
  flags.Int({"--reader-threads"}, &o.reader_threads);
  flags.String({"--run-dir"}, &o.run_dir);
  flags.String({"--cache-dir"}, &o.cache_dir);
  if (int rc = flags.Parse(args); rc >= 0) return rc;
  if (!o.local)
    return UsageError("run: only --local is available here; in a cluster the controller starts the sidecars");
  if (o.file.empty()) return UsageError("run: -f JOB.yaml is required");
  if (!o.generate_dir.empty() && !o.dataset.empty()) {
    return UsageError("run: --generate-dataset and --dataset both name the dataset; give one");
  }
  if (o.verify != "bytes" && o.verify != "ids" && o.verify != "none") {
    return UsageError("--verify: expected bytes, ids or none");
  }
  if (o.steps == 0 || o.steps < -1) return UsageError("--steps: expected a positive number of steps");
  if (o.reader_threads < 0 || o.reader_threads > 256) {
    return UsageError("--reader-threads: expected 1 to 256 (or 0: the sidecar's default), got " +
                      std::to_string(o.reader_threads));
  }
  return LocalRun(std::move(o)).Run();
}

}  // namespace meshload::tools
