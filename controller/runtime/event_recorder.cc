#include "controller/runtime/event_recorder.h"

#include <cstdio>

#include "common/logging.h"

namespace meshload::controller::runtime {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxMessageBytes = 1024;
constexpr size_t kMaxRemembered = 4096;  // aggregation entries kept

}  // namespace

EventRecorder::EventRecorder(kube::KubeClient* client, metrics::Registry* registry, EventRecorderOptions options)
    : client_(client), options_(std::move(options)) {
  if (registry != nullptr) {
    events_total_ = &metrics::BuildCounter()
                         .Name("meshload_controller_events_total")
                         .Help(
                             "Kubernetes Events about DataLoadJobs: created, aggregated into an earlier one "
                             "(count raised), dropped (queue full, rate-limited or not the leader) or failed "
                             "(the API refused them).")
                         .Register(*registry);
    for (const char* outcome : {"created", "aggregated", "dropped", "failed"}) {
      events_total_->Add({{"outcome", outcome}});
    }
  }
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::~EventRecorder() { Stop(); }

void EventRecorder::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(mu_);
  counts_.dropped += queue_.size();
  if (events_total_ != nullptr && !queue_.empty()) {
    events_total_->Add({{"outcome", "dropped"}}).Increment(static_cast<double>(queue_.size()));
  }
  queue_.clear();
  idle_cv_.NotifyAll();
}

void EventRecorder::Count(const char* outcome) {
  {
    MutexLock lock(mu_);
    const std::string o = outcome;
    if (o == "created") ++counts_.created;
    if (o == "aggregated") ++counts_.aggregated;
    if (o == "dropped") ++counts_.dropped;
    if (o == "failed") ++counts_.failed;
  }
  if (events_total_ != nullptr) events_total_->Add({{"outcome", outcome}}).Increment();
}

EventRecorder::Counts EventRecorder::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

void EventRecorder::Record(const json& object, const std::string& type, const std::string& reason,
                           const std::string& message) {
  Pending e;
  e.ref = kube::ObjectReference::To(object);
  e.type = type;
  e.reason = reason;
  e.message = kube::CutUtf8(message, kMaxMessageBytes - 3);
  e.timestamp = kube::NowRfc3339();
  {
    MutexLock lock(mu_);
    if (!stopping_ && queue_.size() < options_.queue_capacity) {
      queue_.push_back(std::move(e));
      cv_.NotifyOne();
      return;
    }
  }
  Count("dropped");
}

bool EventRecorder::Flush(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  const auto deadline = Clock::now() + timeout;
  while (!(queue_.empty() && !writing_)) {
    if (!idle_cv_.WaitUntil(mu_, deadline)) break;  // timed out: the condition as it is now
  }
  return queue_.empty() && !writing_;
}

void EventRecorder::Run() {
  MutexLock lock(mu_);
  while (true) {
    while (!stopping_ && queue_.empty()) cv_.Wait(mu_);
    if (stopping_) return;
    Pending e = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.Unlock();
    try {
      Write(e);
    } catch (const std::exception& ex) {  // e.g. a message that is not UTF-8: lose the event, not the controller
      LogWarn("cannot write an event", {{"reason", e.reason}, {"error", ex.what()}});
      Count("failed");
    }
    lock.Lock();
    writing_ = false;
    if (queue_.empty()) idle_cv_.NotifyAll();
  }
}

bool EventRecorder::TakeToken(const std::string& uid) {
  const auto now = Clock::now();
  auto [it, fresh] = buckets_.try_emplace(uid);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = options_.burst_per_object;
  } else {
    const double refill = std::chrono::duration<double>(now - b.last).count() /
                          std::max(1.0, static_cast<double>(options_.refill_per_object.count()));
    b.tokens = std::min<double>(options_.burst_per_object, b.tokens + refill);
  }
  b.last = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  if (buckets_.size() > kMaxRemembered) {  // forget the objects whose buckets are full again
    for (auto b2 = buckets_.begin(); b2 != buckets_.end();) {
      const double idle = std::chrono::duration<double>(now - b2->second.last).count();
      const bool full =
          b2->second.tokens + idle / std::max(1.0, static_cast<double>(options_.refill_per_object.count())) >=
          options_.burst_per_object;
      b2 = full && b2->first != uid ? buckets_.erase(b2) : std::next(b2);
    }
  }
  return true;
}

void EventRecorder::Write(const Pending& e) {
  if (options_.may_write && !options_.may_write()) {
    Count("dropped");
    return;
  }
  const std::string uid = e.ref.uid;
  const std::string ns = e.ref.namespace_;
  const std::string key = uid + "\x1f" + e.type + "\x1f" + e.reason + "\x1f" + e.message;
  const auto now = Clock::now();
  if (!TakeToken(uid)) {
    Count("dropped");
    return;
  }
  const std::string base = "/api/v1/namespaces/" + kube::QueryEscape(ns) + "/events";

  auto it = written_.find(key);
  if (it != written_.end() && it->second.expires > now) {
    Written& w = it->second;
    const json patch = {{"count", w.count + 1}, {"lastTimestamp", e.timestamp}};
    kube::ApiResponse r = client_->Patch(base + "/" + kube::QueryEscape(w.name), patch);
    if (r.ok()) {
      ++w.count;
      w.expires = now + options_.aggregate_for;
      Count("aggregated");
      return;
    }
    if (r.code != 404) {
      LogWarn("cannot update an event", {{"event", w.name}, {"error", r.ToStatus("patch").ToString()}});
      Count("failed");
      return;
    }
    written_.erase(it);  // expired in the cluster: create it again
  }

  for (int attempt = 0; attempt < 2; ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, ".%llx",
                  static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()) +
                      static_cast<unsigned long long>(attempt));
    const std::string name = e.ref.name + suffix;
    kube::Event event;
    event.metadata.name = name;
    event.metadata.namespace_ = ns;
    event.involved_object = e.ref;
    event.reason = e.reason;
    event.message = e.message;
    event.type = e.type;
    event.first_timestamp = event.last_timestamp = e.timestamp;
    event.source_component = event.reporting_component = options_.component;
    event.reporting_instance = options_.instance;
    kube::ApiResponse r = client_->Post(base, event.ToJson());
    if (r.ok()) {
      if (written_.size() >= kMaxRemembered) {
        for (auto w = written_.begin(); w != written_.end();)
          w = w->second.expires <= now ? written_.erase(w) : std::next(w);
        if (written_.size() >= kMaxRemembered) written_.erase(written_.begin());
      }
      written_[key] = {ns, name, 1, e.timestamp, now + options_.aggregate_for};
      Count("created");
      return;
    }
    if (r.code == 409 && r.attempts > 1) {
      // A retried create that was refused as existing: the first attempt
      // landed (the client's own rule).
      written_[key] = {ns, name, 1, e.timestamp, now + options_.aggregate_for};
      Count("created");
      return;
    }
    if (r.code == 409) continue;  // the name was taken: another suffix
    LogWarn("cannot create an event",
            {{"object", ns + "/" + e.ref.name}, {"reason", e.reason}, {"error", r.ToStatus("create").ToString()}});
    break;
  }
  Count("failed");
}

}  // namespace meshload::controller::runtime
