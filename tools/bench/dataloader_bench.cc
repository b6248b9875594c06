// Host data path benchmark: shuffled reads from the page cache, delivered by
// a meshload-sidecar process into this (consumer) process through the real
// client, against ceilings and the Python baseline measured in the same run.
//
//   build/tools/bench/dataloader_bench [--quick] [--dir DIR] [--only SCENARIO] [--rounds N] [--prefetch N]
//
// --prefetch N replaces every scenario's prefetch (4: the slots the job
// asks for; small batches cycle through 4 slots faster than a RELEASE's
// round trip to the sidecar and back to a producer).
//
// Per scenario it prints:
//   - the single-thread pread ceiling (shuffled per-sample preads of the same
//     batches into one buffer) and the single-thread memcpy ceiling (the same
//     gathers from the page-cache-mapped file), and the memcpy ceiling of
//     all cores gathering at once (the most any copying loader can deliver
//     here; the Python targets are also stated against it); for records
//     of whole pages, the zero-copy alternative too: the same batches' pages
//     mapped into one region (mmap MAP_FIXED per sample);
//   - meshload: samples/s and GB/s delivered, trainer wait, the handoff
//     latency (Next() when the batch is already staged), time to first
//     batch, and the sidecar's peak RSS against prefetch x batch + 64 MiB;
//   - the Python baseline (tools/bench/numpy_baseline.py, Debian numpy; run
//     by /usr/bin/python3, or MESHLOAD_BENCH_PYTHON) on the very same
//     batches, and the ratios the targets are stated in.
// meshload (a fresh sidecar each time) and Python take turns --rounds times
// (default 3): every round's ratio is printed, and the rates and ratio of
// the median round are the headline (of an even count, the upper middle).
// A round whose stream stops early ends the scenario; the rounds before it
// are printed, and the program exits 1.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sidecar/source/dataset_facts.h"
#include "client/client.h"
#include "common/flags.h"
#include "formats/megatron_index.h"
#include "formats/npy.h"
#include "planner/sampler.h"
#include "planner/shard_planner.h"
#include "tools/synthetic_dataset.h"

extern char** environ;

namespace meshload::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
volatile uint64_t g_sink;
// A round failed (its stream stopped early, or the sidecar did not start): exit 1.
bool g_failed = false;

struct Scenario {
  std::string name;
  planner::DatasetFormat format;
  uint64_t record_bytes = 0;  // FixedRecord
  uint64_t seq = 0;           // TokenStream (uint16)
  uint64_t batch = 32;
  uint64_t samples = 0;
  int64_t steps = 0;
  int64_t prefetch = 4;
  double target_vs_pread = 0;   // e.g. 0.70
  double target_vs_python = 0;  // e.g. 3.0
};

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = '\0';
  return std::filesystem::path(buf).parent_path().string();
}

std::string JobYaml(const Scenario& s, const std::string& dir) {
  std::string ds =
      s.format == planner::DatasetFormat::kFixedRecord
          ? "    format: FixedRecord\n    recordBytes: " + std::to_string(s.record_bytes) + "\n"
      : s.format == planner::DatasetFormat::kMegatronIndexed
          ? "    format: MegatronIndexed\n"
          : "    format: TokenStream\n    dtype: uint16\n    sequenceLength: " + std::to_string(s.seq) + "\n";
  return "apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nmetadata: {name: bench-" + s.name +
         "}\nspec:\n  mesh: {processes: 1, devicesPerProcess: 1, axes: [{name: data, size: 1}]}\n"
         "  strategy: PerProcess\n  dataset:\n    uri: " +
         dir + "\n" + ds + "  batch: {globalBatchSize: " + std::to_string(s.batch) +
         ", prefetch: " + std::to_string(s.prefetch) + "}\n  shuffle: {mode: Global, seed: 1}\n";
}

struct Memory {
  uint64_t peak = 0;  // VmHWM: everything resident, mapped page cache included
  uint64_t own = 0;   // RssAnon + RssShmem now: the sidecar's heap and its staging slots
  uint64_t file = 0;  // RssFile now: page-cache pages it has mapped (shared, reclaimable)
};
Memory SidecarMemory(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  Memory m;
  auto kb = [](const std::string& l, size_t skip) { return std::stoull(l.substr(skip)) * 1024; };
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("VmHWM:", 0) == 0) m.peak = kb(l, 6);
    if (l.rfind("RssAnon:", 0) == 0 || l.rfind("RssShmem:", 0) == 0) m.own += kb(l, l.find(':') + 1);
    if (l.rfind("RssFile:", 0) == 0) m.file = kb(l, 8);
  }
  return m;
}

// Numeric field `n` (1-based, as in proc(5)) of /proc/PID/stat; 0 if unknown.
uint64_t StatField(pid_t pid, int n) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');  // field 2, the name, may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream rest(all.substr(close + 2));
  std::string field;
  for (int i = 3; rest >> field; ++i) {
    if (i == n) return std::stoull(field);
  }
  return 0;
}

// CPU seconds (user + system) a process has used so far; 0 if unknown.
double CpuSeconds(pid_t pid) {
  // The process's CPU clock counts nanoseconds; /proc's utime and stime,
  // the fallback, count ticks of 10 ms (too coarse for a short run).
  clockid_t clock;
  timespec ts;
  if (::clock_getcpuclockid(pid, &clock) == 0 && ::clock_gettime(clock, &ts) == 0) {
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }
  return static_cast<double>(StatField(pid, 14) + StatField(pid, 15)) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Minor page faults of a process (all its threads): for the sidecar, mostly
// first touches of the dataset's read-only mapping.
uint64_t MinorFaults(pid_t pid) { return StatField(pid, 10); }

// Context switches (voluntary + involuntary) of every thread of a process.
uint64_t ContextSwitches(pid_t pid) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "status");
    for (std::string l; std::getline(in, l);) {
      if (l.rfind("voluntary_ctxt_switches:", 0) == 0 || l.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        total += std::stoull(l.substr(l.find(':') + 1));
      }
    }
  }
  return total;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One meshload stream: a sidecar process started for it, this process
