/// \file
/// WorkQueue: client-go's rate-limited work queue, for reconcile keys.
///
///   std::string key;
///   while (queue.Get(&key)) {
///     Status st = Reconcile(key);
///     if (st.ok()) queue.Forget(key); else queue.AddRateLimited(key);
///     queue.Done(key);
///   }
///
/// Guarantees:
/// - A key is queued at most once: adding a key that is already waiting is a
///   no-op (repeated events collapse into one reconcile).
/// - A key is never handed to two workers at once: a key added while a
///   worker processes it is held back and queued again by Done().
/// - AddRateLimited backs off per key: 5 ms doubling on every failure up to
///   1000 s; Forget resets the key's failure count (call it on success).
/// - AddAfter(key, d) queues the key once `d` has passed (a requeue that is
///   not a failure, e.g. "check again in 30 s").
/// - ShutDown wakes every Get, which then returns false; queued keys are
///   dropped.
///
/// Thread safety: all methods are thread-safe; one internal thread runs the
/// delayed adds.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"

namespace meshload::controller::runtime {

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};
  std::chrono::milliseconds max_delay{1000 * 1000};
  /// The time delays and backoffs are measured on (null: the steady clock).
  Clock* clock = nullptr;
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Add(const std::string& key) MESHLOAD_EXCLUDES(mu_);
  void AddAfter(const std::string& key, std::chrono::milliseconds delay) MESHLOAD_EXCLUDES(mu_);
  /// Adds after this key's backoff, and counts a failure.
  void AddRateLimited(const std::string& key) MESHLOAD_EXCLUDES(mu_);
  /// Clears the key's failure count.
  void Forget(const std::string& key) MESHLOAD_EXCLUDES(mu_);
  /// Failures counted for the key since the last Forget.
  int NumRequeues(const std::string& key) const MESHLOAD_EXCLUDES(mu_);
  /// The delay AddRateLimited would use next for the key (without counting).
  std::chrono::milliseconds NextBackoff(const std::string& key) const MESHLOAD_EXCLUDES(mu_);

  /// Blocks for the next key; false after ShutDown.
  bool Get(std::string* key) MESHLOAD_EXCLUDES(mu_);
  /// The worker is finished with `key`.
  void Done(const std::string& key) MESHLOAD_EXCLUDES(mu_);

  void ShutDown() MESHLOAD_EXCLUDES(mu_);
  bool shutting_down() const MESHLOAD_EXCLUDES(mu_);

  /// Keys waiting to be handed out (not counting delayed or in-process ones).
  size_t Len() const MESHLOAD_EXCLUDES(mu_);
  /// Keys waiting for their delay.
  size_t DelayedLen() const MESHLOAD_EXCLUDES(mu_);

 private:
  void AddLocked(const std::string& key) MESHLOAD_REQUIRES(mu_);
  std::chrono::milliseconds BackoffLocked(const std::string& key) const MESHLOAD_REQUIRES(mu_);
  void DelayLoop() MESHLOAD_EXCLUDES(mu_);

  const WorkQueueOptions options_;  // set by the constructor, read-only after
  Clock* const clock_;
  mutable Mutex mu_;
  CondVar cv_;        // Get waits here
  CondVar delay_cv_;  // the delay thread waits here
  std::deque<std::string> queue_ MESHLOAD_GUARDED_BY(mu_);
  std::set<std::string> dirty_ MESHLOAD_GUARDED_BY(mu_);  // queued, or to be re-queued by Done
  std::set<std::string> processing_ MESHLOAD_GUARDED_BY(mu_);
  std::multimap<Clock::time_point, std::string> delayed_ MESHLOAD_GUARDED_BY(mu_);
  // The earliest ready time per key.
  std::map<std::string, Clock::time_point> delayed_at_ MESHLOAD_GUARDED_BY(mu_);
  std::map<std::string, int> failures_ MESHLOAD_GUARDED_BY(mu_);
  bool shutting_down_ MESHLOAD_GUARDED_BY(mu_) = false;
  // Started by the constructor and joined by the destructor (no other thread
  // touches it).
  std::thread delay_thread_;
};

}  // namespace meshload::controller::runtime
