/// \file
/// Kubernetes Events for what the controller decides, so that
/// `kubectl describe dataloadjob` and `kubectl get events` show it.
///
/// Record() never blocks a reconcile: events go into a bounded queue that
/// one thread writes (core/v1 Events, POST), through its own API client and
/// rate limit, so events never slow the status writes down. As client-go's
/// recorder does:
///   - the same event for the same object (type, reason, message) within
///     `aggregate_for` raises the count and lastTimestamp of the Event it
///     first created (a merge PATCH) instead of creating another; an Event
///     that is gone (Events expire, 1 h by default) is created again;
///   - each object gets a token bucket (`burst_per_object`, one token back
///     per `refill_per_object`): an object that keeps flapping cannot flood
///     the cluster;
///   - when the queue is full, or the bucket empty, the event is dropped and
///     counted, never waited for.
/// Nothing is written while `may_write` says no (a standby replica, or a
/// leader that lost its lease): those events are dropped.
///
/// Metric: meshload_controller_events_total{outcome="created|aggregated|
/// dropped|failed"}.
///
/// Thread safety: Record() is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/metrics/metrics.h"
#include "common/mutex.h"
#include "controller/kube/client.h"
#include "controller/kube/objects.h"

namespace meshload::controller::runtime {

struct EventRecorderOptions {
  std::string component = "meshload-controller";  // source.component, reportingComponent
  std::string instance;                           // reportingInstance: this replica
  size_t queue_capacity = 1000;
  std::chrono::seconds aggregate_for{600};
  int burst_per_object = 25;
  std::chrono::seconds refill_per_object{300};
  /// Checked before every write; false drops the event. Must not block
  /// (the writer thread waits for it, and Stop() for the writer).
  std::function<bool()> may_write;
};

class EventRecorder {
 public:
  /// `client` is used by the recorder's thread alone; `registry` may be null.
  EventRecorder(kube::KubeClient* client, metrics::Registry* registry, EventRecorderOptions options);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  /// Queues an event about `object` (a namespaced object with apiVersion,
  /// kind and metadata); `type` is "Normal" or "Warning". Messages longer
  /// than 1024 bytes are cut.
  void Record(const nlohmann::json& object, const std::string& type, const std::string& reason,
              const std::string& message) MESHLOAD_EXCLUDES(mu_);

  /// Waits until every queued event has been written or dropped (tests).
  bool Flush(std::chrono::milliseconds timeout) MESHLOAD_EXCLUDES(mu_);
  /// Stops the thread; events still queued are dropped. Idempotent.
  void Stop() MESHLOAD_EXCLUDES(mu_);

  struct Counts {
    uint64_t created = 0, aggregated = 0, dropped = 0, failed = 0;
  };
  Counts counts() const MESHLOAD_EXCLUDES(mu_);

 private:
  struct Pending {
    kube::ObjectReference ref;  // involvedObject
    std::string type, reason, message;
    std::string timestamp;  // when it was recorded (RFC 3339)
  };
  struct Written {
    std::string ns, name;
    int64_t count = 0;
    std::string first_timestamp;
    std::chrono::steady_clock::time_point expires;
  };
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };

  void Run() MESHLOAD_EXCLUDES(mu_);
  void Write(const Pending& e) MESHLOAD_EXCLUDES(mu_);
  bool TakeToken(const std::string& uid);
  void Count(const char* outcome) MESHLOAD_EXCLUDES(mu_);

  // Set by the constructor, read-only after.
  kube::KubeClient* client_;
  EventRecorderOptions options_;
  metrics::Family<metrics::Counter>* events_total_ = nullptr;

  mutable Mutex mu_;
  CondVar cv_, idle_cv_;
  std::deque<Pending> queue_ MESHLOAD_GUARDED_BY(mu_);
  bool writing_ MESHLOAD_GUARDED_BY(mu_) = false;
  bool stopping_ MESHLOAD_GUARDED_BY(mu_) = false;
  Counts counts_ MESHLOAD_GUARDED_BY(mu_);
  // Started by the constructor, joined by Stop(); Stop() is called by the
  // owner (and the destructor), not by several threads at once.
  std::thread thread_;

  // The writer thread's own state (no lock).
  std::map<std::string, Written> written_;  // by object uid + type + reason + message
  std::map<std::string, Bucket> buckets_;   // by object uid
};

}  // namespace meshload::controller::runtime
