// Spec validation: everything that can be checked without the dataset.

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "planner/spec.h"

namespace meshload::planner {

std::string_view ToString(ReplicationMode m) {
  switch (m) {
    case ReplicationMode::kNone: return "None";
    case ReplicationMode::kPartial: return "Partial";
    case ReplicationMode::kFull: return "Full";
  }
  return "?";
}
std::string_view ToString(Fanout f) { return f == Fanout::kLoad ? "Load" : "Broadcast"; }
std::string_view ToString(Strategy s) {
  switch (s) {
    case Strategy::kGlobalLoad: return "GlobalLoad";
    case Strategy::kPerDevice: return "PerDevice";
    case Strategy::kPerProcess: return "PerProcess";
    case Strategy::kLoadAndReshard: return "LoadAndReshard";
  }
  return "?";
}
std::string_view ToString(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::kFixedRecord: return "FixedRecord";
    case DatasetFormat::kTokenStream: return "TokenStream";
    case DatasetFormat::kNpy: return "Npy";
  }
  return "?";
}
std::string_view ToString(ShuffleMode m) {
  switch (m) {
    case ShuffleMode::kNone: return "None";
    case ShuffleMode::kGlobal: return "Global";
    case ShuffleMode::kBlock: return "Block";
  }
  return "?";
}

bool MovesSamplesBetweenProcesses(const JobSpec& spec) {
  return spec.strategy == Strategy::kLoadAndReshard || spec.replication.fanout == Fanout::kBroadcast;
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

constexpr size_t kMaxAxes = 8;  // the CRD's CEL rule multiplies out at most 8 sizes
constexpr int64_t kMaxAxisSize = int64_t{1} << 20;
constexpr int64_t kMaxDevices = int64_t{1} << 22;
constexpr int64_t kMaxPrefetch = 1024;

bool IsValidAxisName(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

bool IsIntegerType(DType t) {
  switch (t) {
    case DType::kInt8:
    case DType::kUint8:
    case DType::kInt16:
    case DType::kUint16:
    case DType::kInt32:
    case DType::kUint32:
    case DType::kInt64:
    case DType::kUint64: return true;
    default: return false;
  }
}

// Adds a problem unless one was already reported at this path or at an
// enclosing one (a missing `spec.batch` should not also be reported as
// "spec.batch.globalBatchSize: must be >= 1, got 0").
void AddOnce(Diagnostics& d, const std::string& path, std::string msg) {
  for (const auto& p : d.problems()) {
    if (p.path == path) return;
    if (path.size() > p.path.size() && path.compare(0, p.path.size(), p.path) == 0 &&
        (path[p.path.size()] == '.' || path[p.path.size()] == '[')) {
      return;
    }
  }
  d.Add(path, std::move(msg));
}

std::string AxisList(const MeshSpec& mesh) {
  std::string s = "[";
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (i) s += ", ";
    s += mesh.axes[i].name + "=" + std::to_string(mesh.axes[i].size);
  }
  return s + "]";
}

// A DNS-1123 label: what Kubernetes allows as a volume's name.
bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && !(c == '-' && i > 0 && i + 1 < s.size())) return false;
  }
  return true;
}

