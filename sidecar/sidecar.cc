#include "sidecar/sidecar.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <fstream>
#include <limits>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "protocol/seqpacket.h"
#include "sidecar/source/dataset_facts.h"

#ifndef MESHLOAD_VERSION
#define MESHLOAD_VERSION "dev"
#endif

namespace meshload::protocol {
namespace {
// Every send to a trainer is non-blocking: a trainer that stops reading must
// not stall the producer (which sends READY under client_mu_) or a shutdown.
Status SendTo(int fd, const std::string& bytes) { return SendMessage(fd, bytes, {}, /*nonblocking=*/true); }
}  // namespace
}  // namespace meshload::protocol

namespace meshload::sidecar {
namespace {

using Clock = std::chrono::steady_clock;

// At most this many READYs unanswered by RELEASE, and at most half of what
// the trainer's socket queue holds (MeasureReadyQueue): a trainer following
// the protocol then never fills its queue, so a full queue means a trainer
// that does not read, and is dropped.
constexpr uint32_t kMaxLeasesPerTrainer = 128;
static_assert(protocol::kMaxByeLeases >= kMaxLeasesPerTrainer, "a BYE must be able to list every lease");

// How many copies of `message` a connected SOCK_SEQPACKET socket queues
// before a send would block: the kernel counts bytes with a per-message
// overhead (about 278 READYs of 132 bytes, 93 of 828 bytes with the default
// 208 KiB send buffer), so the count depends on the job's layout. Measured
// on a socket pair, which gets the same default buffer as an accepted
// connection; 0 if the pair cannot be made.
uint32_t MeasureReadyQueue(const std::string& message) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return 0;
  UniqueFd a(sv[0]), b(sv[1]);
  uint32_t n = 0;
  while (n < 4096 && ::send(a.get(), message.data(), message.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(message.size())) {
    ++n;
  }
  return n;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

// ---------------------------------------------------------------------------
// Metrics: names follow Prometheus conventions (meshload_ prefix, base
// units, _total counters); every label has a bounded set of values.

// Storage request latency buckets (every source the same, so /progress can
// add them up): 10 µs to about 5 s.
const metrics::BucketBoundaries kReadLatencyBuckets = metrics::ExponentialBuckets(1e-5, 2, 20);

struct Sidecar::Metrics {
  explicit Metrics(metrics::Registry& r)
      : bytes_read(metrics::BuildCounter()
                       .Name("meshload_bytes_read_total")
                       .Help("Bytes read from storage, by source scheme.")
                       .Register(r)),
        samples_read(metrics::BuildCounter()
                         .Name("meshload_samples_read_total")
                         .Help("Samples read from storage (a sample read twice counts twice).")
                         .Register(r)
                         .Add({})),
        batches_staged(metrics::BuildCounter()
                           .Name("meshload_batches_staged_total")
                           .Help("Batches staged in a slot and ready for the trainer.")
                           .Register(r)
                           .Add({})),
        batches_delivered(metrics::BuildCounter()
                              .Name("meshload_batches_delivered_total")
                              .Help("Batches handed to the trainer (READY sent).")
                              .Register(r)
                              .Add({})),
        batches_consumed(metrics::BuildCounter()
                             .Name("meshload_batches_consumed_total")
                             .Help("Batches the trainer finished with (RELEASE received).")
                             .Register(r)
                             .Add({})),
        current_step(metrics::BuildGauge()
                         .Name("meshload_current_step")
                         .Help("The last step handed to the trainer.")
                         .Register(r)
                         .Add({})),
        next_staged_step(metrics::BuildGauge()
                             .Name("meshload_next_staged_step")
                             .Help("The next step the producer will stage.")
                             .Register(r)
                             .Add({})),
        slots(metrics::BuildGauge().Name("meshload_slots").Help("Staging slots by state.").Register(r)),
        trainer_wait(metrics::BuildHistogram()
                         .Name("meshload_trainer_wait_seconds")
                         .Help("How long the trainer waited for each batch (measured by the client).")
                         .Register(r)
                         .Add({}, metrics::ExponentialBuckets(1e-6, 4, 12))),
        read_latency(metrics::BuildHistogram()
                         .Name("meshload_storage_read_seconds")
                         .Help("Latency of one storage request, by source scheme.")
                         .Register(r)),
        step_load(metrics::BuildHistogram()
                      .Name("meshload_step_load_seconds")
                      .Help("Time to read one step's batch into its slot.")
                      .Register(r)
                      .Add({}, metrics::ExponentialBuckets(1e-4, 2, 16))),
        device_copy(metrics::BuildHistogram()
                        .Name("meshload_device_copy_seconds")
                        .Help("GPU staging: time to copy one step's batch to the GPUs and wait for it (the fence "
                              "before READY), included in meshload_step_load_seconds.")
                        .Register(r)
                        .Add({}, metrics::ExponentialBuckets(1e-5, 2, 18))),
        device_memory(metrics::BuildGauge()
                          .Name("meshload_device_memory_bytes")
                          .Help("GPU memory held by the staging slots, all local GPUs together (0 with host staging).")
                          .Register(r)
                          .Add({})),
        retries(metrics::BuildCounter()
                    .Name("meshload_storage_retries_total")
                    .Help("Storage requests retried, by source scheme and reason.")
                    .Register(r)),
        errors(metrics::BuildCounter()
                   .Name("meshload_errors_total")
                   .Help("Errors by kind.")
                   .Register(r)),
        connections(metrics::BuildCounter()
                        .Name("meshload_client_connections_total")
                        .Help("Trainer connections by outcome.")
                        .Register(r)),
        clients(metrics::BuildGauge()
                    .Name("meshload_clients_connected")
                    .Help("Trainers connected (0 or 1).")
                    .Register(r)
                    .Add({})),
        leases_reclaimed(metrics::BuildCounter()
                             .Name("meshload_leases_reclaimed_total")
                             .Help("Slots taken back from trainers that disconnected while holding them.")
                             .Register(r)
                             .Add({})),
        oldest_read(metrics::BuildGauge()
                        .Name("meshload_oldest_inflight_read_seconds")
                        .Help("Age of the oldest storage read in flight (0 when none): a stuck read grows it.")
                        .Register(r)
                        .Add({})),
        producer_blocked(metrics::BuildGauge()
                             .Name("meshload_producer_blocked_seconds")
                             .Help("How long the producer has waited for a free slot (0 when not waiting): "
                                   "every slot is staged or leased and none is released.")
                             .Register(r)
                             .Add({})),
        staging_mode(metrics::BuildGauge()
                         .Name("meshload_staging_mode")
                         .Help("1 for the active staging mode (host or cuda).")
                         .Register(r)),
        peer_bytes(metrics::BuildCounter()
                       .Name("meshload_peer_bytes_total")
                       .Help("Sample bytes moved to or from other processes' sidecars (Broadcast, LoadAndReshard), "
                             "by direction.")
                       .Register(r)),
        peer_parts(metrics::BuildCounter()
                       .Name("meshload_peer_parts_total")
                       .Help("Step parts handled for peers: sent, received, skipped (the peer had moved past them), "
                             "served (read again from storage on a peer's demand).")
                       .Register(r)),
        peer_reconnects(metrics::BuildCounter()
                            .Name("meshload_peer_reconnects_total")
                            .Help("Connections to other processes' sidecars re-established after a loss (a peer "
                                  "restarted, or the network dropped the connection).")
                            .Register(r)
                            .Add({})),
        peers_connected(metrics::BuildGauge()
                            .Name("meshload_peers_connected")
                            .Help("Connections to other processes' sidecars that are up.")
                            .Register(r)
                            .Add({})),
        peer_wait(metrics::BuildHistogram()
                      .Name("meshload_peer_wait_seconds")
                      .Help("Time a step waited on its peers after its own reads were done.")
                      .Register(r)
                      .Add({}, metrics::ExponentialBuckets(1e-5, 4, 10))) {}

  metrics::Family<metrics::Counter>& bytes_read;
  metrics::Counter& samples_read;
  metrics::Counter& batches_staged;
  metrics::Counter& batches_delivered;
  metrics::Counter& batches_consumed;
  metrics::Gauge& current_step;
  metrics::Gauge& next_staged_step;
  metrics::Family<metrics::Gauge>& slots;
  metrics::Histogram& trainer_wait;
  metrics::Family<metrics::Histogram>& read_latency;
  metrics::Histogram& step_load;
  metrics::Histogram& device_copy;
  metrics::Gauge& device_memory;
  metrics::Family<metrics::Counter>& retries;
  metrics::Family<metrics::Counter>& errors;
  metrics::Family<metrics::Counter>& connections;
  metrics::Gauge& clients;
  metrics::Counter& leases_reclaimed;
  metrics::Gauge& oldest_read;
  metrics::Gauge& producer_blocked;
  metrics::Family<metrics::Gauge>& staging_mode;
  metrics::Family<metrics::Counter>& peer_bytes;
  metrics::Family<metrics::Counter>& peer_parts;
  metrics::Counter& peer_reconnects;
  metrics::Gauge& peers_connected;
  metrics::Histogram& peer_wait;

  void Error(std::string_view kind) { errors.Add({{"kind", std::string(kind)}}).Increment(); }
};

// Storage events -> metrics.
// Reads are the hot path: the series of the built-in schemes are looked up
// once; another scheme (a registered driver) goes through the family.
class Sidecar::Observer : public source::SourceObserver {
 public:
  explicit Observer(Metrics& m) : m_(m) {
    for (const char* s : {"file", "http", "https"}) {
      known_.push_back({s, &Bytes(s), &Latency(s)});
    }
  }
  void OnRead(std::string_view scheme, uint64_t bytes, double seconds) override {
    const ReadSample one{bytes, seconds};
    OnReads(scheme, &one, 1);
  }
  // One add to the bytes counter and a few to the latency histogram per
  // batch (these atomics are shared by every reader thread).
  void OnReads(std::string_view scheme, const ReadSample* reads, size_t count) override {
    thread_local std::vector<double> seconds;
    seconds.clear();
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      bytes += reads[i].bytes;
      seconds.push_back(reads[i].seconds);
    }
    metrics::Counter* bytes_total = nullptr;
    metrics::Histogram* latency = nullptr;
    for (const auto& k : known_) {
      if (k.scheme == scheme) {
        bytes_total = k.bytes;
        latency = k.latency;
        break;
      }
    }
    if (bytes_total == nullptr) {
      bytes_total = &Bytes(scheme);
      latency = &Latency(scheme);
    }
    bytes_total->Increment(static_cast<double>(bytes));
    latency->ObserveMany(seconds.data(), seconds.size());
  }
  void OnRetry(std::string_view scheme, std::string_view reason) override {
    m_.retries.Add({{"source", std::string(scheme)}, {"reason", std::string(reason)}}).Increment();
  }
  void OnError(std::string_view scheme, std::string_view kind) override {
    (void)scheme;
    m_.Error(std::string("storage_") + std::string(kind));
  }

 private:
  metrics::Counter& Bytes(std::string_view scheme) {
    return m_.bytes_read.Add({{"source", std::string(scheme)}});
  }
  metrics::Histogram& Latency(std::string_view scheme) {
    return m_.read_latency.Add({{"source", std::string(scheme)}}, kReadLatencyBuckets);
  }
  struct Known {
    std::string_view scheme;
    metrics::Counter* bytes;
    metrics::Histogram* latency;
  };
  Metrics& m_;
  std::vector<Known> known_;
};

struct Sidecar::Client {
  UniqueFd fd;
  pid_t pid = 0;
  uid_t uid = 0;
  Clock::time_point connected_at = Clock::now();
  int64_t next_to_send = 0;
  // The leases of this connection, (slot, step), in the order lent: a
  // RELEASE must name one of them (not a lease another connection keeps).
  std::vector<std::pair<uint32_t, int64_t>> leased;
  std::atomic<bool> broken{false};  // a send failed; the server thread drops it
};

// ---------------------------------------------------------------------------

Result<ResolvedJob> ResolveForSidecar(const JobSpec& spec, source::SourceRegistry& sources, Diagnostics& diags) {
  return source::ResolveWithSources(spec, sources, {}, source::Unreachable::kFail, diags);
}

Sidecar::Sidecar(SidecarOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<Sidecar>> Sidecar::Create(SidecarOptions options) {
  std::unique_ptr<Sidecar> s(new Sidecar(std::move(options)));
  MESHLOAD_RETURN_IF_ERROR(s->Init());
  return s;
}

Status Sidecar::Init() {
  registry_ = std::make_unique<metrics::Registry>();
  metrics_ = std::make_unique<Metrics>(*registry_);
  observer_ = std::make_unique<Observer>(*metrics_);
  metrics::RegisterBuildInfo(*registry_, MESHLOAD_VERSION, "sidecar");
  options_.source_options.observer = observer_.get();
  Diagnostics diags;
  auto job = LoadDataLoadJobFile(options_.job_path, diags);
  if (!job.ok()) return job.status();
  job_name_ = job->name;
  const std::string scheme = source::SourceRegistry::SchemeOf(job->spec.dataset.uri);
  if (scheme == "s3") {
    MESHLOAD_RETURN_IF_ERROR(source::S3OptionsForDataset(job->spec.dataset, options_.source_options.s3));
  }
  if (options_.reader_threads <= 0) options_.reader_threads = scheme == "file" ? 4 : 16;
  // Every reader of every producer keeps its connection between steps.
  options_.source_options.max_idle_connections =
      std::max(options_.source_options.max_idle_connections,
               options_.reader_threads * std::max(1, options_.staging_threads));
  sources_ = source::SourceRegistry::WithBuiltins(options_.source_options);
  auto resolved = ResolveForSidecar(job->spec, *sources_, diags);
  if (!resolved.ok() || !diags.ok()) {
    if (!diags.ok()) return InvalidArgument("invalid DataLoadJob:\n" + diags.ToString(), options_.job_path);
    return resolved.status();
  }
  planner_ = std::make_unique<ShardPlanner>(std::move(*resolved));
  const ResolvedJob& rj = planner_->job();
  if (options_.process < 0 || options_.process >= rj.mesh.processes()) {
    return InvalidArgument("process " + std::to_string(options_.process) + " is not in this job's 0.." +
                               std::to_string(rj.mesh.processes() - 1),
                           "--process");
  }
  loading_ = planner_->DefaultLoading();
  // What the handoff protocol can describe (checked now, not at the first
  // trainer, which could not decode SERVER_HELLO).
  if (rj.mesh.devices_per_process() > static_cast<int64_t>(protocol::kMaxDevices)) {
    return InvalidArgument("this sidecar serves at most " + std::to_string(protocol::kMaxDevices) +
                               " devices per process, the job has " + std::to_string(rj.mesh.devices_per_process()),
                           "spec.mesh.devicesPerProcess");
  }
  if (rj.dataset.sample_shape().size() + 1 > protocol::kMaxRank) {
    return InvalidArgument("a sample of rank " + std::to_string(rj.dataset.sample_shape().size()) +
                               " makes tensors of more than " + std::to_string(protocol::kMaxRank) + " dimensions",
                           "spec.dataset");
  }
  layout_ = staging::ComputeBatchLayout(rj, options_.process);

  const uint32_t slots = static_cast<uint32_t>(rj.spec.batch.prefetch);
  MESHLOAD_ASSIGN_OR_RETURN(memory_, staging::HostSlotMemory::Create(slots, layout_.slot_bytes,
                                                            "meshload-" + job_name_ + "-p" +
                                                                std::to_string(options_.process)));
  int64_t first_step = rj.spec.resume.step;
  if (options_.start_step) {
    first_step = *options_.start_step;
  } else if (!options_.resume_file.empty()) {
    MESHLOAD_ASSIGN_OR_RETURN(std::optional<int64_t> recorded, ReadResumeFile(options_.resume_file, rj.spec.resume.step));
    if (recorded) {
      LogInfo("resuming at the step the controller recorded", {{"step", *recorded},
                                                              {"file", options_.resume_file}});
      first_step = *recorded;
    }
  }
  start_step_ = target_step_ = first_step;
  consumed_.Reset(start_step_);
  delivered_step_.store(start_step_ - 1);
  ProgressOptions popts;
  popts.window = options_.progress_window;
  progress_ = std::make_unique<ProgressWindow>(kReadLatencyBuckets, popts);
  MESHLOAD_RETURN_IF_ERROR(InitDeviceStaging());
  pool_ = std::make_unique<staging::SlotPool>(slots, start_step_);
  slot_checksums_.assign(slots, {});
  options_.staging_threads = std::clamp(options_.staging_threads, 1, static_cast<int>(slots));
  StepLoaderOptions lopts;
  lopts.reader_threads = options_.reader_threads;
  lopts.callers = options_.staging_threads;
  lopts.reader_sched = options_.thread_sched;
  // On GPUs, local replicas get a device-to-device copy, not a host one.
  lopts.host_replica_copies = device_ == nullptr;
  if (options_.peers) {
    lopts.peers = *options_.peers;
    lopts.peers->first_step = start_step_;
    lopts.peers->stall_report_after = options_.stall_report_after;
  }
  MESHLOAD_ASSIGN_OR_RETURN(loader_, StepLoader::Create(*planner_, options_.process, loading_, *sources_, layout_, lopts));
  MESHLOAD_RETURN_IF_ERROR(loader_->VerifyFiles());

  event_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_.valid()) return IoErrorFromErrno("eventfd", "", errno);
  MESHLOAD_ASSIGN_OR_RETURN(listen_fd_, protocol::ListenSeqpacket(options_.socket_path, options_.socket_mode));
  if (options_.allowed_uids.empty()) options_.allowed_uids.push_back(::getuid());

  registry_->AddCollectHook([this] {
    const staging::SlotCounts c = pool_->Counts();
    metrics_->slots.Add({{"state", "free"}}).Set(c.free);
    metrics_->slots.Add({{"state", "filling"}}).Set(c.filling);
    metrics_->slots.Add({{"state", "ready"}}).Set(c.ready);
    metrics_->slots.Add({{"state", "leased"}}).Set(c.leased);
    metrics_->oldest_read.Set(loader_->OldestInflight().seconds);
    const int64_t since = producer_blocked_since_ns_.load();
    metrics_->producer_blocked.Set(since ? static_cast<double>(NowNs() - since) / 1e9 : 0.0);
    if (const exchange::PeerExchange* x = loader_->peers()) {
      // The exchange counts; the counters follow (each collect adds what
      // is new, under the registry's collect lock).
      const exchange::ExchangeCounters now = x->counters();
      metrics_->peers_connected.Set(now.peers_connected);
      auto add = [&](const char* family_label, uint64_t value, uint64_t& seen, bool bytes) {
        auto& family = bytes ? metrics_->peer_bytes : metrics_->peer_parts;
        const char* key = bytes ? "direction" : "outcome";
        family.Add({{key, family_label}}).Increment(static_cast<double>(value - seen));
        seen = value;
      };
      add("sent", now.bytes_sent, peer_seen_.bytes_sent, true);
      add("received", now.bytes_received, peer_seen_.bytes_received, true);
      add("sent", now.parts_sent, peer_seen_.parts_sent, false);
      add("received", now.parts_received, peer_seen_.parts_received, false);
      add("skipped", now.parts_skipped, peer_seen_.parts_skipped, false);
      add("served", now.parts_served, peer_seen_.parts_served, false);
      metrics_->peer_reconnects.Increment(static_cast<double>(now.reconnects - peer_seen_.reconnects));
      peer_seen_.reconnects = now.reconnects;
    }
  });
  // Which job and process this sidecar serves, for dashboards and alerts
  // to join on (one series per sidecar).
  metrics::BuildGauge()
      .Name("meshload_job_info")
      .Help("The DataLoadJob and process this sidecar serves, and the job's loading strategy; the value is always 1.")
      .Register(*registry_)
      .Add({{"dataloadjob", job_name_},
            {"process", std::to_string(options_.process)},
            {"strategy", std::string(ToString(loading_.strategy))}})
      .Set(1);
  if (options_.metrics_port >= 0) {
    metrics::HealthServerOptions hopts;
    hopts.bind_address = options_.metrics_address;
    hopts.port = options_.metrics_port;
    progress_->Add(TakeProgressSample());  // the window's first sample: rates count from the start
    hopts.progress = [this] { return ProgressJson(); };
    health_ = std::make_unique<metrics::HealthServer>(*registry_, [this] { return Readiness(); }, hopts);
    MESHLOAD_ASSIGN_OR_RETURN(metrics_port_, health_->Start());
  }
  {
    // The largest READY of this layout (every field at its widest).
    protocol::Ready r;
    r.step = std::numeric_limits<int64_t>::max();
    r.slot = std::numeric_limits<uint32_t>::max();
    const DLPackType dl = ToDLPackType(layout_.dtype);
    for (size_t i = 0; i < layout_.devices.size(); ++i) {
      r.tensors.push_back({TensorOffset(i), dl.code, dl.bits, layout_.devices[i].shape, layout_.devices[i].strides,
                           std::numeric_limits<uint64_t>::max()});
    }
    const uint32_t queue = MeasureReadyQueue(protocol::Encode(r));
    if (queue == 0) {
      // No socket pair (out of descriptors?): the fixed limit, as before.
      max_leases_ = kMaxLeasesPerTrainer;
      LogWarn("could not measure a trainer's socket queue; at most 128 READYs unanswered", {});
    } else {
      max_leases_ = std::clamp<uint32_t>(queue / 2, 1, kMaxLeasesPerTrainer);
    }
    if (max_leases_ < slots) {
      LogInfo("a trainer is sent at most this many batches ahead: its socket queue holds no more (a trainer "
              "that keeps that many batches alive gets no more until it lets one go)",
              {{"max_leases", static_cast<uint64_t>(max_leases_)}, {"slots", static_cast<uint64_t>(slots)},
               {"ready_queue", static_cast<uint64_t>(queue)}});
    }
  }
  LogInfo("sidecar started", {{"job", job_name_},
                              {"process", options_.process},
                              {"strategy", std::string(ToString(loading_.strategy))},
                              {"staging", staging_mode_},
                              {"staging_reason", staging_reason_},
                              {"slots", static_cast<uint64_t>(slots)},
                              {"slot_bytes", memory_->slot_bytes()},
                              {"socket", options_.socket_path},
                              {"metrics_port", metrics_port_},
                              {"staging_threads", options_.staging_threads},
                              {"thread_sched", ToString(options_.thread_sched)},
                              {"mmap_resident_limit_mib", options_.source_options.mmap_resident_limit >> 20},
                              {"first_step", start_step_}});
  for (int i = 0; i < options_.staging_threads; ++i) producers_.emplace_back([this, i] { ProducerMain(i); });
  return Status::Ok();
}

Status Sidecar::InitDeviceStaging() {
  const std::string& want = options_.staging;
  if (want != "auto" && want != "host" && want != "cuda" && want != "cuda-ipc") {
    return InvalidArgument("staging must be auto, host, cuda or cuda-ipc, got \"" + want + "\"", "--staging");
  }
  staging_mode_ = "host";
  auto set_mode = [&] {
    for (const char* m : {"host", "cuda", "cuda-ipc"}) {
      metrics_->staging_mode.Add({{"mode", m}}).Set(staging_mode_ == m ? 1 : 0);
    }
  };
  set_mode();
  if (want == "host") {
    staging_reason_ = "--staging host";
    return Status::Ok();
  }
  // Which staging runs, and why: the driver is opened at run time (dlopen,
  // no link-time dependency), before any thread starts.
  const bool required = want != "auto";
  auto host_because = [&](const std::string& why) -> Status {
    if (required) return FailedPrecondition("--staging " + want + ": " + why, "--staging");
    staging_reason_ = why + ": host staging";
    return Status::Ok();
  };
  auto driver = cuda::Driver::Open();
  if (!driver.ok()) return host_because(driver.status().message());
  const ResolvedJob& rj = planner_->job();
  const size_t local = layout_.devices.size();
  std::vector<int> ordinals = options_.cuda_devices;
  if (ordinals.empty()) {
    for (size_t i = 0; i < local; ++i) ordinals.push_back(static_cast<int>(i));
  }
  std::string gpus;
  for (const auto& d : (*driver)->devices()) gpus += (gpus.empty() ? "" : ",") + d.uuid;
  if (ordinals.size() != local) {
    return InvalidArgument("give one CUDA device per local device: the job has " + std::to_string(local) +
                               " per process, --cuda-devices names " + std::to_string(ordinals.size()),
                           "--cuda-devices");
  }
  for (int o : ordinals) {
    if (o < 0 || o >= static_cast<int>((*driver)->devices().size())) {
      return host_because("the job has " + std::to_string(local) + " devices per process, CUDA device " +
                          std::to_string(o) + " is not among the " + std::to_string((*driver)->devices().size()) +
                          " this process sees (" + gpus + ")");
    }
  }
  const auto share = want == "cuda-ipc" ? staging::DeviceShare::kCudaIpc : staging::DeviceShare::kCudaVmm;
  const uint64_t allocs = static_cast<uint64_t>(local) * static_cast<uint64_t>(rj.spec.batch.prefetch);
  if (share == staging::DeviceShare::kCudaVmm && allocs > protocol::kMaxFds) {
    return InvalidArgument(std::to_string(local) + " devices × prefetch " + std::to_string(rj.spec.batch.prefetch) +
                               " slots make " + std::to_string(allocs) + " allocations; one SERVER_HELLO carries at most " +
                               std::to_string(protocol::kMaxFds) + " descriptors",
                           "spec.batch.prefetch");
  }
  if (share == staging::DeviceShare::kCudaIpc && allocs > protocol::kMaxIpcHandles) {
    return InvalidArgument("too many IPC handles: " + std::to_string(allocs), "spec.batch.prefetch");
  }
  // Devices holding the same shard are replicas: they get a device copy.
  const StepPlan plan = planner_->PlanStep(start_step_, loading_, options_.process, ShardPlanner::Detail::kSamples);
  std::vector<int64_t> shard_of;
  for (const auto& d : plan.devices) shard_of.push_back(d.shard);
  auto device = staging::DeviceSlotMemory::Create(**driver, share, layout_, ordinals, shard_of,
                                                  static_cast<uint32_t>(rj.spec.batch.prefetch), memory_->slot(0),
                                                  memory_->pool_bytes());
  if (!device.ok()) return host_because("device staging could not be set up: " + device.status().ToString());
  device_ = std::move(*device);
  metrics_->device_memory.Set(static_cast<double>(device_->total_bytes()));
  staging_mode_ = share == staging::DeviceShare::kCudaVmm ? "cuda" : "cuda-ipc";
  set_mode();
  std::string used;
  for (const auto& u : device_->uuids()) used += (used.empty() ? "" : ",") + u;
  staging_reason_ = "CUDA driver " + std::to_string((*driver)->version()) + ", staging on " + used +
                    (share == staging::DeviceShare::kCudaVmm ? " (VMM, fds over SCM_RIGHTS)"
                                                             : " (legacy CUDA IPC handles)");
  bool replicas = false;
  for (size_t i = 0; i < shard_of.size(); ++i) {
    for (size_t j = 0; j < i; ++j) replicas |= shard_of[i] == shard_of[j];
  }
  if (replicas) {
    staging_reason_ += device_->peer_access() ? ", local replicas copied device to device"
                                              : ", local replicas copied from the host where their GPUs cannot reach "
                                                "each other";
  }
  if (!device_->peer_access()) {
    LogInfo("some local replicas cannot reach their shard's GPU directly: those copies go through the host");
  }
  if (!device_->host_pinned()) {
    LogWarn("the host assembly pool is not page-locked: copies to the GPU are slower",
               {{"error", device_->host_pin_error()}});
  }
  return Status::Ok();
}

Sidecar::~Sidecar() {
  stop_ = true;
  if (pool_) pool_->Shutdown();
  for (auto& p : producers_) p.join();
  if (health_) health_->Stop();
  if (listen_fd_.valid()) ::unlink(options_.socket_path.c_str());
}

void Sidecar::RequestStop() {
  stop_.store(true);
  if (event_fd_.valid()) {
    uint64_t one = 1;
    ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
    (void)n;
  }
}

void Sidecar::Notify() {
  uint64_t one = 1;
  ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
  (void)n;
}

std::pair<bool, std::string> Sidecar::Readiness() const {
  if (failed_) return {false, "failed: see the logs and meshload_errors_total"};
  if (!target_staged_) return {false, "staging the first batch"};
  return {true, "ready"};
}

void Sidecar::ProducerMain(int index) {
  const std::string name = "ml-stage-" + std::to_string(index);
  ApplyThreadSched(options_.thread_sched, name.c_str());  // before the name, which tests wait for
  ::pthread_setname_np(::pthread_self(), name.c_str());
  while (!stop_ && !failed_) {
    const uint64_t gen = pool_->generation();
    metrics_->next_staged_step.Set(static_cast<double>(pool_->next_fill_step()));
    auto fill = pool_->AcquireNextForFill(gen, std::chrono::milliseconds(200));
    if (!fill) {
      // No free slot: the trainer holds them all (or the target moved).
      if (pool_->generation() == gen && !stop_ && producer_blocked_since_ns_.load() == 0) {
        producer_blocked_since_ns_.store(NowNs());
      }
      continue;
    }
    producer_blocked_since_ns_.store(0);
    const auto [slot, step] = *fill;
    const auto t0 = Clock::now();
    StepLoadStats stats;
    Status st = loader_->Load(step, memory_->slot(slot), slot_checksums_[slot], &stats, index, [&] {
      return pool_->generation() != gen || stop_.load() || failed_.load();
    });
    if (!st.ok() && st.code() == StatusCode::kCancelled && (pool_->generation() != gen || stop_.load())) {
      // A re-plan (or a stop) abandoned this step while it waited on peers.
      pool_->AbandonFill(slot);
      continue;
    }
    if (!st.ok()) {
      StagingFailed(slot, step, std::string("load_") + std::string(StatusCodeName(st.code())),
                    "cannot stage a batch", st);
      return;
    }
    if (device_) {
      // To the GPUs, fenced: READY may go out once this returns.
      const auto c0 = Clock::now();
      Status ds = device_->Stage(slot, memory_->slot(slot));
      metrics_->device_copy.Observe(std::chrono::duration<double>(Clock::now() - c0).count());
      if (!ds.ok()) {
        StagingFailed(slot, step, "device_copy", "cannot copy a batch to the GPU", ds);
        return;
      }
    }
    metrics_->step_load.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (loader_->peers()) metrics_->peer_wait.Observe(stats.peer_wait_seconds);
    metrics_->samples_read.Increment(static_cast<double>(stats.samples_read));
    if (pool_->MarkReady(slot)) {
      {
        std::lock_guard lock(producer_mu_);
        if (gen == generation_) {
          metrics_->batches_staged.Increment();
          if (step == target_step_) target_staged_ = true;
        }
      }
      DeliverReady();
    }
  }
}

void Sidecar::StagingFailed(uint32_t slot, int64_t step, const std::string& kind, const char* what,
                            const Status& st) {
  pool_->AbandonFill(slot);
  metrics_->Error(kind);
  LogError(what, {{"step", step}, {"error", st.ToString()}});
  {
    std::lock_guard lock(producer_mu_);
    if (fatal_.ok()) fatal_ = st;
  }
  failed_ = true;
  Notify();
}

void Sidecar::DeliverReady() {
  // Producers must not queue up behind each other (or the server) on
  // client_mu_ just to send a READY: a producer that finds the lock taken
  // leaves the sending to the holder, who checks ready_pending_ after
  // letting go (ClientLock).
  ready_pending_.store(true);
  while (ready_pending_.load()) {
    std::unique_lock lock(client_mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    ready_pending_.store(false);
    SendReadyBatchesLocked();
  }
}

Sidecar::ClientLock::ClientLock(Sidecar& s) : s_(s), lock_(s.client_mu_) {}

Sidecar::ClientLock::~ClientLock() { Unlock(); }

void Sidecar::ClientLock::Unlock() {
  if (!lock_.owns_lock()) return;
  lock_.unlock();
  if (s_.ready_pending_.load()) s_.DeliverReady();
}

bool Sidecar::PipelineStartsAt(int64_t step) {
  // The producers stage consecutive steps, so the pipeline serves `step`
  // when the lowest step held in a slot (or, with none held, the next step
  // to stage) is `step`; otherwise the trainer needs a re-plan.
  return pool_->FirstPendingStep() == step;
}

void Sidecar::RestartAt(int64_t step) {
  std::lock_guard lock(producer_mu_);
  // The exchange first: stagings of the old generation stop moving data
  // before a new one can begin.
  if (exchange::PeerExchange* x = loader_->peers()) x->Restart(step);
  generation_ = pool_->Reset(step);
  target_step_ = step;
  target_staged_ = false;
}

void Sidecar::AcceptClient() {
  auto fd = protocol::Accept(listen_fd_.get());
  if (!fd.ok()) return;
  auto creds = protocol::GetPeerCredentials(fd->get());
  auto refuse = [&](protocol::ErrorCode code, const std::string& msg, const char* outcome) {
    // Counted and logged before the trainer hears of it, so that what it
    // then sees in /metrics includes its own refusal.
    metrics_->connections.Add({{"outcome", outcome}}).Increment();
    LogWarn("refused a trainer connection", {{"reason", msg}});
    (void)protocol::SendTo(fd->get(), protocol::Encode(protocol::ErrorMessage{code, msg}));
    CloseLater(std::move(*fd));
  };
  if (!creds.ok()) {
    refuse(protocol::ErrorCode::kPermissionDenied, "cannot read peer credentials: " + creds.status().ToString(),
           "refused_uid");
    return;
  }
  if (std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), creds->uid) ==
      options_.allowed_uids.end()) {
    refuse(protocol::ErrorCode::kPermissionDenied,
           "uid " + std::to_string(creds->uid) + " is not allowed to connect (pid " + std::to_string(creds->pid) + ")",
           "refused_uid");
    return;
  }
  if (failure_reported_) {
    refuse(protocol::ErrorCode::kDataError, fatal_message_, "refused_failed");
    return;
  }
  if (client_ || pending_) {
    refuse(protocol::ErrorCode::kBusy,
           "another trainer (pid " + std::to_string(client_ ? client_->pid : pending_->pid) + ") is connected",
           "refused_busy");
    return;
  }
  pending_ = std::make_unique<Client>();
  pending_->fd = std::move(*fd);
  pending_->pid = creds->pid;
  pending_->uid = creds->uid;
}

void Sidecar::CloseLater(UniqueFd fd, LeaseList leases, pid_t pid) {
  // The sidecar sends nothing more: the trainer reads what is queued, then
  // end of file. It may still send (RELEASEs and a BYE, for kept leases).
  ::shutdown(fd.get(), SHUT_WR);
  // At most 64 connections without leases drain at once: beyond that the
  // oldest of them is closed now. Connections that keep leases are never
  // evicted (a flood of refused connections must not free a trainer's held
  // slots); there are at most as many as slots, each keeps at least one.
  if (std::count_if(closing_.begin(), closing_.end(), [](const Closing& c) { return c.leases.empty(); }) >= 64) {
    closing_.erase(std::find_if(closing_.begin(), closing_.end(), [](const Closing& c) { return c.leases.empty(); }));
  }
  closing_.push_back({std::move(fd), Clock::now() + std::chrono::seconds(1), std::move(leases), pid});
}

void Sidecar::ReclaimClosing(Closing& c, const char* why, const LeaseList* only) {
  uint32_t reclaimed = 0;
  std::erase_if(c.leases, [&](const auto& l) {
    if (only != nullptr && std::find(only->begin(), only->end(), l) == only->end()) return false;
    reclaimed += pool_->Release(l.first, l.second) ? 1 : 0;
    return true;
  });
  if (reclaimed > 0) {
    metrics_->leases_reclaimed.Increment(reclaimed);
    LogInfo("leases of a former trainer connection reclaimed",
            {{"pid", static_cast<int64_t>(c.pid)},
             {"reason", why},
             {"leases_reclaimed", static_cast<uint64_t>(reclaimed)},
             {"leases_kept", static_cast<uint64_t>(c.leases.size())}});
  }
}

bool Sidecar::ServeClosingMessages(Closing& c) {
  if (c.leases.empty()) {
    char buf[256];
    while (true) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
      if (n < 0) return true;
    }
  }
  // The trainer may still release the batches it held: every message
  // queued is read now (a closing connection gets no ERROR back; anything
  // but a RELEASE of one of its leases, or a BYE, is ignored).
  for (int i = 0; i < 256; ++i) {
    pollfd p{c.fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    auto msg = protocol::ReceiveMessage(c.fd.get(), protocol::kMaxMessageBytes);
    if (!msg.ok()) {
      if (msg.status().code() == StatusCode::kUnavailable) return false;  // EOF or reset
      continue;
    }
    auto decoded = protocol::Decode(msg->bytes);
    if (!decoded.ok()) continue;
    if (const auto* rel = std::get_if<protocol::Release>(&*decoded)) {
      auto it = std::find(c.leases.begin(), c.leases.end(), std::make_pair(rel->slot, rel->step));
      if (it == c.leases.end()) continue;
      c.leases.erase(it);
      if (pool_->Release(rel->slot, rel->step)) Consumed(rel->step, rel->wait_ns);
    } else if (const auto* bye = std::get_if<protocol::Bye>(&*decoded)) {
      // After an ERROR: the trainer says which batches it still holds; the
      // others (READYs it never handed out) come back now.
      LeaseList unheld;
      for (const auto& l : c.leases) {
        if (std::find(bye->held.begin(), bye->held.end(), protocol::Bye::Held{l.first, l.second}) == bye->held.end()) {
          unheld.push_back(l);
        }
      }
      ReclaimClosing(c, "BYE: batches the trainer never received", &unheld);
    }
    if (c.leases.empty()) {
      c.deadline = Clock::now() + std::chrono::seconds(1);
      return true;
    }
  }
  return true;
}

void Sidecar::ServeClosing(const pollfd* fds, size_t count) {
  // Matched by descriptor, not position: CloseLater may have changed the
  // list since the poll set was built.
  std::vector<int> done;
  for (size_t i = 0; i < count; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) continue;
    for (Closing& c : closing_) {
      if (c.fd.get() == fds[i].fd && !ServeClosingMessages(c)) done.push_back(fds[i].fd);
    }
  }
  const auto now = Clock::now();
  std::erase_if(closing_, [&](Closing& c) {
    const bool closed = std::find(done.begin(), done.end(), c.fd.get()) != done.end();
    if (closed) ReclaimClosing(c, "the trainer closed it");
    return closed || (c.leases.empty() && now > c.deadline);
  });
}

