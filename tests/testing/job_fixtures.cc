#include "tests/testing/job_fixtures.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>

namespace meshload::testing {

planner::JobSpec RandomSpec(std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  planner::JobSpec spec;
  const int naxes = static_cast<int>(uniform(1, 4));
  std::vector<std::string> names = {"data", "fsdp", "model", "seq"};
  std::shuffle(names.begin(), names.end(), rng);
  int64_t devices = 1;
  for (int i = 0; i < naxes; ++i) {
    spec.mesh.axes.push_back({names[static_cast<size_t>(i)], uniform(1, 4)});
    devices *= spec.mesh.axes.back().size;
  }
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= devices; ++d) {
    if (devices % d == 0) divisors.push_back(d);
  }
  spec.mesh.devices_per_process = divisors[static_cast<size_t>(uniform(0, static_cast<int64_t>(divisors.size()) - 1))];
  spec.mesh.processes = devices / spec.mesh.devices_per_process;
  // batchAxes: a random subset in random order (or left to default).
  int64_t shards = 1;
  if (uniform(0, 4) == 0) {
    spec.mesh.batch_axes_set = false;
    shards = devices;
  } else {
    spec.mesh.batch_axes_set = true;
    std::vector<planner::MeshAxis> axes = spec.mesh.axes;
    std::shuffle(axes.begin(), axes.end(), rng);
    for (const auto& a : axes) {
      if (uniform(0, 1)) {
        spec.mesh.batch_axes.push_back(a.name);
        shards *= a.size;
      }
    }
  }
  const int64_t unit = uniform(0, 5) == 0 ? shards : std::lcm(shards, spec.mesh.processes);
  spec.batch.global_batch_size = unit * uniform(1, 3);
  const int64_t B = spec.batch.global_batch_size;
  spec.strategy = planner::kAllStrategies[static_cast<size_t>(uniform(0, 3))];
  if (B % spec.mesh.processes != 0 && spec.strategy == planner::Strategy::kLoadAndReshard) {
    spec.strategy = planner::Strategy::kPerProcess;
  }
  spec.replication.fanout = planner::kAllFanouts[static_cast<size_t>(uniform(0, 1))];
  if (uniform(0, 1)) {
    spec.dataset.format = planner::DatasetFormat::kFixedRecord;
    spec.dataset.record_bytes = uniform(1, 64);
  } else {
    spec.dataset.format = planner::DatasetFormat::kTokenStream;
    spec.dataset.dtype = uniform(0, 1) ? formats::DType::kUint16 : formats::DType::kUint32;
    spec.dataset.sequence_length = uniform(1, 16);
  }
  spec.dataset.uri = "/virtual/data";
  spec.dataset.samples = B * uniform(2, 6) + uniform(0, B - 1);
  spec.shuffle.mode = static_cast<planner::ShuffleMode>(uniform(0, 2));
  spec.shuffle.seed = static_cast<uint64_t>(uniform(0, 1000));
  spec.shuffle.block_size = uniform(1, 2 * B);
  return spec;
}

planner::ValidJob MustValidate(const planner::JobSpec& spec) {
  Diagnostics d;
  auto job = planner::ValidateJob(spec, d);
  if (!job.ok()) {
    ADD_FAILURE() << "the spec is invalid: " << d.ToString() << job.status().ToString();
    std::abort();
  }
  return std::move(*job);
}

planner::ValidJob MustLoad(const std::string& path) {
  Diagnostics d;
  auto job = planner::LoadJobFile(path, d);
  if (!job.ok()) {
    ADD_FAILURE() << path << " does not load: " << d.ToString() << job.status().ToString();
    std::abort();
  }
  return std::move(*job);
}

planner::ShardPlanner MakePlanner(const planner::JobSpec& spec) {
  Diagnostics d;
  auto job = planner::ResolveJob(MustValidate(spec), {}, d);
  if (!job.ok()) {
    ADD_FAILURE() << "spec did not resolve: " << d.ToString() << job.status().ToString();
    std::abort();
  }
  return planner::ShardPlanner(std::move(*job));
}

std::vector<int32_t> RandomDocumentLengths(std::mt19937_64& rng, size_t count, int32_t typical) {
  std::vector<int32_t> out(count);
  for (int32_t& len : out) {
    const bool long_one = rng() % 16 == 0;
    const int32_t lo = long_one ? 2 * typical : std::max(1, typical / 4);
    const int32_t hi = long_one ? 16 * typical : 2 * typical;
    len = std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  }
  return out;
}

