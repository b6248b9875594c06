#include "controller/controller.h"

#include "common/logging.h"
#include "controller/trainer_jobs.h"

namespace meshload::controller {

std::function<void(std::string_view, int)> ApiRequestObserver(metrics::Registry& registry) {
  auto& family = metrics::BuildCounter()
                     .Name("meshload_controller_api_requests_total")
                     .Help("Kubernetes API requests by verb and HTTP code (0: no answer), every attempt counted.")
                     .Register(registry);
  return [&family](std::string_view verb, int code) {
    family.Add({{"verb", std::string(verb)}, {"code", std::to_string(code)}}).Increment();
  };
}

Controller::Controller(kube::KubeClient* client, metrics::Registry* registry, ControllerOptions options)
    : options_(std::move(options)), queue_(options_.queue) {
  kube::InformerOptions jo;
  jo.namespace_ = options_.watch_namespace;
  jo.watch_timeout = options_.watch_timeout;
  kube::InformerOptions po = jo;
  po.transform = SlimPod;
  kube::InformerOptions co = jo;
  co.label_selector = std::string(kManagedByLabel) + "=" + kManagedByValue;
  jobs_ = std::make_unique<kube::Informer>(client, JobsResource(), jo);
  pods_ = std::make_unique<kube::Informer>(client, PodsResource(), po);
  configmaps_ = std::make_unique<kube::Informer>(client, ConfigMapsResource(), co);
  kube::InformerOptions bo = jo;
  bo.transform = SlimBatchJob;
  trainer_jobs_ = std::make_unique<kube::Informer>(client, BatchJobsResource(), bo);
  ReconcilerOptions ro = options_.reconciler;
  if (options_.progress_interval.count() > 0) {
    ProgressPollerOptions pp = options_.progress;
    pp.interval = options_.progress_interval;
    pp.sidecar_container = ro.sidecar_container;
    pp.on_polled = [this](const std::string& key) { queue_.Add(key); };
    poller_ = std::make_unique<ProgressPoller>(jobs_.get(), pods_.get(), configmaps_.get(), pp);
    ro.progress = [this](const std::string& key) { return poller_->Get(key); };
  }
  reconciler_ =
      std::make_unique<Reconciler>(client, jobs_.get(), pods_.get(), configmaps_.get(), trainer_jobs_.get(), ro);

  jobs_->OnChange([this](const nlohmann::json& job, bool) { queue_.Add(kube::ObjectKey(job)); });
  pods_->OnChange([this](const nlohmann::json& pod, bool) {
    for (const auto& key : reconciler_->JobsForPod(pod)) queue_.Add(key);
  });
  trainer_jobs_->OnChange([this](const nlohmann::json& job, bool) {
    for (const auto& key : reconciler_->JobsForTrainerJob(job)) queue_.Add(key);
  });
  configmaps_->OnChange([this](const nlohmann::json& cm, bool) {
    std::string key = Reconciler::JobForConfigMap(cm);
    if (!key.empty()) queue_.Add(key);
  });

  if (registry != nullptr) {
    reconciles_total_ = &metrics::BuildCounter()
                             .Name("meshload_controller_reconciles_total")
                             .Help("DataLoadJob reconciles by result.")
                             .Register(*registry);
    reconciles_total_->Add({{"result", "success"}});
    reconciles_total_->Add({{"result", "error"}});
    duration_ = &metrics::BuildHistogram()
                     .Name("meshload_controller_reconcile_duration_seconds")
                     .Help("Time one reconcile took, API calls included.")
                     .Register(*registry)
                     .Add({}, metrics::ExponentialBuckets(0.0001, 4, 10));
    leader_ = &metrics::BuildGauge()
                   .Name("meshload_controller_leader")
                   .Help("1 while this process holds the leader lease and reconciles.")
                   .Register(*registry)
                   .Add({});
    auto& depth = metrics::BuildGauge()
                      .Name("meshload_controller_queue_depth")
                      .Help("Job keys waiting in the work queue (not counting delayed retries).")
                      .Register(*registry)
                      .Add({});
    auto& delayed = metrics::BuildGauge()
                        .Name("meshload_controller_queue_delayed")
                        .Help("Job keys waiting for their retry backoff.")
                        .Register(*registry)
                        .Add({});
    auto& cached = metrics::BuildGauge()
                       .Name("meshload_controller_cached_objects")
                       .Help("Objects in the informer caches, by resource.")
                       .Register(*registry);
    auto* cj = &cached.Add({{"resource", "dataloadjobs"}});
    auto* cp = &cached.Add({{"resource", "pods"}});
    auto* cc = &cached.Add({{"resource", "configmaps"}});
    auto* ct = &cached.Add({{"resource", "jobs.batch"}});
    registry->AddCollectHook([this, &depth, &delayed, cj, cp, cc, ct] {
      depth.Set(static_cast<double>(queue_.Len()));
      delayed.Set(static_cast<double>(queue_.DelayedLen()));
      cj->Set(static_cast<double>(jobs_->size()));
      cp->Set(static_cast<double>(pods_->size()));
      cc->Set(static_cast<double>(configmaps_->size()));
      ct->Set(static_cast<double>(trainer_jobs_->size()));
    });
  }
}

Controller::~Controller() { Stop(); }

Status Controller::Start(std::chrono::milliseconds sync_timeout) {
  configmaps_->Start();
  pods_->Start();
  trainer_jobs_->Start();
  jobs_->Start();
  auto deadline = std::chrono::steady_clock::now() + sync_timeout;
  for (auto* inf : {configmaps_.get(), pods_.get(), trainer_jobs_.get(), jobs_.get()}) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!inf->WaitForSync(std::max(left, std::chrono::milliseconds(1)))) {
      return Status(StatusCode::kDeadlineExceeded,
                    "the informer caches did not sync in time (is the API server "
                    "reachable, and is the DataLoadJob CRD installed?)");
    }
  }
  LogInfo("informer caches synced", {{"dataloadjobs", static_cast<int64_t>(jobs_->size())},
                                     {"pods", static_cast<int64_t>(pods_->size())},
                                     {"configmaps", static_cast<int64_t>(configmaps_->size())},
                                     {"jobs.batch", static_cast<int64_t>(trainer_jobs_->size())}});
  return Status::Ok();
}

