/// \file
/// Sidecar: the program in every trainer pod that keeps the trainer fed.
///
/// Threads (all started after set-up; the sidecar never forks):
///   - the *producers* (`staging_threads`, at most one per slot) each take
///     a free slot together with the next step to stage (waiting while the
///     trainer holds them all: memory stays at `prefetch` slots), read the
///     batch into it with the StepLoader (alone for small steps, with the
///     loader's reader threads for large ones), mark it ready, and send
///     READY themselves when the trainer is due that step. Consecutive
///     steps are staged in parallel; READYs still go out in step order;
///   - the *server* (Run(), the caller's thread) accepts the trainer on the
///     Unix socket, checks its uid, sends SERVER_HELLO with the pool's fd,
///     then READY for consecutive steps as they are staged, and takes
///     RELEASEs; a trainer that dies has its leases reclaimed, one that
///     leaves (BYE) keeps those of the batches it still holds until they
///     are released; a reconnect at any step re-plans from there
///     (sidecar/session_server.h: SessionServer);
///   - the HealthServer serves /metrics, /healthz, /readyz and /progress
///     (sidecar/progress.h: the consumed step, staged steps, the trainer's
///     wait and storage latency over the last `progress_window`).
/// A watchdog in the server loop reports, within seconds, a storage read
/// stuck in flight and a trainer that holds every slot (logs and gauges).
/// When staging fails for good (a file truncated under it, say) the sidecar
/// stays up: /healthz answers 503 with the reason and every trainer gets it
/// as an ERROR, until it is stopped; then Run() returns 1.
///
/// Metrics: sidecar/sidecar_metrics.h. Life of a batch:
/// docs/life-of-a-batch.md. Protocol: docs/protocol.md.
///
/// Thread safety: Create() and Run() from one thread; RequestStop() from any
/// thread or a signal handler.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/manager.h"
#include "common/metrics/http_endpoints.h"
#include "common/metrics/metrics.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/thread_sched.h"
#include "common/unique_fd.h"
#include "planner/shard_planner.h"
#include "protocol/protocol.h"
#include "sidecar/progress.h"
#include "sidecar/cache/block_cache.h"
#include "sidecar/cache/cached_source.h"
#include "sidecar/source/decoded_source.h"
#include "sidecar/source/parquet_source.h"
#include "sidecar/cache/fetch_ahead.h"
#include "sidecar/source/source.h"
#include "sidecar/staging/batch_layout.h"
#include "sidecar/staging/device_memory.h"
#include "sidecar/staging/host_memory.h"
#include "sidecar/staging/slot_pool.h"
#include "sidecar/step_loader.h"

