// GPU staging end to end: the VMM slot pool, the fence before READY, the fd
// handoff and its one-time import, UUID mapping between the sidecar's and
// the trainer's device numbering, the legacy IPC mode, local replicas by
// device copy, and a sidecar restart under a connected trainer.
//
// By default the driver is tests/testing/fake_cuda.cc (host memory behind
// the real driver API), so these paths run in CI on machines without a GPU;
// every byte is read back through the driver (cuMemcpyDtoH), never through
// the device pointer, so the same tests run unchanged on a real GPU with
// MESHLOAD_GPU_TESTS=real (scripts/gpu-check). Tests that need the stand-in
// (several fake GPUs, GPUs the trainer cannot see) skip there, saying so.
// The jobs use two devices per process where there are two GPUs (always
// with the stand-in) and one on a single-GPU machine, so the handoff, the
// faults and the restart run on any real GPU; only local replicas need two.
#include <dlfcn.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "sidecar/source/dataset_facts.h"
#include "sidecar/source/record_values.h"
#include "client/client.h"
#include "common/cuda/driver.h"
#include "protocol/protocol.h"
#include "protocol/seqpacket.h"
#include "sidecar/sidecar.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/metrics_scrape.h"
#include "tools/synthetic_dataset.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace meshload::sidecar {
namespace {

using meshload::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// The stand-in's devices as this test process sees them (C, B, A); the
// sidecar processes below see them as A, B, C.
constexpr const char* kGpuA = "GPU-aaaaaaaa-0000-4000-8000-000000000001";
constexpr const char* kGpuB = "GPU-bbbbbbbb-0000-4000-8000-000000000002";
constexpr const char* kGpuC = "GPU-cccccccc-0000-4000-8000-000000000003";

bool RealGpu() {
  const char* v = std::getenv("MESHLOAD_GPU_TESTS");
  return v && std::string(v) == "real";
}

const cuda::Driver* DriverOrNull() {
  auto d = cuda::Driver::Open();
  return d.ok() ? *d : nullptr;
}

#define REQUIRE_DRIVER()                                                                           \
  const cuda::Driver* driver = DriverOrNull();                                                     \
  if (driver == nullptr) {                                                                         \
    GTEST_SKIP() << "no CUDA driver (" << cuda::Driver::Open().status().message() << "): skipped"; \
  }

#define REQUIRE_STAND_IN()                                                                                     \
  if (RealGpu()) {                                                                                             \
    GTEST_SKIP() << "needs the stand-in driver's devices (several GPUs, unseen UUIDs): skipped on a real GPU"; \
  }                                                                                                            \
  do {                                                                                                         \
  } while (0)

// Local devices per process in GpuJob: 2 with the stand-in, else as many
// GPUs as the driver sees, at most 2.
int JobDevices() {
  if (!RealGpu()) return 2;
  const cuda::Driver* d = DriverOrNull();
  return d == nullptr ? 2 : static_cast<int>(std::min<size_t>(2, d->devices().size()));
}

// The sidecar binary: MESHLOAD_SIDECAR_BIN (scripts/gpu-check runs a bundle
// away from the build tree), else the one this build made.
std::string SidecarBin() {
  const char* e = std::getenv("MESHLOAD_SIDECAR_BIN");
  return e && *e ? e : MESHLOAD_SIDECAR_BIN;
}

#define REQUIRE_TWO_GPUS()                                                          \
  REQUIRE_DRIVER();                                                                 \
  if (driver->devices().size() < 2) {                                               \
    GTEST_SKIP() << "needs 2 GPUs, this process sees " << driver->devices().size(); \
  }                                                                                 \
  do {                                                                              \
  } while (0)

// A sidecar process's environment: with the stand-in, the two GPUs this
// process sees as its 0 and 1 (C, B); a real driver's own GPUs otherwise.
std::vector<std::string> TwoGpuEnv() {
  if (RealGpu()) return {};
  return {std::string("MESHLOAD_FAKE_CUDA_DEVICES=") + kGpuC + "," + kGpuB};
}

// Imports the stand-in has made in this process (its own counter).
int64_t FakeImports() {
  if (RealGpu()) return -1;
  void* h = ::dlopen(MESHLOAD_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return -1;
  auto fn = reinterpret_cast<uint64_t (*)()>(::dlsym(h, "meshload_fake_cuda_imports"));
  return fn ? static_cast<int64_t>(fn()) : -1;
}

// `format`: the dataset's format lines (FixedRecord of 4096 B when empty).
std::string JobYaml(const std::string& uri, bool replicas, int devices, const std::string& format) {
  const std::string mesh = replicas ? "    axes: [{name: data, size: 2}, {name: model, size: 2}]\n"
                                      "    batchAxes: [data]\n"
                                    : "    axes: [{name: data, size: " + std::to_string(2 * devices) + "}]\n";
  return "apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nmetadata: {name: gpu-test}\nspec:\n"
         "  mesh:\n    processes: 2\n    devicesPerProcess: " +
         std::to_string(devices) + "\n" + mesh + (replicas ? "  replication: {mode: Partial, fanout: Load}\n" : "") +
         "  strategy: PerProcess\n"
         "  dataset:\n    uri: " +
         uri + "\n" + (format.empty() ? "    format: FixedRecord\n    recordBytes: 4096\n" : format) +
         "  batch: {globalBatchSize: 16, prefetch: 3}\n"
         "  shuffle: {mode: Global, seed: 11}\n";
}

// An in-process sidecar serving until destroyed.
class RunningSidecar {
 public:
  explicit RunningSidecar(std::unique_ptr<Sidecar> s) : s_(std::move(s)), thread_([this] { s_->Run(); }) {}
  ~RunningSidecar() {
    s_->RequestStop();
    thread_.join();
  }
  const std::string& staging_reason() const { return s_->staging_reason(); }
  std::string Metrics() { return meshload::testing::ScrapeMetrics(s_->metrics_port()); }
  double Metric(const std::string& series) { return meshload::testing::SampleValue(Metrics(), series); }

 private:
  std::unique_ptr<Sidecar> s_;
  std::thread thread_;
};

class GpuJob {
 public:
  // `devices`: local devices per process; 0: JobDevices() (2 with replicas).
  // `ragged`: a MegatronIndexed dataset (variable-size samples); `fields`:
  // a WebDataset of a field of bytes (jpg) and a decoded one (cls, int64).
  explicit GpuJob(bool replicas = false, int devices = 0, bool ragged = false, bool fields = false)
      : devices_(devices > 0 ? devices
                 : replicas  ? 2
                             : JobDevices()) {
    planner::DatasetSpec ds;
    ds.format = ragged   ? planner::DatasetFormat::kMegatronIndexed
                : fields ? planner::DatasetFormat::kWebDataset
                         : planner::DatasetFormat::kFixedRecord;
    if (!ragged && !fields) ds.record_bytes = 4096;
    if (fields) ds.fields = {{"jpg", std::nullopt}, {"cls", formats::DType::kInt64}};
    auto u = tools::GenerateSyntheticDataset(ds, dir_.path() + "/data", 320, 2);
    EXPECT_OK(u);
    const std::string format = ragged ? "    format: MegatronIndexed\n"
                               : fields
                                   ? "    format: WebDataset\n    fields: [{name: jpg}, {name: cls, dtype: int64}]\n"
                                   : "";
    job_path_ = dir_.Write("job.yaml", JobYaml(*u, replicas, devices_, format));
    socket_ = dir_.path() + "/s.sock";
    Diagnostics d;
    auto r = source::ResolveReadingDataset(testing::MustLoad(job_path_), {}, source::Unreachable::kFail, d);
    EXPECT_OK(r) << d.ToString();
    planner_ = std::make_unique<planner::ShardPlanner>(std::move(*r));
  }

  // Reads every tensor back through the driver and checks it against the
  // plan and the synthetic bytes.
  void ExpectOnGpuAndPlanned(const client::Batch& b, const cuda::Driver& driver) {
    const planner::StepPlan plan = planner_->PlanStep(b.step, planner_->DefaultLoading(), 1);
    if (planner_->job().dataset.record_format()) return ExpectFieldsOnGpu(b, plan, driver);
    ASSERT_EQ(b.tensors.size(), static_cast<size_t>(devices_));
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      const client::Tensor& t = b.tensors[i];
      EXPECT_EQ(t.device_type, 2);  // kDLCUDA
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 256, 0u);
      const auto& ids = plan.devices[i].samples;
      ASSERT_EQ(t.ids_checksum, protocol::SampleIdsChecksum(ids.data(), ids.size()));
      std::vector<uint8_t> host(t.nbytes);
      ASSERT_OK(driver.CopyToHost(host.data(), reinterpret_cast<uintptr_t>(t.data), t.nbytes, t.device_id));
      const planner::DatasetIndex& ds = planner_->job().dataset;
      std::vector<int64_t> offsets;
      if (ds.variable_size()) {
        // Ragged: the offsets are on the device too, before the values.
        ASSERT_NE(t.offsets, nullptr);
        ASSERT_EQ(t.samples, ids.size());
        EXPECT_EQ(ds.BytesOf(ids.data(), ids.size()), t.nbytes);
        offsets.resize(ids.size() + 1);
        ASSERT_OK(driver.CopyToHost(offsets.data(), reinterpret_cast<uintptr_t>(t.offsets),
                                    offsets.size() * sizeof(int64_t), t.device_id));
      }
      uint64_t at = 0;
      for (size_t k = 0; k < ids.size(); ++k) {
        if (ds.variable_size()) {
          ASSERT_EQ(static_cast<uint64_t>(offsets[k]) * 2, at) << "offset " << k;
        }
        ASSERT_EQ(tools::FirstMismatch(ds, ids[k], host.data() + at), -1)
            << "step " << b.step << " device " << i << " sample " << ids[k];
        at += ds.variable_size() ? ds.SampleBytes(ids[k]) : 4096;
      }
      if (ds.variable_size()) {
        EXPECT_EQ(static_cast<uint64_t>(offsets[ids.size()]) * 2, at);
      }
    }
  }

