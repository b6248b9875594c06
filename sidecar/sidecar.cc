#include "sidecar/sidecar.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <fstream>
#include <cerrno>

#include "common/logging.h"
#include "planner/job_files.h"
#include "sidecar/session_server.h"
#include "sidecar/sidecar_metrics.h"
#include "sidecar/source/dataset_facts.h"

#ifndef MESHLOAD_VERSION
#define MESHLOAD_VERSION "dev"
#endif

namespace meshload::sidecar {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

Result<planner::ResolvedJob> ResolveForSidecar(const planner::ValidJob& job, source::SourceRegistry& sources,
                                               Diagnostics& diags) {
  return source::ResolveWithSources(job, sources, {}, source::Unreachable::kFail, diags);
}

Sidecar::Sidecar(SidecarOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<Sidecar>> Sidecar::Create(planner::ValidJob job, SidecarOptions options) {
  std::unique_ptr<Sidecar> s(new Sidecar(std::move(options)));
  MESHLOAD_RETURN_IF_ERROR(s->Init(job));
  return s;
}

Status Sidecar::Init(const planner::ValidJob& job) {
  registry_ = std::make_unique<metrics::Registry>();
  metrics_ = std::make_unique<SidecarMetrics>(*registry_);
  metrics_->started_ns = NowNs();
  observer_ = std::make_unique<StorageMetricsObserver>(*metrics_);
  metrics::RegisterBuildInfo(*registry_, MESHLOAD_VERSION, "sidecar");
  options_.source_options.observer = observer_.get();
  Diagnostics diags;
  job_name_ = job.name();
  MESHLOAD_ASSIGN_OR_RETURN(options_.source_options,
                            source::SourceOptionsForJob(job.spec(), std::move(options_.source_options)));
  // Local files want a few readers; remote storage many (its latency), as
  // each scheme's registration says (the readers size the sources'
  // connection pools, so this is asked before the sources are made).
  const bool all_local = !source::ReadsOverNetwork(job.spec(), *source::SourceRegistry::WithBuiltins({}));
  const bool reader_threads_given = options_.reader_threads > 0;
  if (options_.reader_threads <= 0) options_.reader_threads = all_local ? 4 : 16;
  // Every reader of every producer keeps its connection between steps.
  options_.source_options.max_idle_connections = std::max(
      options_.source_options.max_idle_connections, options_.reader_threads * std::max(1, options_.staging_threads));
  sources_ = source::SourceRegistry::WithBuiltins(options_.source_options);
  auto resolved = ResolveForSidecar(job, *sources_, diags);
  if (!resolved.ok() || !diags.ok()) {
    if (!diags.ok()) return InvalidArgument(diags.Report("invalid DataLoadJob"), options_.job_path);
    return resolved.status();
  }
  planner_ = std::make_unique<planner::ShardPlanner>(std::move(*resolved));
  const planner::ResolvedJob& rj = planner_->job();
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
  MESHLOAD_ASSIGN_OR_RETURN(
      memory_, staging::HostSlotMemory::Create(slots, layout_.slot_bytes,
                                               "meshload-" + job_name_ + "-p" + std::to_string(options_.process)));
  int64_t first_step = rj.spec.resume.step;
  if (options_.start_step) {
    first_step = *options_.start_step;
  } else if (!options_.resume_file.empty()) {
    MESHLOAD_ASSIGN_OR_RETURN(std::optional<int64_t> recorded,
                              ReadResumeFile(options_.resume_file, rj.spec.resume.step));
    if (recorded) {
      LogInfo("resuming at the step the controller recorded", {{"step", *recorded}, {"file", options_.resume_file}});
      first_step = *recorded;
    }
  }
  start_step_ = first_step;
  {
    // No producer runs yet; the lock is for the analysis (target_step_ is
    // guarded).
    MutexLock lock(producer_mu_);
    target_step_ = first_step;
  }
  ProgressOptions popts;
  popts.window = options_.progress_window;
  progress_ = std::make_unique<ProgressWindow>(kReadLatencyBuckets, popts);
  MESHLOAD_RETURN_IF_ERROR(InitDeviceStaging());
  pool_ = std::make_unique<staging::SlotPool>(slots, start_step_, options_.clock);
  slot_staged_.assign(slots, {});
  options_.staging_threads = std::clamp(options_.staging_threads, 1, static_cast<int>(slots));
  MESHLOAD_RETURN_IF_ERROR(InitCache());
  // Parquet files are read as their rows' records: row groups decoded from
  // their column chunks, read from storage directly (not through blocks),
  // kept in memory within the cache's capacity.
  MESHLOAD_ASSIGN_OR_RETURN(
      parquet_rows_,
      source::InstallParquetRows(planner_->job().dataset, *sources_,
                                 static_cast<uint64_t>(planner_->job().spec.dataset.cache.capacity_bytes)));
  // Through the block cache, reads are memory copies (the fetch-ahead's
  // threads wait on the network): a local dataset's readers.
  if (cache_mode_ == "blocks" && !reader_threads_given) options_.reader_threads = 4;
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
    if (lopts.peers->clock == nullptr) lopts.peers->clock = options_.clock;
  }
  MESHLOAD_ASSIGN_OR_RETURN(loader_,
                            StepLoader::Create(*planner_, options_.process, loading_, *sources_, layout_, lopts));
  MESHLOAD_RETURN_IF_ERROR(loader_->VerifyFiles());
  if (fetch_ahead_) fetch_ahead_->Start(start_step_);

  event_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_.valid()) return IoErrorFromErrno("eventfd", "", errno);
  // The trainer side (sidecar/session_server.h); the consumed watermark
  // starts at start_step_.
  if (options_.allowed_uids.empty()) options_.allowed_uids.push_back(::getuid());
  server_ = std::make_unique<SessionServer>(SessionServer::Context{
      .options = {.socket_path = options_.socket_path,
                  .socket_mode = options_.socket_mode,
                  .allowed_uids = options_.allowed_uids,
                  .hello_timeout = options_.hello_timeout,
                  .process = options_.process,
                  .thread_sched = options_.thread_sched},
      .metrics = metrics_.get(),
      .job = &planner_->job(),
      .job_name = job_name_,
      .layout = &layout_,
      .memory = memory_.get(),
      .device = device_.get(),
      .pool = pool_.get(),
      .slot_staged = &slot_staged_,
      .start_step = start_step_,
      .wake_fd = event_fd_.get(),
      .stop = &stop_,
      .failed = &failed_,
      .hooks = {.start_at = [this](int64_t step) { StageFrom(step); },
                .failure = [this] { return ReportFailure(); },
                .watchdog = [this] { Watchdog(); }},
      .clock = options_.clock,
  });
  // Per-dataset counters: one per dataset of the index (a mixture's), and
  // the shards whose samples this process counts (those it is the lowest
  // process of), each by one of its devices.
  for (const planner::DatasetIndex::Part& part : planner_->job().dataset.parts()) {
    const std::string name = part.name.empty() ? "default" : part.name;
    const planner::TokenRows* rows = planner_->job().dataset.token_rows();
    const bool packed = rows && rows->mode() == planner::TokensMode::kPack;
    datasets_.push_back({name, &metrics_->dataset_samples.Add({{"dataset", name}}),
                         &metrics_->dataset_tokens.Add({{"dataset", name}}),
                         packed ? &metrics_->dataset_padding.Add({{"dataset", name}}) : nullptr});
  }
  {
    const planner::DeviceMesh& mesh = planner_->job().mesh;
    std::set<int64_t> shards;
    for (int64_t d = options_.process * mesh.devices_per_process();
         d < (options_.process + 1) * mesh.devices_per_process(); ++d) {
      const int64_t s = mesh.ShardOf(d);
      if (mesh.OwnerOf(s) == options_.process && shards.insert(s).second) counted_devices_.push_back(d);
    }
    MutexLock lock(datasets_mu_);
    datasets_counted_ = start_step_ - 1;
  }
  registry_->AddCollectHook([this] {
    CountConsumedDatasets();
    CountCache();
    metrics_->SetSlotCounts(pool_->Counts());
    metrics_->oldest_read.Set(loader_->OldestInflight().seconds);
    const int64_t since = producer_blocked_since_ns_.load();
    metrics_->producer_blocked.Set(since ? static_cast<double>(NowNs() - since) / 1e9 : 0.0);
    // The exchange counts; the counters follow (SidecarMetrics::CountPeers).
    if (const exchange::PeerExchange* x = loader_->peers()) metrics_->CountPeers(x->counters());
  });
  // Which job and process this sidecar serves, for dashboards and alerts
  // to join on (one series per sidecar).
  RegisterJobInfo(*registry_, job_name_, options_.process, ToString(loading_.strategy));
  if (options_.metrics_port >= 0) {
    metrics::HealthServerOptions hopts;
    hopts.bind_address = options_.metrics_address;
    hopts.port = options_.metrics_port;
    hopts.progress = [this] { return ProgressJson(); };
    health_ = std::make_unique<metrics::HealthServer>(
        *registry_, [this] { return Readiness(); }, hopts);
  }
  // The long-running parts, started in this order and stopped in the
  // reverse one: the trainer's socket, the metrics and health endpoint,
  // the staging threads. (The peer exchange, when the job has one, is the
  // loader's and runs from its creation above to the loader's end, after
  // the staging threads that use it have stopped.)
  parts_.Add({"the trainer socket " + options_.socket_path, [this] { return server_->Listen(); },
              [this] { server_->RemoveSocketFile(); }});
  if (health_) {
    parts_.Add({"the metrics endpoint",
                [this]() -> Status {
                  progress_->Add(TakeProgressSample());  // the window's first sample: rates count from the start
                  MESHLOAD_ASSIGN_OR_RETURN(metrics_port_, health_->Start());
                  return Status::Ok();
                },
                [this] { health_->Stop(); }});
  }
  parts_.Add({"staging",
              [this] {
                server_->ChooseMaxLeases();
                for (int i = 0; i < options_.staging_threads; ++i) {
                  producers_.emplace_back([this, i] { ProducerMain(i); });
                }
                return Status::Ok();
              },
              [this] {
                stop_ = true;
                pool_->Shutdown();
                for (auto& p : producers_) p.join();
                producers_.clear();
              }});
  MESHLOAD_RETURN_IF_ERROR(parts_.Start());
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
                              {"cache_mode", cache_mode_},
                              {"cache_reason", cache_reason_},
                              {"first_step", start_step_}});
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
  const planner::ResolvedJob& rj = planner_->job();
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
                               " slots make " + std::to_string(allocs) +
                               " allocations; one SERVER_HELLO carries at most " + std::to_string(protocol::kMaxFds) +
                               " descriptors",
                           "spec.batch.prefetch");
  }
  if (share == staging::DeviceShare::kCudaIpc && allocs > protocol::kMaxIpcHandles) {
    return InvalidArgument("too many IPC handles: " + std::to_string(allocs), "spec.batch.prefetch");
  }
  // Devices holding the same shard are replicas: they get a device copy.
  const planner::StepPlan plan =
      planner_->PlanStep(start_step_, loading_, options_.process, planner::ShardPlanner::Detail::kSamples);
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
  staging_reason_ =
      "CUDA driver " + std::to_string((*driver)->version()) + ", staging on " + used +
      (share == staging::DeviceShare::kCudaVmm ? " (VMM, fds over SCM_RIGHTS)" : " (legacy CUDA IPC handles)");
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

