// Spec validation: everything that can be checked without the dataset.

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "planner/spec.h"

#include "planner/format_driver.h"
#include "planner/mixture.h"
#include "planner/spec_reader.h"

namespace meshload::planner {

bool MovesSamplesBetweenProcesses(const JobSpec& spec) {
  return spec.strategy == Strategy::kLoadAndReshard || spec.replication.fanout == Fanout::kBroadcast;
}

std::string ResolveMixtureUri(const std::string& root, const std::string& uri) {
  if (uri.find("://") != std::string::npos || uri.rfind('/', 0) == 0) return uri;
  std::string base = root;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/" + uri;
}

std::vector<DatasetSpec> JobDatasets(const JobSpec& spec) {
  if (!spec.mixture) return {spec.dataset};
  std::vector<DatasetSpec> out;
  for (const MixtureDataset& m : spec.mixture->datasets) {
    DatasetSpec ds = spec.dataset;
    ds.uri = ResolveMixtureUri(spec.dataset.uri, m.uri);
    ds.samples = m.samples;
    out.push_back(std::move(ds));
  }
  return out;
}

std::string DatasetPath(const JobSpec& spec, size_t d) {
  return spec.mixture ? "spec.mixture.datasets[" + std::to_string(d) + "]" : std::string("spec.dataset");
}

std::string FormatNameList(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) s += ", ";
    s += names[i];
  }
  return s + "]";
}

std::vector<std::string> EffectiveBatchAxes(const MeshSpec& mesh) {
  if (mesh.batch_axes_set) return mesh.batch_axes;
  std::vector<std::string> all;
  for (const auto& a : mesh.axes) all.push_back(a.name);
  return all;
}

ReplicationMode ImpliedReplicationMode(const MeshSpec& mesh) {
  // Axes of size 1 shard and replicate nothing, so they count on neither side:
  // Full when no axis of size > 1 shards the batch, None when every one does.
  std::vector<std::string> batch = EffectiveBatchAxes(mesh);
  std::set<std::string> b(batch.begin(), batch.end());
  bool any_sharded = false, any_replicated = false;
  for (const auto& a : mesh.axes) {
    if (a.size <= 1) continue;
    (b.count(a.name) ? any_sharded : any_replicated) = true;
  }
  if (!any_sharded) return ReplicationMode::kFull;
  return any_replicated ? ReplicationMode::kPartial : ReplicationMode::kNone;
}

