// YAML -> DataLoadJob. Every problem is collected, none stops the parse, so a
// user sees all their typos at once.

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "planner/spec.h"

namespace meshload::planner {
namespace {

std::string LineOf(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return {};
  return " (line " + std::to_string(m.line + 1) + ")";
}

std::string NodeKind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "something else";
}

// Levenshtein distance for "did you mean" hints on unknown fields and values.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Suggest(std::string_view got, std::initializer_list<std::string_view> options) {
  std::string_view best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (auto o : options) {
    size_t d = EditDistance(got, o);
    if (d < best_d) best_d = d, best = o;
  }
  if (best_d <= std::max<size_t>(2, got.size() / 3)) return " (did you mean " + std::string(best) + "?)";
  return {};
}

std::string JoinOptions(std::initializer_list<std::string_view> options) {
  std::string s;
  for (auto o : options) {
    if (!s.empty()) s += ", ";
    s += o;
  }
  return s;
}

// Reads typed values out of YAML nodes, recording a problem (with the field
// path and line) for every node of the wrong shape.
class SpecReader {
 public:
  explicit SpecReader(Diagnostics& d) : d_(d) {}

  // True when `n` is a mapping; records a problem otherwise. Unknown keys are
  // reported with a suggestion.
  bool Map(const YAML::Node& n, const std::string& path, std::initializer_list<std::string_view> known) {
    if (!n.IsMap()) {
      d_.Add(path.empty() ? "(document)" : path, "expected a mapping, got " + NodeKind(n) + LineOf(n));
      return false;
    }
    for (const auto& kv : n) {
      const std::string key = kv.first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        d_.Add(path.empty() ? key : path + "." + key,
               "unknown field" + Suggest(key, known) + "; known fields: " + JoinOptions(known) + LineOf(kv.first));
      }
    }
    return true;
  }

  std::optional<int64_t> Int(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar() || n.Tag() == "!") {  // "!" marks a quoted scalar: a string
      d_.Add(path,
             "expected an integer, got " + NodeKind(n) + (n.Tag() == "!" ? " (a quoted string)" : "") + LineOf(n));
      return std::nullopt;
    }
    const std::string& s = n.Scalar();
    // Hand parse: yaml-cpp accepts floats and octal-ish forms we do not want.
    size_t i = 0;
    bool neg = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    if (i == s.size()) {
      d_.Add(path, "expected an integer, got '" + s + "'" + LineOf(n));
      return std::nullopt;
    }
    uint64_t v = 0;
    bool digits = false;
    for (; i < s.size(); ++i) {
      if (s[i] == '_' && digits) continue;  // YAML 1.1 digit separators: 1_000
      digits = true;
      if (s[i] < '0' || s[i] > '9') {
        d_.Add(path, "expected an integer, got '" + s + "'" + LineOf(n));
        return std::nullopt;
      }
      uint64_t digit = static_cast<uint64_t>(s[i] - '0');
      if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
        d_.Add(path, "integer '" + s + "' is out of range (max 9223372036854775807)" + LineOf(n));
        return std::nullopt;
      }
      v = v * 10 + digit;
    }
    return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  }

  std::optional<std::string> Str(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) {
      d_.Add(path, "expected a string, got " + NodeKind(n) + LineOf(n));
      return std::nullopt;
    }
    return n.Scalar();
  }

  // An enum value spelled exactly as in the CRD, named by its ToString
  // (planner/spec.cc): the spellings are written down once.
  template <typename E>
  std::optional<E> Named(const YAML::Node& n, const std::string& path, std::initializer_list<E> values) {
    std::vector<std::pair<std::string_view, E>> named;
    for (E v : values) named.emplace_back(ToString(v), v);
    return Enum<E>(n, path, named);
  }

  // A value spelled exactly as one of `values`' names.
  template <typename E>
  std::optional<E> Enum(const YAML::Node& n, const std::string& path,
                        const std::vector<std::pair<std::string_view, E>>& values) {
    auto s = Str(n, path);
    if (!s) return std::nullopt;
    for (const auto& [name, v] : values) {
      if (*s == name) return v;
    }
    std::string options;
    std::string suggestion;
    size_t best = std::numeric_limits<size_t>::max();
    for (const auto& [name, v] : values) {
      if (!options.empty()) options += ", ";
      options += name;
      size_t dist = EditDistance(*s, name);
      if (dist < best) best = dist, suggestion = std::string(name);
    }
    std::string hint = best <= 2 ? " (did you mean " + suggestion + "?)" : "";
    d_.Add(path, "unknown value '" + *s + "'" + hint + "; expected one of " + options + LineOf(n));
    return std::nullopt;
  }

  std::vector<std::string> StrList(const YAML::Node& n, const std::string& path) {
    std::vector<std::string> out;
    if (!n.IsSequence()) {
      d_.Add(path, "expected a list of strings, got " + NodeKind(n) + LineOf(n));
      return out;
    }
    for (size_t i = 0; i < n.size(); ++i) {
      if (auto s = Str(n[i], path + "[" + std::to_string(i) + "]")) out.push_back(*s);
    }
    return out;
  }

  void Missing(const std::string& path, const std::string& what) { d_.Add(path, "required field is missing; " + what); }

  Diagnostics& diags() { return d_; }

 private:
  Diagnostics& d_;
};