// consuming through the client.
struct MeshloadRun {
  bool ok = false;
  double rate = 0;       // samples/s while streaming
  double byte_rate = 0;  // bytes/s delivered while streaming
  double elapsed = 0, sidecar_cores = 0, consumer_cores = 0;
  double sidecar_cs = 0, consumer_cs = 0, sidecar_faults = 0;  // per step
  double ttfb = 0;
  std::vector<double> waits, handoff;
  Memory mem;
};

MeshloadRun RunMeshload(const Scenario& s, const std::string& job_path, const std::string& root) {
  MeshloadRun run;
  // meshload: a sidecar process, this process consumes through the client.
  const std::string sock = root + "/" + s.name + ".sock";
  std::string sidecar = SelfDir() + "/../../sidecar/meshload-sidecar";
  if (const char* e = std::getenv("MESHLOAD_SIDECAR_BIN")) sidecar = e;
  std::vector<std::string> args = {sidecar, "--job",     job_path, "--process",   "0",    "--socket",
                                   sock,    "--staging", "host",   "--log-level", "warn", "--reader-threads",
                                   "2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto launch = Clock::now();
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "FAILED: cannot start %s\n", sidecar.c_str());
    return run;
  }
  client::ClientOptions co;
  co.socket_path = sock;
  co.reconnect_backoff_initial = std::chrono::milliseconds(2);
  co.max_reconnect_attempts = 20;
  auto c = client::Client::Connect(co);
  if (!c.ok()) {
    std::fprintf(stderr, "FAILED to connect: %s\n", c.status().ToString().c_str());
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return run;
  }
  bool failed = false;  // the stream stopped early: this run's figures are not results
  auto first = (*c)->Next();
  run.ttfb = Since(launch);
  if (!first.ok()) {
    std::fprintf(stderr, "FAILED at the first step: %s\n", first.status().ToString().c_str());
    failed = true;
  }
  first = Status(StatusCode::kUnavailable, "released");
  const auto t0 = Clock::now();
  const double sidecar_cpu0 = CpuSeconds(pid), self_cpu0 = CpuSeconds(::getpid());
  const uint64_t sidecar_cs0 = ContextSwitches(pid), self_cs0 = ContextSwitches(::getpid());
  const uint64_t sidecar_faults0 = MinorFaults(pid);
  int64_t streamed = 0;  // steps received after the first
  uint64_t bytes = 0;
  for (int64_t t = 1; t < s.steps && !failed; ++t) {
    auto b = (*c)->Next();
    if (!b.ok()) {
      std::fprintf(stderr, "FAILED at step %lld: %s\n", static_cast<long long>(t), b.status().ToString().c_str());
      failed = true;
      break;
    }
    ++streamed;
    for (const auto& tensor : b->tensors) bytes += tensor.nbytes;
    run.waits.push_back(b->wait_seconds);
    g_sink = static_cast<const uint8_t*>(b->tensors[0].data)[0];  // the consumer sees the data
  }
  const double elapsed = Since(t0);
  const double sidecar_cpu = CpuSeconds(pid) - sidecar_cpu0, self_cpu = CpuSeconds(::getpid()) - self_cpu0;
  const double per_step = static_cast<double>(std::max<int64_t>(streamed, 1));
  run.sidecar_cs = static_cast<double>(ContextSwitches(pid) - sidecar_cs0) / per_step;
  run.sidecar_faults = static_cast<double>(MinorFaults(pid) - sidecar_faults0) / per_step;
  run.consumer_cs = static_cast<double>(ContextSwitches(::getpid()) - self_cs0) / per_step;
  run.rate = static_cast<double>(streamed * static_cast<int64_t>(s.batch)) / elapsed;
  run.byte_rate = static_cast<double>(bytes) / elapsed;
  run.elapsed = elapsed;
  run.sidecar_cores = sidecar_cpu / elapsed;
  run.consumer_cores = self_cpu / elapsed;
  // Handoff: a consumer slower than the loader finds every batch staged;
  // Next() then costs RELEASE of the previous slot + READY + receive.
  for (int i = 0; i < 300; ++i) {
    // 2 ms of "training" per step: longer than any scenario takes to stage a
    // batch, so the next one is always ready when Next() is called.
    std::this_thread::sleep_for(std::chrono::microseconds(2000));
    auto b = (*c)->Next();
    if (!b.ok()) break;
    run.handoff.push_back(b->wait_seconds);
  }
  run.mem = SidecarMemory(pid);
  (*c)->Close();
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  run.ok = !failed;
  return run;
}

// The Python baseline over the same batches (samples/s; 0 if it failed).
// The NumPy baseline's rate; a baseline that fails to run (no interpreter, no
// numpy, no script, or no rate printed) stops the program with its output:
// a ratio against a baseline that did not run would be meaningless.
double RunPython(const std::string& cmd) {
  double py_rate = 0;
  std::string output;
  int status = -1;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, p)) {
      if (std::strncmp(line, "samples_per_s=", 14) == 0) {
        py_rate = std::atof(line + 14);
      } else {
        std::fprintf(stderr, "python: %s", line);
        output += line;
      }
    }
    status = ::pclose(p);
  }
  if (status != 0 || !(py_rate > 0)) {
    std::fprintf(stderr,
                 "dataloader_bench: the NumPy baseline failed (exit status %d, %s):\n  %s\n%s"
                 "(set MESHLOAD_BENCH_PYTHON to a python3 with numpy)\n",
                 status, py_rate > 0 ? "a rate printed" : "no rate printed", cmd.c_str(), output.c_str());
    std::exit(1);
  }
  return py_rate;
}