void Sidecar::OnHello(const protocol::ClientHello& hello) {
  if (hello.want_step > (int64_t{1} << 62)) {
    // Counted before the trainer hears of it (as in AcceptClient).
    metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
    (void)protocol::SendTo(pending_->fd.get(), protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kBadRequest,
                                                                        "want_step " + std::to_string(hello.want_step) +
                                                                            " is out of range"}));
    CloseLater(std::move(pending_->fd));
    pending_.reset();
    return;
  }
  const int64_t want = hello.want_step >= 0 ? hello.want_step : start_step_;
  if (!PipelineStartsAt(want)) {
    LogInfo("re-planning for the trainer", {{"step", want}});
    RestartAt(want);
  } else {
    // Ready once `want` is staged: maybe already (a producer comparing its
    // step with target_step_ before this did not count it), maybe not yet
    // (every staged step was consumed: an earlier step's readiness does
    // not count).
    std::lock_guard lock(producer_mu_);
    target_step_ = want;
    target_staged_ = pool_->WaitReady(want, std::chrono::milliseconds(0));
  }
  ClientLock client_lock(*this);
  client_ = std::move(pending_);
  client_->next_to_send = want;
  // The trainer starts at `want`: what comes before it is done, from its side.
  consumed_.Reset(want);
  delivered_step_.store(want - 1);
  const ResolvedJob& rj = planner_->job();
  protocol::ServerHello sh;
  sh.job = job_name_;
  sh.process = static_cast<uint32_t>(options_.process);
  for (size_t i = 0; i < layout_.devices.size(); ++i) {
    const auto& t = layout_.devices[i];
    sh.devices.push_back({static_cast<uint32_t>(t.device), static_cast<uint8_t>(device_ ? 2 : 1),
                          device_ ? device_->uuids()[i] : ""});
    const DLPackType dl = ToDLPackType(layout_.dtype);
    sh.layout.push_back({TensorOffset(i), dl.code, dl.bits, t.shape, t.strides, t.nbytes});
  }
  sh.slots = memory_->slots();
  std::vector<int> fds;
  if (!device_) {
    sh.memory = protocol::MemoryKind::kHostMemfd;
    sh.slot_bytes = memory_->slot_bytes();
    sh.pool_bytes = memory_->pool_bytes();
    fds = {memory_->fd()};
  } else {
    sh.slot_bytes = device_->alloc_bytes();
    sh.pool_bytes = device_->alloc_bytes() * device_->slots();
    if (device_->share() == staging::DeviceShare::kCudaVmm) {
      sh.memory = protocol::MemoryKind::kCudaVmmFd;
      fds = device_->fds();
    } else {
      sh.memory = protocol::MemoryKind::kCudaIpc;
      for (const auto& h : device_->ipc_handles()) sh.ipc_handles.emplace_back(h.begin(), h.end());
    }
  }
  sh.fd_count = static_cast<uint32_t>(fds.size());
  sh.first_step = want;
  sh.steps_per_epoch = rj.steps_per_epoch;
  sh.global_batch = rj.global_batch;
  sh.mesh.processes = static_cast<uint32_t>(rj.mesh.processes());
  sh.mesh.devices_per_process = static_cast<uint32_t>(rj.mesh.devices_per_process());
  for (const MeshAxis& a : rj.spec.mesh.axes) sh.mesh.axes.push_back({a.name, static_cast<uint64_t>(a.size)});
  sh.mesh.batch_axes = EffectiveBatchAxes(rj.spec.mesh);
  Status st = protocol::SendMessage(client_->fd.get(), protocol::Encode(sh), fds, /*nonblocking=*/true);
  if (!st.ok()) {
    client_lock.Unlock();
    DropClient("sending SERVER_HELLO failed: " + st.ToString());
    return;
  }
  metrics_->connections.Add({{"outcome", "accepted"}}).Increment();
  metrics_->clients.Set(1);
  LogInfo("trainer connected", {{"pid", static_cast<int64_t>(client_->pid)},
                                {"uid", static_cast<uint64_t>(client_->uid)},
                                {"step", want}});
  SendReadyBatchesLocked();
}