  // A WebDataset batch: per device a ragged jpg and a dense cls tensor,
  // both on the GPU, each sample's values those its record decodes to
  // (read here through the file source).
  void ExpectFieldsOnGpu(const client::Batch& b, const planner::StepPlan& plan, const cuda::Driver& driver) {
    const planner::DatasetIndex& ds = planner_->job().dataset;
    ASSERT_EQ(b.tensors.size(), 2u * static_cast<size_t>(devices_));
    auto sources = source::SourceRegistry::WithBuiltins({});
    std::vector<planner::Extent> scratch;
    const auto decoder = source::RecordDecoderOf(ds);
    const std::vector<std::string> names = source::RecordFileNames(ds);
    for (int d = 0; d < devices_; ++d) {
      const client::Tensor& jpg = b.tensors[2 * static_cast<size_t>(d)];
      const client::Tensor& cls = b.tensors[2 * static_cast<size_t>(d) + 1];
      const auto& ids = plan.devices[static_cast<size_t>(d)].samples;
      ASSERT_EQ(jpg.field, "jpg");
      ASSERT_EQ(cls.field, "cls");
      EXPECT_EQ(jpg.device_type, 2);
      EXPECT_EQ(cls.device_type, 2);
      ASSERT_NE(jpg.offsets, nullptr);
      ASSERT_EQ(jpg.samples, ids.size());
      ASSERT_EQ(cls.shape, std::vector<int64_t>{static_cast<int64_t>(ids.size())});
      std::vector<uint8_t> values(jpg.nbytes);
      std::vector<int64_t> offsets(ids.size() + 1), classes(ids.size());
      ASSERT_OK(driver.CopyToHost(values.data(), reinterpret_cast<uintptr_t>(jpg.data), jpg.nbytes, jpg.device_id));
      ASSERT_OK(driver.CopyToHost(offsets.data(), reinterpret_cast<uintptr_t>(jpg.offsets),
                                  offsets.size() * sizeof(int64_t), jpg.device_id));
      ASSERT_OK(driver.CopyToHost(classes.data(), reinterpret_cast<uintptr_t>(cls.data), cls.nbytes, cls.device_id));
      for (size_t k = 0; k < ids.size(); ++k) {
        const source::RecordPlace place = source::PlaceOfRecord(ds, ids[k], scratch, names);
        std::string record(place.bytes, '\0');
        auto found = sources->For(ds.files()[place.file].path);
        ASSERT_OK(found);
        ASSERT_OK(found->first->Read(found->second, place.offset, record.data(), record.size()));
        formats::FieldValues v;
        std::string key;
        ASSERT_OK(source::RecordValues(*decoder, ids[k], record, place, v, key));
        ASSERT_TRUE(v[0] && v[1]);
        const std::string got(reinterpret_cast<const char*>(values.data()) + offsets[k],
                              static_cast<size_t>(offsets[k + 1] - offsets[k]));
        EXPECT_EQ(got, std::string(*v[0])) << "step " << b.step << " device " << d << " sample " << ids[k];
        EXPECT_EQ(classes[k], std::stoll(std::string(*v[1]))) << "sample " << ids[k];
      }
    }
  }