Status Sidecar::InitCache() {
  const planner::ResolvedJob& rj = planner_->job();
  const planner::DatasetCache& spec = rj.spec.dataset.cache;
  // The dataset's objects read through the cache: those whose source waits
  // on the network, and every file stored compressed (decompressed into
  // the cache, whatever its storage).
  source::Source* remote = nullptr;
  struct CachedFile {
    size_t file;
    std::string name;         // the source's name for the file
    std::string stored_name;  // and for its stored object, when it is stored compressed
  };
  std::vector<CachedFile> remote_files;
  bool stored_files = false;
  size_t parquet_files = 0;
  for (size_t i = 0; i < rj.dataset.files().size(); ++i) {
    const planner::DatasetFile& f = rj.dataset.files()[i];
    MESHLOAD_ASSIGN_OR_RETURN(auto found, sources_->For(f.path));
    std::string stored_name;
    // A Parquet file's rows are decoded from its column chunks, which a
    // row group's read fetches whole (sidecar/source/parquet_source.h).
    if (f.parquet) {
      ++parquet_files;
      continue;
    }
    if (f.stored) {
      MESHLOAD_ASSIGN_OR_RETURN(auto stored, sources_->For(f.stored->path));
      if (stored.first != found.first) {
        return InvalidArgument("is on another kind of storage than " + source::RedactUri(f.path),
                               source::RedactUri(f.stored->path));
      }
      stored_name = std::move(stored.second);
      stored_files = true;
    } else if (!found.first->LatencyBound()) {
      continue;
    }
    if (remote != nullptr && remote != found.first) {
      return InvalidArgument(
          "the dataset's objects read through the cache (remote ones, and files stored compressed) are on more "
          "than one kind of storage",
          "spec.dataset.uri");
    }
    remote = found.first;
    remote_files.push_back({i, std::move(found.second), std::move(stored_name)});
  }
  auto set_mode = [this](std::string mode, std::string why) {
    cache_mode_ = std::move(mode);
    cache_reason_ = std::move(why);
    for (const char* m : {"blocks", "direct", "none"}) metrics_->cache_mode.Add({{"mode", m}}).Set(cache_mode_ == m);
  };
  const planner::BlockGeometry geometry{static_cast<uint64_t>(spec.block_bytes),
                                        static_cast<uint64_t>(spec.whole_object_bytes)};
  // The bytes of blocks (a compressed file: its decompressed bytes) an epoch
  // of this process keeps in use at once under the job's shuffle.
  std::optional<uint64_t> in_use_bytes;  // estimated once
  auto in_use = [&] {
    if (!in_use_bytes) {
      in_use_bytes = planner::EstimateFetch(*planner_, loading_, options_.process, geometry,
                                            planner_->EpochOf(start_step_), 1 << 18)
                         .working_set_bytes;
    }
    return *in_use_bytes;
  };
  auto direct = [&](std::string why) -> Status {
    set_mode(remote ? "direct" : "none", std::move(why));
    if (stored_files) {
      // Without blocks, compressed files are decompressed in memory, within
      // the cache's capacity; when an epoch keeps more of them in use than
      // that, files are decompressed again and again within it.
      const uint64_t capacity = static_cast<uint64_t>(spec.capacity_bytes);
      MESHLOAD_ASSIGN_OR_RETURN(decoding_, source::InstallDecoding(rj.dataset, *sources_, capacity));
      const uint64_t needed = in_use();
      LogWarn(needed > capacity
                  ? "compressed files are decompressed in memory, not into the block cache, and an epoch keeps more "
                    "of them in use than spec.dataset.cache.capacityBytes holds: files are read and decompressed "
                    "again within each epoch (a larger capacityBytes, a cache directory, or a Window shuffle avoids "
                    "it; meshload plan --compare shows what each shuffle needs)"
                  : "compressed files are decompressed in memory, not into the block cache: a file evicted from "
                    "memory is read and decompressed again",
              {{"reason", cache_reason_}, {"capacity_bytes", spec.capacity_bytes}, {"in_use_bytes", needed}});
    }
    return Status::Ok();
  };
  if (remote == nullptr) {
    if (parquet_files == 0) return direct("the dataset is local");
    return direct(rj.spec.dataset.format == planner::DatasetFormat::kArrow
                      ? "Arrow rows are decoded from their files' record batches, read from storage as needed and "
                        "kept decoded within spec.dataset.cache.capacityBytes"
                      : "Parquet rows are decoded from their row groups' column chunks, read from storage as needed "
                        "and kept decoded within spec.dataset.cache.capacityBytes");
  }
  if (spec.mode == planner::CacheMode::kDirect) return direct("spec.dataset.cache.mode is Direct");
  if (options_.cache_dir.empty()) {
    if (spec.mode == planner::CacheMode::kBlocks) {
      return FailedPrecondition("spec.dataset.cache.mode Blocks needs a cache directory: give --cache-dir",
                                "--cache-dir");
    }
    return direct("no cache directory (--cache-dir)");
  }
  const uint64_t capacity = static_cast<uint64_t>(spec.capacity_bytes);
  if (spec.mode == planner::CacheMode::kAuto) {
    // Blocks pay when the cache holds each block from the first to the last
    // step of the epoch that reads it; otherwise they would be fetched again.
    if (const uint64_t needed = in_use(); needed > capacity) {
      return direct("an epoch keeps " + std::to_string(needed) +
                    " bytes of blocks in use under this shuffle, more than spec.dataset.cache.capacityBytes (" +
                    std::to_string(capacity) +
                    "): reads fetch their own bytes (a Window shuffle, or a larger "
                    "cache, lets blocks be fetched once; meshload plan --compare)");
    }
  }
  cache::BlockCacheOptions copts;
  copts.dir = options_.cache_dir;
  copts.capacity_bytes = capacity;
  copts.clock = options_.clock;
  auto opened = cache::BlockCache::Open(copts);
  if (!opened.ok()) {
    if (spec.mode == planner::CacheMode::kBlocks) return opened.status();
    return direct("the cache directory cannot be used: " + opened.status().ToString());
  }
  cache_ = std::move(*opened);
  cached_ = std::make_unique<cache::CachedSource>(*remote, *cache_, geometry);
  cached_->CountByEpoch([this](int64_t step) { return planner_->EpochOf(step); });
  std::vector<int64_t> object_of_file(rj.dataset.files().size(), -1);
  const planner::BlockMap blocks(rj, geometry);
  // The object's version (its ETag) keys its blocks: a rewritten object
  // never matches blocks of its old bytes. The listing that indexed the
  // dataset gave it (an S3 ETag); else one request for it, 16 at a time.
  std::vector<Result<source::ObjectInfo>> versions(remote_files.size(), source::ObjectInfo{});
  source::ForEachObject(*remote, remote_files.size(), [&](size_t i) {
    const CachedFile& cf = remote_files[i];
    const planner::DatasetFile& f = rj.dataset.files()[cf.file];
    if (f.version.empty()) versions[i] = remote->Stat(f.stored ? cf.stored_name : cf.name);
  });
  for (size_t i = 0; i < remote_files.size(); ++i) {
    const CachedFile& cf = remote_files[i];
    const planner::DatasetFile& f = rj.dataset.files()[cf.file];
    if (!versions[i].ok()) return versions[i].status();
    const std::string& version = f.version.empty() ? versions[i]->version : f.version;
    object_of_file[cf.file] =
        static_cast<int64_t>(f.stored ? cached_->AddStoredObject(cf.name, f.size, cf.stored_name, *f.stored, version)
                                      : cached_->AddObject(cf.name, f.size, version, blocks.starts(cf.file)));
  }
  sources_->Interpose(remote, cached_.get());
  cache::FetchAheadOptions fopts;
  fopts.lookahead_bytes = std::min<uint64_t>(static_cast<uint64_t>(spec.lookahead_bytes), capacity / 2);
  fopts.threads = static_cast<int>(spec.fetch_threads);
  // Planned at most an epoch ahead: what a step that far off reads only
  // orders evictions (a block with no use noted counts as used furthest
  // ahead), and planning six epochs of a small dataset at start-up took
  // the CPU the trainer's own start-up needed.
  fopts.max_steps_ahead = std::clamp<int64_t>(static_cast<int64_t>(rj.steps_per_epoch), 1, fopts.max_steps_ahead);
  fetch_ahead_ = std::make_unique<cache::FetchAhead>(*planner_, loading_, options_.process, *cached_,
                                                     std::move(object_of_file), fopts);
  set_mode("blocks", "blocks of " + std::to_string(geometry.block_bytes) + " bytes (objects up to " +
                         std::to_string(geometry.whole_object_bytes) + " whole) in " + cache_->root() + ", " +
                         std::to_string(capacity) + " bytes, " + std::to_string(cache_->resident_bytes()) + " there");
  metrics_->cache_capacity.Set(static_cast<double>(capacity));
  if (spec.warm_steps > 0) {
    warm_ = false;
    warm_thread_ = std::thread([this, steps = spec.warm_steps] {
      const auto t0 = std::chrono::steady_clock::now();
      Status st = fetch_ahead_->WaitResident(start_step_, steps, std::chrono::minutes(30));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (st.ok()) {
        LogInfo("the block cache holds the first steps' blocks", {{"steps", steps}, {"seconds", s}});
      } else {
        LogWarn("the block cache could not be warmed; serving anyway",
                {{"steps", steps}, {"seconds", s}, {"error", st.ToString()}});
      }
      warm_ = true;
    });
  }
  return Status::Ok();
}

