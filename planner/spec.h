/// \file
/// The DataLoadJob custom resource as typed structs, its YAML parser and its
/// validation.
///
/// Parsing and validation never stop at the first mistake: both collect every
/// problem into a Diagnostics, each naming its field path, e.g.
///   spec.batch.globalBatchSize: 100 is not divisible by the 8 data shards of
///   batchAxes [data, fsdp]
///
/// Defaults are applied by the parser (see docs/crd-reference.md); a field's
/// `*_set` flag or std::optional says whether the user wrote it, which
/// validation needs to tell "defaulted" from "declared".
///
/// Thread safety: plain values; the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/dtype.h"

namespace meshload::planner {

inline constexpr std::string_view kApiGroup = "meshload.io";
inline constexpr std::string_view kApiVersion = "meshload.io/v1alpha1";
inline constexpr std::string_view kKind = "DataLoadJob";

enum class ReplicationMode { kNone, kPartial, kFull };
enum class Fanout { kLoad, kBroadcast };
enum class Strategy { kGlobalLoad, kPerDevice, kPerProcess, kLoadAndReshard };
enum class DatasetFormat { kFixedRecord, kTokenStream, kNpy };
enum class ShuffleMode { kNone, kGlobal, kBlock };

std::string_view ToString(ReplicationMode m);
std::string_view ToString(Fanout f);
std::string_view ToString(Strategy s);
std::string_view ToString(DatasetFormat f);
std::string_view ToString(ShuffleMode m);

inline constexpr Strategy kAllStrategies[] = {Strategy::kGlobalLoad, Strategy::kPerDevice, Strategy::kPerProcess,
                                              Strategy::kLoadAndReshard};
inline constexpr Fanout kAllFanouts[] = {Fanout::kLoad, Fanout::kBroadcast};

struct MeshAxis {
  std::string name;
  int64_t size = 0;
};

struct MeshSpec {
  int64_t processes = 0;  // required
  int64_t devices_per_process = 1;
  std::vector<MeshAxis> axes;  // required, non-empty; row-major, last axis fastest
  /// The PartitionSpec of the batch dimension; defaults to every axis in mesh
  /// order. Order matters: the shard index is row-major over this list.
  std::vector<std::string> batch_axes;
  bool batch_axes_set = false;
};

struct ReplicationSpec {
  /// Declared mode; when absent it is derived from batchAxes.
  std::optional<ReplicationMode> mode;
  Fanout fanout = Fanout::kLoad;
};

/// The pod volume that holds a local dataset: the injected sidecar mounts it
/// read-only at mount_path (the path spec.dataset.uri is under).
struct DatasetVolume {
  std::string name;        // a volume of the trainer pods
  std::string mount_path;  // absolute
};

/// How the sidecar reaches an s3:// dataset (spec.dataset.s3). Empty fields
/// fall back to the standard AWS environment variables of the sidecar.
struct DatasetS3 {
  std::string endpoint;             // http(s)://host[:port]; empty: AWS_ENDPOINT_URL_S3 / AWS's
  std::string region;               // empty: AWS_REGION, else us-east-1
  std::string addressing = "Auto";  // Auto, Path, VirtualHosted
  std::string credentials_secret;   // a Secret in the job's namespace the injected sidecar mounts
};

struct DatasetSpec {
  std::string uri;  // required: path, file:// URI, directory or glob; http(s)://, s3:// for the sidecar
  DatasetFormat format = DatasetFormat::kFixedRecord;  // required
  std::optional<DType> dtype;
  int64_t record_bytes = 0;        // FixedRecord: required; Npy: optional bytes-per-sample hint
  int64_t sequence_length = 0;     // TokenStream: required
  std::optional<int64_t> samples;  // count when the data is not reachable from the planner
  std::optional<DatasetVolume> volume;
  std::optional<DatasetS3> s3;
  // Set by the parser: the field was written (possibly as 0), and the format
  // was missing or unknown (then format-specific checks would only add noise).
  bool record_bytes_set = false;
  bool sequence_length_set = false;
  bool format_unknown = false;
};

struct BatchSpec {
  int64_t global_batch_size = 0;  // required
  int64_t prefetch = 2;
};

struct ShuffleSpec {
  ShuffleMode mode = ShuffleMode::kGlobal;
  uint64_t seed = 0;
  int64_t block_size = 1024;  // Block mode only
};

struct ResumeSpec {
  int64_t step = 0;
};

/// When the controller says the loader starves the trainers or a process
/// straggles (the Starved and Straggling conditions; docs/controller.md).
struct HealthSpec {
  /// Starved: a trainer waited for data more than this % of the last window.
  int64_t starved_wait_percent = 25;
  /// Straggling: a process is more than this many steps behind the median...
  int64_t straggler_steps = 100;
  /// ...or its storage p99 latency is this many times the job's median.
  int64_t straggler_latency_factor = 4;
};

struct LabelSelectorRequirement {
  std::string key;
  std::string op;  // In, NotIn, Exists, DoesNotExist
  std::vector<std::string> values;
};

struct LabelSelector {
  std::map<std::string, std::string> match_labels;
  std::vector<LabelSelectorRequirement> match_expressions;
  bool empty() const { return match_labels.empty() && match_expressions.empty(); }
};

/// The sidecar the controller's webhook injects into trainer pods, where the
/// job overrides the chart's defaults. The planner checks the shapes only;
/// resources are Kubernetes quantities, passed on as written.
struct SidecarSpec {
  std::string image;                                    // empty: the controller's --sidecar-image
  std::map<std::string, std::string> requests, limits;  // empty: the controller's defaults
  bool resources_set = false;
};

struct JobSpec {
  MeshSpec mesh;
  ReplicationSpec replication;
  Strategy strategy = Strategy::kPerProcess;
  DatasetSpec dataset;
  BatchSpec batch;
  ShuffleSpec shuffle;
  ResumeSpec resume;
  HealthSpec health;
  std::optional<LabelSelector> selector;
  SidecarSpec sidecar;
};

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

/// Parses a bare `spec` mapping, as YAML or JSON text (the controller's
/// resolved job carries the spec as JSON). Paths in diagnostics start with
/// `spec`. Returns an error only when the text is not a YAML/JSON mapping.
Result<JobSpec> ParseJobSpecText(std::string_view text, Diagnostics& diags);

/// Reads the file and parses it; file errors carry the file name.
Result<DataLoadJob> LoadDataLoadJobFile(const std::string& path, Diagnostics& diags);

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

/// Renders `[a, b]`.
std::string FormatNameList(const std::vector<std::string>& names);

}  // namespace meshload::planner
