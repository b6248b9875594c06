/// \file
/// Controller: informers for DataLoadJobs, pods, the controller's
/// ConfigMaps and batch/v1 Jobs (the trainers'), a work queue of job keys, N workers running the Reconciler,
/// a periodic resync, and the controller's Prometheus metrics.
///
///   Controller c(client, &registry, {.workers = 4});
///   MESHLOAD_RETURN_IF_ERROR(c.Start());   // informers listed and watching
///   c.StartWorkers();             // once this process leads
///   ...
///   c.Stop();
///
/// Events map to keys: a job event to the job; a pod event to the jobs whose
/// selector matches the pod or whose ConfigMap lists it; a ConfigMap event
/// to its job; a batch/v1 Job event to the jobs whose selector matches its
/// pod template (controller/trainer_jobs.h). What the event was does not matter: the reconcile reads the
/// world.
///
/// With ControllerOptions::progress_interval, a ProgressPoller reads the
/// ready sidecars' /progress that often and queues each job after it, so
/// its status.progress and resume.json follow the trainers.
///
/// Metrics (prefix meshload_controller_): reconciles_total{result}
/// (success, error), reconcile_duration_seconds, queue_depth, leader,
/// api_requests_total{verb,code} (the latter fed by the client's
/// observer, see ApiRequestObserver), cached_objects{resource}.
///
/// Logs: one JSON line per reconcile that wrote or failed, with a
/// `reconcile_id` unique within the process.
///
/// Thread safety: Start, StartWorkers and Stop one after another, never at
/// once (meshload-controller calls StartWorkers on its leader-election
/// thread and joins that thread before Stop); the rest are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/mutex.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/progress_poller.h"
#include "controller/reconciler.h"
#include "controller/runtime/workqueue.h"

namespace meshload::controller {

struct ControllerOptions {
  std::string watch_namespace;  // empty: all namespaces
  int workers = 4;
  ReconcilerOptions reconciler;
  std::chrono::seconds resync_period{600};
  std::chrono::seconds watch_timeout{300};
  runtime::WorkQueueOptions queue;
  /// How often the sidecars' /progress is polled (ProgressPoller) for
  /// status.progress and resume.json; 0 turns polling off.
  std::chrono::milliseconds progress_interval{0};
  /// The poller's timeout, concurrency and default port (its interval,
  /// container name and callback are set from the above).
  ProgressPollerOptions progress;
};

/// Registers meshload_controller_api_requests_total in `registry` and
/// returns an observer for ClientOptions::observer that counts into it.
std::function<void(std::string_view, int)> ApiRequestObserver(metrics::Registry& registry);

class Controller {
 public:
  Controller(kube::KubeClient* client, metrics::Registry* registry, ControllerOptions options);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  /// Starts the informers and waits up to `sync_timeout` for their first
  /// lists.
  Status Start(std::chrono::milliseconds sync_timeout = std::chrono::seconds(60));
  /// Starts the workers and the resync loop; every job is queued once.
  void StartWorkers();
  /// Stops workers, informers and the queue. Idempotent.
  void Stop() MESHLOAD_EXCLUDES(mu_);

  bool synced() const;
  /// A DataLoadJob from the informer cache (null: none), for the webhook.
  kube::ObjectPtr Job(const std::string& ns, const std::string& name) const;
  void SetLeader(bool leader);

  // For tests and benchmarks.
  /// True once the queue is empty and no worker is busy, for `quiet`
  /// continuously; false at `timeout`.
  bool WaitIdle(std::chrono::milliseconds quiet, std::chrono::milliseconds timeout);
  int64_t reconciles() const { return reconciles_.load(); }
  int64_t reconcile_errors() const { return errors_.load(); }
  int64_t writes() const { return writes_.load(); }
  runtime::WorkQueue& queue() { return queue_; }
  Reconciler& reconciler() { return *reconciler_; }

 private:
  void Worker() MESHLOAD_EXCLUDES(mu_);
  void ResyncLoop() MESHLOAD_EXCLUDES(mu_);
  void EnqueueAllJobs();

  // Set by the constructor, read-only after.
  ControllerOptions options_;
  runtime::WorkQueue queue_;
  std::unique_ptr<kube::Informer> jobs_, pods_, configmaps_, trainer_jobs_;
  std::unique_ptr<ProgressPoller> poller_;
  std::unique_ptr<Reconciler> reconciler_;
  // Started by StartWorkers and joined by Stop, which never run at once.
  std::vector<std::thread> workers_;
  std::thread resync_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> busy_{0};
  std::atomic<int64_t> reconciles_{0}, errors_{0}, writes_{0}, next_id_{1};
  // Guards no data: the resync loop waits on cv_ for stopping_ (an atomic),
  // and Stop notifies it holding mu_ so no wake-up is lost.
  Mutex mu_;
  CondVar cv_;

  // Set by the constructor, read-only after (the metrics are thread-safe).
  metrics::Family<metrics::Counter>* reconciles_total_ = nullptr;
  metrics::Histogram* duration_ = nullptr;
  metrics::Gauge* leader_ = nullptr;
};

}  // namespace meshload::controller