Sidecar::~Sidecar() {
  parts_.Stop();
  if (fetch_ahead_) fetch_ahead_->Stop();  // ends a warm-up's wait too
  if (warm_thread_.joinable()) warm_thread_.join();
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
  if (!warm_) return {false, "filling the block cache with the first steps' blocks (spec.dataset.cache.warmSteps)"};
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
    // The blocks of steps already staged have no use left (unless a
    // trainer comes back for an earlier step): the cache may evict them
    // for the steps being read now.
    if (fetch_ahead_) fetch_ahead_->Passed(std::max(server_->consumed_step(), pool_->FirstFillingStep() - 1));
    if (cached_) cached_->NoteStep(step);
    const auto t0 = Clock::now();
    StepLoadStats stats;
    Status st = loader_->Load(step, memory_->slot(slot), slot_staged_[slot], &stats, index,
                              [&] { return pool_->generation() != gen || stop_.load() || failed_.load(); });
    if (!st.ok() && st.code() == StatusCode::kCancelled && (pool_->generation() != gen || stop_.load())) {
      // A re-plan (or a stop) abandoned this step while it waited on peers.
      pool_->AbandonFill(slot);
      continue;
    }
    if (!st.ok()) {
      StagingFailed(slot, step, std::string("load_") + std::string(StatusCodeName(st.code())), "cannot stage a batch",
                    st);
      return;
    }
    if (device_) {
      // To the GPUs, fenced: READY may go out once this returns.
      const auto c0 = Clock::now();
      Status ds = device_->Stage(slot, memory_->slot(slot), &slot_staged_[slot]);
      metrics_->device_copy.Observe(std::chrono::duration<double>(Clock::now() - c0).count());
      if (!ds.ok()) {
        StagingFailed(slot, step, "device_copy", "cannot copy a batch to the GPU", ds);
        return;
      }
    }
    metrics_->step_load.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (loader_->peers()) metrics_->peer_wait.Observe(stats.peer_wait_seconds);
    metrics_->samples_read.Increment(static_cast<double>(stats.samples_read));
    if (stats.samples_skipped > 0) metrics_->samples_skipped.Increment(static_cast<double>(stats.samples_skipped));
    if (pool_->MarkReady(slot)) {
      if (fetch_ahead_) fetch_ahead_->Passed(pool_->FirstFillingStep() - 1);
      {
        MutexLock lock(producer_mu_);
        if (gen == generation_) {
          metrics_->batches_staged.Increment();
          if (step == target_step_) target_staged_ = true;
        }
      }
      server_->DeliverReady();  // READY from here, if the trainer is due this step
    }
  }
}