void Sidecar::SendReadyBatchesLocked() {
  if (!client_ || client_->broken) return;
  while (client_->leased.size() < max_leases_) {
    auto slot = pool_->Lease(client_->next_to_send);
    if (!slot) break;
    protocol::Ready r;
    r.step = client_->next_to_send;
    r.slot = *slot;
    const DLPackType dl = ToDLPackType(layout_.dtype);
    for (size_t i = 0; i < layout_.devices.size(); ++i) {
      const auto& t = layout_.devices[i];
      r.tensors.push_back({TensorOffset(i), dl.code, dl.bits, t.shape, t.strides, slot_checksums_[*slot][i]});
    }
    Status st = protocol::SendTo(client_->fd.get(), protocol::Encode(r));
    if (!st.ok()) {
      // Possibly on the producer thread: leave the dropping to the server.
      pool_->Release(*slot, r.step);
      client_->broken = true;
      Notify();
      return;
    }
    client_->leased.emplace_back(*slot, r.step);
    client_->next_to_send++;
    metrics_->batches_delivered.Increment();
    metrics_->current_step.Set(static_cast<double>(r.step));
    delivered_step_.store(r.step);
  }
}

void Sidecar::DropClient(const std::string& why, bool keep_leases, const LeaseList* keep) {
  ClientLock lock(*this);
  if (!client_) return;
  const LeaseList& mine = client_->leased;
  LeaseList kept;
  uint32_t reclaimed = 0;
  for (const auto& l : mine) {
    const bool held = keep_leases && (keep == nullptr || std::find(keep->begin(), keep->end(), l) != keep->end());
    if (held) {
      kept.push_back(l);
    } else {
      reclaimed += pool_->Release(l.first, l.second) ? 1 : 0;
    }
  }
  metrics_->leases_reclaimed.Increment(reclaimed);
  metrics_->clients.Set(0);
  LogInfo("trainer disconnected", {{"pid", static_cast<int64_t>(client_->pid)},
                                   {"reason", why},
                                   {"leases_reclaimed", static_cast<uint64_t>(reclaimed)},
                                   {"leases_kept", static_cast<uint64_t>(kept.size())},
                                   {"next_step", client_->next_to_send}});
  // Drained before closing, so an ERROR just sent is not lost to a reset;
  // batches the trainer still holds stay lent until it releases or closes.
  CloseLater(std::move(client_->fd), std::move(kept), client_->pid);
  client_.reset();
}