void ParseMesh(SpecReader& r, const YAML::Node& n, MeshSpec& mesh) {
  const std::string path = "spec.mesh";
  if (!r.Map(n, path, {"processes", "devicesPerProcess", "axes", "batchAxes"})) return;
  if (n["processes"]) {
    if (auto v = r.Int(n["processes"], path + ".processes")) mesh.processes = *v;
  } else {
    r.Missing(path + ".processes", "set the number of trainer processes (pods)");
  }
  if (n["devicesPerProcess"]) {
    if (auto v = r.Int(n["devicesPerProcess"], path + ".devicesPerProcess")) {
      mesh.devices_per_process = *v;
    }
  }
  if (n["axes"]) {
    const YAML::Node& axes = n["axes"];
    if (!axes.IsSequence()) {
      r.diags().Add(path + ".axes", "expected a list of {name, size}, got " + NodeKind(axes) + LineOf(axes));
    } else {
      for (size_t i = 0; i < axes.size(); ++i) {
        const std::string ap = path + ".axes[" + std::to_string(i) + "]";
        MeshAxis axis;
        if (r.Map(axes[i], ap, {"name", "size"})) {
          if (axes[i]["name"]) {
            if (auto s = r.Str(axes[i]["name"], ap + ".name")) axis.name = *s;
          } else {
            r.Missing(ap + ".name", "name the axis, e.g. data");
          }
          if (axes[i]["size"]) {
            if (auto v = r.Int(axes[i]["size"], ap + ".size")) axis.size = *v;
          } else {
            r.Missing(ap + ".size", "give the number of devices along this axis");
          }
        }
        mesh.axes.push_back(std::move(axis));
      }
    }
  } else {
    r.Missing(path + ".axes", "list the mesh axes, e.g. [{name: data, size: 8}]");
  }
  if (n["batchAxes"]) {
    mesh.batch_axes = r.StrList(n["batchAxes"], path + ".batchAxes");
    mesh.batch_axes_set = true;
  }
}