void Sidecar::StagingFailed(uint32_t slot, int64_t step, const std::string& kind, const char* what, const Status& st) {
  pool_->AbandonFill(slot);
  metrics_->Error(kind);
  LogError(what, {{"step", step}, {"error", st.ToString()}});
  {
    MutexLock lock(producer_mu_);
    if (fatal_.ok()) fatal_ = st;
  }
  failed_ = true;
  Notify();
}

bool Sidecar::PipelineStartsAt(int64_t step) {
  // The producers stage consecutive steps, so the pipeline serves `step`
  // when the lowest step held in a slot (or, with none held, the next step
  // to stage) is `step`; otherwise the trainer needs a re-plan.
  return pool_->FirstPendingStep() == step;
}

void Sidecar::RestartAt(int64_t step) {
  MutexLock lock(producer_mu_);
  // The exchange first: stagings of the old generation stop moving data
  // before a new one can begin.
  if (exchange::PeerExchange* x = loader_->peers()) x->Restart(step);
  if (fetch_ahead_) fetch_ahead_->StartAt(step);
  generation_ = pool_->Reset(step);
  target_step_ = step;
  target_staged_ = false;
}

void Sidecar::StageFrom(int64_t want) {
  if (!PipelineStartsAt(want)) {
    LogInfo("re-planning for the trainer", {{"step", want}});
    RestartAt(want);
  } else {
    // Ready once `want` is staged: maybe already (a producer comparing its
    // step with target_step_ before this did not count it), maybe not yet
    // (every staged step was consumed: an earlier step's readiness does
    // not count).
    MutexLock lock(producer_mu_);
    target_step_ = want;
    target_staged_ = pool_->WaitReady(want, std::chrono::milliseconds(0));
  }
}

