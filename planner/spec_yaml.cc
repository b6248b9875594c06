// YAML -> DataLoadJob. Every problem is collected, none stops the parse, so a
// user sees all their typos at once. The spec's fields are parsed by the code
// generated from the declaration (ParseJobSpecFields); this file reads the
// document around them: kind, apiVersion, metadata.

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "planner/spec.h"
#include "planner/spec_reader.h"

namespace meshload::planner {
namespace {

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

// A JSON tree as the YAML tree the parser reads: strings as quoted scalars
// (so "8" is a string, as in the JSON), no text in between.
YAML::Node FromJson(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      YAML::Node n(YAML::NodeType::Map);
      for (const auto& [k, v] : j.items()) n[k] = FromJson(v);
      return n;
    }
    case nlohmann::json::value_t::array: {
      YAML::Node n(YAML::NodeType::Sequence);
      for (const auto& v : j) n.push_back(FromJson(v));
      return n;
    }
    case nlohmann::json::value_t::string: {
      YAML::Node n(j.get<std::string>());
      n.SetTag("!");
      return n;
    }
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: return YAML::Node(YAML::NodeType::Null);
    default: return YAML::Node(j.dump());  // numbers and booleans, as JSON writes them
  }
}

Result<DataLoadJob> ParseDocument(const YAML::Node& doc, Diagnostics& diags);

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
  return ParseDocument(docs[matches[0]], diags);
}

namespace {

Result<DataLoadJob> ParseDocument(const YAML::Node& doc, Diagnostics& diags) {
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
    ParseJobSpecFields(r, doc["spec"], job.spec);
  } else {
    r.Missing("spec", "a DataLoadJob needs a spec");
  }
  return job;
}

}  // namespace

Result<JobSpec> ParseJobSpecText(std::string_view text, Diagnostics& diags) {
  auto root = LoadYamlRoot(text, nullptr);
  if (!root.ok()) return root.status();
  if (!root->IsMap()) return InvalidArgument("expected a spec mapping, got " + NodeKind(*root));
  SpecReader r(diags);
  JobSpec spec;
  ParseJobSpecFields(r, *root, spec);
  return spec;
}

Result<ValidJob> ValidateJob(DataLoadJob job, Diagnostics& diags) {
  ValidateJobSpec(job.spec, diags);
  if (!diags.ok()) return diags.ToStatus();
  return ValidJob(std::move(job));
}

Result<ValidJob> ValidateJob(JobSpec spec, Diagnostics& diags) {
  DataLoadJob job;
  job.api_version = std::string(kApiVersion);
  job.kind = std::string(kKind);
  job.spec = std::move(spec);
  return ValidateJob(std::move(job), diags);
}

Result<ValidJob> LoadJobText(std::string_view yaml_or_json, Diagnostics& diags) {
  MESHLOAD_ASSIGN_OR_RETURN(DataLoadJob job, ParseDataLoadJob(yaml_or_json, diags));
  return ValidateJob(std::move(job), diags);
}

Result<ValidJob> LoadJobFile(const std::string& path, Diagnostics& diags) {
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
  return ValidateJob(std::move(*job), diags);
}

Result<ValidJob> LoadJobObject(const nlohmann::json& object, Diagnostics& diags) {
  if (!object.is_object()) return InvalidArgument("a DataLoadJob object is a JSON object, got " + object.dump());
  YAML::Node doc = FromJson(object);
  if (!doc["apiVersion"]) doc["apiVersion"] = std::string(kApiVersion);
  if (!doc["kind"]) doc["kind"] = std::string(kKind);
  if (doc["kind"].Scalar() != kKind) {
    return InvalidArgument("not a DataLoadJob: kind " + object.value("kind", std::string()));
  }
  MESHLOAD_ASSIGN_OR_RETURN(DataLoadJob job, ParseDocument(doc, diags));
  return ValidateJob(std::move(job), diags);
}

}  // namespace meshload::planner
