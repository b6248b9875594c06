#include "sidecar/source/dataset_facts.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace meshload::sidecar::source {

Result<formats::NpyHeader> ReadNpyHeader(Source& source, const std::string& name, uint64_t size) {
  const std::string where = RedactUri(name);
  std::string head(static_cast<size_t>(std::min<uint64_t>(formats::kNpyPreambleBytes, size)), '\0');
  MESHLOAD_RETURN_IF_ERROR(source.Read(name, 0, head.data(), head.size()));
  Result<uint64_t> data_offset = formats::NpyDataOffset(head);
  if (!data_offset.ok()) return data_offset.status().WithLocationPrefix(where);
  // Bounded: NpyDataOffset caps the header at about 1 MiB.
  const uint64_t want = std::min<uint64_t>(*data_offset, size);
  if (want > head.size()) {
    const size_t got = head.size();
    head.resize(static_cast<size_t>(want));
    MESHLOAD_RETURN_IF_ERROR(source.Read(name, got, head.data() + got, want - got));
  }
  Result<formats::NpyHeader> header = formats::ParseNpyHeader(head);
  if (!header.ok()) return header.status().WithLocationPrefix(where);
  return header;
}

Status S3OptionsForDataset(const planner::DatasetSpec& spec, S3Options& s3) {
  if (spec.s3) {
    if (!spec.s3->endpoint.empty()) s3.endpoint = spec.s3->endpoint;
    if (!spec.s3->region.empty()) s3.region = spec.s3->region;
    if (spec.s3->addressing == "Path") s3.addressing = S3Options::Addressing::kPath;
    if (spec.s3->addressing == "VirtualHosted") s3.addressing = S3Options::Addressing::kVirtualHosted;
  }
  return S3OptionsFromEnvironment(s3);
}

Result<planner::DatasetIndex> IndexDataset(const planner::DatasetSpec& spec, SourceRegistry& sources,
                                           Diagnostics& diags) {
  MESHLOAD_ASSIGN_OR_RETURN(auto found, sources.For(spec.uri));
  auto [source, name] = found;
  MESHLOAD_ASSIGN_OR_RETURN(std::vector<Source::Listed> objects, source->List(name));
  std::vector<planner::DatasetIndex::FileFacts> files;
  files.reserve(objects.size());
  std::vector<std::pair<std::string, std::string>> secret;  // names whose redacted form differs
  for (auto& o : objects) {
    if (std::string r = RedactUri(o.name); r != o.name) secret.emplace_back(o.name, std::move(r));
    planner::DatasetIndex::FileFacts facts;
    facts.path = o.name;
    facts.size = o.size;
    if (spec.format == planner::DatasetFormat::kNpy) facts.npy = ReadNpyHeader(*source, o.name, o.size);
    files.push_back(std::move(facts));
  }
  Diagnostics index_diags;
  auto index = planner::DatasetIndex::FromFiles(spec, std::move(files), index_diags);
  // A signed URL's query must not reach messages and logs.
  auto redact = [&](std::string s) {
    for (const auto& [name, redacted] : secret) {
      for (size_t at; (at = s.find(name)) != std::string::npos;) s.replace(at, name.size(), redacted);
    }
    return s;
  };
  for (const auto& p : index_diags.problems()) diags.Add(redact(p.path), redact(p.message));
  if (!index.ok()) {
    return Status(index.status().code(), redact(index.status().message()), redact(index.status().location()));
  }
  return index;
}

Result<planner::ResolvedJob> ResolveWithSources(const planner::ValidJob& job, SourceRegistry& sources,
                                                planner::ResolveOptions options, Unreachable unreachable,
                                                Diagnostics& diags) {
  if (options.index || options.samples) {
    return planner::ResolveJob(job, options, diags);
  }
  const planner::JobSpec& spec = job.spec();
  Diagnostics index_diags;
  auto index = IndexDataset(spec.dataset, sources, index_diags);
  if (!index.ok() && unreachable == Unreachable::kUseDeclaredSamples && spec.dataset.samples) {
    return planner::ResolveJob(job, options, diags);  // planned from spec.dataset.samples
  }
  for (const auto& p : index_diags.problems()) diags.Add(p.path, p.message);
  if (!index.ok()) {
    diags.Add("spec.dataset.uri",
              index.status().ToString() + (unreachable == Unreachable::kFail
                                               ? std::string()
                                               : "; make the data reachable from here, or give its size with "
                                                 "spec.dataset.samples or --samples"));
    // Storage that refuses or cannot be reached keeps its code: callers
    // tell a dataset they cannot read from a wrong job (a URI that names
    // nothing is the job's: kInvalidArgument, as a dataset that does not
    // match the spec).
    const Status all = diags.ToStatus();
    const StatusCode code = index.status().code();
    if (code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound) return all;
    return Status(code, all.message(), all.location());
  }
  if (!diags.ok()) return diags.ToStatus();
  options.index = std::move(*index);
  return planner::ResolveJob(job, options, diags);
}

Result<planner::ResolvedJob> ResolveReadingDataset(const planner::ValidJob& job, planner::ResolveOptions options,
                                                   Unreachable unreachable, Diagnostics& diags) {
  SourceOptions sopts;
  if (SourceRegistry::SchemeOf(job.spec().dataset.uri) == "s3") {
    if (Status st = S3OptionsForDataset(job.spec().dataset, sopts.s3); !st.ok()) {
      diags.Add(st);
      return diags.ToStatus();
    }
  }
  auto sources = SourceRegistry::WithBuiltins(sopts);
  return ResolveWithSources(job, *sources, std::move(options), unreachable, diags);
}

}  // namespace meshload::sidecar::source