bool Controller::synced() const {
  return jobs_->synced() && pods_->synced() && configmaps_->synced() && trainer_jobs_->synced();
}

void Controller::SetLeader(bool leader) {
  if (leader_ != nullptr) leader_->Set(leader ? 1 : 0);
}

void Controller::StartWorkers() {
  EnqueueAllJobs();
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { Worker(); });
  resync_ = std::thread([this] { ResyncLoop(); });
  if (poller_) poller_->Start();
}

void Controller::EnqueueAllJobs() {
  for (const auto& job : jobs_->List("")) queue_.Add(kube::ObjectKey(*job));
}

void Controller::Worker() {
  std::string key;
  while (queue_.Get(&key)) {
    busy_.fetch_add(1);
    const int64_t id = next_id_.fetch_add(1);
    auto start = std::chrono::steady_clock::now();
    ReconcileResult result;
    Status st = reconciler_->Reconcile(key, &result);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    reconciles_.fetch_add(1);
    writes_.fetch_add(result.writes);
    if (duration_ != nullptr) duration_->Observe(seconds);
    if (st.ok()) {
      queue_.Forget(key);
      if (reconciles_total_ != nullptr) reconciles_total_->Add({{"result", "success"}}).Increment();
      if (result.writes > 0) {
        LogInfo("reconciled", {{"reconcile_id", id},
                               {"job", key},
                               {"phase", result.phase},
                               {"writes", result.writes},
                               {"seconds", seconds}});
      } else {
        LogDebug("reconciled, nothing to change", {{"reconcile_id", id}, {"job", key}, {"seconds", seconds}});
      }
    } else {
      errors_.fetch_add(1);
      if (reconciles_total_ != nullptr) reconciles_total_->Add({{"result", "error"}}).Increment();
      auto backoff = queue_.NextBackoff(key);
      queue_.AddRateLimited(key);
      LogWarn("reconcile failed; will retry", {{"reconcile_id", id},
                                               {"job", key},
                                               {"error", st.ToString()},
                                               {"writes", result.writes},
                                               {"retry_in_ms", static_cast<int64_t>(backoff.count())}});
    }
    queue_.Done(key);
    busy_.fetch_sub(1);
  }
}

void Controller::ResyncLoop() {
  MutexLock lock(mu_);
  while (!stopping_.load()) {
    const auto deadline = std::chrono::steady_clock::now() + options_.resync_period;
    while (!stopping_.load()) {
      if (!cv_.WaitUntil(mu_, deadline)) break;  // the resync period passed
    }
    if (stopping_.load()) break;
    lock.Unlock();
    EnqueueAllJobs();
    lock.Lock();
  }
}

kube::ObjectPtr Controller::Job(const std::string& ns, const std::string& name) const {
  return jobs_ ? jobs_->Get(ns, name) : nullptr;
}

bool Controller::WaitIdle(std::chrono::milliseconds quiet, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto idle_since = std::chrono::steady_clock::time_point::max();
  while (std::chrono::steady_clock::now() < deadline) {
    bool idle = queue_.Len() == 0 && queue_.DelayedLen() == 0 && busy_.load() == 0;
    auto now = std::chrono::steady_clock::now();
    if (!idle) {
      idle_since = std::chrono::steady_clock::time_point::max();
    } else if (idle_since == std::chrono::steady_clock::time_point::max()) {
      idle_since = now;
    } else if (now - idle_since >= quiet) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void Controller::Stop() {
  if (stopping_.exchange(true)) return;
  {
    MutexLock lock(mu_);
    cv_.NotifyAll();
  }
  if (poller_) poller_->Stop();
  queue_.ShutDown();
  for (auto& w : workers_) w.join();
  if (resync_.joinable()) resync_.join();
  jobs_->Stop();
  pods_->Stop();
  configmaps_->Stop();
  trainer_jobs_->Stop();
  SetLeader(false);
}

}  // namespace meshload::controller