namespace meshload::sidecar {

class SessionServer;           // sidecar/session_server.h
struct SidecarMetrics;         // sidecar/sidecar_metrics.h
class StorageMetricsObserver;  // sidecar/sidecar_metrics.h

struct SidecarOptions {
  std::string job_path;     // where the job came from (the mounted ConfigMap in a pod), for messages
  int64_t process = -1;     // this pod's process index
  std::string socket_path;  // where the trainer connects; its directory must exist
  mode_t socket_mode = 0660;
  /// The uids allowed to connect; empty means the sidecar's own uid only.
  std::vector<uid_t> allowed_uids;
  /// /metrics, /healthz, /readyz; -1 disables, 0 picks a free port.
  int metrics_port = -1;
  std::string metrics_address = "0.0.0.0";
  /// The span GET /progress reports rates over (the controller polls about
  /// this often).
  std::chrono::nanoseconds progress_window = std::chrono::seconds(15);
  /// The first step to stage before a trainer connects (default: the
  /// resume file's step, else spec.resume.step). A trainer may ask for any
  /// other step.
  std::optional<int64_t> start_step;
  /// The controller's resume.json ({"step": R, "specStep": S}, a key of the
  /// job's ConfigMap, mounted next to job.json): the sidecar starts at R
  /// while the job's spec.resume.step is still S. Empty, or a file that does
  /// not exist: spec.resume.step. A file that is not such a document is an
  /// error naming it.
  std::string resume_file;
  /// Storage reader threads; 0: 4 for local files, 16 for a remote
  /// (latency-bound: http, https, s3) dataset, whose reads are round trips.
  int reader_threads = 0;
  /// Producers staging consecutive steps at once (clamped to the slots):
  /// small batches are bound by per-step work, which this spreads over cores.
  int staging_threads = 2;
  /// The scheduling class of the producers, the reader threads and the
  /// server loop (common/thread_sched.h): batch keeps their wake-ups from
  /// preempting the trainer and each other.
  ThreadSched thread_sched = ThreadSched::kBatch;
  source::SourceOptions source_options;
  /// The other processes' sidecars, for plans that move samples between
  /// processes (Broadcast, LoadAndReshard); `process`, `fingerprint`,
  /// `first_step` and `serve` are filled in.
  std::optional<exchange::ExchangeOptions> peers;
  /// Where batches are staged: "auto" (CUDA VMM when a driver and enough
  /// devices are there, host memory otherwise, saying why), "host", "cuda"
  /// (VMM; an error when CUDA cannot be used) or "cuda-ipc" (the legacy
  /// cudaIpcMemHandle fallback; the trainer must see the sidecar's pid).
  std::string staging = "auto";
  /// The CUDA device of each local device, in the job's local device order
  /// (default 0, 1, ...: the pod's GPUs as CUDA_VISIBLE_DEVICES shows them).
  std::vector<int> cuda_devices;
  /// How long a read or a full pool may stall before it is reported.
  std::chrono::milliseconds stall_report_after{3000};
  /// How long a connected client has to send CLIENT_HELLO.
  std::chrono::milliseconds hello_timeout{5000};
  /// The node-local block cache of a remote dataset (spec.dataset.cache;
  /// sidecar/cache/block_cache.h); empty: none, reads go to the source.
  std::string cache_dir;
  /// The clock the timeouts above run on (the trainer's hello, a refused
  /// connection's drain, the watchdog, the slot pool's and the peer
  /// exchange's timeouts); null: Clock::Real().
  Clock* clock = nullptr;
};

class Sidecar {
 public:
  /// Resolves the job (loaded and validated once, by the caller:
  /// planner::LoadJobFile), verifies the dataset files, allocates the slot
  /// pool, starts the producer and the metrics endpoint, and listens on the
  /// socket. Every problem with the dataset is reported at once.
  static Result<std::unique_ptr<Sidecar>> Create(planner::ValidJob job, SidecarOptions options);
  ~Sidecar();

  /// Serves until RequestStop(). Returns 0 after a clean stop, 1 when
  /// staging had failed (logged, sent to trainers, reported on /healthz).
  int Run();

  /// Async-signal-safe.
  void RequestStop();

  int metrics_port() const { return metrics_port_; }
  /// The staging mode in use and why (the start-up log line's staging_reason).
  const std::string& staging_reason() const { return staging_reason_; }
  const planner::ResolvedJob& job() const { return planner_->job(); }

 private:
  explicit Sidecar(SidecarOptions options);
  Status Init(const planner::ValidJob& job);
  // Sets up GPU staging as options_.staging asks (device_, staging_reason_).
  Status InitDeviceStaging();
  // A remote dataset's block cache and fetch-ahead, as spec.dataset.cache
  // and --cache-dir say (cache_mode_, cache_reason_), interposed in sources_.
  Status InitCache();
  void ProducerMain(int index) MESHLOAD_EXCLUDES(producer_mu_);
  // A step could not be staged: staging stops for good (counted as `kind`,
  // logged as `what`); the server tells trainers and /healthz fails.
  void StagingFailed(uint32_t slot, int64_t step, const std::string& kind, const char* what, const Status& st)
      MESHLOAD_EXCLUDES(producer_mu_);
  void RestartAt(int64_t step) MESHLOAD_EXCLUDES(producer_mu_);
  bool PipelineStartsAt(int64_t step);
  // A trainer starts at `want` (its hello; the server's start_at hook): the
  // producers serve it next, re-planned unless the pipeline starts there.
  void StageFrom(int64_t want) MESHLOAD_EXCLUDES(producer_mu_);
  // Staging failed (the server's failure hook, server thread): /healthz
  // fails with fatal_, and its text is what trainers are told.
  std::string ReportFailure() MESHLOAD_EXCLUDES(producer_mu_);
  void Notify();
  void Watchdog();
  std::pair<bool, std::string> Readiness() const;