namespace {

// The declared bounds of the mesh (planner/api/dataloadjob.yaml), which
// ValidateMeshSpec checks by hand, with the arithmetic between them.
constexpr size_t kMaxAxes = kMeshSpecAxesMaxItems;  // the CRD's CEL rule multiplies out at most 8 sizes
constexpr int64_t kMaxAxisSize = kMeshAxisSizeMaximum;
constexpr int64_t kMaxDevices = kMeshSpecProcessesMaximum;  // processes, devices per process and the whole mesh
static_assert(kMeshSpecDevicesPerProcessMaximum == kMaxDevices);

bool IsValidAxisName(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

std::string AxisList(const MeshSpec& mesh) {
  std::string s = "[";
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (i) s += ", ";
    s += mesh.axes[i].name + "=" + std::to_string(mesh.axes[i].size);
  }
  return s + "]";
}

// What the declaration cannot say about spec.dataset.s3 (its fields' own
// patterns are declared): it belongs to an s3:// dataset.
void ValidateDatasetS3(const DatasetSpec& ds, Diagnostics& d) {
  if (ds.uri.rfind("s3://", 0) != 0) {
    d.Add("spec.dataset.s3", "is for s3:// datasets; spec.dataset.uri is '" + ds.uri + "'");
  }
}

void ValidateDatasetVolume(const DatasetSpec& ds, const std::string& uri_path, Diagnostics& d) {
  const DatasetVolume& v = *ds.volume;
  const std::string& m = v.mount_path;
  if (m.empty()) return;  // reported as missing by the parser
  if (m[0] != '/' || m.find("/../") != std::string::npos ||
      static_cast<int64_t>(m.size()) > kDatasetVolumeMountPathMaxLength ||
      (m.size() >= 3 && m.compare(m.size() - 3, 3, "/..") == 0)) {
    d.Add("spec.dataset.volume.mountPath", "'" + m + "' must be an absolute path without '..'");
    return;
  }
  // A local dataset must be inside the mount, or the sidecar would not see it.
  std::string path = ds.uri;
  if (path.rfind("file://", 0) == 0) path = path.substr(7);
  if (path.find("://") != std::string::npos || path.empty()) return;  // not local: the volume may hold a cache
  std::string prefix = m;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  if (!(path == prefix || path.rfind(prefix == "/" ? prefix : prefix + "/", 0) == 0)) {
    d.Add(uri_path, "'" + ds.uri + "' is not under spec.dataset.volume.mountPath '" + m +
                        "', where the sidecar mounts the dataset's volume");
  }
}

// spec.tokens: what its declaration cannot say (the token ids against the
// dataset's dtype are checked with the index: DatasetIndex::CutIntoRows).
void ValidateTokens(const JobSpec& spec, Diagnostics& d) {
  const TokensSpec& t = *spec.tokens;
  if (!spec.dataset.format_unknown && !DriverOf(spec.dataset.format).traits().documents) {
    d.Add("spec.tokens", "needs format " + FormatsWith(&FormatTraits::documents) +
                             " (documents whose index gives their lengths), but "
                             "spec.dataset.format is " +
                             std::string(ToString(spec.dataset.format)));
  }
  if (!t.mode_invalid && t.mode != TokensMode::kPack) {
    if (t.pad_token_set) d.Add("spec.tokens.padToken", "is only used with mode Pack; remove it");
    if (t.packing_set) d.Add("spec.tokens.packing", "is only used with mode Pack; remove it");
  }
  if (spec.batch.balance.mode == BalanceMode::kTokens) {
    d.Add("spec.batch.balance.mode", "Tokens is not used with spec.tokens: every row holds the same " +
                                         std::to_string(t.sequence_length) + " tokens; remove it");
  }
  if (spec.dataset.dtype && !formats::IsIntegerDType(*spec.dataset.dtype)) {
    d.Add("spec.dataset.dtype", "spec.tokens needs token ids (an integer dtype), got " +
                                    std::string(formats::DTypeName(*spec.dataset.dtype)));
  }
}

// spec.mixture: what its declaration cannot say.
void ValidateMixture(const JobSpec& spec, Diagnostics& d) {
  const MixtureSpec& mix = *spec.mixture;
  if (mix.datasets.size() < 2) {
    d.Add("spec.mixture.datasets", "a mixture needs at least 2 datasets, got " + std::to_string(mix.datasets.size()) +
                                       "; for one dataset, leave spec.mixture out");
  }
  if (spec.dataset.samples) {
    d.Add("spec.dataset.samples",
          "is not used with spec.mixture; give each dataset's in spec.mixture.datasets[i].samples");
  }
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < mix.datasets.size(); ++i) {
    const MixtureDataset& m = mix.datasets[i];
    const std::string at = "spec.mixture.datasets[" + std::to_string(i) + "]";
    if (!m.name.empty()) {
      auto [it, fresh] = names.emplace(m.name, i);
      if (!fresh) d.Add(at + ".name", "'" + m.name + "' is also datasets[" + std::to_string(it->second) + "]'s name");
    }
    if (!m.uri.empty()) {
      const std::string path = m.uri.substr(0, m.uri.find('?'));
      if (path == ".." || path.rfind("../", 0) == 0 || path.find("/../") != std::string::npos ||
          (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0)) {
        d.Add(at + ".uri", "'" + m.uri + "' has a '..' component");
      } else if (spec.dataset.volume) {
        DatasetSpec resolved = spec.dataset;
        resolved.uri = ResolveMixtureUri(spec.dataset.uri, m.uri);
        ValidateDatasetVolume(resolved, at + ".uri", d);
      }
    }
    for (size_t k = 1; k < m.schedule.size(); ++k) {
      if (m.schedule[k].step <= m.schedule[k - 1].step) {
        d.Add(at + ".schedule[" + std::to_string(k) + "].step",
              std::to_string(m.schedule[k].step) + " does not follow schedule[" + std::to_string(k - 1) + "].step " +
                  std::to_string(m.schedule[k - 1].step) + "; steps must increase");
      }
    }
  }
  if (!d.ok()) return;
  // Every step must draw from some dataset: the weights in force from each
  // step where one changes must not all be 0.
  std::set<int64_t> steps = {0};
  for (const MixtureDataset& m : mix.datasets) {
    for (const MixtureWeight& e : m.schedule) steps.insert(e.step);
  }
  if (steps.size() - 1 > MixtureSchedule::kMaxChanges) {
    d.Add("spec.mixture.datasets", "the weights change at " + std::to_string(steps.size() - 1) + " steps; at most " +
                                       std::to_string(MixtureSchedule::kMaxChanges));
    return;
  }
  for (int64_t step : steps) {
    bool any = false;
    for (const MixtureDataset& m : mix.datasets) {
      double w = m.weight;
      for (const MixtureWeight& e : m.schedule) {
        if (e.step <= step) w = e.weight;
      }
      any = any || w > 0;
    }
    if (!any) {
      d.Add("spec.mixture.datasets", step == 0 ? std::string("the weights are all 0: no dataset would give a sample")
                                               : "the weights from step " + std::to_string(step) +
                                                     " on are all 0: no dataset would give a sample");
      return;
    }
  }
}