std::string Sidecar::ReportFailure() {
  Status fatal;
  {
    MutexLock lock(producer_mu_);
    fatal = fatal_;
  }
  std::string message = fatal.ToString();
  // /healthz first: a trainer told of the failure may look there at once.
  if (health_) health_->SetHealthy(false, message);
  return message;
}

Result<std::optional<int64_t>> ReadResumeFile(const std::string& path, int64_t spec_step) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::optional<int64_t>();
    return IoErrorFromErrno("cannot read the resume file", path, errno);
  }
  std::stringstream text;
  text << in.rdbuf();
  MESHLOAD_ASSIGN_OR_RETURN(const planner::ResumeRecord record, planner::ResumeRecord::Parse(text.str(), path));
  // Recorded under another spec.resume.step: the user asked for a new start since.
  if (record.spec_step != spec_step) return std::optional<int64_t>();
  return std::optional<int64_t>(record.step);
}

void Sidecar::CountConsumedDatasets() const {
  if (!server_ || datasets_.empty()) return;
  MutexLock lock(datasets_mu_);
  const int64_t consumed = server_->consumed_step();
  if (consumed < datasets_counted_) datasets_counted_ = consumed;  // the trainer went back (StageFrom)
  std::vector<uint64_t> samples(datasets_.size()), tokens(datasets_.size()), padding(datasets_.size());
  const planner::TokenRows* rows = planner_->job().dataset.token_rows();
  const uint64_t row_tokens = rows ? rows->row_tokens() : 0;
  const planner::DatasetIndex& ds = planner_->job().dataset;
  for (int64_t step = datasets_counted_ + 1; step <= consumed; ++step) {
    const planner::StepPlan plan =
        planner_->PlanStep(step, loading_, options_.process, planner::ShardPlanner::Detail::kSamples);
    for (const planner::DevicePlan& d : plan.devices) {
      if (!std::binary_search(counted_devices_.begin(), counted_devices_.end(), d.device)) continue;
      const std::vector<uint64_t> t = planner_->TokensOf(d.samples);
      for (size_t k = 0; k < d.samples.size(); ++k) {
        const size_t part = ds.PartOf(d.samples[k]);
        ++samples[part];
        tokens[part] += t[k];
        if (rows) padding[part] += row_tokens - t[k];
      }
    }
  }
  datasets_counted_ = std::max(datasets_counted_, consumed);
  for (size_t i = 0; i < datasets_.size(); ++i) {
    if (samples[i]) datasets_[i].samples->Increment(static_cast<double>(samples[i]));
    if (tokens[i]) datasets_[i].tokens->Increment(static_cast<double>(tokens[i]));
    if (padding[i] && datasets_[i].padding) datasets_[i].padding->Increment(static_cast<double>(padding[i]));
  }
}

