/// \file
/// A dataset's facts (its files or objects, their sizes, the .npy headers)
/// gathered through the storage sources for every scheme (a stat and a
/// directory listing or glob for files, HEAD for http(s), ListObjectsV2 for
/// s3), and a job resolved with them. The planner itself reads no storage.
/// Used by the sidecar and by `meshload plan` / `run` / `demo-trainer`, so
/// a storage scheme is added in one place: its Source (Stat, ReadV, List).
///
/// Thread safety: functions over the registry, which is thread-safe.
#pragma once

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/dataset_index.h"
#include "formats/megatron_index.h"
#include "formats/npy.h"
#include "planner/shard_planner.h"
#include "planner/spec.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {

/// The .npy header of object `name` (of `size` bytes) from its first bytes:
/// the preamble, then exactly the header, never the data. Errors as
/// ParseNpyHeader's, located "name@offset"; the source's own when it cannot
/// be read.
Result<formats::NpyHeader> ReadNpyHeader(Source& source, const std::string& name, uint64_t size);

/// Megatron-LM's `PREFIX.idx` (object `name`, `size` bytes), read whole and
/// parsed (formats::ParseMegatronIndex; errors located "name@offset").
Result<formats::MegatronIndex> ReadMegatronIndex(Source& source, const std::string& name, uint64_t size);

/// The index of `spec.uri`'s objects as its source lists them
/// (Source::List: one object, a prefix, or a glob), in name order, with
/// each .npy header read from the object's first bytes. Problems with the
/// objects go to `diags` (as DatasetIndex::FromFiles reports them), URIs
/// redacted; an error when nothing usable was found, naming the URI.
Result<planner::DatasetIndex> IndexDataset(const planner::DatasetSpec& spec, SourceRegistry& sources,
                                           Diagnostics& diags);

/// True when one of the job's datasets is on storage `sources` registered
/// as SourceRegistry::Latency::kNetwork (a remote scheme, whatever its
/// name).
bool ReadsOverNetwork(const planner::JobSpec& spec, const SourceRegistry& sources);

/// How ResolveWithSources treats a dataset it cannot list.
enum class Unreachable {
  kFail,               // the caller reads the data next (the sidecar, run --local)
  kUseDeclaredSamples  // plan from spec.dataset.samples when it is given (meshload plan)
};

/// ResolveJob, with the dataset indexed through `sources` (IndexDataset)
/// unless `options` already gives the index or the sample count. A dataset
/// the storage refuses or cannot serve (denied, unreachable) is an error
/// with the storage's code; kInvalidArgument means the job or its data is
/// wrong (a URI that names nothing included).
Result<planner::ResolvedJob> ResolveWithSources(const planner::ValidJob& job, SourceRegistry& sources,
                                                planner::ResolveOptions options, Unreachable unreachable,
                                                Diagnostics& diags);

/// ResolveWithSources with a registry of the built-in sources made for the
/// job (SourceOptionsForJob): what the CLI's commands
/// use.
Result<planner::ResolvedJob> ResolveReadingDataset(const planner::ValidJob& job, planner::ResolveOptions options,
                                                   Unreachable unreachable, Diagnostics& diags);

}  // namespace meshload::sidecar::source