  // Process 1 of the job, staging on the GPUs, metrics on a free port.
  SidecarOptions Options() const {
    SidecarOptions o;
    o.job_path = job_path_;
    o.process = 1;
    o.socket_path = socket_;
    o.metrics_port = 0;
    o.metrics_address = "127.0.0.1";
    o.staging = "cuda";
    return o;
  }
  Result<std::unique_ptr<RunningSidecar>> Start(const SidecarOptions& o) {
    MESHLOAD_ASSIGN_OR_RETURN(auto s, Sidecar::Create(testing::MustLoad(o.job_path), o));
    return std::make_unique<RunningSidecar>(std::move(s));
  }

  // Connects and checks `steps` batches on the GPUs (and `also` on each).
  void TakeSteps(int64_t steps, const cuda::Driver& driver,
                 const std::function<void(const client::Batch&)>& also = {}) {
    auto c = Connect();
    ASSERT_TRUE(c);
    for (int64_t step = 0; step < steps; ++step) {
      auto b = c->Next(10000ms);
      ASSERT_OK(b);
      if (also) also(*b);
      ExpectOnGpuAndPlanned(*b, driver);
    }
  }

  std::unique_ptr<client::Client> Connect(int attempts = 3) {
    client::ClientOptions o;
    o.socket_path = socket_;
    o.max_reconnect_attempts = attempts;
    o.reconnect_backoff_initial = 20ms;
    auto c = client::Client::Connect(o);
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The real sidecar binary for process 1, with extra environment and
  // flags; its log goes to log_path().
  pid_t Spawn(const std::vector<std::string>& env_extra, const std::vector<std::string>& flags) {
    std::vector<std::string> args = {SidecarBin(), "--job", job_path_,      "--process", "1",
                                     "--socket",   socket_, "--log-format", "kv"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<std::string> env = env_extra;  // these win over this process's own
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      bool overridden = false;
      for (const auto& x : env_extra) overridden |= kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1);
      if (!overridden) env.push_back(kv);
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }
  std::string log_path() const { return dir_.path() + "/sidecar.log"; }
  std::string Log() const {
    std::ifstream f(log_path());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // Local devices per process (the tensors of a batch).
  int devices() const { return devices_; }

  int devices_;
  meshload::testing::TempDir dir_;
  std::string job_path_, socket_;
  std::unique_ptr<planner::ShardPlanner> planner_;
};

void Reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(DeviceStaging, VmmAllocationsRoundTripThroughAnExportedDescriptor) {
  REQUIRE_DRIVER();
  ASSERT_OK(driver->Granularity(0));
  const uint64_t g = *driver->Granularity(0);
  auto a = driver->AllocateShareable(0, g + 1);
  ASSERT_OK(a);
  EXPECT_EQ((*a)->bytes(), 2 * g);  // rounded to the granularity
  auto fd = (*a)->Export();
  ASSERT_OK(fd);
  auto imported = driver->Import(0, fd->get(), (*a)->bytes());
  ASSERT_OK(imported);
  fd->Reset();  // the import does not need the descriptor any more
  auto stream = driver->CreateStream(0, 1);
  ASSERT_OK(stream);
  std::vector<uint8_t> src(g + 1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_OK((*stream)->CopyToDevice((*a)->ptr(), src.data(), src.size()));
  ASSERT_OK((*stream)->Record(0));
  ASSERT_OK((*stream)->Wait(0));
  std::vector<uint8_t> back(src.size());
  ASSERT_OK(driver->CopyToHost(back.data(), (*imported)->ptr(), back.size(), 0));
  EXPECT_EQ(back, src);  // the same memory, seen through the importer's mapping
}

TEST(DeviceStaging, AnIpcHandleSmallerThanTheSlotItIsSaidToHoldIsRefused) {
  // A legacy IPC handle names an allocation; a sidecar that claims larger
  // slots would make the trainer read past its end. The importer checks.
  REQUIRE_STAND_IN();  // the exporter is a forked child: CUDA does not survive fork on a real GPU
  REQUIRE_DRIVER();
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "forks a child from a multi-threaded test process, which ThreadSanitizer does not follow: "
                  "skipped under TSan (the release and ASan runs have it)";
#endif
  int to_parent[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(to_parent[0]);
    auto a = driver->AllocateIpc(0, 4096);
    cuda::IpcHandle h{};
    if (a.ok()) h = (*a)->handle();
    const ssize_t n = ::write(to_parent[1], h.data(), h.size());
    ::pause();  // the handle stays valid while this process lives
    ::_exit(n == static_cast<ssize_t>(h.size()) ? 0 : 1);
  }
  ::close(to_parent[1]);
  cuda::IpcHandle h{};
  ASSERT_EQ(::read(to_parent[0], h.data(), h.size()), static_cast<ssize_t>(h.size()));
  ::close(to_parent[0]);
  auto too_big = driver->OpenIpc(0, h, 1 << 20);
  EXPECT_FALSE(too_big.ok());
  EXPECT_THAT(too_big, meshload::testing::StatusIs(StatusCode::kInvalidArgument, HasSubstr("holds 4096 bytes")));
  auto fits = driver->OpenIpc(0, h, 4096);
  EXPECT_OK(fits);
  fits = Status(StatusCode::kCancelled, "closed");  // closes the import before the exporter goes
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST(DeviceStaging, ServesBatchesOnTheGpuImportingEachSlotOncePerConnection) {
  REQUIRE_DRIVER();
  GpuJob job;
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  const int64_t imports_before = FakeImports();
  {
    auto c = job.Connect();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->hello().memory, protocol::MemoryKind::kCudaVmmFd);
    EXPECT_EQ(c->hello().fd_count, static_cast<uint32_t>(job.devices()) * 3u);
    for (int64_t step = 0; step < 25; ++step) {
      auto b = c->Next(10000ms);
      ASSERT_OK(b);
      ASSERT_EQ(b->step, step);
      for (int i = 0; i < job.devices(); ++i) EXPECT_EQ(b->tensors[i].device_id, i);
      job.ExpectOnGpuAndPlanned(*b, *driver);
    }
    // devices × 3 slots, once at connect, not per batch: as the client
    // counts them (any driver), and as the stand-in does.
    EXPECT_EQ(c->gpu_imports(), job.devices() * 3);
    if (imports_before >= 0) {
      EXPECT_EQ(FakeImports() - imports_before, job.devices() * 3);
    }
  }
  const std::string m = (*s)->Metrics();
  EXPECT_THAT(m, HasSubstr("meshload_staging_mode{mode=\"cuda\"} 1"));
  EXPECT_THAT(m, HasSubstr("meshload_staging_mode{mode=\"host\"} 0"));
  // devices x 3 slots, each rounded up to the granularity; a copy timed per step.
  const uint64_t granularity = *driver->Granularity(0);
  EXPECT_THAT(m, HasSubstr("meshload_device_memory_bytes " + std::to_string(job.devices() * 3 * granularity)));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("meshload_device_copy_seconds_count 0")));
}

// Variable-size samples: each device's region (the offsets, then the
// values) is staged on its GPU, and the trainer finds both there.
TEST(DeviceStaging, RaggedBatchesReachTheGpuWithTheirOffsets) {
  REQUIRE_DRIVER();
  GpuJob job(/*replicas=*/false, /*devices=*/0, /*ragged=*/true);
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  job.TakeSteps(12, *driver, [](const client::Batch& b) {
    for (const auto& t : b.tensors) EXPECT_EQ(reinterpret_cast<uintptr_t>(t.offsets) % 8, 0u);
  });
}

TEST(DeviceStaging, WebDatasetFieldsReachTheGpuAsARaggedAndADenseTensorPerDevice) {
  REQUIRE_DRIVER();
  GpuJob job(/*replicas=*/false, /*devices=*/0, /*ragged=*/false, /*fields=*/true);
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  job.TakeSteps(10, *driver);
}

TEST(DeviceStaging, WebDatasetFieldReplicasGetADeviceCopyOfTheirShard) {
  REQUIRE_TWO_GPUS();
  GpuJob job(/*replicas=*/true, /*devices=*/0, /*ragged=*/false, /*fields=*/true);
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  job.TakeSteps(8, *driver, [](const client::Batch& b) {
    EXPECT_EQ(b.tensors[0].ids_checksum, b.tensors[2].ids_checksum);
    EXPECT_EQ(b.tensors[0].shape, b.tensors[2].shape);
  });
}

TEST(DeviceStaging, RaggedReplicasGetADeviceCopyOfTheirShard) {
  REQUIRE_TWO_GPUS();
  GpuJob job(/*replicas=*/true, /*devices=*/0, /*ragged=*/true);
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  job.TakeSteps(8, *driver, [](const client::Batch& b) {
    EXPECT_EQ(b.tensors[0].ids_checksum, b.tensors[1].ids_checksum);
    EXPECT_EQ(b.tensors[0].nbytes, b.tensors[1].nbytes);
  });
}

TEST(DeviceStaging, LocalReplicasGetADeviceCopyOfTheirShard) {
  REQUIRE_TWO_GPUS();  // one GPU per local device: the sidecar refuses one GPU for two
  GpuJob job(/*replicas=*/true);
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  EXPECT_THAT((*s)->staging_reason(), HasSubstr("local replicas copied device to device"));
  // Both local devices hold the same shard; the host copy of the second is
  // never made, so its bytes can only have come from the first GPU.
  job.TakeSteps(8, *driver,
                [](const client::Batch& b) { EXPECT_EQ(b.tensors[0].ids_checksum, b.tensors[1].ids_checksum); });
}

TEST(DeviceStaging, ReplicasOnGpusThatCannotReachEachOtherAreCopiedFromTheHostSlot) {
  REQUIRE_STAND_IN();
  REQUIRE_TWO_GPUS();
  ::setenv("MESHLOAD_FAKE_CUDA_NO_PEER", "1", 1);  // cuDeviceCanAccessPeer says no
  GpuJob job(/*replicas=*/true);
  auto s = job.Start(job.Options());
  ::unsetenv("MESHLOAD_FAKE_CUDA_NO_PEER");
  ASSERT_OK(s);
  EXPECT_THAT((*s)->staging_reason(), HasSubstr("local replicas copied from the host"));
  job.TakeSteps(8, *driver);
}

TEST(DeviceStaging, GpuSlotsHeldAcrossACloseStayLentAndADeadTrainersAreReclaimed) {
  REQUIRE_DRIVER();
  GpuJob job;
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  auto metric = [&](const std::string& series) { return (*s)->Metric(series); };
  std::vector<std::vector<uint8_t>> first;  // steps 0..2 as read back from the GPUs
  {
    auto c = job.Connect();
    ASSERT_TRUE(c);
    std::vector<client::Batch> held;
    for (int i = 0; i < 3; ++i) {
      auto b = c->Next(10000ms);
      ASSERT_OK(b);
      std::vector<uint8_t> bytes(b->tensors[0].nbytes);
      ASSERT_TRUE(driver
                      ->CopyToHost(bytes.data(), reinterpret_cast<uintptr_t>(b->tensors[0].data), bytes.size(),
                                   b->tensors[0].device_id)
                      .ok());
      first.push_back(std::move(bytes));
      held.push_back(std::move(*b));  // every slot leased ...
    }
    EXPECT_EQ(c->Next(300ms).status().code(), StatusCode::kDeadlineExceeded);  // ... so nothing more
    c->Close();  // BYE: the trainer still holds all three, which stay lent
    {
      // The sidecar serves a trainer's messages before the connections that
      // came after them: once this one is answered, the BYE was handled.
      auto probe = protocol::ConnectSeqpacket(job.socket_);
      ASSERT_OK(probe);
      ASSERT_OK(protocol::SendMessage(probe->get(),
                                      protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, 3})));
      ASSERT_OK(protocol::ReceiveMessage(probe->get(), protocol::kMaxMessageBytes));  // SERVER_HELLO
    }  // closed: its end is served before the next connection too
    EXPECT_EQ(metric("meshload_leases_reclaimed_total"), 0);
  }  // dropped: their RELEASEs go on the old connection once the fences pass
  (void)WaitFor([&] { return metric("meshload_batches_consumed_total") >= 3; }, 20s);
  EXPECT_EQ(metric("meshload_batches_consumed_total"), 3);
  {
    // A trainer that dies holding every slot: its socket closes with no BYE
    // and no RELEASE.
    auto fd = protocol::ConnectSeqpacket(job.socket_);
    ASSERT_OK(fd);
    ASSERT_OK(
        protocol::SendMessage(fd->get(), protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, 3})));
    ASSERT_OK(protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes));  // SERVER_HELLO
    for (int i = 0; i < 3; ++i) {
      auto r = protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes);
      ASSERT_OK(r);
      ASSERT_TRUE(std::holds_alternative<protocol::Ready>(protocol::Decode(r->bytes).value()));
    }
  }
  (void)WaitFor([&] { return metric("meshload_leases_reclaimed_total") >= 3; }, 20s);
  EXPECT_EQ(metric("meshload_leases_reclaimed_total"), 3);
  client::ClientOptions co;
  co.socket_path = job.socket_;
  co.start_step = 1;
  auto c2 = client::Client::Connect(co);
  ASSERT_OK(c2);
  for (int64_t step = 1; step < 6; ++step) {
    auto b = (*c2)->Next(10000ms);
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    job.ExpectOnGpuAndPlanned(*b, *driver);
    if (step < 3) {
      std::vector<uint8_t> bytes(b->tensors[0].nbytes);
      ASSERT_TRUE(driver
                      ->CopyToHost(bytes.data(), reinterpret_cast<uintptr_t>(b->tensors[0].data), bytes.size(),
                                   b->tensors[0].device_id)
                      .ok());
      EXPECT_EQ(bytes, first[static_cast<size_t>(step)]);
    }
  }
  c2->reset();
}

