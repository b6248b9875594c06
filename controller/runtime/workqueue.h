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
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace meshload::runtime {

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};
  std::chrono::milliseconds max_delay{1000 * 1000};
};

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Add(const std::string& key);
  void AddAfter(const std::string& key, std::chrono::milliseconds delay);
  /// Adds after this key's backoff, and counts a failure.
  void AddRateLimited(const std::string& key);
  /// Clears the key's failure count.
  void Forget(const std::string& key);
  /// Failures counted for the key since the last Forget.
  int NumRequeues(const std::string& key) const;
  /// The delay AddRateLimited would use next for the key (without counting).
  std::chrono::milliseconds NextBackoff(const std::string& key) const;

  /// Blocks for the next key; false after ShutDown.
  bool Get(std::string* key);
  /// The worker is finished with `key`.
  void Done(const std::string& key);

  void ShutDown();
  bool shutting_down() const;

  /// Keys waiting to be handed out (not counting delayed or in-process ones).
  size_t Len() const;
  /// Keys waiting for their delay.
  size_t DelayedLen() const;

 private:
  void AddLocked(const std::string& key);
  std::chrono::milliseconds BackoffLocked(const std::string& key) const;
  void DelayLoop();

  WorkQueueOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // Get waits here
  std::condition_variable delay_cv_;  // the delay thread waits here
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       // queued, or to be re-queued by Done
  std::set<std::string> processing_;
  std::multimap<Clock::time_point, std::string> delayed_;
  std::map<std::string, Clock::time_point> delayed_at_;  // earliest ready time per key
  std::map<std::string, int> failures_;
  bool shutting_down_ = false;
  std::thread delay_thread_;
};

}  // namespace meshload::runtime