// Operators In and NotIn need values, Exists and DoesNotExist take none.
void ValidateSelector(const LabelSelector& sel, Diagnostics& d) {
  for (size_t i = 0; i < sel.match_expressions.size(); ++i) {
    const LabelSelectorRequirement& req = sel.match_expressions[i];
    const std::string ep = "spec.selector.matchExpressions[" + std::to_string(i) + "]";
    const bool needs_values = req.op == "In" || req.op == "NotIn";
    if (needs_values && req.values.empty()) {
      d.Add(ep + ".values", "operator " + req.op + " needs at least one value");
    } else if (!needs_values && !req.op.empty() && !req.values.empty()) {
      d.Add(ep + ".values", "operator " + req.op + " takes no values");
    }
  }
}

}  // namespace

int64_t ValidateMeshSpec(const MeshSpec& mesh, Diagnostics& d) {
  bool ok = true;
  if (mesh.processes < 1 || mesh.processes > kMaxDevices) {
    AddOnce(d, "spec.mesh.processes",
            "must be between 1 and " + std::to_string(kMaxDevices) + ", got " + std::to_string(mesh.processes));
    ok = false;
  }
  if (mesh.devices_per_process < 1 || mesh.devices_per_process > kMaxDevices) {
    AddOnce(
        d, "spec.mesh.devicesPerProcess",
        "must be between 1 and " + std::to_string(kMaxDevices) + ", got " + std::to_string(mesh.devices_per_process));
    ok = false;
  }
  if (mesh.axes.empty()) {
    AddOnce(d, "spec.mesh.axes", "must list at least one axis, e.g. [{name: data, size: 8}]");
    return 0;
  }
  if (mesh.axes.size() > kMaxAxes) {
    d.Add("spec.mesh.axes",
          "has " + std::to_string(mesh.axes.size()) + " axes; at most " + std::to_string(kMaxAxes) + " are supported");
    return 0;
  }
  std::map<std::string, size_t> seen;
  int64_t devices = 1;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    const auto& a = mesh.axes[i];
    const std::string ap = "spec.mesh.axes[" + std::to_string(i) + "]";
    if (!IsValidAxisName(a.name)) {
      AddOnce(d, ap + ".name",
              "'" + a.name + "' is not a valid axis name (a letter or _, then letters, digits, _ or -; at most 63)");
      ok = false;
    } else if (auto it = seen.find(a.name); it != seen.end()) {
      d.Add(ap + ".name", "duplicate axis name '" + a.name + "' (also axes[" + std::to_string(it->second) +
                              "]); axis names must be unique");
      ok = false;
    } else {
      seen[a.name] = i;
    }
    if (a.size < 1) {
      AddOnce(d, ap + ".size", "must be >= 1, got " + std::to_string(a.size));
      ok = false;
    } else if (a.size > kMaxAxisSize) {
      d.Add(ap + ".size", "must be <= " + std::to_string(kMaxAxisSize) + ", got " + std::to_string(a.size));
      ok = false;
    } else if (ok) {
      devices *= a.size;
      if (devices > kMaxDevices) {
        d.Add("spec.mesh.axes", "the mesh has more than " + std::to_string(kMaxDevices) + " devices");
        ok = false;
      }
    }
  }
  if (!ok) return 0;
  if (mesh.processes * mesh.devices_per_process != devices) {
    d.Add("spec.mesh", "processes × devicesPerProcess = " + std::to_string(mesh.processes) + " × " +
                           std::to_string(mesh.devices_per_process) + " = " +
                           std::to_string(mesh.processes * mesh.devices_per_process) + ", but the axes " +
                           AxisList(mesh) + " have " + std::to_string(devices) + " devices; they must be equal");
    ok = false;
  }
  // batchAxes
  int64_t shards = 1;
  std::set<std::string> used;
  bool batch_ok = true;
  if (mesh.batch_axes_set) {
    for (size_t i = 0; i < mesh.batch_axes.size(); ++i) {
      const std::string& n = mesh.batch_axes[i];
      const std::string bp = "spec.mesh.batchAxes[" + std::to_string(i) + "]";
      auto it = seen.find(n);
      if (it == seen.end()) {
        std::string hint;
        for (const auto& [name, idx] : seen) {
          (void)idx;
          if (name.size() + 2 >= n.size() && n.size() + 2 >= name.size() &&
              (name.find(n) != std::string::npos || n.find(name) != std::string::npos)) {
            hint = " (did you mean " + name + "?)";
          }
        }
        d.Add(bp, "unknown axis '" + n + "'" + hint + "; the mesh axes are " +
                      FormatNameList(EffectiveBatchAxes(MeshSpec{0, 0, mesh.axes, {}, false})));
        batch_ok = false;
      } else if (!used.insert(n).second) {
        d.Add(bp, "axis '" + n + "' is listed twice; each axis may shard the batch once");
        batch_ok = false;
      } else {
        shards *= mesh.axes[it->second].size;
      }
    }
  } else {
    for (const auto& a : mesh.axes) shards *= a.size;
  }
  if (!batch_ok) return 0;
  return ok ? shards : 0;
}

