// The DataLoadJob's status as a typed struct with one JSON binding, the
// status a reconcile wants for a job, and the Events a status change
// deserves.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace meshload::controller {

/// status.conditions[] (metav1.Condition).
struct JobCondition {
  std::string type, status, reason, message;
  int64_t observed_generation = 0;
  std::string last_transition_time;

  static JobCondition FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

/// status: phase, observedGeneration, processesReady, planHash,
/// peerSecretName, peerSecretUID, suspendedAtStep, progress (the sub-document ProgressStatus
/// builds, kept as JSON: controller/progress_poller.h describes it), and the
/// conditions. FromJson reads a stored status tolerantly (a missing or
/// mistyped member reads as empty); ToJson writes what a reconcile sends.
struct JobStatus {
  std::string phase;
  int64_t observed_generation = 0;
  int64_t processes_ready = 0;
  std::string plan_hash;
  std::string peer_secret_name;  // the Secret's name, once it exists
  std::string peer_secret_uid;   // its uid, when this controller made it
  nlohmann::json progress;       // null without a poll
  /// While the trainer Jobs are suspended after running: the step they
  /// resume at.
  std::optional<int64_t> suspended_at_step;
  std::vector<JobCondition> conditions;

  static JobStatus FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
  /// The condition of that type, or null.
  const JobCondition* Find(const std::string& type) const;
};

struct Condition {
  std::string type, status, reason, message;
};

// The desired status, built from the world; lastTransitionTime and
// observedGeneration are added by StatusToWrite.
struct DesiredStatus {
  std::string phase;
  int64_t processes_ready = 0;
  std::string plan_hash;
  std::string peer_secret;      // the Secret's name, once it exists
  std::string peer_secret_uid;  // its uid, when this controller made it
  nlohmann::json progress;      // status.progress (ProgressStatus), null without a poll
  std::optional<int64_t> suspended_at_step;
  std::vector<Condition> conditions;
};

/// The status to write: the desired one at `generation`, each condition
/// keeping the lastTransitionTime of `current`'s condition of that type
/// while its status is the same (messages cut to 32,000 bytes at a UTF-8
/// boundary).
JobStatus StatusToWrite(const DesiredStatus& d, int64_t generation, const JobStatus& current);

/// The events a status change deserves: one per condition whose status
/// changed (or, on a new job, that starts bad, or Planned); Warning when it
/// went bad, Normal when it went good.
struct ConditionEvent {
  std::string type, reason, message;
};
std::vector<ConditionEvent> ConditionEvents(const JobStatus& before, const JobStatus& after);

}  // namespace meshload::controller
