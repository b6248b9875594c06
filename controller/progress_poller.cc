#include "controller/progress_poller.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "common/logging.h"

namespace meshload::controller {

using nlohmann::json;

namespace {

const json& At(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string Text(const json& j, const char* key) {
  const json& v = At(j, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

bool SidecarReady(const json& pod, const std::string& container) {
  for (const char* list : {"containerStatuses", "initContainerStatuses"}) {
    const json& statuses = At(At(pod, "status"), list);
    if (!statuses.is_array()) continue;
    for (const auto& c : statuses) {
      if (Text(c, "name") == container) return At(c, "ready").is_boolean() && At(c, "ready").get<bool>();
    }
  }
  return false;
}

// The port of the sidecar container named `metrics` (SlimPod keeps it as
// spec.metricsPort), else `fallback`.
int MetricsPort(const json& pod, int fallback) {
  const json& port = At(At(pod, "spec"), "metricsPort");
  return port.is_number_integer() && port.get<int64_t>() > 0 && port.get<int64_t>() < 65536 ? port.get<int>()
                                                                                            : fallback;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ThreeSignificant(double v) {
  if (v <= 0 || !std::isfinite(v)) return 0;
  const double scale = std::pow(10.0, 2 - static_cast<int>(std::floor(std::log10(v))));
  return std::round(v * scale) / scale;
}

}  // namespace

ProgressPoller::ProgressPoller(kube::Informer* jobs, kube::Informer* pods, kube::Informer* configmaps,
                               ProgressPollerOptions options)
    : jobs_(jobs), pods_(pods), configmaps_(configmaps), options_(std::move(options)) {}

ProgressPoller::~ProgressPoller() { Stop(); }

void ProgressPoller::Start() {
  {
    MutexLock lock(loop_mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void ProgressPoller::Stop() {
  {
    MutexLock lock(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void ProgressPoller::Loop() {
  MutexLock lock(loop_mu_);
  while (!stopping_) {
    lock.Unlock();
    PollOnce();
    lock.Lock();
    const auto deadline = std::chrono::steady_clock::now() + options_.interval;
    while (!stopping_) {
      if (!loop_cv_.WaitUntil(loop_mu_, deadline)) break;  // the interval passed
    }
  }
}

std::optional<JobProgress> ProgressPoller::Get(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = last_.find(key);
  if (it == last_.end()) return std::nullopt;
  return it->second;
}

void ProgressPoller::Fetch(Target& t) const {
  ProcessProgress& out = *t.out;
  httplib::Client client(t.host, t.port);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.timeout);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(options_.timeout - seconds);
  client.set_connection_timeout(seconds.count(), micros.count());
  client.set_read_timeout(seconds.count(), micros.count());
  client.set_keep_alive(false);
  auto res = client.Get("/progress");
  const std::string where = t.host + ":" + std::to_string(t.port);
  if (!res) {
    out.error = "GET http://" + where + "/progress: " + httplib::to_string(res.error());
    return;
  }
  if (res->status != 200) {
    out.error = "GET http://" + where + "/progress: HTTP " + std::to_string(res->status);
    return;
  }
  json report = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (!report.is_object() || !At(report, "consumedStep").is_number_integer()) {
    out.error = "GET http://" + where + "/progress: not a progress report";
    return;
  }
  if (At(report, "process") != json(out.process)) {
    // A pod IP reused by another pod, or a sidecar of another process.
    out.error = "http://" + where + " answers for process " + At(report, "process").dump() + ", not " +
                std::to_string(out.process);
    return;
  }
  out.reached = true;
  out.report = std::move(report);
}

void ProgressPoller::PollOnce() {
  std::map<std::string, JobProgress> polls;
  struct Address {
    std::string key;
    size_t index;  // into the job's sidecars
    std::string host;
    int port;
  };
  std::vector<Address> addresses;
  for (const kube::ObjectPtr& job : jobs_->List("")) {
    const json& md = At(*job, "metadata");
    const std::string ns = Text(md, "namespace"), name = Text(md, "name");
    if (ns.empty() || name.empty() || !At(md, "deletionTimestamp").is_null()) continue;
    const std::string key = ns + "/" + name;
    JobProgress& poll = polls[key];
    const json& processes = At(At(At(*job, "spec"), "mesh"), "processes");
    poll.processes = processes.is_number_integer() ? processes.get<int64_t>() : 0;
    kube::ObjectPtr cm = configmaps_->Get(ns, name + "-meshload");
    if (!cm) continue;
    const json& data = At(*cm, "data");
    if (!data.is_object()) continue;
    for (auto it = data.begin(); it != data.end(); ++it) {
      if (it.key().rfind("process.", 0) != 0 || !it.value().is_string()) continue;
      const std::string pod_name = it.key().substr(8);
      kube::ObjectPtr pod = pods_->Get(ns, pod_name);
      if (!pod || !SidecarReady(*pod, options_.sidecar_container)) continue;
      const std::string ip = Text(At(*pod, "status"), "podIP");
      if (ip.empty()) continue;
      ProcessProgress p;
      p.pod = pod_name;
      try {
        p.process = std::stoll(it.value().get<std::string>());
      } catch (...) {
        continue;
      }
      addresses.push_back({key, poll.sidecars.size(), ip, MetricsPort(*pod, options_.default_port)});
      poll.sidecars.push_back(std::move(p));
    }
  }
  // The targets point into `polls`, which no longer changes shape.
  std::vector<Target> targets;
  for (const Address& a : addresses) targets.push_back({a.key, &polls[a.key].sidecars[a.index], a.host, a.port});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < targets.size(); i = next++) Fetch(targets[i]);
  };
  const size_t n = std::min<size_t>(targets.size(), static_cast<size_t>(std::max(1, options_.concurrency)));
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();

  for (auto& [key, poll] : polls) {
    std::sort(poll.sidecars.begin(), poll.sidecars.end(),
              [](const ProcessProgress& a, const ProcessProgress& b) { return a.process < b.process; });
  }
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> keys;
  {
    MutexLock lock(mu_);
    for (auto it = last_.begin(); it != last_.end();) {
      it = polls.count(it->first) ? std::next(it) : last_.erase(it);
    }
    for (auto& [key, poll] : polls) {
      poll.polled_at = now;
      last_[key] = std::move(poll);
      keys.push_back(key);
    }
  }
  if (options_.on_polled) {
    for (const auto& key : keys) options_.on_polled(key);
  }
}

const char* SlowPartName(SlowPart part) {
  switch (part) {
    case SlowPart::kStorage: return "storage";
    case SlowPart::kTrainer: return "trainer";
    case SlowPart::kExchange: return "exchange";
    case SlowPart::kStaging: return "staging";
  }
  return "staging";
}

namespace {

std::optional<double> Number(const json& j) {
  if (!j.is_number()) return std::nullopt;
  return j.get<double>();
}

std::optional<double> StorageP99(const json& report) { return Number(At(At(report, "storageReadSeconds"), "p99")); }

// The median of the reached processes' storage p99 (0 when none measured).
double MedianP99(const std::vector<const ProcessProgress*>& reached) {
  std::vector<double> p99s;
  for (const auto* p : reached) {
    if (auto v = StorageP99(p->report)) p99s.push_back(*v);
  }
  return Median(p99s);
}

}  // namespace

SlowPart WhatIsSlow(const json& report, double median_p99, int64_t latency_factor) {
  const auto p99 = StorageP99(report);
  if (p99 && median_p99 > 0 && *p99 > static_cast<double>(latency_factor) * median_p99) return SlowPart::kStorage;
  if (auto f = Number(At(report, "trainerWaitFraction")); f && *f < 0.05) return SlowPart::kTrainer;
  if (auto f = Number(At(report, "peerWaitFraction")); f && *f > 0.5) return SlowPart::kExchange;
  return SlowPart::kStaging;
}

json ProgressStatus(const JobProgress& poll, int64_t global_batch, const HealthThresholds& thresholds,
                    const json& current) {
  const int64_t lag_steps = thresholds.straggler_steps;
  const int64_t starved_percent = thresholds.starved_wait_percent;
  std::vector<const ProcessProgress*> reached;
  json unreachable = json::array();
  for (const auto& p : poll.sidecars) {
    if (p.reached) {
      reached.push_back(&p);
    } else {
      unreachable.push_back({{"process", p.process}, {"pod", p.pod}, {"reason", p.error}});
    }
  }
  json out = {{"processesReporting", static_cast<int64_t>(reached.size())}};
  if (!unreachable.empty()) out["unreachable"] = unreachable;
  if (reached.empty()) return out;
  std::vector<double> steps, rates;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto* p : reached) {
    const int64_t s = p->report["consumedStep"].get<int64_t>();
    lo = std::min(lo, s);
    hi = std::max(hi, s);
    steps.push_back(static_cast<double>(s));
    const json& r = At(p->report, "stepsPerSecond");
    if (r.is_number()) rates.push_back(r.get<double>());
  }
  std::set<int64_t> reporting;
  for (const auto* p : reached) reporting.insert(p->process);
  const bool all = poll.processes > 0 && static_cast<int64_t>(reporting.size()) == poll.processes;
  if (all) {
    out["step"] = lo;
    out["resumeStep"] = lo + 1;
  }
  out["maxStep"] = hi;
  if (!rates.empty()) out["samplesPerSecond"] = ThreeSignificant(Median(rates) * static_cast<double>(global_batch));
  const double median = Median(steps);
  const double median_p99 = MedianP99(reached);
  json lagging = json::array();
  for (const auto* p : reached) {
    const int64_t s = p->report["consumedStep"].get<int64_t>();
    const double behind = median - static_cast<double>(s);
    if (behind > static_cast<double>(lag_steps)) {
      lagging.push_back(
          {{"process", p->process},
           {"pod", p->pod},
           {"step", s},
           {"behind", static_cast<int64_t>(std::llround(behind))},
           {"slow", SlowPartName(WhatIsSlow(p->report, median_p99, thresholds.straggler_latency_factor))}});
    }
  }
  if (!lagging.empty()) out["lagging"] = lagging;
  std::set<int64_t> listed;
  if (At(current, "starving").is_array()) {
    for (const auto& e : current["starving"]) {
      if (At(e, "process").is_number_integer()) listed.insert(e["process"].get<int64_t>());
    }
  }
  json starving = json::array();
  const double limit = static_cast<double>(starved_percent) / 100.0;
  for (const auto* p : reached) {
    if (!At(p->report, "trainerConnected").is_boolean() || !p->report["trainerConnected"].get<bool>()) continue;
    const json& f = At(p->report, "trainerWaitFraction");
    if (!f.is_number()) continue;
    const double wait = f.get<double>();
    if (wait > limit || (listed.count(p->process) && wait > limit / 2)) {
      starving.push_back({{"process", p->process}, {"pod", p->pod}});
    }
  }
  if (!starving.empty()) out["starving"] = starving;
  return out;
}

namespace {

// The condition of `type` in the status's array, or null.
json CurrentCondition(const json& conditions, const std::string& type) {
  if (!conditions.is_array()) return json();
  for (const auto& c : conditions) {
    if (c.is_object() && Text(c, "type") == type) return c;
  }
  return json();
}

std::string Who(const ProcessProgress& p) { return "process " + std::to_string(p.process) + " (pod " + p.pod + ")"; }

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size() && i < 16; ++i) out += (i ? ", " : "") + parts[i];
  if (parts.size() > 16) out += " and " + std::to_string(parts.size() - 16) + " more";
  return out;
}

}  // namespace

std::vector<ProgressCondition> ProgressConditions(const JobProgress& poll, const HealthThresholds& t,
                                                  const json& conditions) {
  std::vector<const ProcessProgress*> reached;
  for (const auto& p : poll.sidecars) {
    if (p.reached) reached.push_back(&p);
  }
  std::vector<ProgressCondition> out;
  if (reached.empty()) {
    out.push_back({"Starved", "Unknown", "NoProgress", "no sidecar answered the controller's last poll"});
    out.push_back({"Straggling", "Unknown", "NoProgress", "no sidecar answered the controller's last poll"});
    return out;
  }
  auto keep = [&](const std::string& type) -> std::optional<ProgressCondition> {
    json c = CurrentCondition(conditions, type);
    if (Text(c, "status") != "True") return std::nullopt;
    return ProgressCondition{type, "True", Text(c, "reason"), Text(c, "message")};
  };

  // Starved.
  const double starve = static_cast<double>(t.starved_wait_percent) / 100.0;
  std::vector<std::string> starving;
  bool in_band = false;
  for (const auto* p : reached) {
    if (!At(p->report, "trainerConnected").is_boolean() || !p->report["trainerConnected"].get<bool>()) continue;
    auto f = Number(At(p->report, "trainerWaitFraction"));
    if (!f) continue;
    if (*f > starve) starving.push_back(Who(*p));
    if (*f > starve / 2) in_band = true;
  }
  if (!starving.empty()) {
    out.push_back({"Starved", "True", "TrainersWaitForData",
                   "the trainers of " + Join(starving) + " waited for data more than " +
                       std::to_string(t.starved_wait_percent) +
                       "% of the last window: the loader, not the model, is the bottleneck"});
  } else if (auto kept = keep("Starved"); kept && in_band) {
    out.push_back(*kept);
  } else {
    out.push_back({"Starved", "False", "LoaderKeepsUp", ""});
  }

  // Straggling.
  std::vector<double> steps;
  for (const auto* p : reached) steps.push_back(static_cast<double>(p->report["consumedStep"].get<int64_t>()));
  const double median_step = Median(steps);
  const double median_p99 = MedianP99(reached);
  const double factor = static_cast<double>(t.straggler_latency_factor);
  std::vector<std::string> straggling;
  in_band = false;
  for (const auto* p : reached) {
    const double behind = median_step - static_cast<double>(p->report["consumedStep"].get<int64_t>());
    const auto p99 = StorageP99(p->report);
    const bool slow_storage = p99 && median_p99 > 0 && *p99 > factor * median_p99;
    const bool lags = behind > static_cast<double>(t.straggler_steps);
    if (behind > static_cast<double>(t.straggler_steps) / 2 ||
        (p99 && median_p99 > 0 && *p99 > factor / 2 * median_p99)) {
      in_band = true;
    }
    if (!lags && !slow_storage) continue;
    std::string what;
    switch (WhatIsSlow(p->report, median_p99, t.straggler_latency_factor)) {
      case SlowPart::kStorage:
        what = "its storage is slow (p99 over " + std::to_string(t.straggler_latency_factor) + "x the job's median)";
        break;
      case SlowPart::kTrainer: what = "its trainer is slow (it does not wait for data)"; break;
      case SlowPart::kExchange:
        what =
            "the exchange is slow (its trainer waits, and its sidecar spends most of its staging time waiting "
            "on other processes' sidecars)";
        break;
      case SlowPart::kStaging:
        what = "its staging is slow (its trainer waits; neither its storage nor the exchange is slow)";
        break;
    }
    straggling.push_back(
        Who(*p) + (lags ? " is more than " + std::to_string(t.straggler_steps) + " steps behind the median: " : ": ") +
        what);
  }
  if (!straggling.empty()) {
    std::string msg;
    for (const auto& s : straggling) msg += (msg.empty() ? "" : "; ") + s;
    out.push_back({"Straggling", "True", "ProcessesStraggle", msg});
  } else if (auto kept = keep("Straggling"); kept && in_band) {
    out.push_back(*kept);
  } else {
    out.push_back({"Straggling", "False", "NoStragglers", ""});
  }
  return out;
}

json ProgressToWrite(const json& current, const json& fresh, int64_t granularity, bool moves_due) {
  if (!current.is_object() || !fresh.is_object()) return fresh;
  // Everything but the moving figures must be equal.
  json a = current, b = fresh;
  for (const char* k : {"step", "maxStep", "resumeStep", "samplesPerSecond"}) {
    a.erase(k);
    b.erase(k);
  }
  if (a != b) return fresh;
  bool moved = false;
  for (const char* k : {"step", "maxStep", "resumeStep"}) {
    const json& x = At(current, k);
    const json& y = At(fresh, k);
    if (x.is_null() != y.is_null()) return fresh;
    if (x.is_number_integer() && std::llabs(x.get<int64_t>() - y.get<int64_t>()) >= granularity) moved = true;
  }
  const json& x = At(current, "samplesPerSecond");
  const json& y = At(fresh, "samplesPerSecond");
  if (x.is_null() != y.is_null()) return fresh;
  if (y.is_number()) {
    const double before = x.get<double>(), now = y.get<double>();
    if (now == 0 && before != 0) return fresh;  // the trainers stopped: the exact step
    if (before == 0 && now != 0) return fresh;
    if (std::fabs(now - before) > 0.1 * std::max(before, now)) moved = true;
    if (now == 0 && current != fresh) return fresh;
  }
  return moved && moves_due ? fresh : current;
}

}  // namespace meshload::controller