void ValidateDatasetS3(const DatasetSpec& ds, Diagnostics& d) {
  const DatasetS3& s3 = *ds.s3;
  if (ds.uri.rfind("s3://", 0) != 0) {
    d.Add("spec.dataset.s3", "is for s3:// datasets; spec.dataset.uri is '" + ds.uri + "'");
  }
  const std::string& e = s3.endpoint;
  if (!e.empty()) {
    const size_t sep = e.find("://");
    const std::string scheme = sep == std::string::npos ? "" : e.substr(0, sep);
    const std::string rest = sep == std::string::npos ? "" : e.substr(sep + 3);
    const std::string host = rest.substr(0, rest.find('/'));
    const std::string path = rest.substr(host.size());
    if ((scheme != "http" && scheme != "https") || host.empty() || host.find('@') != std::string::npos ||
        (!path.empty() && path != "/")) {
      d.Add("spec.dataset.s3.endpoint",
            "'" + e + "' is not an endpoint: give http(s)://host[:port], without a path or credentials");
    }
  }
  const std::string& r = s3.region;
  if (!r.empty() &&
      (r.size() > 64 || r.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)) {
    d.Add("spec.dataset.s3.region", "'" + r + "' is not a region (lower-case letters, digits and '-')");
  }
  if (s3.addressing != "Auto" && s3.addressing != "Path" && s3.addressing != "VirtualHosted") {
    d.Add("spec.dataset.s3.addressing", "must be one of Auto, Path, VirtualHosted, got '" + s3.addressing + "'");
  }
  const std::string& secret = s3.credentials_secret;
  bool name_ok = !secret.empty() && secret.size() <= 253;
  for (size_t i = 0; i < secret.size(); ++i) {
    const char c = secret[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    name_ok = name_ok && (alnum || ((c == '-' || c == '.') && i > 0 && i + 1 < secret.size()));
  }
  if (!secret.empty() && !name_ok) {
    d.Add("spec.dataset.s3.credentialsSecret", "'" + secret + "' is not a Secret name (a DNS subdomain)");
  }
}

void ValidateDatasetVolume(const DatasetSpec& ds, Diagnostics& d) {
  const DatasetVolume& v = *ds.volume;
  if (!v.name.empty() && !IsDnsLabel(v.name)) {
    d.Add("spec.dataset.volume.name", "'" + v.name +
                                          "' is not a volume name (a DNS label: lower-case letters, "
                                          "digits and '-', at most 63 characters)");
  }
  const std::string& m = v.mount_path;
  if (m.empty()) return;  // reported as missing by the parser
  if (m[0] != '/' || m.find("/../") != std::string::npos || m.size() > 4096 ||
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
    d.Add("spec.dataset.uri", "'" + ds.uri + "' is not under spec.dataset.volume.mountPath '" + m +
                                  "', where the sidecar mounts the dataset's volume");
  }
}

void ValidateSidecar(const SidecarSpec& sc, Diagnostics& d) {
  if (sc.image.find_first_of(" \t\n") != std::string::npos) {
    d.Add("spec.sidecar.image", "'" + sc.image + "' is not an image reference (it contains white space)");
  }
  for (const auto* m : {&sc.requests, &sc.limits}) {
    for (const auto& [name, q] : *m) {
      const bool digits = !q.empty() && ((q[0] >= '0' && q[0] <= '9') || q[0] == '.');
      if (!digits) {
        d.Add(std::string("spec.sidecar.resources.") + (m == &sc.requests ? "requests." : "limits.") + name,
              "'" + q + "' is not a quantity (e.g. 500m, 2, 1Gi)");
      }
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
  if (B < 1) {
    AddOnce(d, "spec.batch.globalBatchSize", "must be >= 1, got " + std::to_string(B));
  } else if (shards > 0) {
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
  if (spec.batch.prefetch < 1 || spec.batch.prefetch > kMaxPrefetch) {
    d.Add("spec.batch.prefetch",
          "must be between 1 and " + std::to_string(kMaxPrefetch) + ", got " + std::to_string(spec.batch.prefetch));
  }

  // Dataset fields by format.
  const DatasetSpec& ds = spec.dataset;
  if (ds.uri.empty()) AddOnce(d, "spec.dataset.uri", "must not be empty");
  if (ds.volume) ValidateDatasetVolume(ds, d);
  if (ds.s3) ValidateDatasetS3(ds, d);
  if (spec.sidecar.resources_set || !spec.sidecar.image.empty()) ValidateSidecar(spec.sidecar, d);
  const bool record_bytes_given = ds.record_bytes_set || ds.record_bytes != 0;
  const bool sequence_length_given = ds.sequence_length_set || ds.sequence_length != 0;
  switch (ds.format_unknown ? static_cast<DatasetFormat>(-1) : ds.format) {
    case DatasetFormat::kFixedRecord: {
      if (ds.record_bytes < 1) {
        AddOnce(d, "spec.dataset.recordBytes",
                !record_bytes_given ? "required for format FixedRecord: the bytes of one record"
                                    : "must be >= 1, got " + std::to_string(ds.record_bytes));
      } else if (ds.dtype && ds.record_bytes % static_cast<int64_t>(DTypeSize(*ds.dtype)) != 0) {
        d.Add("spec.dataset.recordBytes", std::to_string(ds.record_bytes) + " is not a whole number of " +
                                              std::string(DTypeName(*ds.dtype)) + " elements (" +
                                              std::to_string(DTypeSize(*ds.dtype)) + " bytes each)");
      }
      if (sequence_length_given) {
        d.Add("spec.dataset.sequenceLength", "is only used by format TokenStream; remove it");
      }
      break;
    }
    case DatasetFormat::kTokenStream: {
      if (!ds.dtype) {
        AddOnce(d, "spec.dataset.dtype", "required for format TokenStream: the token type, e.g. uint16 or uint32");
      } else if (!IsIntegerType(*ds.dtype)) {
        d.Add("spec.dataset.dtype",
              "TokenStream tokens must be an integer type, got " + std::string(DTypeName(*ds.dtype)));
      }
      if (ds.sequence_length < 1) {
        AddOnce(d, "spec.dataset.sequenceLength",
                !sequence_length_given
                    ? "required for format TokenStream: tokens per sample (T; a sample is T+1 tokens)"
                    : "must be >= 1, got " + std::to_string(ds.sequence_length));
      }
      if (record_bytes_given) {
        d.Add("spec.dataset.recordBytes",
              "is not used by format TokenStream (a sample is sequenceLength+1 tokens); remove it");
      }
      break;
    }
    case DatasetFormat::kNpy: {
      if (sequence_length_given) {
        d.Add("spec.dataset.sequenceLength", "is only used by format TokenStream; remove it");
      }
      if (record_bytes_given && ds.record_bytes < 1) {
        d.Add("spec.dataset.recordBytes", "must be >= 1, got " + std::to_string(ds.record_bytes));
      }
      break;
    }
    default: break;  // format missing or unknown: already reported
  }
  if (ds.samples && *ds.samples < 1) {
    d.Add("spec.dataset.samples", "must be >= 1, got " + std::to_string(*ds.samples));
  }
  if (ds.samples && B >= 1 && *ds.samples >= 1 && *ds.samples < B) {
    d.Add("spec.dataset.samples", "the dataset has " + std::to_string(*ds.samples) +
                                      " samples, fewer than one global batch of " + std::to_string(B));
  }
  if (spec.shuffle.mode == ShuffleMode::kBlock && spec.shuffle.block_size < 1) {
    d.Add("spec.shuffle.blockSize", "must be >= 1, got " + std::to_string(spec.shuffle.block_size));
  }
  if (spec.resume.step < 0) {
    d.Add("spec.resume.step", "must be >= 0, got " + std::to_string(spec.resume.step));
  }
  if (spec.health.starved_wait_percent < 1 || spec.health.starved_wait_percent > 100) {
    d.Add("spec.health.starvedWaitPercent",
          "must be 1 to 100 (% of the window), got " + std::to_string(spec.health.starved_wait_percent));
  }
  if (spec.health.straggler_steps < 1) {
    d.Add("spec.health.stragglerSteps", "must be >= 1, got " + std::to_string(spec.health.straggler_steps));
  }
  if (spec.health.straggler_latency_factor < 2) {
    d.Add("spec.health.stragglerLatencyFactor",
          "must be >= 2 (times the job's median latency), got " + std::to_string(spec.health.straggler_latency_factor));
  }
}

}  // namespace meshload::planner