void Sidecar::ServeClientMessage() {
  auto msg = protocol::ReceiveMessage(client_->fd.get(), protocol::kMaxMessageBytes);
  if (!msg.ok()) {
    // End of file or a reset: the trainer is gone, its leases come back.
    // Anything else (an oversized datagram) leaves a trainer that may
    // still hold batches: they stay lent until it closes.
    const bool gone = msg.status().code() == StatusCode::kUnavailable;
    if (!gone) metrics_->Error("protocol");
    DropClient(msg.status().ToString(), /*keep_leases=*/!gone);
    return;
  }
  auto decoded = protocol::Decode(msg->bytes);
  if (!decoded.ok()) {
    metrics_->Error("protocol");
    (void)protocol::SendTo(client_->fd.get(),
                           protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kBadRequest, decoded.status().ToString()}));
    DropClient("malformed message: " + decoded.status().ToString(), /*keep_leases=*/true);
    return;
  }
  if (const auto* bye = std::get_if<protocol::Bye>(&*decoded)) {
    LeaseList keep;
    for (const auto& h : bye->held) keep.emplace_back(h.slot, h.step);
    DropClient("the trainer left the connection (BYE)", /*keep_leases=*/true, &keep);
    return;
  }
  if (const auto* rel = std::get_if<protocol::Release>(&*decoded)) {
    bool ours = false;
    {
      ClientLock lock(*this);
      auto& leased = client_->leased;
      auto it = std::find(leased.begin(), leased.end(), std::make_pair(rel->slot, rel->step));
      ours = it != leased.end() && pool_->Release(rel->slot, rel->step);
      if (ours) {
        leased.erase(it);
        Consumed(rel->step, rel->wait_ns);
        SendReadyBatchesLocked();
      }
    }
    if (!ours) {
      metrics_->Error("protocol");
      (void)protocol::SendTo(client_->fd.get(),
                             protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kBadRequest,
                                                           "RELEASE of slot " + std::to_string(rel->slot) +
                                                               " step " + std::to_string(rel->step) +
                                                               ", which this connection does not lease"}));
      DropClient("bad RELEASE", /*keep_leases=*/true);
    }
    return;
  }
  metrics_->Error("protocol");
  DropClient("unexpected message after the handshake", /*keep_leases=*/true);
}

