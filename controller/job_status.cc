#include "controller/job_status.h"

#include "controller/kube/client.h"
#include "controller/kube/json_fields.h"

namespace meshload::controller {

using nlohmann::json;

using kube::Field;
using kube::Str;

json StatusJson(const DesiredStatus& d, int64_t generation, const json& current) {
  json out = json::object();
  out["phase"] = d.phase;
  out["observedGeneration"] = generation;
  out["processesReady"] = d.processes_ready;
  if (!d.plan_hash.empty()) out["planHash"] = d.plan_hash;
  if (!d.peer_secret.empty()) out["peerSecretName"] = d.peer_secret;
  if (!d.peer_secret_uid.empty()) out["peerSecretUID"] = d.peer_secret_uid;
  if (d.progress.is_object()) out["progress"] = d.progress;
  json conds = json::array();
  const json& old = Field(current, "conditions");
  for (const auto& c : d.conditions) {
    std::string ltt = kube::NowRfc3339();
    if (old.is_array()) {
      for (const auto& o : old) {
        if (Str(o, "type") == c.type && Str(o, "status") == c.status && !Str(o, "lastTransitionTime").empty()) {
          ltt = Str(o, "lastTransitionTime");
        }
      }
    }
    json cj = {{"type", c.type},
               {"status", c.status},
               {"reason", c.reason},
               {"message", kube::CutUtf8(c.message, 32000)},
               {"observedGeneration", generation},
               {"lastTransitionTime", ltt}};
    conds.push_back(std::move(cj));
  }
  out["conditions"] = std::move(conds);
  return out;
}

std::vector<ConditionEvent> ConditionEvents(const json& before, const json& after) {
  std::vector<ConditionEvent> out;
  const json& old = Field(before, "conditions");
  const json& now = Field(after, "conditions");
  if (!now.is_array()) return out;
  for (const auto& c : now) {
    const std::string type = Str(c, "type"), status = Str(c, "status");
    std::string reason = Str(c, "reason"), message = Str(c, "message");
    std::string was, was_reason, was_message;
    if (old.is_array()) {
      for (const auto& o : old) {
        if (Str(o, "type") == type) {
          was = Str(o, "status");
          was_reason = Str(o, "reason");
          was_message = Str(o, "message");
        }
      }
    }
    if (status == "Unknown") continue;
    // Degraded, Starved and Straggling are good when False.
    const bool negative = type == "Degraded" || type == "Starved" || type == "Straggling";
    const bool good = negative == (status == "False");
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
      const bool worth = type == "Planned" || (type == "SidecarsReady" ? good : !good);
      if (!worth) continue;
    } else if (type == "Degraded" && good && reason == "InvalidSpec") {
      continue;  // not a recovery: the spec went invalid (Valid says so)
    }
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
