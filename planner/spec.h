/// \file
/// The DataLoadJob custom resource: its typed structs (generated from the one
/// declaration, planner/api/dataloadjob.yaml), its parser and its validation.
///
/// Parsing and validation never stop at the first mistake: both collect every
/// problem into a Diagnostics, each naming its field path, e.g.
///   spec.batch.globalBatchSize: 100 is not divisible by the 8 data shards of
///   batchAxes [data, fsdp]
///
/// Defaults are the structs' initializers (the declaration's); a field's
/// `*_set` flag or std::optional says whether the user wrote it, which
/// validation needs to tell "defaulted" from "declared".
///
/// Thread safety: plain values; the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/dataloadjob_api.h"
#include "formats/dtype.h"

namespace meshload::planner {

inline constexpr std::string_view kApiGroup = "meshload.io";
inline constexpr std::string_view kApiVersion = "meshload.io/v1alpha1";
inline constexpr std::string_view kKind = "DataLoadJob";

// The enums and structs of the spec (JobSpec and its parts, with their
// defaults and the declared bounds) are generated from the one declaration,
// planner/api/dataloadjob.yaml.

struct DataLoadJob {
  std::string api_version;
  std::string kind;
  std::string name;
  std::string namespace_;
  std::map<std::string, std::string> labels;
  JobSpec spec;
};

/// Parses one DataLoadJob from YAML text. Multi-document input is accepted:
/// the one document whose kind is DataLoadJob is taken (none or several is an
/// error). Type errors, unknown fields, unknown enum values and missing
/// required fields are all collected into `diags` (with line numbers for
/// type errors); the returned job holds what could be parsed, with defaults.
/// Returns an error status only when no DataLoadJob document could be found
/// or the YAML itself does not parse; `diags` says the rest.
Result<DataLoadJob> ParseDataLoadJob(std::string_view yaml_text, Diagnostics& diags);

/// Parses a bare `spec` mapping, as YAML or JSON text. Paths in diagnostics
/// start with `spec`. Returns an error only when the text is not a YAML/JSON
/// mapping.
Result<JobSpec> ParseJobSpecText(std::string_view text, Diagnostics& diags);

/// A DataLoadJob that parsed without a problem and passed ValidateJobSpec:
/// what every component receives. Only the loaders below make one, so a
/// component that holds one knows the job was validated, and validates it
/// no more.
class ValidJob {
 public:
  const DataLoadJob& job() const { return job_; }
  const JobSpec& spec() const { return job_.spec; }
  const std::string& name() const { return job_.name; }

 private:
  explicit ValidJob(DataLoadJob job) : job_(std::move(job)) {}
  friend Result<ValidJob> ValidateJob(DataLoadJob job, Diagnostics& diags);
  DataLoadJob job_;
};

/// The one way to a ValidJob: validates `job` (ValidateJobSpec) after what
/// parsing it already put into `diags`; an error when `diags` holds any
/// problem, and then `diags` lists every one.
Result<ValidJob> ValidateJob(DataLoadJob job, Diagnostics& diags);
/// A spec built in code (tests, benchmarks), as a job without a name.
Result<ValidJob> ValidateJob(JobSpec spec, Diagnostics& diags);

/// The entry points: read, parse and validate a DataLoadJob, once.
/// A manifest file (YAML or JSON; a multi-document file gives its one
/// DataLoadJob); file errors carry the file name.
Result<ValidJob> LoadJobFile(const std::string& path, Diagnostics& diags);
/// The same from text.
Result<ValidJob> LoadJobText(std::string_view yaml_or_json, Diagnostics& diags);
/// A DataLoadJob object as the API server gives it (the informer's cache,
/// an admission request): read from the JSON tree as it is, without text in
/// between. `apiVersion` and `kind` may be left out (list items).
Result<ValidJob> LoadJobObject(const nlohmann::json& object, Diagnostics& diags);

/// Checks the spec's internal consistency (everything that does not need the
/// dataset): mesh arithmetic, batchAxes, replication mode, divisibility,
/// format-specific fields. Adds every problem to `diags`.
void ValidateJobSpec(const JobSpec& spec, Diagnostics& diags);

/// Validates only the mesh (axis names and sizes, process arithmetic,
/// batchAxes). Returns the number of data shards S, or 0 when the mesh is
/// too broken for the checks that depend on it.
int64_t ValidateMeshSpec(const MeshSpec& mesh, Diagnostics& diags);

/// The replication mode that batchAxes imply.
ReplicationMode ImpliedReplicationMode(const MeshSpec& mesh);

/// The effective batchAxes (the declared list, or every axis).
std::vector<std::string> EffectiveBatchAxes(const MeshSpec& mesh);

/// True when the job moves samples between its processes' sidecars (a
/// Broadcast fan-out or LoadAndReshard): they need the peer exchange and the
/// job's peer secret.
bool MovesSamplesBetweenProcesses(const JobSpec& spec);

/// A mixture dataset's uri resolved against spec.dataset.uri: a relative
/// path (no scheme, no leading '/') is joined to it; anything else is kept.
std::string ResolveMixtureUri(const std::string& root, const std::string& uri);

/// The job's datasets: spec.dataset, or one per spec.mixture dataset
/// (spec.dataset with that dataset's resolved uri and samples), in order.
std::vector<DatasetSpec> JobDatasets(const JobSpec& spec);

/// Where dataset `d` of JobDatasets is declared, for messages:
/// "spec.dataset" or "spec.mixture.datasets[d]".
std::string DatasetPath(const JobSpec& spec, size_t d);

/// Renders `[a, b]`.
std::string FormatNameList(const std::vector<std::string>& names);

}  // namespace meshload::planner