  SidecarOptions options_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<SidecarMetrics> metrics_;
  std::unique_ptr<StorageMetricsObserver> observer_;
  std::unique_ptr<source::SourceRegistry> sources_;
  std::unique_ptr<planner::ShardPlanner> planner_;
  planner::Loading loading_;
  staging::BatchLayout layout_;
  std::unique_ptr<staging::HostSlotMemory> memory_;
  std::unique_ptr<staging::DeviceSlotMemory> device_;  // GPU staging; null: host staging
  std::unique_ptr<staging::SlotPool> pool_;
  // The block cache of a remote dataset (null: none; cache_reason_ says why).
  std::unique_ptr<cache::BlockCache> cache_;
  std::unique_ptr<cache::CachedSource> cached_;
  // Compressed files decompressed in memory, when there are no blocks.
  std::vector<std::unique_ptr<source::DecodingSource>> decoding_;
  std::vector<std::unique_ptr<source::ParquetRowSource>> parquet_rows_;
  std::string cache_mode_ = "none";  // blocks, direct (a remote dataset read without the cache) or none
  std::string cache_reason_;
  std::unique_ptr<StepLoader> loader_;
  // After the loader: it plans like the loader and fills what it will read.
  std::unique_ptr<cache::FetchAhead> fetch_ahead_;
  std::atomic<bool> warm_{true};  // spec.dataset.cache.warmSteps done (readiness)
  std::thread warm_thread_;
  std::vector<std::vector<staging::StagedTensor>> slot_staged_;  // per slot, written before MarkReady
  std::unique_ptr<metrics::HealthServer> health_;
  int metrics_port_ = -1;
  std::string job_name_;
  std::string staging_mode_ = "host";  // host, cuda or cuda-ipc
  std::string staging_reason_;         // why this staging mode (logged at start)

  // The trainer side: the socket, connections, handshake, READY/RELEASE,
  // leases (sidecar/session_server.h, which says what its mutex guards).
  std::unique_ptr<SessionServer> server_;
  UniqueFd event_fd_;  // producer -> server wake-ups, and RequestStop()

  // Producer state.
  Mutex producer_mu_;
  uint64_t generation_ MESHLOAD_GUARDED_BY(producer_mu_) = 0;
  int64_t target_step_ MESHLOAD_GUARDED_BY(producer_mu_) = 0;  // the first step the trainer asked for (readiness)
  Status fatal_ MESHLOAD_GUARDED_BY(producer_mu_);
  // --start-step or spec.resume.step: what want_step -1 means. Written in
  // Init() before any thread starts, read-only after: no lock.
  int64_t start_step_ = 0;
  std::atomic<bool> target_staged_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> producer_blocked_since_ns_{0};
  bool reported_stuck_read_ = false;  // server thread only (the watchdog)
  std::vector<std::thread> producers_;

  // Progress (GET /progress): the window; the consumed watermark and the
  // last step handed over are the server's (SessionServer::consumed_step).
  std::unique_ptr<ProgressWindow> progress_;
  ProgressSample TakeProgressSample() const;
  std::string ProgressJson();
  // The block cache's figures: its metrics (collect hook) and /progress's "cache".
  void CountCache() const;
  nlohmann::json CacheJson() const;
  /// The Parquet row groups decoded so far and their column chunks' bytes.
  std::pair<uint64_t, uint64_t> ParquetCounts() const;

  // Per-dataset figures (meshload_dataset_*_total, /progress "datasets"):
  // the consumed steps' samples of the shards this process owns, counted
  // up to the consumed watermark whenever metrics or progress are read.
  struct DatasetCounters {
    std::string name;
    metrics::Counter* samples = nullptr;
    metrics::Counter* tokens = nullptr;
    metrics::Counter* padding = nullptr;  // packed rows only
  };
  std::vector<DatasetCounters> datasets_;  // per part of the index; set in Init()
  std::vector<int64_t> counted_devices_;   // one device of each shard this process owns
  mutable Mutex datasets_mu_;
  mutable int64_t datasets_counted_ MESHLOAD_GUARDED_BY(datasets_mu_) = -1;  // the last step counted
  void CountConsumedDatasets() const MESHLOAD_EXCLUDES(datasets_mu_);

  // Starts and stops the parts above in order (Init, the destructor).
  Manager parts_{"meshload-sidecar"};
};

/// The step in the controller's resume file `path` (SidecarOptions::
/// resume_file), when it was recorded for `spec_step` (the job's
/// spec.resume.step); nullopt when the file does not exist or was recorded
/// for another spec.resume.step. kInvalidArgument naming the file when it is
/// not {"step": N >= 0, "specStep": S}.
Result<std::optional<int64_t>> ReadResumeFile(const std::string& path, int64_t spec_step);

/// Resolves the job as a sidecar must, with its dataset indexed through
/// `sources` (source::ResolveWithSources: its files or objects, their sizes
/// and .npy headers, for every scheme): the sidecar reads the data next, so
/// data it cannot reach is an error, never a plan from
/// spec.dataset.samples. Every problem goes to `diags`.
Result<planner::ResolvedJob> ResolveForSidecar(const planner::ValidJob& job, source::SourceRegistry& sources,
                                               Diagnostics& diags);

}  // namespace meshload::sidecar