void ValidateJobSpec(const JobSpec& spec, Diagnostics& d) {
  const MeshSpec& mesh = spec.mesh;
  const int64_t shards = ValidateMeshSpec(mesh, d);
  // Every field's own bounds, patterns and lengths, as declared.
  CheckDeclaredBounds(spec, d);

  // Replication mode against batchAxes: a mismatch is an error, not a guess.
  if (shards > 0 && spec.replication.mode) {
    ReplicationMode implied = ImpliedReplicationMode(mesh);
    ReplicationMode declared = *spec.replication.mode;
    if (implied != declared) {
      std::string why;
      switch (declared) {
        case ReplicationMode::kNone:
          why = "None (pure data parallel) needs batchAxes to include every axis of size > 1";
          break;
        case ReplicationMode::kFull:
          why = "Full needs batchAxes: [] (every device holds the whole global batch)";
          break;
        case ReplicationMode::kPartial:
          why = "Partial needs batchAxes to leave out some axis of size > 1, but not all";
          break;
      }
      std::string batch_desc =
          mesh.batch_axes_set ? "batchAxes " + FormatNameList(mesh.batch_axes)
                              : "batchAxes (defaulted to every axis " + FormatNameList(EffectiveBatchAxes(mesh)) + ")";
      d.Add("spec.replication.mode", "declared " + std::string(ToString(declared)) + " but " + batch_desc + " mean " +
                                         std::string(ToString(implied)) + "; " + why);
    }
  }

  const int64_t B = spec.batch.global_batch_size;
  if (B >= 1 && shards > 0) {
    if (B % shards != 0) {
      d.Add("spec.batch.globalBatchSize", std::to_string(B) + " is not divisible by the " + std::to_string(shards) +
                                              " data shards of batchAxes " + FormatNameList(EffectiveBatchAxes(mesh)) +
                                              "; use a multiple of " + std::to_string(shards));
    }
    if (spec.strategy == Strategy::kLoadAndReshard && mesh.processes >= 1 && B % mesh.processes != 0) {
      d.Add("spec.batch.globalBatchSize",
            std::to_string(B) + " is not divisible by the " + std::to_string(mesh.processes) +
                " processes, which strategy LoadAndReshard needs (process p reads positions "
                "[p·B/P, (p+1)·B/P)); use a multiple of " +
                std::to_string(mesh.processes) + " or another strategy");
    }
  }
  if (spec.batch.balance.mode == BalanceMode::kTokens && !spec.dataset.format_unknown &&
      !DriverOf(spec.dataset.format).traits().variable_size) {
    d.Add("spec.batch.balance.mode", "Tokens needs variable-size samples (format " +
                                         FormatsWith(&FormatTraits::variable_size) + "); " +
                                         std::string(ToString(spec.dataset.format)) +
                                         " samples all have the same size, so every shard already has the same tokens");
  }
  // Dataset fields by format.
  const DatasetSpec& ds = spec.dataset;
  if (ds.volume && !spec.mixture) ValidateDatasetVolume(ds, "spec.dataset.uri", d);
  if (spec.mixture) ValidateMixture(spec, d);
  if (ds.s3) ValidateDatasetS3(ds, d);
  if (spec.selector) ValidateSelector(*spec.selector, d);
  // The format's own checks (a format missing or unknown is already reported).
  if (!ds.format_unknown) DriverOf(ds.format).CheckSpec(ds, d);
  if (!ds.format_unknown && !DriverOf(ds.format).traits().records && !ds.fields.empty()) {
    d.Add("spec.dataset.fields",
          "are only used by formats " + FormatsWith(&FormatTraits::records, "and") + "; remove them");
  }
  if (!ds.format_unknown && !ds.compression_invalid && ds.compression != FileCompression::kNone &&
      !DriverOf(ds.format).traits().file_compression) {
    d.Add("spec.dataset.compression", "is only used by format " + FormatsWith(&FormatTraits::file_compression) +
                                          " (an MDS shard's compression comes from its index.json); remove it");
  }
  if (!ds.format_unknown && !ds.split.empty() && !DriverOf(ds.format).traits().splits) {
    d.Add("spec.dataset.split", "is only used by formats " + FormatsWith(&FormatTraits::splits, "and") +
                                    " (a Hugging Face Hub repository, a saved DatasetDict); remove it");
  }
  if (!ds.config.empty() && ds.split.empty()) {
    d.Add("spec.dataset.config", "needs spec.dataset.split (the repository's split to read)");
  } else if (!ds.format_unknown && !ds.config.empty() && !DriverOf(ds.format).traits().hub_repository) {
    d.Add("spec.dataset.config", "is only used by format " + FormatsWith(&FormatTraits::hub_repository) +
                                     " (a Hugging Face Hub repository's configs); remove it");
  }
  if (spec.tokens) ValidateTokens(spec, d);
  if (ds.samples && B >= 1 && *ds.samples >= 1 && *ds.samples < B && !spec.tokens) {
    d.Add("spec.dataset.samples", "the dataset has " + std::to_string(*ds.samples) +
                                      " samples, fewer than one global batch of " + std::to_string(B));
  }
  const ShuffleMode mode = spec.shuffle.mode;
  if (spec.shuffle.block_size_set && !spec.shuffle.mode_invalid && mode != ShuffleMode::kBlock &&
      mode != ShuffleMode::kWindow) {
    d.Add("spec.shuffle.blockSize", "is only used with modes Block and Window, but mode is " +
                                        std::string(ToString(mode)) + "; remove it or set mode: Block or Window");
  }
  if (spec.shuffle.window_blocks_set && !spec.shuffle.mode_invalid && mode != ShuffleMode::kWindow) {
    d.Add("spec.shuffle.windowBlocks", "is only used with mode Window, but mode is " + std::string(ToString(mode)) +
                                           "; remove it or set mode: Window");
  }
}

}  // namespace meshload::planner
