/// \file
/// ProgressPoller: reads every ready sidecar's `GET /progress`
/// (sidecar/progress.h) for the controller, so that a DataLoadJob's status
/// says where its trainers are (status.progress) and the step a restarted or
/// resized job resumes at is recorded without the user's bookkeeping.
///
/// Every `interval` it takes, from the informer caches, each job's assigned
/// pods (the ConfigMap's `process.<pod>` keys) whose sidecar is ready and
/// has a pod IP, and asks each sidecar on its metrics port (the sidecar
/// container's port named `metrics`, else `default_port`) with a timeout, at
/// most `concurrency` requests at once. A sidecar that cannot be reached, or
/// answers something that is not a progress report, is recorded as such with
/// the reason: never guessed. Then `on_polled(job key)` (the controller
/// queues a reconcile, which writes the status; see ProgressStatus).
///
/// Thread safety: thread-safe, but Start() and Stop() one after another,
/// never at once (Controller::StartWorkers and Stop).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "controller/job_status.h"
#include "controller/kube/informer.h"

namespace meshload::controller {

/// One process's answer in a poll.
struct ProcessProgress {
  int64_t process = -1;
  std::string pod;
  bool reached = false;
  std::string error;      // when not reached: why (connection refused, timeout, HTTP 404, not JSON, ...)
  nlohmann::json report;  // when reached: the sidecar's /progress document
};

/// One poll of a job's sidecars.
struct JobProgress {
  std::chrono::steady_clock::time_point polled_at;
  int64_t processes = 0;                  // the job's process count (spec.mesh.processes)
  std::vector<ProcessProgress> sidecars;  // the ready sidecars polled, by process index
};

struct ProgressPollerOptions {
  std::chrono::milliseconds interval{15000};
  std::chrono::milliseconds timeout{2000};
  int concurrency = 16;
  /// The sidecar's metrics port when its container names none.
  int default_port = 9464;
  /// The sidecar container's name in trainer pods.
  std::string sidecar_container = "meshload-sidecar";
  std::function<void(const std::string& key)> on_polled;
};

class ProgressPoller {
 public:
  ProgressPoller(kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps, ProgressPollerOptions options);
  ~ProgressPoller();
  ProgressPoller(const ProgressPoller&) = delete;
  ProgressPoller& operator=(const ProgressPoller&) = delete;

  /// Polls every `interval` from a thread of its own, the first time at once.
  void Start() MESHLOAD_EXCLUDES(loop_mu_);
  void Stop() MESHLOAD_EXCLUDES(loop_mu_);

  /// One round over every job now, on the caller's thread.
  void PollOnce() MESHLOAD_EXCLUDES(mu_);

  /// The last poll of job "ns/name"; nullopt before the first, or once the
  /// job is gone.
  std::optional<JobProgress> Get(const std::string& key) const MESHLOAD_EXCLUDES(mu_);

 private:
  struct Target {
    std::string key;
    ProcessProgress* out;
    std::string host;
    int port;
  };
  void Loop() MESHLOAD_EXCLUDES(loop_mu_);
  void Fetch(Target& t) const;

  // Set by the constructor, read-only after.
  kube::Informer* jobs_;
  kube::Informer* pods_;
  kube::Informer* configmaps_;
  const ProgressPollerOptions options_;

  mutable Mutex mu_;
  std::map<std::string, JobProgress> last_ MESHLOAD_GUARDED_BY(mu_);

  Mutex loop_mu_;
  CondVar loop_cv_;
  bool stopping_ MESHLOAD_GUARDED_BY(loop_mu_) = false;
  std::thread thread_;  // started by Start, joined by Stop, which never run at once
};

struct HealthThresholds {
  int64_t starved_wait_percent = 25;
  int64_t straggler_steps = 100;
  int64_t straggler_latency_factor = 4;
};

/// What makes a process slow, as its sidecar reports it (with the job's
/// median storage p99 for comparison):
///  - kStorage: its storage read p99 is more than latency_factor times the
///    job's median p99;
///  - kTrainer: its trainer hardly waits for data (under 5% of the window):
///    the loader keeps up, the model is slow;
///  - kExchange: its trainer waits, and more than half of its staging time
///    was spent waiting on other processes' sidecars (peerWaitFraction);
///  - kStaging: its trainer waits and neither storage nor the exchange is
///    slow: gathering, decoding or the copy to the device.
enum class SlowPart { kStorage, kTrainer, kExchange, kStaging };
/// "storage", "trainer", "exchange", "staging" (status.progress.lagging[].slow).
const char* SlowPartName(SlowPart part);
SlowPart WhatIsSlow(const nlohmann::json& report, double median_p99, int64_t latency_factor);

/// The status.progress of a job from its last poll (null without one):
///   {"step": the step every process has consumed (the minimum),
///    "maxStep", "resumeStep": step + 1, "samplesPerSecond" (the median
///    process's steps per second × the global batch, 3 significant digits),
///    "processesReporting": N, "lagging": [{"process", "pod", "step",
///    "behind", "slow"}], "starving": [{"process", "pod"}], "unreachable":
///    [{"process", "pod", "reason"}]}
/// `step` and `resumeStep` only when every process of the job answered
/// (otherwise an unreachable one may be behind); a process lags when its
/// step is more than thresholds.straggler_steps behind the median (`slow`:
/// SlowPartName(WhatIsSlow(...))); a process starves when its connected
/// trainer waited for data more than thresholds.starved_wait_percent % of
/// the window, and stays listed (in `current`, the status.progress written
/// before) until it waits less than half that.
nlohmann::json ProgressStatus(const JobProgress& poll, int64_t global_batch, const HealthThresholds& thresholds,
                              const nlohmann::json& current = nlohmann::json());

/// A condition the progress decides: Starved or Straggling.
struct ProgressCondition {
  std::string type, status, reason, message;
};

/// The Starved and Straggling conditions from a poll, given the job's
/// current conditions (`conditions`, the status's) for hysteresis:
///  - Starved True (TrainersWaitForData) when a connected trainer waited for
///    data more than starved_wait_percent of the sidecar's window; it stays
///    True, unchanged, until every trainer waits less than half that; False
///    (LoaderKeepsUp) otherwise.
///  - Straggling True (ProcessesStraggle) when a process is more than
///    straggler_steps behind the median step, or its storage p99 is more
///    than straggler_latency_factor times the job's median p99; it stays
///    True, unchanged, until each is below half its threshold; False
///    (NoStragglers) otherwise. The message names each process and pod and
///    what is slow (WhatIsSlow): its storage, its trainer, the exchange
///    with its peers, or its staging.
/// Unknown (NoProgress) while no sidecar answered. Messages carry no
/// measured figures, so a condition is rewritten only when it or the set of
/// processes it names changes.
std::vector<ProgressCondition> ProgressConditions(const JobProgress& poll, const HealthThresholds& thresholds,
                                                  const std::vector<JobCondition>& conditions);

/// What to write: `fresh`, or `current` (the status.progress written
/// before) when nothing changed but steps by less than `granularity` and
/// the rate by less than 10%, so that a running job's status is written
/// about once per `granularity` steps; and while `moves_due` is false (the
/// last write was less than the controller's minimum interval ago) not for
/// moving steps or rate at all. A job whose trainers stopped
/// (samplesPerSecond 0), or any other change (who reports, lags or is
/// unreachable), is written at once, with its exact figures.
nlohmann::json ProgressToWrite(const nlohmann::json& current, const nlohmann::json& fresh, int64_t granularity,
                               bool moves_due = true);

}  // namespace meshload::controller