// The last batch of a connection the client has left is dropped (in Python:
// with the GIL held) while the GPU is still busy: the drop does not wait for
// the GPU; the release worker sends the RELEASE once the device is done.
TEST(DeviceStaging, DroppingTheLastGpuBatchOfALeftConnectionNeverWaitsForTheGpu) {
  REQUIRE_STAND_IN();  // the GPU is kept busy by the stand-in's MESHLOAD_FAKE_CUDA_CTX_SYNC_MS
  REQUIRE_DRIVER();
  GpuJob job;
  auto s = job.Start(job.Options());
  ASSERT_OK(s);
  auto c = job.Connect();
  ASSERT_TRUE(c);
  auto b = c->Next(10000ms);
  ASSERT_OK(b);
  c->Close();  // BYE: the batch keeps its slot and the connection
  c.reset();
  ::setenv("MESHLOAD_FAKE_CUDA_CTX_SYNC_MS", "500", 1);  // the trainer's GPU work takes 0.5 s more
  const auto t0 = std::chrono::steady_clock::now();
  b = client::Batch{};  // the last lease of the connection, without a stream: the device is waited for
  const auto dropped = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(dropped, 200ms) << "dropping the batch waited for the GPU";
  double consumed = 0;
  (void)WaitFor([&] { return (consumed = (*s)->Metric("meshload_batches_consumed_total")) >= 1; }, 20s);
  EXPECT_EQ(consumed, 1) << "the RELEASE is sent once the device is done";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 450ms);
  ::unsetenv("MESHLOAD_FAKE_CUDA_CTX_SYNC_MS");
}

