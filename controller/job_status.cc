#include "controller/job_status.h"

#include "controller/kube/client.h"
#include "controller/kube/json_fields.h"

namespace meshload::controller {

using nlohmann::json;

using kube::Field;
using kube::Int;
using kube::Str;

JobCondition JobCondition::FromJson(const json& j) {
  return {Str(j, "type"),
          Str(j, "status"),
          Str(j, "reason"),
          Str(j, "message"),
          Int(j, "observedGeneration"),
          Str(j, "lastTransitionTime")};
}

json JobCondition::ToJson() const {
  return {{"type", type},
          {"status", status},
          {"reason", reason},
          {"message", message},
          {"observedGeneration", observed_generation},
          {"lastTransitionTime", last_transition_time}};
}

JobStatus JobStatus::FromJson(const json& j) {
  JobStatus s;
  s.phase = Str(j, "phase");
  s.observed_generation = Int(j, "observedGeneration");
  s.processes_ready = Int(j, "processesReady");
  s.plan_hash = Str(j, "planHash");
  s.peer_secret_name = Str(j, "peerSecretName");
  s.peer_secret_uid = Str(j, "peerSecretUID");
  if (Field(j, "progress").is_object()) s.progress = j["progress"];
  if (Field(j, "suspendedAtStep").is_number_integer()) s.suspended_at_step = j["suspendedAtStep"].get<int64_t>();
  const json& conds = Field(j, "conditions");
  if (conds.is_array()) {
    for (const auto& c : conds) s.conditions.push_back(JobCondition::FromJson(c));
  }
  return s;
}

json JobStatus::ToJson() const {
  json out = json::object();
  out["phase"] = phase;
  out["observedGeneration"] = observed_generation;
  out["processesReady"] = processes_ready;
  if (!plan_hash.empty()) out["planHash"] = plan_hash;
  if (!peer_secret_name.empty()) out["peerSecretName"] = peer_secret_name;
  if (!peer_secret_uid.empty()) out["peerSecretUID"] = peer_secret_uid;
  if (progress.is_object()) out["progress"] = progress;
  if (suspended_at_step) out["suspendedAtStep"] = *suspended_at_step;
  json conds = json::array();
  for (const auto& c : conditions) conds.push_back(c.ToJson());
  out["conditions"] = std::move(conds);
  return out;
}

const JobCondition* JobStatus::Find(const std::string& type) const {
  const JobCondition* found = nullptr;
  for (const auto& c : conditions) {
    if (c.type == type) found = &c;  // the last of that type, as a list read in order
  }
  return found;
}

JobStatus StatusToWrite(const DesiredStatus& d, int64_t generation, const JobStatus& current) {
  JobStatus out;
  out.phase = d.phase;
  out.observed_generation = generation;
  out.processes_ready = d.processes_ready;
  out.plan_hash = d.plan_hash;
  out.peer_secret_name = d.peer_secret;
  out.peer_secret_uid = d.peer_secret_uid;
  if (d.progress.is_object()) out.progress = d.progress;
  out.suspended_at_step = d.suspended_at_step;
  for (const auto& c : d.conditions) {
    std::string ltt = kube::NowRfc3339();
    for (const auto& o : current.conditions) {
      if (o.type == c.type && o.status == c.status && !o.last_transition_time.empty()) ltt = o.last_transition_time;
    }
    out.conditions.push_back({c.type, c.status, c.reason, kube::CutUtf8(c.message, 32000), generation, ltt});
  }
  return out;
}

std::vector<ConditionEvent> ConditionEvents(const JobStatus& before, const JobStatus& after) {
  std::vector<ConditionEvent> out;
  for (const auto& c : after.conditions) {
    const std::string& type = c.type;
    const std::string& status = c.status;
    std::string reason = c.reason, message = c.message;
    std::string was, was_reason, was_message;
    if (const JobCondition* o = before.Find(type)) {
      was = o->status;
      was_reason = o->reason;
      was_message = o->message;
    }
    if (status == "Unknown") continue;
    // Degraded, Starved and Straggling are good when False. Admitted is
    // neither: waiting for a queue, or being preempted by it, is how
    // queued jobs run (Normal either way).
    const bool negative = type == "Degraded" || type == "Starved" || type == "Straggling";
    const bool neutral = type == "Admitted";
    const bool good = neutral || negative == (status == "False");
    const bool fresh = was.empty() || was == "Unknown";  // a new, or newly valid, job
    if (was == status) {
      // Still bad, for another reason or with other errors (an edit that
      // leaves the spec invalid, a different problem): say so. Repeats of
      // the same are raised counts, not new events.
      const bool still_bad = !good && (type == "Valid" || type == "Degraded");
      if (!still_bad || (reason == was_reason && message == was_message)) continue;
    } else if (fresh) {
      // Say what is wrong, that it was planned, and that its sidecars are
      // ready; not ready yet, and not degraded, is how a job starts.
      const bool worth =
          type == "Planned" || (type == "SidecarsReady" ? good : !good) || (neutral && status == "False");
      if (!worth) continue;
    } else if (type == "Degraded" && good && reason == "InvalidSpec") {
      continue;  // not a recovery: the spec went invalid (Valid says so)
    }
    // Pods gone with their suspended Jobs are Admitted's event, not a
    // sidecar problem or a recovery.
    if (reason == "TrainersSuspended" && (type == "SidecarsReady" || type == "Degraded")) continue;
    // Sidecars that are not all ready are SidecarsReady's events (Degraded
    // says it too, and would repeat each one, at every job's start as well).
    if (type == "Degraded" && (good ? was_reason : reason) == "NotAllSidecarsReady") continue;
    if (type == "Degraded" && good) {
      reason = "Recovered";
      message = "no longer degraded (was: " + was_reason + ")";
    }
    if (message.empty()) message = type + " is now " + status;
    if (message.rfind(reason + ": ", 0) == 0) message.erase(0, reason.size() + 2);  // "Reason: ..." problems
    out.push_back({good ? "Normal" : "Warning", reason.empty() ? type : reason, message});
  }
  return out;
}

}  // namespace meshload::controller