void RunScenario(const Scenario& s, const std::string& root, int rounds) {
  const std::string dir = root + "/" + s.name;
  planner::DatasetSpec ds;
  ds.format = s.format;
  ds.record_bytes = static_cast<int64_t>(s.record_bytes);
  if (s.format == planner::DatasetFormat::kTokenStream) {
    ds.dtype = formats::DType::kUint16;
    ds.sequence_length = static_cast<int64_t>(s.seq);
  }
  const std::string file =
      dir + (s.format == planner::DatasetFormat::kFixedRecord ? "/part-00000.bin" : "/part-00000.tok");
  const uint64_t sample_bytes = s.format == planner::DatasetFormat::kFixedRecord ? s.record_bytes : (s.seq + 1) * 2;
  const uint64_t expect_size =
      s.format == planner::DatasetFormat::kFixedRecord ? s.samples * s.record_bytes : (s.samples * s.seq + 1) * 2;
  std::error_code ec;
  if (std::filesystem::file_size(file, ec) != expect_size) {
    auto g = tools::GenerateSyntheticDataset(ds, dir, s.samples, 1);
    if (!g.ok()) {
      std::fprintf(stderr, "generate: %s\n", g.status().ToString().c_str());
      return;
    }
  }
  const std::string job_path = root + "/" + s.name + ".yaml";
  std::ofstream(job_path) << JobYaml(s, dir);
  Diagnostics d;
  auto job = planner::LoadJobFile(job_path, d);
  if (!job.ok()) {
    std::fprintf(stderr, "%s%s\n", d.ToString().c_str(), job.status().ToString().c_str());
    return;
  }
  auto resolved = sidecar::source::ResolveReadingDataset(*job, {}, sidecar::source::Unreachable::kFail, d);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s", d.ToString().c_str());
    return;
  }
  planner::ShardPlanner planner(std::move(*resolved));
  std::vector<std::vector<uint64_t>> batches;
  for (int64_t t = 0; t < s.steps; ++t) batches.push_back(planner.GlobalBatch(t));

  // Page cache: read the whole file once, and map it (prefaulted).
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  const uint64_t size = std::filesystem::file_size(file);
  auto* map = static_cast<const uint8_t*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0));
  std::vector<uint8_t> buf(s.batch * sample_bytes);
  const uint64_t stride = s.format == planner::DatasetFormat::kFixedRecord ? s.record_bytes : s.seq * 2;

  // Ceilings on one thread, same batches.
  auto t0 = Clock::now();
  for (const auto& b : batches) {
    for (size_t k = 0; k < b.size(); ++k) {
      if (::pread(fd, buf.data() + k * sample_bytes, sample_bytes, static_cast<off_t>(b[k] * stride)) < 0) return;
    }
    g_sink = buf[0];
  }
  const double pread_rate = static_cast<double>(s.steps * static_cast<int64_t>(s.batch)) / Since(t0);
  t0 = Clock::now();
  for (const auto& b : batches) {
    for (size_t k = 0; k < b.size(); ++k) std::memcpy(buf.data() + k * sample_bytes, map + b[k] * stride, sample_bytes);
    g_sink = buf[1];
  }
  const double memcpy_rate = static_cast<double>(s.steps * static_cast<int64_t>(s.batch)) / Since(t0);
  // The same gathers on every core at once (batch i on thread i mod n, each
  // thread into its own buffer): no loader that copies each sample once into
  // a batch buffer can deliver more on this machine, whatever it overlaps.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  t0 = Clock::now();
  {
    std::vector<std::thread> threads;
    for (unsigned w = 0; w < cores; ++w) {
      threads.emplace_back([&, w] {
        std::vector<uint8_t> own(buf.size());
        for (size_t i = w; i < batches.size(); i += cores) {
          const auto& b = batches[i];
          for (size_t k = 0; k < b.size(); ++k)
            std::memcpy(own.data() + k * sample_bytes, map + b[k] * stride, sample_bytes);
          g_sink = own[1];
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  const double all_cores_rate = static_cast<double>(s.steps * static_cast<int64_t>(s.batch)) / Since(t0);
  // Zero-copy instead: each sample's pages mapped into one batch region
  // (mmap MAP_FIXED over the previous batch's), one byte per page touched.
  // Only where samples are whole pages at page offsets (FixedRecord here).
  double remap_rate = 0;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (s.format == planner::DatasetFormat::kFixedRecord && s.record_bytes % page == 0) {
    const size_t region_bytes = s.batch * sample_bytes;
    void* region = ::mmap(nullptr, region_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const size_t remap_steps = std::min<size_t>(batches.size(), 4000);  // 5 us a page: a few seconds at most
    bool ok = region != MAP_FAILED;
    t0 = Clock::now();
    for (size_t i = 0; i < remap_steps && ok; ++i) {
      const auto& b = batches[i];
      auto* base = static_cast<uint8_t*>(region);
      for (size_t k = 0; k < b.size() && ok; ++k) {
        ok = ::mmap(base + k * sample_bytes, sample_bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fd,
                    static_cast<off_t>(b[k] * stride)) != MAP_FAILED;
      }
      for (size_t at = 0; ok && at < region_bytes; at += page) g_sink = base[at];
    }
    if (ok) remap_rate = static_cast<double>(remap_steps * s.batch) / Since(t0);
    if (region != MAP_FAILED) ::munmap(region, region_bytes);
  }
  ::munmap(const_cast<uint8_t*>(map), size);
  ::close(fd);

  // The Python baseline reads the same batches from a file of ids.
  const std::string ids_path = root + "/" + s.name + "-ids.npy";
  {
    std::vector<uint64_t> flat;
    for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
    auto header = formats::MakeNpyHeader(formats::DType::kUint64, {static_cast<uint64_t>(batches.size()), s.batch});
    std::ofstream out(ids_path, std::ios::binary);
    out << *header;
    out.write(reinterpret_cast<const char*>(flat.data()), static_cast<std::streamsize>(flat.size() * 8));
  }
  // MESHLOAD_BENCH_PYTHON: another python3 with numpy (a machine whose
  // numpy is in a virtual environment).
  const char* py_env = std::getenv("MESHLOAD_BENCH_PYTHON");
  const std::string py_cmd =
      std::string(py_env && *py_env ? py_env : "/usr/bin/python3") + " " + SelfDir() +
      "/../../../tools/bench/numpy_baseline.py " +
      (s.format == planner::DatasetFormat::kFixedRecord ? "fixed " + file + " " + std::to_string(s.record_bytes)
                                                        : "tokens " + file + " uint16 " + std::to_string(s.seq)) +
      " " + ids_path + " 2>&1";

  // meshload and Python take turns, `rounds` times: the machine's speed
  // drifts by tens of percent between minutes, so each ratio compares runs
  // a few seconds apart, and the median round is the headline.
  std::vector<MeshloadRun> runs;
  std::vector<double> py_rates;
  int failed_round = 0;  // 1-based; 0: none failed
  for (int r = 0; r < rounds; ++r) {
    MeshloadRun run = RunMeshload(s, job_path, root);
    if (!run.ok) {
      failed_round = r + 1;
      g_failed = true;
      break;
    }
    runs.push_back(std::move(run));
    py_rates.push_back(RunPython(py_cmd));
  }
  if (runs.empty()) {
    std::printf("\n%s: FAILED in round 1 (see above): no figures\n", s.name.c_str());
    return;
  }
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto ratio = [&](size_t i) { return py_rates[i] > 0 ? runs[i].rate / py_rates[i] : 0.0; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratio(a) < ratio(b); });
  const size_t mid = order[order.size() / 2];  // the median round (the upper one of an even count)
  const MeshloadRun& m = runs[mid];
  const double ml_rate = m.rate, py_rate = py_rates[mid];
  std::vector<double> waits, handoff;
  double ttfb = 0;
  Memory mem;
  for (const auto& run : runs) {
    waits.insert(waits.end(), run.waits.begin(), run.waits.end());
    handoff.insert(handoff.end(), run.handoff.begin(), run.handoff.end());
    ttfb = std::max(ttfb, run.ttfb);
    mem.own = std::max(mem.own, run.mem.own);
    mem.file = std::max(mem.file, run.mem.file);
    mem.peak = std::max(mem.peak, run.mem.peak);
  }

  const double batch_mb = static_cast<double>(s.batch * sample_bytes) / 1048576.0;
  const double bound = static_cast<double>(s.prefetch) * static_cast<double>(s.batch * sample_bytes) + 64.0 * 1048576;
  std::printf("\n%s: %llu samples x %llu B, batch %llu (%.2f MiB), %lld steps, prefetch %lld\n", s.name.c_str(),
              static_cast<unsigned long long>(s.samples), static_cast<unsigned long long>(sample_bytes),
              static_cast<unsigned long long>(s.batch), batch_mb, static_cast<long long>(s.steps),
              static_cast<long long>(s.prefetch));
  auto gbs = [&](double rate) { return rate * static_cast<double>(sample_bytes) / 1e9; };
  std::printf("  ceiling, 1 thread pread (shuffled)   %11.0f samples/s  %6.2f GB/s\n", pread_rate, gbs(pread_rate));
  std::printf("  ceiling, 1 thread memcpy (shuffled)  %11.0f samples/s  %6.2f GB/s\n", memcpy_rate, gbs(memcpy_rate));
  std::printf("  ceiling, %u threads memcpy (all cores)%11.0f samples/s  %6.2f GB/s\n", cores, all_cores_rate,
              gbs(all_cores_rate));
  if (remap_rate > 0) {
    std::printf("  ceiling, 1 thread page remap (0 copy)%11.0f samples/s  %6.2f GB/s\n", remap_rate, gbs(remap_rate));
  }
  std::printf("  python numpy memmap + gather         %11.0f samples/s  %6.2f GB/s  (median round)\n", py_rate,
              gbs(py_rate));
  std::printf("  meshload (sidecar -> this process)   %11.0f samples/s  %6.2f GB/s  (median round)\n", ml_rate,
              gbs(ml_rate));
  std::printf(
      "    = %.2fx pread ceiling%s, %.2fx memcpy ceiling, %.2fx python%s\n", ml_rate / pread_rate,
      s.target_vs_pread > 0 ? (" (target >= " + std::to_string(s.target_vs_pread).substr(0, 4) + ")").c_str() : "",
      ml_rate / memcpy_rate, py_rate > 0 ? ml_rate / py_rate : 0.0,
      s.target_vs_python > 0 ? (" (target >= " + std::to_string(s.target_vs_python).substr(0, 3) + ")").c_str() : "");
  if (s.target_vs_python > 0 && py_rate > 0) {
    // What the target asks for, against what the machine can copy at all.
    const double needed = s.target_vs_python * py_rate;
    std::printf("    target %.1fx python = %.0f samples/s = %.2fx the all-cores memcpy ceiling", s.target_vs_python,
                needed, needed / all_cores_rate);
    if (remap_rate > 0) std::printf(", %.1fx the remap ceiling", needed / remap_rate);
    std::printf("%s\n", needed > all_cores_rate && needed > remap_rate * cores
                            ? " (beyond what this machine can deliver, copied or mapped)"
                            : "");
  }
  std::printf("  rounds (meshload / python, x python) ");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::printf("%s%.0fk / %.0fk = %.2fx", i ? ", " : "", runs[i].rate / 1e3, py_rates[i] / 1e3, ratio(i));
  }
  if (failed_round > 0) std::printf(", round %d FAILED (see above)", failed_round);
  std::printf("\n");
  std::printf("  CPU while streaming                  sidecar %.2f cores, consumer %.2f cores (%.2f s, median round)\n",
              m.sidecar_cores, m.consumer_cores, m.elapsed);
  std::printf("  context switches per step            sidecar %.2f, consumer %.2f (median round)\n", m.sidecar_cs,
              m.consumer_cs);
  std::printf(
      "  page faults per step                 sidecar %.2f (first touches of the dataset mapping; median round)\n",
      m.sidecar_faults);
  std::printf("  trainer wait while streaming         p50 %.1f us, p99 %.1f us (all rounds)\n",
              Quantile(waits, 0.5) * 1e6, Quantile(waits, 0.99) * 1e6);
  std::printf("  handoff, batch already staged        p50 %.1f us, p99 %.1f us (target p99 < 50 us, all rounds)\n",
              Quantile(handoff, 0.5) * 1e6, Quantile(handoff, 0.99) * 1e6);
  std::printf(
      "  time to first batch                  %.1f ms (target < 1000 ms, sidecar start-up included; worst round)\n",
      ttfb * 1e3);
  std::printf("  sidecar memory: own (anon + slots)   %.1f MiB (bound prefetch x batch + 64 MiB = %.1f MiB)\n",
              static_cast<double>(mem.own) / 1048576.0, bound / 1048576.0);
  std::printf("    mapped page cache (RssFile)        %.1f MiB; peak RSS (VmHWM) %.1f MiB\n",
              static_cast<double>(mem.file) / 1048576.0, static_cast<double>(mem.peak) / 1048576.0);
}

// A Megatron indexed dataset (one .bin and its .idx in `dir`) of `n`
// sequences of `elem`-byte elements whose sizes are spread evenly over
// [min_bytes, max_bytes] (seeded, whole elements). Returns the mean bytes.
double WriteMegatron(const std::string& dir, uint64_t n, uint64_t min_bytes, uint64_t max_bytes, formats::DType dtype) {
  std::filesystem::create_directories(dir);
  formats::MegatronIndex index;
  formats::MegatronDTypeFor(dtype, index.dtype);
  const uint64_t es = formats::DTypeSize(dtype);
  auto size_of = [&](uint64_t i) {
    return (min_bytes + planner::Mix64(i + 77) % (max_bytes - min_bytes + 1)) / es * es;
  };
  uint64_t total = 0;
  for (uint64_t i = 0; i < n; ++i) total += size_of(i);
  // Written once: a file rewritten before every run would still be in
  // writeback while the first rounds read it.
  std::error_code ec;
  if (std::filesystem::file_size(dir + "/docs.bin", ec) == total && std::filesystem::exists(dir + "/docs.idx")) {
    return static_cast<double>(total) / static_cast<double>(n);
  }
  std::ofstream bin(dir + "/docs.bin", std::ios::binary | std::ios::trunc);
  // Written in 4 MiB pieces, as the fixed-size peer's generator writes: the
  // page cache then holds both files in folios of the same sizes, and
  // neither pays more page faults for how it was written.
  std::vector<char> buf;
  buf.reserve(5 << 20);
  int64_t at = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t bytes = size_of(i);
    const size_t from = buf.size();
    buf.resize(from + bytes);
    for (uint64_t j = 0; j < bytes; j += 8) {
      const uint64_t w = planner::Mix64(i * 1315423911ull + j);
      std::memcpy(buf.data() + from + j, &w, std::min<uint64_t>(8, bytes - j));
    }
    if (buf.size() >= (4u << 20) || i + 1 == n) {
      bin.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
    index.lengths.push_back(static_cast<int32_t>(bytes / es));
    index.pointers.push_back(at);
    index.document_indices.push_back(static_cast<int64_t>(i));
    at += static_cast<int64_t>(bytes);
  }
  index.document_indices.push_back(static_cast<int64_t>(n));
  std::ofstream(dir + "/docs.idx", std::ios::binary | std::ios::trunc) << formats::MegatronIndexBytes(index);
  return static_cast<double>(at) / static_cast<double>(n);
}

// `rounds` runs of two jobs, which goes first alternating (neither always
// gets the warmer machine); `each(a, b)` takes every round's pair. False,
// having said so, when a run failed.
template <typename Each>
bool AlternatingRounds(const std::string& name, int rounds, const Scenario& a, const std::string& a_job,
                       const Scenario& b, const std::string& b_job, const std::string& root, Each each) {
  for (int r = 0; r < rounds; ++r) {
    MeshloadRun x, y;
    if (r % 2 == 0) {
      x = RunMeshload(a, a_job, root);
      y = RunMeshload(b, b_job, root);
    } else {
      y = RunMeshload(b, b_job, root);
      x = RunMeshload(a, a_job, root);
    }
    if (!x.ok || !y.ok) {
      std::printf("\n%s: FAILED in round %d (see above)\n", name.c_str(), r + 1);
      g_failed = true;
      return false;
    }
    each(x, y);
  }
  return true;
}

// Variable-size samples against fixed-size samples of the same mean size,
// the same batch and the same bytes in all, in one run: meshload's bytes/s
// for each, alternating `rounds` times (median ratio).
void RunVariableVsFixed(const std::string& name, const std::string& root, uint64_t min_bytes, uint64_t max_bytes,
                        formats::DType dtype, uint64_t total_bytes, uint64_t batch, int64_t steps, int rounds) {
  const uint64_t n = total_bytes / ((min_bytes + max_bytes) / 2);
  Scenario var{name, planner::DatasetFormat::kMegatronIndexed, 0, 0, batch, n, steps, 4, 0, 0};
  const std::string var_dir = root + "/" + name;
  const double mean = WriteMegatron(var_dir, n, min_bytes, max_bytes, dtype);
  const uint64_t record = static_cast<uint64_t>(mean + 0.5);
  Scenario fixed{name + "-fixed", planner::DatasetFormat::kFixedRecord, record, 0, batch, n, steps, 4, 0, 0};
  const std::string fixed_dir = root + "/" + fixed.name;
  std::error_code ec;
  if (std::filesystem::file_size(fixed_dir + "/part-00000.bin", ec) != n * record) {
    planner::DatasetSpec ds;
    ds.format = planner::DatasetFormat::kFixedRecord;
    ds.record_bytes = static_cast<int64_t>(record);
    if (auto g = tools::GenerateSyntheticDataset(ds, fixed_dir, n, 1); !g.ok()) {
      std::fprintf(stderr, "generate: %s\n", g.status().ToString().c_str());
      g_failed = true;
      return;
    }
  }
  const std::string var_job = root + "/" + var.name + ".yaml", fixed_job = root + "/" + fixed.name + ".yaml";
  std::ofstream(var_job) << JobYaml(var, var_dir);
  std::ofstream(fixed_job) << JobYaml(fixed, fixed_dir);
  std::vector<double> ratios;
  std::vector<std::pair<double, double>> rates;  // (variable, fixed) bytes/s
  std::vector<double> var_waits;
  const bool ok = AlternatingRounds(name, rounds, var, var_job, fixed, fixed_job, root,
                                    [&](const MeshloadRun& v, const MeshloadRun& f) {
                                      rates.emplace_back(v.byte_rate, f.byte_rate);
                                      ratios.push_back(v.byte_rate / f.byte_rate);
                                      var_waits.insert(var_waits.end(), v.waits.begin(), v.waits.end());
                                    });
  if (!ok) return;
  std::vector<size_t> order(ratios.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratios[a] < ratios[b]; });
  const size_t mid = order[order.size() / 2];
  std::printf("\n%s: %llu MegatronIndexed sequences of %llu to %llu B (%s, mean %.0f B), batch %llu, %lld steps\n",
              name.c_str(), static_cast<unsigned long long>(n), static_cast<unsigned long long>(min_bytes),
              static_cast<unsigned long long>(max_bytes), std::string(formats::DTypeName(dtype)).c_str(), mean,
              static_cast<unsigned long long>(batch), static_cast<long long>(steps));
  std::printf("  peer: FixedRecord of %llu B (the same mean), the same batch, steps and bytes, in the same run\n",
              static_cast<unsigned long long>(record));
  std::printf("  meshload, variable-size (ragged)     %6.2f GB/s  (median round)\n", rates[mid].first / 1e9);
  std::printf("  meshload, fixed-size                 %6.2f GB/s  (median round)\n", rates[mid].second / 1e9);
  std::printf("    = %.2fx the fixed-size bytes/s (target >= 0.90)\n", ratios[mid]);
  std::printf("  rounds (variable / fixed GB/s)       ");
  for (size_t i = 0; i < rates.size(); ++i) {
    std::printf("%s%.2f / %.2f = %.2fx", i ? ", " : "", rates[i].first / 1e9, rates[i].second / 1e9, ratios[i]);
  }
  std::printf("\n  trainer wait, variable-size          p50 %.1f us, p99 %.1f us (all rounds)\n",
              Quantile(var_waits, 0.5) * 1e6, Quantile(var_waits, 0.99) * 1e6);
}

// A mixture of three MegatronIndexed corpora (spec.mixture, weights
// 0.5/0.3/0.2) against one corpus of the same documents' sizes, the same
// batch and steps, in one run: the sidecar's and the consumer's CPU per step
// (median of `rounds` alternating rounds). Target: mixing adds at most 10%.
void RunMixedVsSingle(const std::string& name, const std::string& root, uint64_t total_bytes, int64_t steps,
                      int rounds) {
  const uint64_t min_bytes = 200, max_bytes = 16000;
  const uint64_t n = total_bytes / ((min_bytes + max_bytes) / 2);
  const std::string dir = root + "/" + name;
  const char* names[] = {"web", "code", "books"};
  for (const char* c : names) WriteMegatron(dir + "/" + c, n / 3, min_bytes, max_bytes, formats::DType::kUint16);
  // The peer reads as many bytes in all, from one corpus.
  WriteMegatron(dir + "-single", n, min_bytes, max_bytes, formats::DType::kUint16);
  Scenario single{name + "-single", planner::DatasetFormat::kMegatronIndexed, 0, 0, 32, n, steps, 4, 0, 0};
  Scenario mixed{name, planner::DatasetFormat::kMegatronIndexed, 0, 0, 32, n, steps, 4, 0, 0};
  const std::string single_job = root + "/" + single.name + ".yaml", mixed_job = root + "/" + mixed.name + ".yaml";
  std::ofstream(single_job) << JobYaml(single, dir + "-single");
  std::string yaml = JobYaml(mixed, dir);
  yaml +=
      "  mixture:\n    datasets:\n"
      "      - {name: web, uri: web, weight: 0.5}\n"
      "      - {name: code, uri: code, weight: 0.3}\n"
      "      - {name: books, uri: books, weight: 0.2}\n";
  std::ofstream(mixed_job) << yaml;
  struct PerStep {
    double sidecar_us, consumer_us, rate;
  };
  std::vector<std::pair<PerStep, PerStep>> results;  // (mixed, single)
  auto per_step = [&](const MeshloadRun& r) {
    return PerStep{r.sidecar_cores * r.elapsed / static_cast<double>(steps) * 1e6,
                   r.consumer_cores * r.elapsed / static_cast<double>(steps) * 1e6, r.rate};
  };
  if (!AlternatingRounds(
          name, rounds, mixed, mixed_job, single, single_job, root,
          [&](const MeshloadRun& m, const MeshloadRun& s) { results.emplace_back(per_step(m), per_step(s)); })) {
    return;
  }
  auto cpu = [](const PerStep& p) { return p.sidecar_us + p.consumer_us; };
  std::sort(results.begin(), results.end(),
            [&](const auto& a, const auto& b) { return cpu(a.first) / cpu(a.second) < cpu(b.first) / cpu(b.second); });
  const auto& [m, s] = results[results.size() / 2];
  std::printf(
      "\n%s: 3 MegatronIndexed corpora of %llu sequences each (200 to 16,000 B), weights 0.5/0.3/0.2,\n"
      "batch 32, %lld steps\n",
      name.c_str(), static_cast<unsigned long long>(n / 3), static_cast<long long>(steps));
  std::printf("  peer: one corpus of %llu such sequences (as many bytes), the same batch and steps, in the same run\n",
              static_cast<unsigned long long>(n));
  std::printf("  CPU per step, mixed                  sidecar %.1f us + consumer %.1f us  (%.0f samples/s)\n",
              m.sidecar_us, m.consumer_us, m.rate);
  std::printf("  CPU per step, one corpus             sidecar %.1f us + consumer %.1f us  (%.0f samples/s)\n",
              s.sidecar_us, s.consumer_us, s.rate);
  std::printf("    = %.2fx the one corpus's CPU per step (median of %zu rounds; target <= 1.10)\n", cpu(m) / cpu(s),
              results.size());
}

// Rows of tokens (spec.tokens) against TokenStream windows of the same
// tokens: one MegatronIndexed corpus of 100 to 4,000-token documents read
// as Pack and as Concatenate rows of 2,048 tokens, and its .bin file read as
// a TokenStream of 2,048 + 1-token samples, batch 32, in one run: the
// sidecar's and the consumer's CPU per step (median of `rounds` alternating
// rounds). Target: rows cost at most 10% more CPU a step.
void RunRowsVsTokenStream(const std::string& name, const std::string& root, uint64_t total_bytes, int64_t steps,
                          int rounds) {
  const uint64_t min_bytes = 200, max_bytes = 8000;
  const uint64_t n = total_bytes / ((min_bytes + max_bytes) / 2);
  const std::string dir = root + "/" + name;
  WriteMegatron(dir, n, min_bytes, max_bytes, formats::DType::kUint16);
  const uint64_t tokens = std::filesystem::file_size(dir + "/docs.bin") / 2;
  Scenario stream{
      name + "-tokenstream", planner::DatasetFormat::kTokenStream, 0, 2048, 32, tokens / 2048, steps, 4, 0, 0};
  Scenario rows{name, planner::DatasetFormat::kMegatronIndexed, 0, 0, 32, n, steps, 4, 0, 0};
  const std::string stream_job = root + "/" + stream.name + ".yaml";
  std::ofstream(stream_job) << JobYaml(stream, dir + "/docs.bin");
  struct PerStep {
    double sidecar_us, consumer_us, rate;
  };
  auto per_step = [&](const MeshloadRun& r) {
    return PerStep{r.sidecar_cores * r.elapsed / static_cast<double>(steps) * 1e6,
                   r.consumer_cores * r.elapsed / static_cast<double>(steps) * 1e6, r.rate};
  };
  auto cpu = [](const PerStep& p) { return p.sidecar_us + p.consumer_us; };
  std::printf(
      "\n%s: %llu MegatronIndexed documents of 100 to 4,000 uint16 tokens (%llu tokens), rows of 2,048\n"
      "tokens, batch 32, %lld steps\n",
      name.c_str(), static_cast<unsigned long long>(n), static_cast<unsigned long long>(tokens),
      static_cast<long long>(steps));
  std::printf(
      "  peer: the same .bin read as TokenStream samples of 2,048 + 1 tokens, the same batch and steps,\n"
      "  in the same run\n");
  for (const char* mode : {"Pack", "Concatenate"}) {
    const std::string job = root + "/" + name + "-" + mode + ".yaml";
    std::string yaml = JobYaml(rows, dir);
    yaml += std::string("  tokens: {mode: ") + mode +
            ", sequenceLength: 2048, endOfDocument: {token: 0, append: Always}" +
            (std::string(mode) == "Pack" ? ", padToken: 0" : "") + "}\n";
    std::ofstream(job) << yaml;
    std::vector<std::pair<PerStep, PerStep>> results;  // (rows, stream)
    if (!AlternatingRounds(
            name + "-" + mode, rounds, rows, job, stream, stream_job, root,
            [&](const MeshloadRun& r, const MeshloadRun& t) { results.emplace_back(per_step(r), per_step(t)); })) {
      return;
    }
    std::sort(results.begin(), results.end(), [&](const auto& a, const auto& b) {
      return cpu(a.first) / cpu(a.second) < cpu(b.first) / cpu(b.second);
    });
    const auto& [r, t] = results[results.size() / 2];
    std::printf("  CPU per step, %-11s            sidecar %.1f us + consumer %.1f us  (%.0f rows/s)\n", mode,
                r.sidecar_us, r.consumer_us, r.rate);
    std::printf("  CPU per step, TokenStream            sidecar %.1f us + consumer %.1f us  (%.0f samples/s)\n",
                t.sidecar_us, t.consumer_us, t.rate);
    std::printf("    = %.2fx TokenStream's CPU per step (median of %zu rounds; target <= 1.10)\n", cpu(r) / cpu(t),
                results.size());
  }
}

int Main(int argc, char** argv) {
  bool quick = false;
  std::string only;                 // --only NAME: one scenario
  std::optional<int64_t> rounds;    // --rounds N: meshload and Python alternate N times; default 3, 1 with --quick
  std::optional<int64_t> prefetch;  // --prefetch N: every scenario's slots
  std::string root = "/tmp/meshload-bench";
  FlagParser flags("",
                   "usage: dataloader_bench [--quick] [--dir DIR] [--only fixed-1MiB|fixed-4KiB|tokens-u16-2048|"
                   "docs-u16-100-8000|blobs-u8-20-500KiB|docs-mixture-3|rows-u16-2048]"
                   " [--rounds N] [--prefetch N]\n",
                   "dataloader_bench");
  flags.Bool({"--quick"}, &quick);
  flags.String({"--dir"}, &root);
  flags.String({"--only"}, &only);
  flags.OptionalInt({"--rounds"}, &rounds);
  flags.OptionalInt({"--prefetch"}, &prefetch);
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  if (rounds && (*rounds < 1 || *rounds > 100)) {
    return UsageError("--rounds must be 1..100, got " + std::to_string(*rounds), "dataloader_bench");
  }
  if (prefetch && (*prefetch < 1 || *prefetch > 64)) {
    return UsageError("--prefetch must be 1..64, got " + std::to_string(*prefetch), "dataloader_bench");
  }
  const int round_count = rounds ? static_cast<int>(*rounds) : (quick ? 1 : 3);
  std::filesystem::create_directories(root);
  const uint64_t gib = quick ? 256ull << 20 : 1ull << 30;
  std::vector<Scenario> scenarios = {
      {"fixed-1MiB", planner::DatasetFormat::kFixedRecord, 1 << 20, 0, 16, gib >> 20, quick ? 64 : 256, 4, 0.70, 0},
      {"fixed-4KiB", planner::DatasetFormat::kFixedRecord, 4096, 0, 32, gib >> 12, quick ? 2000 : 24000, 4, 0, 0},
      {"tokens-u16-2048", planner::DatasetFormat::kTokenStream, 0, 2048, 32, gib / 4096, quick ? 2000 : 24000, 4, 0, 0},
  };
  if (prefetch) {
    for (auto& s : scenarios) s.prefetch = *prefetch;
  }
  const std::vector<std::string> variable = {"docs-u16-100-8000", "blobs-u8-20-500KiB", "docs-mixture-3",
                                             "rows-u16-2048"};
  if (!only.empty() &&
      std::none_of(scenarios.begin(), scenarios.end(), [&](const Scenario& s) { return s.name == only; }) &&
      std::find(variable.begin(), variable.end(), only) == variable.end()) {
    return UsageError("--only: no scenario named " + only +
                          " (fixed-1MiB, fixed-4KiB, tokens-u16-2048, docs-u16-100-8000, blobs-u8-20-500KiB, "
                          "docs-mixture-3, rows-u16-2048)",
                      "dataloader_bench");
  }
  std::printf("meshload host data path benchmark%s (data in %s)\n", quick ? " (quick)" : "", root.c_str());
  for (const auto& s : scenarios) {
    if (only.empty() || s.name == only) RunScenario(s, root, round_count);
  }
  // Variable-size samples: token documents of 100 to 8,000 tokens, and
  // blobs of 20 to 500 KiB (the sizes of encoded images), each against
  // fixed-size samples of the same mean.
  if (only.empty() || only == variable[0]) {
    RunVariableVsFixed(variable[0], root, 200, 16000, formats::DType::kUint16, gib, 32, quick ? 2000 : 8000,
                       round_count);
  }
  if (only.empty() || only == variable[1]) {
    RunVariableVsFixed(variable[1], root, 20 << 10, 500 << 10, formats::DType::kUint8, gib, 16, quick ? 300 : 1500,
                       round_count);
  }
  if (only.empty() || only == variable[2]) {
    RunMixedVsSingle(variable[2], root, gib, quick ? 2000 : 8000, std::max(round_count, 3));
  }
  if (only.empty() || only == variable[3]) {
    RunRowsVsTokenStream(variable[3], root, gib, quick ? 2000 : 8000, std::max(round_count, 3));
  }
  if (g_failed) {
    std::printf("\nFAILED: a round stopped early (see above); the figures printed cover the rounds before it\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace meshload::tools::bench

int main(int argc, char** argv) { return meshload::tools::bench::Main(argc, argv); }
