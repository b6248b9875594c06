/// \file
/// LeaderElector: leader election on a coordination.k8s.io/v1 Lease, as
/// client-go's leaderelection package does it.
///
///   LeaderElector elector(client, {.ns = "meshload-system", .name = "meshload-controller",
///                                  .identity = pod_name});
///   elector.Run([&] { StartWorkers(); }, [&] { std::exit(1); });
///
/// - Try to acquire every `retry_period` (jittered up to +20%): create the
///   Lease, or take it over when its record has not changed for
///   `lease_duration` as measured on *this* process's clock (the holder's
///   renewTime is never compared with our clock, so clock skew between nodes
///   does not matter).
/// - While leading, renew every `retry_period`; a renew that has not
///   succeeded for `renew_deadline` means the lease is lost. IsLeader() turns
///   false as soon as the last renew is older than `renew_deadline`, even in
///   a process that was frozen (SIGSTOP) and has not noticed yet, so workers
///   that check it before writing do not write after losing the lease.
/// - Losing the lease calls `on_stopped_leading` once; the controller exits
///   (a fresh process starts clean, as client-go recommends).
/// - Stop() while leading releases the lease (holder cleared,
///   leaseDurationSeconds 1), so a standby takes over at once.
/// - Writes use the Lease's resourceVersion: two candidates never both win.
///
/// Defaults are client-go's: 15 s lease, 10 s renew deadline, 2 s retry.
///
/// Thread safety: Run blocks in the calling thread; IsLeader, Stop and the
/// accessors are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/clock.h"
#include "common/mutex.h"
#include "controller/kube/client.h"

namespace meshload::controller::runtime {

struct LeaderElectionOptions {
  std::string ns;
  std::string name = "meshload-controller";
  std::string identity;
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  /// The time the lease's expiry, the renew deadline and the retries are
  /// measured on (null: the steady clock). The Lease's own times
  /// (acquireTime, renewTime) are wall-clock MicroTime either way.
  Clock* clock = nullptr;
};

class LeaderElector {
 public:
  LeaderElector(kube::KubeClient* client, LeaderElectionOptions options);

  /// Campaigns until leading (then calls `on_started_leading`, which should
  /// return quickly), renews until the lease is lost or Stop() is called,
  /// then calls `on_stopped_leading` (only if it had been leading and the
  /// lease was lost, not on Stop()). Returns when done.
  void Run(const std::function<void()>& on_started_leading, const std::function<void()>& on_stopped_leading)
      MESHLOAD_EXCLUDES(mu_);

  void Stop() MESHLOAD_EXCLUDES(mu_);
  bool IsLeader() const;
  /// The holder in the last record seen ("" when none).
  std::string observed_holder() const MESHLOAD_EXCLUDES(mu_);
  const LeaderElectionOptions& options() const { return options_; }

 private:
  /// One acquire-or-renew attempt; true when we hold the lease afterwards.
  bool TryAcquireOrRenew() MESHLOAD_EXCLUDES(mu_);
  /// Records the Lease this elector just created or updated (the API
  /// server's answer) as the one last seen.
  void ObserveWritten(nlohmann::json lease) MESHLOAD_EXCLUDES(mu_);
  void Release();
  bool SleepUnlessStopped(std::chrono::milliseconds d) MESHLOAD_EXCLUDES(mu_);
  std::string LeasePath(bool collection) const;
  int64_t NowNs() const;  // clock_'s time in ns

  // Set by the constructor, read-only after.
  kube::KubeClient* client_;
  LeaderElectionOptions options_;
  Clock* const clock_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ MESHLOAD_GUARDED_BY(mu_) = false;
  nlohmann::json observed_record_ MESHLOAD_GUARDED_BY(mu_);  // the Lease spec last seen
  std::string observed_rv_ MESHLOAD_GUARDED_BY(mu_);
  Clock::time_point observed_time_ MESHLOAD_GUARDED_BY(mu_){};
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> last_renew_ns_{0};  // clock_, when we last held it
};

/// Kubernetes MicroTime: "2026-11-21T12:00:00.123456Z".
std::string MicroTimeNow();

}  // namespace meshload::controller::runtime