ProgressSample Sidecar::TakeProgressSample() const {
  CountConsumedDatasets();
  ProgressSample s;
  s.time_ns = NowNs();
  s.consumed_step = server_->consumed_step();
  s.delivered_step = server_->delivered_step();
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
  // Each dataset: its weight now, the samples the job consumed of it up to
  // this process's consumed step (every process's shards: from the
  // schedule), its epoch, and this process's tokens of it.
  const int64_t consumed = server_->consumed_step();
  const planner::MixtureSchedule* mix = planner_->mixture();
  const auto& parts = planner_->job().dataset.parts();
  const uint64_t B = planner_->job().global_batch;
  const std::vector<uint64_t> before =
      mix ? mix->ConsumedBefore(consumed + 1) : std::vector<uint64_t>{static_cast<uint64_t>(consumed + 1) * B};
  const std::vector<double> weights =
      mix ? mix->WeightsAt(std::max<int64_t>(consumed + 1, 0)) : std::vector<double>{1.0};
  nlohmann::json datasets = nlohmann::json::array();
  for (size_t d = 0; d < datasets_.size() && d < parts.size(); ++d) {
    datasets.push_back({{"name", datasets_[d].name},
                        {"weight", weights[d]},
                        {"samplesConsumed", before[d]},
                        {"epoch", parts[d].samples ? before[d] / parts[d].samples : 0},
                        {"processTokens", static_cast<uint64_t>(datasets_[d].tokens->Value())}});
    // Packed rows: this process's padding tokens of them.
    if (datasets_[d].padding) {
      datasets.back()["processPaddingTokens"] = static_cast<uint64_t>(datasets_[d].padding->Value());
    }
  }
  report["datasets"] = std::move(datasets);
  report["cache"] = CacheJson();
  return report.dump();
}