planner::ShardPlanner MakeMegatronPlanner(planner::JobSpec spec, const std::vector<int32_t>& lengths) {
  Diagnostics d;
  auto job = ResolveMegatron(std::move(spec), lengths, d);
  if (!job.ok()) {
    ADD_FAILURE() << "spec did not resolve: " << d.ToString() << job.status().ToString();
    std::abort();
  }
  return planner::ShardPlanner(std::move(*job));
}

namespace {

// A MegatronIndexed dataset of uint16 sequences of these lengths, indexed as
// if `bin`'s .idx had been read.
planner::DatasetIndex MegatronIndexOf(const planner::DatasetSpec& spec, const std::string& bin,
                                      const std::vector<int32_t>& lengths) {
  formats::MegatronIndex index;
  if (!formats::MegatronDTypeOf(8, index.dtype)) std::abort();  // uint16
  int64_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    index.lengths.push_back(lengths[i]);
    index.pointers.push_back(at);
    index.document_indices.push_back(static_cast<int64_t>(i));
    at += int64_t{lengths[i]} * 2;
  }
  index.document_indices.push_back(static_cast<int64_t>(lengths.size()));
  index.data_bytes_needed = static_cast<uint64_t>(at);
  planner::DatasetIndex::FileFacts facts;
  facts.path = bin;
  facts.size = static_cast<uint64_t>(at);
  facts.megatron = std::move(index);
  std::vector<planner::DatasetIndex::FileFacts> files;
  files.push_back(std::move(facts));
  Diagnostics d;
  auto dataset = planner::DatasetIndex::FromFiles(spec, std::move(files), d);
  if (!dataset.ok() || !d.ok()) {
    ADD_FAILURE() << "the Megatron index did not build: " << d.ToString() << dataset.status().ToString();
    std::abort();
  }
  return std::move(*dataset);
}

void MakeMegatronDataset(planner::DatasetSpec& dataset) {
  dataset.format = planner::DatasetFormat::kMegatronIndexed;
  dataset.samples.reset();
  dataset.record_bytes = 0;
  dataset.record_bytes_set = false;
  dataset.sequence_length = 0;
  dataset.sequence_length_set = false;
  dataset.dtype.reset();
}

}  // namespace

Result<planner::ResolvedJob> ResolveMegatron(planner::JobSpec spec, const std::vector<int32_t>& lengths,
                                             Diagnostics& d) {
  MakeMegatronDataset(spec.dataset);
  spec.dataset.uri = "/virtual/corpus";
  planner::ResolveOptions o;
  o.index = MegatronIndexOf(spec.dataset, "/virtual/corpus.bin", lengths);
  return planner::ResolveJob(MustValidate(spec), o, d);
}

planner::ShardPlanner MakeMegatronMixturePlanner(planner::JobSpec spec,
                                                 const std::vector<std::vector<int32_t>>& lengths,
                                                 const std::vector<double>& weights) {
  MakeMegatronDataset(spec.dataset);
  spec.dataset.uri = "/virtual/corpora";
  planner::MixtureSpec m;
  for (size_t k = 0; k < lengths.size(); ++k) {
    planner::MixtureDataset ds;
    ds.name = "corpus" + std::to_string(k);
    ds.uri = ds.name;
    ds.weight = weights[k];
    m.datasets.push_back(ds);
  }
  spec.mixture = m;
  std::vector<planner::DatasetIndex> parts;
  std::vector<std::string> names, paths;
  const std::vector<planner::DatasetSpec> datasets = planner::JobDatasets(spec);
  for (size_t k = 0; k < lengths.size(); ++k) {
    parts.push_back(MegatronIndexOf(datasets[k], "/virtual/corpora/" + m.datasets[k].name + ".bin", lengths[k]));
    names.push_back(m.datasets[k].name);
    paths.push_back(planner::DatasetPath(spec, k));
  }
  Diagnostics d;
  auto combined = planner::DatasetIndex::Combine(std::move(parts), names, paths, d);
  planner::ResolveOptions o;
  if (combined.ok()) o.index = std::move(*combined);
  auto job = combined.ok() ? planner::ResolveJob(MustValidate(spec), o, d) : combined.status();
  if (!job.ok() || !d.ok()) {
    ADD_FAILURE() << "the mixture did not resolve: " << d.ToString() << job.status().ToString();
    std::abort();
  }
  return planner::ShardPlanner(std::move(*job));
}

std::string MinimalJobYaml() {
  return R"(apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata:
  name: minimal
spec:
  mesh:
    processes: 2
    devicesPerProcess: 2
    axes:
      - name: data
        size: 4
  strategy: PerProcess
  dataset:
    uri: /data/records.bin
    format: FixedRecord
    recordBytes: 64
    samples: 1000
  batch:
    globalBatchSize: 8
)";
}

}  // namespace meshload::testing