TEST(DeviceStaging, DeviceStagingNeedsADeviceForEveryLocalDevice) {
  REQUIRE_DRIVER();
  GpuJob job(/*replicas=*/false, /*devices=*/2);  // nothing is staged: any GPU count will do
  SidecarOptions o = job.Options();
  o.cuda_devices = {0, 99};
  auto s = Sidecar::Create(testing::MustLoad(o.job_path), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("CUDA device 99 is not among")) << s.status().ToString();
  o.cuda_devices = {0};
  s = Sidecar::Create(testing::MustLoad(o.job_path), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().ToString(), HasSubstr("--cuda-devices"));
  // auto falls back to host staging and says why.
  o.staging = "auto";
  o.cuda_devices = {0, 99};
  s = Sidecar::Create(testing::MustLoad(o.job_path), o);
  ASSERT_OK(s);
}

TEST(DeviceStagingProcess, TheTrainersOrdinalsFollowTheUuids) {
  REQUIRE_STAND_IN();
  REQUIRE_DRIVER();
  GpuJob job;
  // The sidecar sees A, B, C and stages on A and B; this process sees C, B, A.
  const pid_t pid = job.Spawn({std::string("MESHLOAD_FAKE_CUDA_DEVICES=") + kGpuA + "," + kGpuB + "," + kGpuC},
                              {"--staging", "cuda", "--cuda-devices", "0,1"});
  auto c = job.Connect(10);
  ASSERT_TRUE(c) << job.Log();
  EXPECT_EQ(c->hello().devices[0].uuid, kGpuA);
  EXPECT_EQ(c->hello().devices[1].uuid, kGpuB);
  for (int64_t step = 0; step < 5; ++step) {
    auto b = c->Next(10000ms);
    ASSERT_OK(b);
    EXPECT_EQ(b->tensors[0].device_id, 2);  // A is this process's device 2
    EXPECT_EQ(b->tensors[1].device_id, 1);
    job.ExpectOnGpuAndPlanned(*b, *driver);
  }
  Reap(pid);
}