Result<std::optional<int64_t>> ReadResumeFile(const std::string& path, int64_t spec_step) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::optional<int64_t>();
    return IoErrorFromErrno("cannot read the resume file", path, errno);
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, "resume file: " + what + ", expected {\"step\": N, \"specStep\": S}",
                  path);
  };
  if (!doc.is_object()) return bad("not a JSON object");
  const auto step = doc.find("step");
  const auto spec = doc.find("specStep");
  if (step == doc.end() || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return bad("\"step\" is not a non-negative integer");
  }
  if (spec == doc.end() || !spec->is_number_integer()) return bad("\"specStep\" is not an integer");
  // Recorded under another spec.resume.step: the user asked for a new start since.
  if (spec->get<int64_t>() != spec_step) return std::optional<int64_t>();
  return std::optional<int64_t>(step->get<int64_t>());
}

void Sidecar::Consumed(int64_t step, uint64_t wait_ns) {
  metrics_->batches_consumed.Increment();
  metrics_->trainer_wait.Observe(static_cast<double>(wait_ns) / 1e9);
  consumed_.Consumed(step);
}

ProgressSample Sidecar::TakeProgressSample() const {
  ProgressSample s;
  s.time_ns = NowNs();
  s.consumed_step = consumed_.step();
  s.delivered_step = delivered_step_.load();
  s.next_staged_step = pool_->next_fill_step();
  s.batches_consumed = static_cast<uint64_t>(metrics_->batches_consumed.Value());
  s.trainer_wait_seconds = metrics_->trainer_wait.Sum();
  s.trainer_waits = metrics_->trainer_wait.Count();
  s.read_latency_buckets.assign(kReadLatencyBuckets.size() + 1, 0);
  metrics_->read_latency.ForEach([&](const metrics::Labels&, const metrics::Histogram& h) {
    const std::vector<uint64_t> c = h.CumulativeCounts();
    for (size_t i = 0; i < c.size() && i < s.read_latency_buckets.size(); ++i) s.read_latency_buckets[i] += c[i];
  });
  auto sum = [](const metrics::Family<metrics::Counter>& f) {
    double total = 0;
    f.ForEach([&](const metrics::Labels&, const metrics::Counter& c) { total += c.Value(); });
    return static_cast<uint64_t>(total);
  };
  s.bytes_read = sum(metrics_->bytes_read);
  s.staging_seconds = metrics_->step_load.Sum();
  s.steps_staged = metrics_->step_load.Count();
  s.exchanges = loader_->peers() != nullptr;
  s.peer_wait_seconds = metrics_->peer_wait.Sum();
  s.storage_retries = sum(metrics_->retries);
  s.errors = sum(metrics_->errors);
  s.trainer_connected = metrics_->clients.Value() > 0;
  return s;
}