std::pair<uint64_t, uint64_t> Sidecar::ParquetCounts() const {
  uint64_t groups = 0, bytes = 0;
  for (const auto& rows : parquet_rows_) {
    groups += rows->decodes();
    bytes += rows->chunk_bytes_read();
  }
  return {groups, bytes};
}

void Sidecar::CountCache() const {
  if (!parquet_rows_.empty()) {
    const auto [groups, bytes] = ParquetCounts();
    metrics_->CountParquet(groups, bytes);
  }
  if (!cached_) return;
  const cache::BlockCacheCounters& c = cache_->counters();
  const cache::CachedSourceCounters& s = cached_->counters();
  metrics_->CountCache({.hits = c.hits.load(),
                        .misses = c.misses.load(),
                        .fetched_bytes = c.fetched_bytes.load() + s.direct_bytes.load(),
                        .delivered_bytes = s.delivered_bytes.load(),
                        .evicted_bytes = c.evicted_bytes.load(),
                        .corrupt = c.corrupt_blocks.load(),
                        .write_errors = c.write_errors.load(),
                        .ahead_errors = fetch_ahead_->fill_errors(),
                        .found = c.found_on_disk.load()});
  metrics_->cache_bytes.Set(static_cast<double>(cache_->resident_bytes()));
  metrics_->cache_lookahead_steps.Set(static_cast<double>(fetch_ahead_->ahead_steps()));
  metrics_->cache_lookahead_bytes.Set(static_cast<double>(fetch_ahead_->ahead_bytes()));
}