TEST(DeviceStagingProcess, AGpuTheTrainerCannotSeeIsAClearErrorListingBothSides) {
  REQUIRE_STAND_IN();
  REQUIRE_DRIVER();
  GpuJob job;
  const std::string unseen = "GPU-dddddddd-0000-4000-8000-000000000004";
  const pid_t pid =
      job.Spawn({"MESHLOAD_FAKE_CUDA_DEVICES=" + std::string(kGpuA) + "," + unseen}, {"--staging", "cuda"});
  client::ClientOptions o;
  o.socket_path = job.socket_;
  o.max_reconnect_attempts = 10;
  o.reconnect_backoff_initial = 20ms;
  auto c = client::Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg = c.status().message();
  EXPECT_THAT(msg, HasSubstr("which this process cannot see"));
  EXPECT_THAT(msg, HasSubstr(unseen));
  EXPECT_THAT(msg, HasSubstr(kGpuC));  // this side's list
  Reap(pid);
}

TEST(DeviceStagingProcess, LegacyIpcHandlesCarryTheSameBytes) {
  REQUIRE_DRIVER();
  GpuJob job;
  const std::vector<std::string> env = TwoGpuEnv();
  const pid_t pid = job.Spawn(env, {"--staging", "cuda-ipc"});
  auto c = job.Connect(10);
  ASSERT_TRUE(c) << job.Log();
  EXPECT_EQ(c->hello().memory, protocol::MemoryKind::kCudaIpc);
  EXPECT_EQ(c->hello().fd_count, 0u);
  EXPECT_EQ(c->hello().ipc_handles.size(), static_cast<size_t>(job.devices()) * 3u);
  for (int64_t step = 0; step < 6; ++step) {
    auto b = c->Next(10000ms);
    ASSERT_OK(b);
    job.ExpectOnGpuAndPlanned(*b, *driver);
  }
  Reap(pid);
}