void ParseDataset(SpecReader& r, const YAML::Node& n, DatasetSpec& ds) {
  const std::string path = "spec.dataset";
  if (!r.Map(n, path, {"uri", "format", "dtype", "recordBytes", "sequenceLength", "samples", "volume", "s3"})) {
    return;
  }
  if (n["uri"]) {
    if (auto s = r.Str(n["uri"], path + ".uri")) ds.uri = *s;
  } else {
    r.Missing(path + ".uri", "give a path, file:// URI, directory, glob, http(s):// URL or s3:// URI");
  }
  ds.format_unknown = true;
  if (n["format"]) {
    if (auto f =
            r.Named<DatasetFormat>(n["format"], path + ".format",
                                   {DatasetFormat::kFixedRecord, DatasetFormat::kTokenStream, DatasetFormat::kNpy})) {
      ds.format = *f;
      ds.format_unknown = false;
    }
  } else {
    r.Missing(path + ".format", "one of FixedRecord, TokenStream, Npy");
  }
  if (n["dtype"]) {
    if (auto s = r.Str(n["dtype"], path + ".dtype")) {
      auto t = ParseDType(*s);
      if (t.ok()) {
        ds.dtype = *t;
      } else {
        r.diags().Add(path + ".dtype", t.status().message() + LineOf(n["dtype"]));
      }
    }
  }
  if (n["recordBytes"]) {
    ds.record_bytes_set = true;
    if (auto v = r.Int(n["recordBytes"], path + ".recordBytes")) ds.record_bytes = *v;
  }
  if (n["sequenceLength"]) {
    ds.sequence_length_set = true;
    if (auto v = r.Int(n["sequenceLength"], path + ".sequenceLength")) ds.sequence_length = *v;
  }
  if (n["samples"]) {
    if (auto v = r.Int(n["samples"], path + ".samples")) ds.samples = *v;
  }
  if (n["volume"]) {
    const YAML::Node& v = n["volume"];
    const std::string vp = path + ".volume";
    if (r.Map(v, vp, {"name", "mountPath"})) {
      DatasetVolume vol;
      if (v["name"]) {
        if (auto s = r.Str(v["name"], vp + ".name")) vol.name = *s;
      } else {
        r.Missing(vp + ".name", "name the trainer pods' volume that holds the dataset");
      }
      if (v["mountPath"]) {
        if (auto s = r.Str(v["mountPath"], vp + ".mountPath")) vol.mount_path = *s;
      } else {
        r.Missing(vp + ".mountPath", "give the absolute path the sidecar mounts it at (spec.dataset.uri is under it)");
      }
      ds.volume = std::move(vol);
    }
  }
  if (n["s3"]) {
    const YAML::Node& v = n["s3"];
    const std::string sp = path + ".s3";
    if (r.Map(v, sp, {"endpoint", "region", "addressing", "credentialsSecret"})) {
      DatasetS3 s3;
      if (v["endpoint"]) {
        if (auto x = r.Str(v["endpoint"], sp + ".endpoint")) s3.endpoint = *x;
      }
      if (v["region"]) {
        if (auto x = r.Str(v["region"], sp + ".region")) s3.region = *x;
      }
      if (v["addressing"]) {
        if (auto x = r.Str(v["addressing"], sp + ".addressing")) s3.addressing = *x;
      }
      if (v["credentialsSecret"]) {
        if (auto x = r.Str(v["credentialsSecret"], sp + ".credentialsSecret")) s3.credentials_secret = *x;
      }
      ds.s3 = std::move(s3);
    }
  }
}

void ParseQuantities(SpecReader& r, const YAML::Node& n, const std::string& path,
                     std::map<std::string, std::string>& out) {
  if (!n.IsMap()) {
    r.diags().Add(path, "expected a mapping of resource name to quantity, got " + NodeKind(n) + LineOf(n));
    return;
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    if (auto v = r.Str(kv.second, path + "." + key)) out[key] = *v;
  }
}

void ParseSidecar(SpecReader& r, const YAML::Node& n, SidecarSpec& sc) {
  const std::string path = "spec.sidecar";
  if (!r.Map(n, path, {"image", "resources"})) return;
  if (n["image"]) {
    if (auto s = r.Str(n["image"], path + ".image")) sc.image = *s;
  }
  if (n["resources"]) {
    const YAML::Node& res = n["resources"];
    sc.resources_set = true;
    if (r.Map(res, path + ".resources", {"requests", "limits"})) {
      if (res["requests"]) ParseQuantities(r, res["requests"], path + ".resources.requests", sc.requests);
      if (res["limits"]) ParseQuantities(r, res["limits"], path + ".resources.limits", sc.limits);
    }
  }
}

