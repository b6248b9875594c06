// The status a reconcile wants for a DataLoadJob, as the JSON it writes
// through /status, and the Events a status change deserves.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshload::controller {

struct Condition {
  std::string type, status, reason, message;
};

// The desired status, built from the world; lastTransitionTime is added by
// StatusJson from the stored status.
struct DesiredStatus {
  std::string phase;
  int64_t processes_ready = 0;
  std::string plan_hash;
  std::string peer_secret;      // the Secret's name, once it exists
  std::string peer_secret_uid;  // its uid, when this controller made it
  nlohmann::json progress;      // status.progress (ProgressStatus), null without a poll
  std::vector<Condition> conditions;
};

/// status as written: phase, observedGeneration, processesReady, planHash,
/// peerSecretName/UID, progress, and the conditions, each keeping the
/// lastTransitionTime of `current`'s condition of that type while its status
/// is the same (messages cut to 32,000 bytes at a UTF-8 boundary).
nlohmann::json StatusJson(const DesiredStatus& d, int64_t generation, const nlohmann::json& current);

/// The events a status change deserves: one per condition whose status
/// changed (or, on a new job, that starts bad, or Planned); Warning when it
/// went bad, Normal when it went good.
struct ConditionEvent {
  std::string type, reason, message;
};
std::vector<ConditionEvent> ConditionEvents(const nlohmann::json& before, const nlohmann::json& after);

}  // namespace meshload::controller