nlohmann::json Sidecar::CacheJson() const {
  nlohmann::json out = {{"mode", cache_mode_}, {"reason", cache_reason_}};
  out["timeToFirstBatchSeconds"] = metrics_->time_to_first_batch.Value();
  if (!parquet_rows_.empty()) {
    const auto [groups, bytes] = ParquetCounts();
    out["parquet"] = {{"rowGroupsDecoded", groups}, {"chunkBytesFetched", bytes}};
  }
  if (!cached_) return out;
  const cache::BlockCacheCounters& c = cache_->counters();
  const cache::CachedSourceCounters& s = cached_->counters();
  const uint64_t fetched = c.fetched_bytes.load() + s.direct_bytes.load();
  const uint64_t delivered = s.delivered_bytes.load();
  out["hits"] = c.hits.load();
  out["misses"] = c.misses.load();
  out["fetchedBytes"] = fetched;
  out["deliveredBytes"] = delivered;
  out["amplification"] = delivered ? static_cast<double>(fetched) / static_cast<double>(delivered) : 0.0;
  out["evictedBytes"] = c.evicted_bytes.load();
  out["residentBytes"] = cache_->resident_bytes();
  out["capacityBytes"] = cache_->capacity_bytes();
  out["lookaheadSteps"] = fetch_ahead_->ahead_steps();
  out["lookaheadBytes"] = fetch_ahead_->ahead_bytes();
  out["corruptBlocks"] = c.corrupt_blocks.load();
  out["foundBlocks"] = c.found_on_disk.load();
  out["writeErrors"] = c.write_errors.load();
  out["storing"] = cache_->storing();
  // From the first fetch's start to the latest fetch's end: the fill rate
  // of a burst (a first epoch) is fetchedBytes over it.
  const int64_t first = c.first_fetch_ns.load(), last = c.last_fetch_ns.load();
  out["fetchSpanSeconds"] = first > 0 && last > first ? static_cast<double>(last - first) / 1e9 : 0.0;
  // Bytes fetched for each epoch's steps, whenever they were fetched.
  nlohmann::json by_epoch = nlohmann::json::array();
  for (const auto& [epoch, bytes] : cached_->FetchedByEpoch()) by_epoch.push_back({{"epoch", epoch}, {"bytes", bytes}});
  out["fetchedBytesByEpoch"] = std::move(by_epoch);
  out["warm"] = warm_.load();
  return out;
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
  server_->CheckTrainerHoldsSlots(blocked, limit);
}

int Sidecar::Run() {
  server_->Run();
  const nlohmann::json c = CacheJson();
  const auto [parquet_groups, parquet_bytes] = ParquetCounts();
  LogInfo("sidecar stopping", {{"job", job_name_},
                               {"process", options_.process},
                               {"cache_mode", cache_mode_},
                               {"cache_reason", cache_reason_},
                               {"cache_fetched_bytes", c.value("fetchedBytes", uint64_t{0})},
                               {"cache_delivered_bytes", c.value("deliveredBytes", uint64_t{0})},
                               {"cache_hits", c.value("hits", uint64_t{0})},
                               {"cache_misses", c.value("misses", uint64_t{0})},
                               {"cache_corrupt_blocks", c.value("corruptBlocks", uint64_t{0})},
                               {"cache_found_blocks", c.value("foundBlocks", uint64_t{0})},
                               {"cache_write_errors", c.value("writeErrors", uint64_t{0})},
                               {"parquet_row_groups_decoded", parquet_groups},
                               {"parquet_chunk_bytes", parquet_bytes}});
  return failed_ ? 1 : 0;
}

}  // namespace meshload::sidecar