JobSpec ParseSpecMapping(SpecReader& r, const YAML::Node& spec) {
  JobSpec js;
  const std::string path = "spec";
  if (!r.Map(spec, path,
             {"mesh", "replication", "strategy", "dataset", "batch", "shuffle", "resume", "health", "selector",
              "sidecar"})) {
    return js;
  }
  if (spec["mesh"]) {
    ParseMesh(r, spec["mesh"], js.mesh);
  } else {
    r.Missing("spec.mesh", "describe the device mesh: processes, devicesPerProcess, axes");
  }
  if (spec["replication"]) {
    const YAML::Node& n = spec["replication"];
    if (r.Map(n, "spec.replication", {"mode", "fanout"})) {
      if (n["mode"]) {
        js.replication.mode =
            r.Named<ReplicationMode>(n["mode"], "spec.replication.mode",
                                     {ReplicationMode::kNone, ReplicationMode::kPartial, ReplicationMode::kFull});
      }
      if (n["fanout"]) {
        if (auto f = r.Named<Fanout>(n["fanout"], "spec.replication.fanout", {Fanout::kLoad, Fanout::kBroadcast})) {
          js.replication.fanout = *f;
        }
      }
    }
  }
  if (spec["strategy"]) {
    if (auto s = r.Named<Strategy>(
            spec["strategy"], "spec.strategy",
            {Strategy::kGlobalLoad, Strategy::kPerDevice, Strategy::kPerProcess, Strategy::kLoadAndReshard})) {
      js.strategy = *s;
    }
  }
  if (spec["dataset"]) {
    ParseDataset(r, spec["dataset"], js.dataset);
  } else {
    r.Missing("spec.dataset", "describe the dataset: uri, format and its fields");
  }
  if (spec["batch"]) {
    const YAML::Node& n = spec["batch"];
    if (r.Map(n, "spec.batch", {"globalBatchSize", "prefetch"})) {
      if (n["globalBatchSize"]) {
        if (auto v = r.Int(n["globalBatchSize"], "spec.batch.globalBatchSize")) {
          js.batch.global_batch_size = *v;
        }
      } else {
        r.Missing("spec.batch.globalBatchSize", "give the number of samples per global step");
      }
      if (n["prefetch"]) {
        if (auto v = r.Int(n["prefetch"], "spec.batch.prefetch")) js.batch.prefetch = *v;
      }
    }
  } else {
    r.Missing("spec.batch", "set batch.globalBatchSize");
  }
  if (spec["shuffle"]) {
    const YAML::Node& n = spec["shuffle"];
    if (r.Map(n, "spec.shuffle", {"mode", "seed", "blockSize"})) {
      bool mode_ok = true;
      if (n["mode"]) {
        if (auto m = r.Named<ShuffleMode>(n["mode"], "spec.shuffle.mode",
                                          {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock})) {
          js.shuffle.mode = *m;
        } else {
          mode_ok = false;
        }
      }
      if (n["seed"]) {
        if (auto v = r.Int(n["seed"], "spec.shuffle.seed")) {
          if (*v < 0) {
            r.diags().Add("spec.shuffle.seed", "must be >= 0, got " + std::to_string(*v));
          } else {
            js.shuffle.seed = static_cast<uint64_t>(*v);
          }
        }
      }
      if (n["blockSize"]) {
        if (auto v = r.Int(n["blockSize"], "spec.shuffle.blockSize")) js.shuffle.block_size = *v;
        if (mode_ok && js.shuffle.mode != ShuffleMode::kBlock) {
          r.diags().Add("spec.shuffle.blockSize", "is only used with mode Block, but mode is " +
                                                      std::string(ToString(js.shuffle.mode)) +
                                                      "; remove it or set mode: Block");
        }
      }
    }
  }
  if (spec["resume"]) {
    const YAML::Node& n = spec["resume"];
    if (r.Map(n, "spec.resume", {"step"})) {
      if (n["step"]) {
        if (auto v = r.Int(n["step"], "spec.resume.step")) js.resume.step = *v;
      }
    }
  }
  if (spec["health"]) {
    const YAML::Node& n = spec["health"];
    if (r.Map(n, "spec.health", {"starvedWaitPercent", "stragglerSteps", "stragglerLatencyFactor"})) {
      if (n["starvedWaitPercent"]) {
        if (auto v = r.Int(n["starvedWaitPercent"], "spec.health.starvedWaitPercent"))
          js.health.starved_wait_percent = *v;
      }
      if (n["stragglerSteps"]) {
        if (auto v = r.Int(n["stragglerSteps"], "spec.health.stragglerSteps")) js.health.straggler_steps = *v;
      }
      if (n["stragglerLatencyFactor"]) {
        if (auto v = r.Int(n["stragglerLatencyFactor"], "spec.health.stragglerLatencyFactor")) {
          js.health.straggler_latency_factor = *v;
        }
      }
    }
  }
  if (spec["sidecar"]) ParseSidecar(r, spec["sidecar"], js.sidecar);
  if (spec["selector"]) {
    const YAML::Node& n = spec["selector"];
    LabelSelector sel;
    if (r.Map(n, "spec.selector", {"matchLabels", "matchExpressions"})) {
      if (n["matchLabels"]) {
        const YAML::Node& ml = n["matchLabels"];
        if (!ml.IsMap()) {
          r.diags().Add("spec.selector.matchLabels",
                        "expected a mapping of label to value, got " + NodeKind(ml) + LineOf(ml));
        } else {
          for (const auto& kv : ml) {
            const std::string key = kv.first.Scalar();
            if (auto v = r.Str(kv.second, "spec.selector.matchLabels." + key)) {
              sel.match_labels[key] = *v;
            }
          }
        }
      }
      if (n["matchExpressions"]) {
        const YAML::Node& me = n["matchExpressions"];
        if (!me.IsSequence()) {
          r.diags().Add("spec.selector.matchExpressions",
                        "expected a list of {key, operator, values}, got " + NodeKind(me) + LineOf(me));
        } else {
          for (size_t i = 0; i < me.size(); ++i) {
            const std::string ep = "spec.selector.matchExpressions[" + std::to_string(i) + "]";
            LabelSelectorRequirement req;
            if (!r.Map(me[i], ep, {"key", "operator", "values"})) continue;
            if (me[i]["key"]) {
              if (auto s = r.Str(me[i]["key"], ep + ".key")) req.key = *s;
            } else {
              r.Missing(ep + ".key", "name the label key");
            }
            if (me[i]["operator"]) {
              if (auto op = r.Enum<std::string_view>(
                      me[i]["operator"], ep + ".operator",
                      {{"In", "In"}, {"NotIn", "NotIn"}, {"Exists", "Exists"}, {"DoesNotExist", "DoesNotExist"}})) {
                req.op = std::string(*op);
              }
            } else {
              r.Missing(ep + ".operator", "one of In, NotIn, Exists, DoesNotExist");
            }
            if (me[i]["values"]) req.values = r.StrList(me[i]["values"], ep + ".values");
            bool needs_values = req.op == "In" || req.op == "NotIn";
            if (needs_values && req.values.empty()) {
              r.diags().Add(ep + ".values", "operator " + req.op + " needs at least one value");
            } else if (!needs_values && !req.op.empty() && !req.values.empty()) {
              r.diags().Add(ep + ".values", "operator " + req.op + " takes no values");
            }
            sel.match_expressions.push_back(std::move(req));
          }
        }
      }
    }
    js.selector = std::move(sel);
  }
  return js;
}

