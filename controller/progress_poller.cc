#include "controller/progress_poller.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "common/logging.h"
#include "controller/kube/json_fields.h"
#include "controller/kube/objects.h"

namespace meshload::controller {

using kube::Field;
using nlohmann::json;

namespace {

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
  if (!report.is_object() || !Field(report, "consumedStep").is_number_integer()) {
    out.error = "GET http://" + where + "/progress: not a progress report";
    return;
  }
  if (Field(report, "process") != json(out.process)) {
    // A pod IP reused by another pod, or a sidecar of another process.
    out.error = "http://" + where + " answers for process " + Field(report, "process").dump() + ", not " +
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
    const kube::ObjectMeta md = kube::MetadataOf(*job);
    if (md.namespace_.empty() || md.name.empty() || md.being_deleted()) continue;
    const std::string key = md.namespace_ + "/" + md.name;
    JobProgress& poll = polls[key];
    poll.processes = kube::Int(Field(Field(*job, "spec"), "mesh"), "processes");
    kube::ObjectPtr cm_object = configmaps_->Get(md.namespace_, md.name + "-meshload");
    if (!cm_object) continue;
    const kube::ConfigMap cm = kube::ConfigMap::FromJson(*cm_object);
    for (const auto& [data_key, value] : cm.data) {
      if (data_key.rfind("process.", 0) != 0) continue;
      const std::string pod_name = data_key.substr(8);
      kube::ObjectPtr pod_object = pods_->Get(md.namespace_, pod_name);
      if (!pod_object) continue;
      const kube::Pod pod = kube::Pod::FromJson(*pod_object);
      const kube::ContainerStatus* sidecar = pod.StatusOf(options_.sidecar_container);
      if (sidecar == nullptr || !sidecar->ready || pod.pod_ip.empty()) continue;
      ProcessProgress p;
      p.pod = pod_name;
      try {
        p.process = std::stoll(value);
      } catch (...) {
        continue;
      }
      addresses.push_back(
          {key, poll.sidecars.size(), pod.pod_ip,
           pod.sidecar_metrics_port > 0 ? static_cast<int>(pod.sidecar_metrics_port) : options_.default_port});
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

std::optional<double> StorageP99(const json& report) {
  return Number(Field(Field(report, "storageReadSeconds"), "p99"));
}

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
  if (auto f = Number(Field(report, "trainerWaitFraction")); f && *f < 0.05) return SlowPart::kTrainer;
  if (auto f = Number(Field(report, "peerWaitFraction")); f && *f > 0.5) return SlowPart::kExchange;
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
    const json& r = Field(p->report, "stepsPerSecond");
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
  // Per dataset: what the job took up to the lowest step (that process's
  // report), and every reporting sidecar's tokens together.
  const ProcessProgress* lowest = nullptr;
  for (const auto* p : reached) {
    if (p->report["consumedStep"].get<int64_t>() == lo && Field(p->report, "datasets").is_array()) lowest = p;
  }
  if (lowest) {
    json datasets = json::array();
    for (const json& d : lowest->report["datasets"]) {
      if (!d.is_object() || !Field(d, "name").is_string()) continue;
      int64_t tokens = 0;
      for (const auto* p : reached) {
        if (!Field(p->report, "datasets").is_array()) continue;
        for (const json& e : p->report["datasets"]) {
          if (Field(e, "name") == d["name"] && Field(e, "processTokens").is_number_integer()) {
            tokens += e["processTokens"].get<int64_t>();
          }
        }
      }
      json entry = {{"name", d["name"]}, {"tokens", tokens}};
      for (const char* k : {"weight", "samplesConsumed", "epoch"}) {
        if (Field(d, k).is_number()) entry[std::string(k) == "samplesConsumed" ? "samples" : k] = d[k];
      }
      datasets.push_back(std::move(entry));
    }
    out["datasets"] = std::move(datasets);
  }
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
  if (Field(current, "starving").is_array()) {
    for (const auto& e : current["starving"]) {
      if (Field(e, "process").is_number_integer()) listed.insert(e["process"].get<int64_t>());
    }
  }
  json starving = json::array();
  const double limit = static_cast<double>(starved_percent) / 100.0;
  for (const auto* p : reached) {
    if (!Field(p->report, "trainerConnected").is_boolean() || !p->report["trainerConnected"].get<bool>()) continue;
    const json& f = Field(p->report, "trainerWaitFraction");
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

std::string Who(const ProcessProgress& p) { return "process " + std::to_string(p.process) + " (pod " + p.pod + ")"; }

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size() && i < 16; ++i) out += (i ? ", " : "") + parts[i];
  if (parts.size() > 16) out += " and " + std::to_string(parts.size() - 16) + " more";
  return out;
}

}  // namespace

std::vector<ProgressCondition> ProgressConditions(const JobProgress& poll, const HealthThresholds& t,
                                                  const std::vector<JobCondition>& conditions) {
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
    // The first of that type, as the status lists it.
    auto c = std::find_if(conditions.begin(), conditions.end(), [&](const JobCondition& x) { return x.type == type; });
    if (c == conditions.end() || c->status != "True") return std::nullopt;
    return ProgressCondition{type, "True", c->reason, c->message};
  };

  // Starved.
  const double starve = static_cast<double>(t.starved_wait_percent) / 100.0;
  std::vector<std::string> starving;
  bool in_band = false;
  for (const auto* p : reached) {
    if (!Field(p->report, "trainerConnected").is_boolean() || !p->report["trainerConnected"].get<bool>()) continue;
    auto f = Number(Field(p->report, "trainerWaitFraction"));
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
  for (const char* k : {"step", "maxStep", "resumeStep", "samplesPerSecond", "datasets"}) {
    a.erase(k);
    b.erase(k);
  }
  if (a != b) return fresh;
  bool moved = false;
  for (const char* k : {"step", "maxStep", "resumeStep"}) {
    const json& x = Field(current, k);
    const json& y = Field(fresh, k);
    if (x.is_null() != y.is_null()) return fresh;
    if (x.is_number_integer() && std::llabs(x.get<int64_t>() - y.get<int64_t>()) >= granularity) moved = true;
  }
  const json& x = Field(current, "samplesPerSecond");
  const json& y = Field(fresh, "samplesPerSecond");
  if (x.is_null() != y.is_null()) return fresh;
  if (y.is_number()) {
    if (!x.is_number()) return fresh;  // a stored figure that is not one (an edit): rewritten
    const double before = x.get<double>(), now = y.get<double>();
    if (now == 0 && before != 0) return fresh;  // the trainers stopped: the exact step
    if (before == 0 && now != 0) return fresh;
    if (std::fabs(now - before) > 0.1 * std::max(before, now)) moved = true;
    if (now == 0 && current != fresh) return fresh;
  }
  return moved && moves_due ? fresh : current;
}

}  // namespace meshload::controller