TEST(DeviceStagingProcess, ARestartedSidecarIsImportedAgainAndTheTrainerGetsIdenticalBytes) {
  REQUIRE_DRIVER();
  GpuJob job;
  const std::vector<std::string> env = TwoGpuEnv();
  pid_t pid = job.Spawn(env, {"--staging", "cuda"});
  auto c = job.Connect(10);
  ASSERT_TRUE(c) << job.Log();
  const int64_t imports_before = FakeImports();
  std::vector<client::Batch> held;
  for (int64_t step = 0; step < 3; ++step) {
    auto b = c->Next(10000ms);
    ASSERT_OK(b);
    job.ExpectOnGpuAndPlanned(*b, *driver);
    if (step == 2) held.push_back(std::move(*b));  // the trainer dies holding a slot, as far as the sidecar knows
  }
  Reap(pid);
  pid = job.Spawn(env, {"--staging", "cuda"});
  for (int64_t step = 3; step < 9; ++step) {
    auto b = c->Next(15000ms);
    ASSERT_OK(b) << b.status().ToString() << job.Log();
    EXPECT_EQ(b->step, step);
    job.ExpectOnGpuAndPlanned(*b, *driver);
  }
  EXPECT_EQ(c->reconnects(), 1);
  EXPECT_EQ(c->gpu_imports(), 2 * job.devices() * 3);  // the first pool and the new one, once each
  if (imports_before >= 0) {                           // the new pool, once
    EXPECT_EQ(FakeImports() - imports_before, job.devices() * 3);
  }
  held.clear();
  Reap(pid);
}