std::string Sidecar::ProgressJson() {
  progress_->Add(TakeProgressSample());
  nlohmann::json report = progress_->Report();
  report["job"] = job_name_;
  report["process"] = options_.process;
  report["stepsPerEpoch"] = planner_->job().steps_per_epoch;
  return report.dump();
}

void Sidecar::Watchdog() {
  if (progress_) progress_->Add(TakeProgressSample());
  const double limit = std::chrono::duration<double>(options_.stall_report_after).count();
  const InflightRead oldest = loader_->OldestInflight();
  if (oldest.seconds > limit) {
    if (!reported_stuck_read_) {
      LogWarn("storage read stuck", {{"object", source::RedactUri(oldest.uri)},
                                     {"offset", oldest.offset},
                                     {"length", oldest.length},
                                     {"seconds", oldest.seconds}});
      metrics_->Error("read_stalled");
      reported_stuck_read_ = true;
    }
  } else {
    reported_stuck_read_ = false;
  }
  const int64_t since = producer_blocked_since_ns_.load();
  const double blocked = since ? static_cast<double>(NowNs() - since) / 1e9 : 0.0;
  if (blocked > limit && client_) {
    if (!reported_blocked_) {
      ClientLock lock(*this);
      uint64_t kept = 0;  // batches the trainer still holds from connections it left
      for (const Closing& c : closing_) kept += c.leases.size();
      LogWarn("trainer holds every slot; staging is paused", {{"seconds", blocked},
                                                              {"leased", static_cast<uint64_t>(client_->leased.size())},
                                                              {"kept", kept},
                                                              {"next_step", client_->next_to_send}});
      reported_blocked_ = true;
    }
  } else {
    reported_blocked_ = false;
  }
}