Result<YAML::Node> LoadYamlRoot(std::string_view text, std::vector<YAML::Node>* all) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(text));
    if (all) *all = docs;
    return docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::Exception& e) {
    // Compiler style, so that `file` + location reads `job.yaml:3:1`.
    std::string loc;
    if (e.mark.line >= 0) {
      loc = ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    }
    return InvalidArgument("not valid YAML: " + e.msg, loc);
  }
}

}  // namespace

Result<DataLoadJob> ParseDataLoadJob(std::string_view yaml_text, Diagnostics& diags) {
  std::vector<YAML::Node> docs;
  auto root = LoadYamlRoot(yaml_text, &docs);
  if (!root.ok()) return root.status();

  std::vector<size_t> matches;
  for (size_t i = 0; i < docs.size(); ++i) {
    const YAML::Node& d = docs[i];
    if (d.IsMap() && d["kind"] && d["kind"].IsScalar() && d["kind"].Scalar() == kKind) {
      matches.push_back(i);
    }
  }
  if (matches.empty()) {
    return InvalidArgument("no document with kind: DataLoadJob among the " + std::to_string(docs.size()) +
                           " YAML document(s)");
  }
  if (matches.size() > 1) {
    return InvalidArgument("found " + std::to_string(matches.size()) +
                           " DataLoadJob documents; give a file with exactly one");
  }
  const YAML::Node& doc = docs[matches[0]];
  Diagnostics& local = diags;
  SpecReader r(local);
  DataLoadJob job;
  r.Map(doc, "", {"apiVersion", "kind", "metadata", "spec", "status"});
  job.kind = doc["kind"].Scalar();
  if (doc["apiVersion"]) {
    if (auto s = r.Str(doc["apiVersion"], "apiVersion")) {
      job.api_version = *s;
      if (*s != kApiVersion) {
        local.Add("apiVersion", "'" + *s + "' is not served; use " + std::string(kApiVersion));
      }
    }
  } else {
    r.Missing("apiVersion", "use " + std::string(kApiVersion));
  }
  if (doc["metadata"]) {
    const YAML::Node& md = doc["metadata"];
    if (md.IsMap()) {
      // The ObjectMeta fields a manifest or a server round trip may carry.
      r.Map(md, "metadata",
            {"name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation", "creationTimestamp",
             "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers", "ownerReferences", "managedFields",
             "generateName"});
      for (const char* field : {"labels", "annotations"}) {
        if (md[field] && !md[field].IsMap()) {
          local.Add(std::string("metadata.") + field,
                    "expected a mapping of strings, got " + NodeKind(md[field]) + LineOf(md[field]));
        } else if (md[field]) {
          for (const auto& kv : md[field]) {
            if (!kv.second.IsScalar()) {
              local.Add(std::string("metadata.") + field + "." + kv.first.Scalar(),
                        "expected a string, got " + NodeKind(kv.second) + LineOf(kv.second));
            }
          }
        }
      }
      if (md["name"]) {
        if (auto s = r.Str(md["name"], "metadata.name")) job.name = *s;
      }
      if (md["namespace"]) {
        if (auto s = r.Str(md["namespace"], "metadata.namespace")) job.namespace_ = *s;
      }
      if (md["labels"] && md["labels"].IsMap()) {
        for (const auto& kv : md["labels"]) {
          if (kv.second.IsScalar()) job.labels[kv.first.Scalar()] = kv.second.Scalar();
        }
      }
    } else {
      local.Add("metadata", "expected a mapping, got " + NodeKind(md) + LineOf(md));
    }
  }
  if (job.name.empty()) r.Missing("metadata.name", "every Kubernetes object needs a name");
  if (job.name.size() > 63) {
    // As the CRD and the controller say: the name labels what is made for
    // the job, and label values have at most 63 characters.
    local.Add("metadata.name", "at most 63 characters (it labels the ConfigMap and Secret made for the job), got " +
                                   std::to_string(job.name.size()) + LineOf(doc["metadata"]["name"]));
  }
  if (doc["spec"]) {
    job.spec = ParseSpecMapping(r, doc["spec"]);
  } else {
    r.Missing("spec", "a DataLoadJob needs a spec");
  }
  return job;
}

Result<JobSpec> ParseJobSpecText(std::string_view text, Diagnostics& diags) {
  auto root = LoadYamlRoot(text, nullptr);
  if (!root.ok()) return root.status();
  if (!root->IsMap()) return InvalidArgument("expected a spec mapping, got " + NodeKind(*root));
  SpecReader r(diags);
  return ParseSpecMapping(r, *root);
}

Result<DataLoadJob> LoadDataLoadJobFile(const std::string& path, Diagnostics& diags) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return IoError("is not a regular file; give the path of a DataLoadJob manifest", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoErrorFromErrno("cannot open job file", path, errno);
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return IoErrorFromErrno("cannot read job file", path, errno);
  auto job = ParseDataLoadJob(buf.str(), diags);
  if (!job.ok()) return job.status().WithLocationPrefix(path);
  return job;
}

}  // namespace meshload::planner
