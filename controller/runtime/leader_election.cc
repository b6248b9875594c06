#include "controller/runtime/leader_election.h"

#include <sys/time.h>

#include <cstdio>
#include <ctime>
#include <random>
#include <utility>

#include "common/logging.h"

namespace meshload::controller::runtime {
std::string MicroTimeNow() {
  struct timeval tv {};
  gettimeofday(&tv, nullptr);
  struct tm tm {};
  gmtime_r(&tv.tv_sec, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long>(tv.tv_usec));
  return buf;
}

LeaderElector::LeaderElector(kube::KubeClient* client, LeaderElectionOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

int64_t LeaderElector::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->Now().time_since_epoch()).count();
}

std::string LeaderElector::LeasePath(bool collection) const {
  std::string base = "/apis/coordination.k8s.io/v1/namespaces/" + options_.ns + "/leases";
  return collection ? base : base + "/" + options_.name;
}

bool LeaderElector::IsLeader() const {
  if (!leading_.load()) return false;
  auto age = std::chrono::nanoseconds(NowNs() - last_renew_ns_.load());
  return age < options_.renew_deadline;
}

std::string LeaderElector::observed_holder() const {
  MutexLock lock(mu_);
  return observed_record_.is_object() ? observed_record_.value("holderIdentity", "") : "";
}

bool LeaderElector::SleepUnlessStopped(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto deadline = clock_->Now() + d;
  while (!stop_) {
    if (!clock_->WaitUntil(cv_, mu_, deadline)) break;  // timed out: stop_ as it is now
  }
  return !stop_;
}

void LeaderElector::Stop() {
  MutexLock lock(mu_);
  stop_ = true;
  cv_.NotifyAll();
}

bool LeaderElector::TryAcquireOrRenew() {
  const std::string now = MicroTimeNow();
  const int64_t duration_s = std::chrono::duration_cast<std::chrono::seconds>(options_.lease_duration).count();
  kube::ApiResponse got = client_->Get(LeasePath(false));
  if (got.code == 404) {
    nlohmann::json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                            {"kind", "Lease"},
                            {"metadata", {{"name", options_.name}, {"namespace", options_.ns}}},
                            {"spec",
                             {{"holderIdentity", options_.identity},
                              {"leaseDurationSeconds", duration_s},
                              {"acquireTime", now},
                              {"renewTime", now},
                              {"leaseTransitions", 0}}}};
    kube::ApiResponse created = client_->Post(LeasePath(true), lease);
    if (!created.ok()) {
      if (created.code == 403) {
        // The chart makes the Lease and grants no right to create one.
        LogWarn("the lease does not exist and this identity may not create it: make it (the Helm chart does)",
                {{"lease", options_.ns + "/" + options_.name}, {"error", created.ToStatus("create lease").ToString()}});
      } else {
        LogDebug("cannot create the lease", {{"error", created.ToStatus("create lease").ToString()}});
      }
      return false;
    }
    ObserveWritten(std::move(created.body));
    return true;
  }
  if (!got.ok()) {
    LogWarn("cannot read the lease", {{"error", got.ToStatus("get lease").ToString()}});
    return false;
  }
  nlohmann::json spec = got.body.value("spec", nlohmann::json::object());
  const std::string holder = spec.value("holderIdentity", "");
  {
    MutexLock lock(mu_);
    if (spec != observed_record_) {
      observed_record_ = spec;
      observed_time_ = clock_->Now();
    }
    observed_rv_ = got.body["metadata"].value("resourceVersion", "");
    int64_t their_duration = spec.value("leaseDurationSeconds", duration_s);
    bool expired = clock_->Now() > observed_time_ + std::chrono::seconds(their_duration);
    if (!holder.empty() && holder != options_.identity && !expired) return false;
  }
  nlohmann::json updated = got.body;
  nlohmann::json& s = updated["spec"];
  const bool ours = holder == options_.identity;
  s["holderIdentity"] = options_.identity;
  s["leaseDurationSeconds"] = duration_s;
  s["renewTime"] = now;
  if (!ours) {
    // A Lease made empty (the chart makes it) was never held: its first
    // holder is no transition, as when the elector creates it.
    const bool never_held = holder.empty() && !spec.contains("acquireTime");
    s["acquireTime"] = now;
    s["leaseTransitions"] = spec.value("leaseTransitions", 0) + (never_held ? 0 : 1);
  }
  kube::ApiResponse put = client_->Put(LeasePath(false), updated);  // carries metadata.resourceVersion
  if (!put.ok()) {
    LogDebug("cannot update the lease", {{"error", put.ToStatus("update lease").ToString()}});
    return false;
  }
  ObserveWritten(std::move(put.body));
  return true;
}

void LeaderElector::ObserveWritten(nlohmann::json lease) {
  MutexLock lock(mu_);
  observed_record_ = lease["spec"];
  observed_rv_ = lease["metadata"].value("resourceVersion", "");
  observed_time_ = clock_->Now();
}

void LeaderElector::Release() {
  kube::ApiResponse got = client_->Get(LeasePath(false));
  if (!got.ok() || got.body["spec"].value("holderIdentity", "") != options_.identity) return;
  nlohmann::json updated = got.body;
  updated["spec"]["holderIdentity"] = "";
  updated["spec"]["leaseDurationSeconds"] = 1;
  updated["spec"]["renewTime"] = MicroTimeNow();
  kube::ApiResponse put = client_->Put(LeasePath(false), updated);
  LogInfo("released the leader lease", {{"lease", options_.ns + "/" + options_.name}, {"ok", put.ok()}});
}

void LeaderElector::Run(const std::function<void()>& on_started_leading,
                        const std::function<void()>& on_stopped_leading) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  auto jittered = [&] {
    auto ms = options_.retry_period.count();
    return std::chrono::milliseconds(ms + std::uniform_int_distribution<int64_t>(0, ms / 5)(rng));
  };
  LogInfo("campaigning for the leader lease",
          {{"lease", options_.ns + "/" + options_.name}, {"identity", options_.identity}});
  while (true) {
    if (TryAcquireOrRenew()) break;
    if (!SleepUnlessStopped(jittered())) return;
  }
  last_renew_ns_.store(NowNs());
  leading_.store(true);
  LogInfo("became the leader", {{"lease", options_.ns + "/" + options_.name}, {"identity", options_.identity}});
  on_started_leading();
  bool lost = false;
  while (SleepUnlessStopped(options_.retry_period)) {
    // A process that was frozen past the deadline must not renew as if
    // nothing happened: someone else may have led meanwhile.
    if (!IsLeader()) {
      lost = true;
      break;
    }
    if (TryAcquireOrRenew()) {
      last_renew_ns_.store(NowNs());
      continue;
    }
    std::string holder = observed_holder();
    if (!holder.empty() && holder != options_.identity) {
      lost = true;
      break;
    }
    if (!IsLeader()) {
      lost = true;
      break;
    }
  }
  leading_.store(false);
  if (lost) {
    LogError(
        "lost the leader lease",
        {{"lease", options_.ns + "/" + options_.name}, {"holder", observed_holder()}, {"identity", options_.identity}});
    on_stopped_leading();
  } else {
    Release();
  }
}

}  // namespace meshload::controller::runtime