int Sidecar::Run() {
  auto last_watchdog = Clock::now();
  // The server loop too: a RELEASE it handles a little later costs nothing
  // (the trainer has `prefetch` batches), preempting a producer does.
  ApplyThreadSched(options_.thread_sched, "server");
  while (!stop_) {
    // Connections closing: at most 64 without leases, and at most one per
    // slot with them.
    thread_local std::vector<pollfd> fd_storage;
    fd_storage.resize(4 + closing_.size());
    pollfd* fds = fd_storage.data();
    nfds_t n = 0;
    fds[n++] = {event_fd_.get(), POLLIN, 0};
    fds[n++] = {listen_fd_.get(), POLLIN, 0};
    const int client_i = client_ ? static_cast<int>(n) : -1;
    if (client_) fds[n++] = {client_->fd.get(), POLLIN, 0};
    const int pending_i = pending_ ? static_cast<int>(n) : -1;
    if (pending_) fds[n++] = {pending_->fd.get(), POLLIN, 0};
    const nfds_t closing_i = n;
    for (const auto& c : closing_) fds[n++] = {c.fd.get(), POLLIN, 0};
    int rc = ::poll(fds, n, 250);
    if (rc < 0 && errno != EINTR) {
      LogError("poll failed", {{"error", std::strerror(errno)}});
      failed_ = true;
      break;
    }
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      while (::read(event_fd_.get(), &v, sizeof v) > 0) {
      }
    }
    if (stop_) break;
    if (failed_ && !failure_reported_) {
      // Staging cannot go on. Stay up so the failure is visible (/healthz
      // answers 503 with the reason; every trainer that connects gets it as
      // an ERROR) until stopped, then exit 1.
      Status fatal;
      {
        std::lock_guard lock(producer_mu_);
        fatal = fatal_;
      }
      fatal_message_ = fatal.ToString();
      // /healthz first: a trainer told of the failure may look there at once.
      if (health_) health_->SetHealthy(false, fatal_message_);
      if (client_) {
        (void)protocol::SendTo(client_->fd.get(),
                               protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kDataError, fatal_message_}));
        DropClient("staging failed", /*keep_leases=*/true);
      }
      if (pending_) {  // accepted before the failure, hello not yet read
        (void)protocol::SendTo(pending_->fd.get(),
                               protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kDataError, fatal_message_}));
        CloseLater(std::move(pending_->fd));
        pending_.reset();
      }
      failure_reported_ = true;
    }
    if (!closing_.empty()) ServeClosing(fds + closing_i, n - closing_i);
    // The trainer's messages before new connections: a BYE and the same
    // trainer's next connection may arrive in one wake-up.
    if (client_i >= 0 && client_ && (fds[client_i].revents & (POLLIN | POLLHUP | POLLERR))) {
      // Every message already queued is served in this wake-up (RELEASEs
      // pile up while the producers keep the cores busy).
      ServeClientMessage();
      for (int more = 0; more < 64 && client_; ++more) {
        pollfd again{client_->fd.get(), POLLIN, 0};
        if (::poll(&again, 1, 0) <= 0) break;
        ServeClientMessage();
      }
    }
    if (rc > 0 && (fds[1].revents & POLLIN)) AcceptClient();
    if (ready_pending_.load()) DeliverReady();
    if (pending_i >= 0 && pending_ && (fds[pending_i].revents & (POLLIN | POLLHUP | POLLERR))) {
      auto msg = protocol::ReceiveMessage(pending_->fd.get(), protocol::kMaxMessageBytes);
      Result<protocol::Message> decoded = msg.ok() ? protocol::Decode(msg->bytes) : Result<protocol::Message>(msg.status());
      const protocol::ClientHello* hello = decoded.ok() ? std::get_if<protocol::ClientHello>(&*decoded) : nullptr;
      if (!hello) {
        const std::string why = decoded.ok() ? "expected CLIENT_HELLO" : decoded.status().ToString();
        // A well-formed header of another protocol version deserves the
        // version error, so a newer or older client can say what is wrong.
        const bool other_version = msg.ok() && msg->bytes.size() >= 6 &&
                                   static_cast<uint8_t>(msg->bytes[4]) + 256 * static_cast<uint8_t>(msg->bytes[5]) !=
                                       protocol::kProtocolVersion &&
                                   msg->bytes.compare(0, 4, "MLD1") == 0;
        metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
        LogWarn("dropped a trainer connection before its hello", {{"reason", why}});
        if (msg.ok()) {
          (void)protocol::SendTo(pending_->fd.get(),
              protocol::Encode(protocol::ErrorMessage{other_version ? protocol::ErrorCode::kVersionMismatch : protocol::ErrorCode::kBadRequest,
                                            other_version ? "this sidecar speaks protocol version " +
                                                                std::to_string(protocol::kProtocolVersion)
                                                          : why}));
        }
        CloseLater(std::move(pending_->fd));
        pending_.reset();
      } else if (hello->version != protocol::kProtocolVersion) {
        metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
        LogWarn("dropped a trainer connection: protocol version mismatch", {{"version", static_cast<uint64_t>(hello->version)}});
        (void)protocol::SendTo(pending_->fd.get(),
                               protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kVersionMismatch,
                                                             "this sidecar speaks protocol version " +
                                                                 std::to_string(protocol::kProtocolVersion)}));
        CloseLater(std::move(pending_->fd));
        pending_.reset();
      } else {
        OnHello(*hello);
      }
    }
    if (pending_ && Clock::now() - pending_->connected_at > options_.hello_timeout) {
      metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
      LogWarn("dropped a trainer connection: no CLIENT_HELLO in time", {{"pid", static_cast<int64_t>(pending_->pid)}});
      pending_.reset();
    }
    if (client_ && client_->broken) DropClient("sending READY failed", /*keep_leases=*/true);
    if (Clock::now() - last_watchdog > std::chrono::milliseconds(500)) {
      Watchdog();
      last_watchdog = Clock::now();
    }
  }
  // From here on no producer stages into any slot: the trainer keeps the
  // batches it holds (it reconnects to the next sidecar and releases them
  // on this connection, or not at all), and their bytes must not change.
  // Nor is a connection queued where nobody will accept it: a trainer
  // reconnecting finds no socket and backs off instead of waiting 5 s for a
  // SERVER_HELLO that never comes.
  pool_->Shutdown();
  if (listen_fd_.valid()) {
    listen_fd_.Reset();
    ::unlink(options_.socket_path.c_str());
  }
  if (client_) {
    (void)protocol::SendTo(client_->fd.get(),
                           protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kShuttingDown, "the sidecar is stopping"}));
    DropClient("the sidecar is stopping", /*keep_leases=*/true);
  }
  // Give the connections being closed a moment (at most 300 ms) to read what
  // was sent to them, so the last ERROR is not lost to a reset at exit.
  // Those that keep leases are not waited for: the slots go with the process.
  std::erase_if(closing_, [](const Closing& c) { return !c.leases.empty(); });
  const auto drain_until = Clock::now() + std::chrono::milliseconds(300);
  while (!closing_.empty() && Clock::now() < drain_until) {
    std::vector<pollfd> cfds;
    for (const auto& c : closing_) cfds.push_back({c.fd.get(), POLLIN, 0});
    ::poll(cfds.data(), cfds.size(), 20);
    ServeClosing(cfds.data(), cfds.size());
  }
  LogInfo("sidecar stopping", {{"job", job_name_}, {"process", options_.process}});
  return failed_ ? 1 : 0;
}

}  // namespace meshload::sidecar
