/// \file
/// The files the controller publishes for a job's sidecars, keys of the
/// job's ConfigMap mounted beside job.json (docs/operations.md):
///   assignments.json  {"processes": P, "pods": {NAME: {"uid", "index", "ip"}},
///                      "samples": N (when the controller resolved it)}
///   resume.json       {"step": R, "specStep": S}
/// One binding each: the controller writes them with ToJson, the sidecar
/// and the controller read them with Parse, whose errors name the file and
/// the field.
///
/// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"

namespace meshload::planner {

/// A trainer pod's process, as the controller assigned it.
struct PodAssignment {
  std::string uid;
  int64_t index = 0;
  std::string ip;  // "" until the pod has one
};

struct Assignments {
  int64_t processes = 0;
  std::map<std::string, PodAssignment> pods;  // by pod name
  std::optional<int64_t> samples;

  nlohmann::json ToJson() const;
  /// kInvalidArgument naming `file` and the field: not the controller's
  /// assignments (processes, pods), processes out of range (1 to 2^22), an
  /// index that is not an integer in [0, processes).
  static Result<Assignments> Parse(const std::string& text, const std::string& file);
  /// What can be read of `text`, entry by entry: each pod whose index is an
  /// integer >= 0 (uid and ip when they are strings); processes and samples
  /// when they are integers (else 0 and none). Never fails: the controller
  /// keeps every assignment it can of a ConfigMap someone edited, rather
  /// than renumber running trainers.
  static Assignments ReadLeniently(const std::string& text);
};

struct ResumeRecord {
  int64_t step = 0;       // the step the sidecars start at
  int64_t spec_step = 0;  // the spec.resume.step it was recorded under

  nlohmann::json ToJson() const;
  /// kInvalidArgument naming `file`: not {"step": N >= 0, "specStep": S}.
  static Result<ResumeRecord> Parse(const std::string& text, const std::string& file);
};

}  // namespace meshload::planner