TEST(DeviceStagingProcess, CudaStagingWithoutADriverIsAnErrorAndAutoSaysWhyItStagesOnTheHost) {
  GpuJob job;
  pid_t pid = job.Spawn({"MESHLOAD_CUDA_LIBRARY=/nonexistent/libcuda.so.1"}, {"--staging", "cuda"});
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_THAT(job.Log(), HasSubstr("--staging cuda: no CUDA driver: cannot open /nonexistent/libcuda.so.1"));
  pid = job.Spawn({"MESHLOAD_CUDA_LIBRARY=/nonexistent/libcuda.so.1"}, {"--staging", "auto"});
  auto c = job.Connect(10);
  ASSERT_TRUE(c) << job.Log();
  EXPECT_EQ(c->hello().memory, protocol::MemoryKind::kHostMemfd);
  const std::string log = job.Log();
  EXPECT_THAT(log, HasSubstr("staging=host"));
  EXPECT_THAT(log, HasSubstr("cannot open /nonexistent/libcuda.so.1"));
  c.reset();
  Reap(pid);
}

}  // namespace
}  // namespace meshload::sidecar

int main(int argc, char** argv) {
  // The stand-in driver unless the real one is asked for. Set before
  // anything opens the driver (it is opened once per process).
  if (!meshload::sidecar::RealGpu()) {
    ::setenv("MESHLOAD_CUDA_LIBRARY", MESHLOAD_FAKE_CUDA, 1);
    ::setenv("MESHLOAD_FAKE_CUDA_DEVICES",
             (std::string(meshload::sidecar::kGpuC) + "," + meshload::sidecar::kGpuB + "," + meshload::sidecar::kGpuA)
                 .c_str(),
             1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
