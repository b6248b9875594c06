#include "planner/spec.h"

#include "planner/shard_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace meshload::planner {
namespace {

using ::testing::HasSubstr;
using testing::MinimalJobYaml;
using ::testing::Not;

// Parses and validates; returns every problem as "path: message" lines.
std::vector<std::string> Problems(const std::string& yaml) {
  Diagnostics d;
  auto job = ParseDataLoadJob(yaml, d);
  if (!job.ok()) {
    return {job.status().ToString()};
  }
  ValidateJobSpec(job->spec, d);
  std::vector<std::string> out;
  for (const auto& p : d.problems()) out.push_back(p.ToString());
  return out;
}

// Replaces the first occurrence of `from` in the minimal manifest.
std::string Edit(const std::string& from, const std::string& to) {
  std::string y = MinimalJobYaml();
  size_t at = y.find(from);
  if (at == std::string::npos)
    ADD_FAILURE() << "no '" << from << "' in the manifest";
  else
    y.replace(at, from.size(), to);
  return y;
}

::testing::AssertionResult HasProblem(const std::vector<std::string>& problems, const std::string& needle) {
  for (const auto& p : problems) {
    if (p.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  }
  std::string all;
  for (const auto& p : problems) all += "\n  " + p;
  return ::testing::AssertionFailure() << "no problem contains '" << needle << "'; got:" << all;
}

// HasProblem of the minimal manifest with Edit(from, to).
::testing::AssertionResult EditHasProblem(const std::string& from, const std::string& to, const std::string& needle) {
  return HasProblem(Problems(Edit(from, to)), needle);
}

TEST(Spec, ParsesTheMinimalManifestWithDefaults) {
  Diagnostics d;
  auto job = ParseDataLoadJob(MinimalJobYaml(), d);
  ASSERT_OK(job);
  ValidateJobSpec(job->spec, d);
  ASSERT_OK(d);
  EXPECT_EQ(job->name, "minimal");
  const JobSpec& s = job->spec;
  EXPECT_EQ(s.mesh.processes, 2);
  EXPECT_EQ(s.mesh.devices_per_process, 2);
  EXPECT_FALSE(s.mesh.batch_axes_set);
  EXPECT_EQ(EffectiveBatchAxes(s.mesh), std::vector<std::string>{"data"});
  EXPECT_EQ(ImpliedReplicationMode(s.mesh), ReplicationMode::kNone);
  EXPECT_EQ(s.replication.fanout, Fanout::kLoad);
  EXPECT_EQ(s.strategy, Strategy::kPerProcess);
  EXPECT_EQ(s.batch.prefetch, 2);
  EXPECT_EQ(s.shuffle.mode, ShuffleMode::kGlobal);
  EXPECT_EQ(s.shuffle.seed, 0u);
  EXPECT_EQ(s.resume.step, 0);
  EXPECT_EQ(s.dataset.samples, 1000);
}

TEST(Spec, TakesTheDataLoadJobFromAMultiDocumentFile) {
  std::string yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + MinimalJobYaml() +
                     "---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: y}\n";
  Diagnostics d;
  auto job = ParseDataLoadJob(yaml, d);
  ASSERT_OK(job);
  EXPECT_EQ(job->name, "minimal");
  EXPECT_OK(d);
}

TEST(Spec, RejectsFilesWithoutOrWithSeveralDataLoadJobs) {
  Diagnostics d;
  EXPECT_THAT(ParseDataLoadJob("kind: ConfigMap\n", d).status().message(),
              HasSubstr("no document with kind: DataLoadJob"));
  EXPECT_THAT(ParseDataLoadJob(MinimalJobYaml() + "---\n" + MinimalJobYaml(), d).status().message(),
              HasSubstr("2 DataLoadJob"));
}

TEST(Spec, InvalidYamlNamesTheLine) {
  Diagnostics d;
  auto job = ParseDataLoadJob("kind: DataLoadJob\nspec: [unclosed\n", d);
  ASSERT_FALSE(job.ok());
  // The flow sequence opened on line 2 is still open at the end (line 3).
  EXPECT_EQ(job.status().location(), ":3:1") << job.status().ToString();
  EXPECT_EQ(job.status().WithLocationPrefix("job.yaml").ToString().rfind("job.yaml:3:1: not valid YAML", 0), 0u);
}

// Regressions: each of these once crashed, accepted nonsense, or buried the
// real problem under follow-on messages.
TEST(Spec, AFieldThatDoesNotParseStopsResolutionInsteadOfPlanningWithZero) {
  for (const char* bad : {"globalBatchSize: \"8\"", "globalBatchSize: eight"}) {
    Diagnostics d;
    auto job = ParseDataLoadJob(Edit("globalBatchSize: 8", bad), d);
    ASSERT_OK(job);
    // A job with a parse problem never becomes a ValidJob, so it is never resolved.
    auto valid = ValidateJob(std::move(*job), d);
    EXPECT_FALSE(valid.ok()) << bad;
    EXPECT_TRUE(HasProblem(d.problems().empty() ? std::vector<std::string>{} : std::vector<std::string>{d.ToString()},
                           "spec.batch.globalBatchSize: expected an integer"));
  }
  Diagnostics d;
  auto job = ParseDataLoadJob(Edit("  batch:\n    globalBatchSize: 8\n", "  batch: {}\n"), d);
  ASSERT_OK(job);
  EXPECT_FALSE(ValidateJob(std::move(*job), d).ok());
}

TEST(Spec, HugeProcessCountsAreRejectedNotOverflowed) {
  std::string y = Edit("processes: 2", "processes: 4611686018427387905");
  y.replace(y.find("devicesPerProcess: 2"), 20, "devicesPerProcess: 4");
  auto p = Problems(y);
  EXPECT_TRUE(HasProblem(p, "spec.mesh.processes: must be between 1 and 4194304, got 4611686018427387905"));
}

TEST(Spec, UnderscoresAloneAreNotANumber) {
  EXPECT_TRUE(HasProblem(Problems(Edit("  strategy:", "  shuffle: {seed: _}\n  strategy:")),
                         "spec.shuffle.seed: expected an integer, got '_'"));
  Diagnostics d;
  auto job = ParseDataLoadJob(Edit("samples: 1000", "samples: 1_000"), d);
  ASSERT_OK(job);
  EXPECT_EQ(job->spec.dataset.samples, 1000);
}

TEST(Spec, AMissingSectionIsReportedOnceWithoutFollowOnProblems) {
  std::string y = MinimalJobYaml();
  y = y.substr(0, y.find("  batch:"));
  auto p = Problems(y);
  EXPECT_TRUE(HasProblem(p, "spec.batch: required field is missing"));
  for (const auto& s : p) EXPECT_THAT(s, Not(HasSubstr("spec.batch.globalBatchSize")));
}

TEST(Spec, AnUnknownFormatDoesNotBringFormatSpecificNoise) {
  auto p = Problems(Edit("format: FixedRecord\n    recordBytes: 64", "format: Avro"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.format: unknown value 'Avro'"));
  for (const auto& s : p) EXPECT_THAT(s, Not(HasSubstr("recordBytes")));
}

TEST(Spec, AnExplicitZeroIsOutOfRangeNotMissing) {
  EXPECT_TRUE(
      HasProblem(Problems(Edit("recordBytes: 64", "recordBytes: 0")), "spec.dataset.recordBytes: must be >= 1, got 0"));
  EXPECT_TRUE(HasProblem(Problems(Edit("format: FixedRecord\n    recordBytes: 64", "format: Npy\n    recordBytes: 0")),
                         "spec.dataset.recordBytes: must be >= 1, got 0"));
}

TEST(Spec, MetadataIsCheckedLikeTheRest) {
  EXPECT_TRUE(HasProblem(Problems(Edit("  name: minimal", "  name: minimal\n  nmespace: x")),
                         "metadata.nmespace: unknown field (did you mean namespace?)"));
  EXPECT_TRUE(HasProblem(Problems(Edit("  name: minimal", "  name: minimal\n  labels: [a]")),
                         "metadata.labels: expected a mapping of strings"));
  EXPECT_TRUE(
      Problems(Edit("  name: minimal", "  name: minimal\n  labels: {team: ml}\n  resourceVersion: \"12\"")).empty());
}

TEST(Spec, TheDatasetVolumeAndTheSidecarOverridesAreParsed) {
  Diagnostics d;
  auto job = ParseDataLoadJob(Edit("    samples: 1000\n",
                                   "    samples: 1000\n    volume: {name: data, mountPath: /data}\n"
                                   "  sidecar:\n    image: registry.example.com/meshload/sidecar:1.2\n"
                                   "    resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {memory: 2Gi}}\n"),
                              d);
  ASSERT_OK(job);
  ValidateJobSpec(job->spec, d);
  ASSERT_OK(d);
  ASSERT_TRUE(job->spec.dataset.volume.has_value());
  EXPECT_EQ(job->spec.dataset.volume->name, "data");
  EXPECT_EQ(job->spec.dataset.volume->mount_path, "/data");
  EXPECT_EQ(job->spec.sidecar.image, "registry.example.com/meshload/sidecar:1.2");
  EXPECT_EQ(job->spec.sidecar.resources.requests.at("cpu"), "500m");
  EXPECT_EQ(job->spec.sidecar.resources.limits.at("memory"), "2Gi");
}

TEST(Spec, ADatasetVolumeMustHoldALocalDataset) {
  auto with = [](const std::string& volume) {
    return Problems(Edit("    samples: 1000\n", "    samples: 1000\n    volume: " + volume + "\n"));
  };
  EXPECT_TRUE(
      HasProblem(with("{name: data, mountPath: /datasets}"),
                 "spec.dataset.uri: '/data/records.bin' is not under spec.dataset.volume.mountPath '/datasets'"));
  EXPECT_TRUE(HasProblem(with("{name: data, mountPath: /dat}"), "is not under spec.dataset.volume.mountPath '/dat'"));
  EXPECT_TRUE(with("{name: data, mountPath: /data/}").empty());
  EXPECT_TRUE(HasProblem(with("{name: Data_Set, mountPath: /data}"),
                         "spec.dataset.volume.name: 'Data_Set' is not a volume name"));
  EXPECT_TRUE(HasProblem(with("{name: data, mountPath: data}"),
                         "spec.dataset.volume.mountPath: 'data' must be an absolute path"));
  EXPECT_TRUE(HasProblem(with("{name: data, mountPath: /data/../etc}"), "must be an absolute path without '..'"));
  EXPECT_TRUE(HasProblem(with("{name: data}"), "spec.dataset.volume.mountPath: required field is missing"));
  EXPECT_TRUE(HasProblem(with("{name: data, mountPath: /data, readOnly: true}"),
                         "spec.dataset.volume.readOnly: unknown field"));
}

TEST(Spec, SidecarOverridesAreChecked) {
  auto p = Problems(
      Edit("  batch:\n", "  sidecar: {image: 'a b', resources: {limits: {memory: lots}}, imag: x}\n  batch:\n"));
  EXPECT_TRUE(HasProblem(p, "spec.sidecar.imag: unknown field (did you mean image?)"));
  EXPECT_TRUE(HasProblem(p, "spec.sidecar.image: 'a b' is not an image reference"));
  EXPECT_TRUE(HasProblem(p, "spec.sidecar.resources.limits.memory: 'lots' is not a quantity"));
}

TEST(Spec, OnlyBroadcastAndLoadAndReshardMoveSamplesBetweenProcesses) {
  JobSpec s;
  EXPECT_FALSE(MovesSamplesBetweenProcesses(s));
  s.replication.fanout = Fanout::kBroadcast;
  EXPECT_TRUE(MovesSamplesBetweenProcesses(s));
  s.replication.fanout = Fanout::kLoad;
  for (Strategy st : {Strategy::kGlobalLoad, Strategy::kPerDevice, Strategy::kPerProcess}) {
    s.strategy = st;
    EXPECT_FALSE(MovesSamplesBetweenProcesses(s)) << ToString(st);
  }
  s.strategy = Strategy::kLoadAndReshard;
  EXPECT_TRUE(MovesSamplesBetweenProcesses(s));
}

// Edits of the minimal manifest, each a test of its own
// (Spec/ManifestEdit.BringsItsProblem/<name>): the problem it must bring.
struct EditCase {
  const char* name;
  const char* from;
  const char* to;
  const char* problem;
};
void PrintTo(const EditCase& c, std::ostream* os) { *os << c.name; }

const EditCase kEdits[] = {
    {"AxisSizeBelowOneIsNamedByPath", "size: 4", "size: 0", "spec.mesh.axes[0].size: must be >= 1, got 0"},
    {"DuplicateAxisNames", "      - name: data\n        size: 4",
     "      - {name: data, size: 2}\n      - {name: data, size: 2}",
     "spec.mesh.axes[1].name: duplicate axis name 'data' (also axes[0])"},
    {"UnknownBatchAxisWithSuggestion", "        size: 4\n", "        size: 4\n    batchAxes: [dat]\n",
     "spec.mesh.batchAxes[0]: unknown axis 'dat' (did you mean data?)"},
    {"ProcessesTimesDevicesMustEqualTheMesh", "processes: 2", "processes: 3",
     "spec.mesh: processes × devicesPerProcess = 3 × 2 = 6, but the axes [data=4] have 4 devices"},
    {"UnknownFieldsAreErrorsWithSuggestions", "globalBatchSize: 8", "globalBatchsize: 8",
     "spec.batch.globalBatchsize: unknown field (did you mean globalBatchSize?)"},
    {"DatasetSmallerThanOneGlobalBatch", "samples: 1000", "samples: 5",
     "spec.dataset.samples: the dataset has 5 samples, fewer than one global batch of 8"},
    // Unknown enum values list every value the field takes.
    {"UnknownStrategyWithSuggestion", "strategy: PerProcess", "strategy: PerProces",
     "spec.strategy: unknown value 'PerProces' (did you mean PerProcess?); expected one of "
     "GlobalLoad, PerDevice, PerProcess, LoadAndReshard"},
    {"UnknownShuffleMode", "  strategy:", "  shuffle: {mode: Random}\n  strategy:",
     "spec.shuffle.mode: unknown value 'Random'; expected one of None, Global, Block"},
    {"UnknownFormat", "format: FixedRecord", "format: Avro",
     "spec.dataset.format: unknown value 'Avro' (did you mean Arrow?); expected one of FixedRecord, TokenStream, Npy"},
    {"UnknownReplicationMode", "  strategy:", "  replication: {mode: Half}\n  strategy:",
     "spec.replication.mode: unknown value 'Half'; expected one of None, Partial, Full"},
    {"UnknownFanout", "  strategy:", "  replication: {fanout: Push}\n  strategy:",
     "spec.replication.fanout: unknown value 'Push'; expected one of Load, Broadcast"},
    {"UnknownDtype", "format: FixedRecord", "format: FixedRecord\n    dtype: uint128",
     "spec.dataset.dtype: unknown dtype 'uint128'"},
};

class ManifestEdit : public ::testing::TestWithParam<EditCase> {};

TEST_P(ManifestEdit, BringsItsProblem) {
  EXPECT_TRUE(EditHasProblem(GetParam().from, GetParam().to, GetParam().problem));
}

INSTANTIATE_TEST_SUITE_P(Spec, ManifestEdit, ::testing::ValuesIn(kEdits),
                         [](const ::testing::TestParamInfo<EditCase>& info) { return std::string(info.param.name); });

TEST(Spec, BatchNotDivisibleByShards) {
  std::string y = Edit("      - name: data\n        size: 4",
                       "      - {name: data, size: 2}\n      - {name: fsdp, size: 4}\n      - {name: model, size: 2}");
  y.replace(y.find("processes: 2"), 12, "processes: 8");
  y.replace(y.find("globalBatchSize: 8"), 18, "globalBatchSize: 100");
  y.replace(y.find("  strategy:"), 0, "    batchAxes: [data, fsdp]\n");
  auto p = Problems(y);
  EXPECT_TRUE(
      HasProblem(p, "spec.batch.globalBatchSize: 100 is not divisible by the 8 data shards of batchAxes [data, fsdp]"));
}

TEST(Spec, LoadAndReshardNeedsBatchDivisibleByProcesses) {
  std::string y = Edit("strategy: PerProcess", "strategy: LoadAndReshard");
  y = y.replace(y.find("processes: 2"), 12, "processes: 4");
  y = y.replace(y.find("devicesPerProcess: 2"), 20, "devicesPerProcess: 1");
  y = y.replace(y.find("size: 4"), 7, "size: 4\n      - {name: model, size: 1}");
  y = y.replace(y.find("globalBatchSize: 8"), 18, "globalBatchSize: 6");
  auto p = Problems(y);
  EXPECT_TRUE(HasProblem(p, "not divisible by the 4 processes, which strategy LoadAndReshard needs"));
}

TEST(Spec, ReplicationModeMustMatchBatchAxes) {
  auto full = Problems(Edit("  strategy:", "  replication: {mode: Full}\n  strategy:"));
  EXPECT_TRUE(HasProblem(
      full, "spec.replication.mode: declared Full but batchAxes (defaulted to every axis [data]) mean None"));
  std::string y =
      Edit("      - name: data\n        size: 4", "      - {name: data, size: 2}\n      - {name: model, size: 2}");
  y.replace(y.find("  strategy:"), 0, "    batchAxes: [data]\n  replication: {mode: None}\n");
  EXPECT_TRUE(HasProblem(Problems(y), "declared None but batchAxes [data] mean Partial"));
  std::string ok = Edit("  strategy:", "  replication: {mode: None}\n  strategy:");
  EXPECT_TRUE(Problems(ok).empty());
}

TEST(Spec, AtMostEightAxes) {
  std::string axes;
  for (int i = 0; i < 9; ++i) axes += "      - {name: a" + std::to_string(i) + ", size: 1}\n";
  auto p = Problems(Edit("      - name: data\n        size: 4\n", axes));
  EXPECT_TRUE(HasProblem(p, "spec.mesh.axes: has 9 axes; at most 8 are supported"));
}

TEST(Spec, ANameLongerThanALabelValueIsRefused) {
  EXPECT_TRUE(Problems(Edit("  name: minimal", "  name: " + std::string(63, 'a'))).empty());
  EXPECT_TRUE(HasProblem(Problems(Edit("  name: minimal", "  name: " + std::string(64, 'a'))),
                         "metadata.name: at most 63 characters (it labels the ConfigMap and Secret made for the job), "
                         "got 64 (line 4)"));
}

TEST(Spec, MissingRequiredFieldsAreAllReported) {
  auto p = Problems("apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nspec:\n  mesh: {}\n  dataset: {}\n");
  EXPECT_TRUE(HasProblem(p, "metadata.name: required field is missing"));
  EXPECT_TRUE(HasProblem(p, "spec.mesh.processes: required field is missing"));
  EXPECT_TRUE(HasProblem(p, "spec.mesh.axes: required field is missing"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.uri: required field is missing"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.format: required field is missing"));
  EXPECT_TRUE(HasProblem(p, "spec.batch: required field is missing"));
  // A missing field is reported once, not again as "must be >= 1".
  for (const auto& s : p) EXPECT_THAT(s, Not(HasSubstr("spec.mesh.processes: must be")));
}

TEST(Spec, EveryProblemIsReportedAtOnce) {
  std::string y = Edit("size: 4", "size: 0");
  y.replace(y.find("strategy: PerProcess"), 20, "strategy: Nope");
  y.replace(y.find("recordBytes: 64"), 15, "recordBytes: -1");
  auto p = Problems(y);
  EXPECT_GE(p.size(), 3u);
  EXPECT_TRUE(HasProblem(p, "spec.mesh.axes[0].size"));
  EXPECT_TRUE(HasProblem(p, "spec.strategy"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.recordBytes: must be >= 1, got -1"));
}

TEST(Spec, TypeErrorsNameTheFieldAndLine) {
  EXPECT_TRUE(
      EditHasProblem("processes: 2", "processes: two", "spec.mesh.processes: expected an integer, got 'two' (line 7)"));
  EXPECT_TRUE(EditHasProblem("processes: 2", "processes: \"2\"",
                             "spec.mesh.processes: expected an integer, got '2' (a quoted string)"));
  EXPECT_TRUE(EditHasProblem("processes: 2", "processes: 2.5", "spec.mesh.processes: expected an integer, got '2.5'"));
  EXPECT_TRUE(EditHasProblem("processes: 2", "processes: 99999999999999999999", "out of range"));
}

TEST(Spec, FormatSpecificFields) {
  auto p = Problems(Edit("format: FixedRecord\n    recordBytes: 64", "format: TokenStream"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.dtype: required for format TokenStream"));
  EXPECT_TRUE(HasProblem(p, "spec.dataset.sequenceLength: required for format TokenStream"));
  EXPECT_TRUE(EditHasProblem("format: FixedRecord\n    recordBytes: 64",
                             "format: TokenStream\n    dtype: float32\n    sequenceLength: 8",
                             "TokenStream tokens must be an integer type, got float32"));
  EXPECT_TRUE(EditHasProblem("recordBytes: 64", "recordBytes: 6\n    dtype: float32",
                             "spec.dataset.recordBytes: 6 is not a whole number of float32 elements"));
  EXPECT_TRUE(EditHasProblem("format: FixedRecord", "format: FixedRecord\n    sequenceLength: 4",
                             "spec.dataset.sequenceLength: is only used by format TokenStream"));
}

// WebDataset and MDS name the fields a batch carries; other formats take none.
TEST(Spec, RecordFormatsNeedTheirFieldsAndTakeNoDatasetDtype) {
  const char* from = "format: FixedRecord\n    recordBytes: 64";
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset", "spec.dataset.fields: required for format WebDataset"));
  EXPECT_TRUE(EditHasProblem(from, "format: MDS\n    fields: [{name: image}]\n    recordBytes: 64",
                             "spec.dataset.recordBytes: is not used by format MDS"));
  EXPECT_TRUE(EditHasProblem(from, "format: MDS\n    fields: [{name: image}]\n    dtype: uint8",
                             "spec.dataset.dtype: is not used by format MDS; give each field's dtype"));
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset\n    fields: [{name: jpg}, {name: jpg, dtype: int64}]",
                             "spec.dataset.fields[1].name: 'jpg' is listed twice"));
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset\n    fields: [{name: cls, dtype: bfloat16}]",
                             "spec.dataset.fields[0].dtype: bfloat16 is not decoded from a WebDataset member's text"));
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset\n    fields: [{name: a/b}]",
                             "spec.dataset.fields[0].name: 'a/b' is not a field name"));
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset\n    fields: [{name: jpg}]\n    missingField: Drop",
                             "spec.dataset.missingField: unknown value 'Drop'; expected one of Error, Skip"));
  EXPECT_TRUE(
      EditHasProblem("recordBytes: 64", "recordBytes: 64\n    fields: [{name: jpg}]",
                     "spec.dataset.fields: are only used by formats WebDataset, MDS, TFRecord, Parquet and Arrow"));
  auto ok = Problems(Edit(from,
                          "format: WebDataset\n    fields: [{name: jpg}, {name: cls, dtype: int64}]\n"
                          "    missingField: Skip"));
  EXPECT_TRUE(ok.empty()) << ::testing::PrintToString(ok);
}

// Parquet: a ragged column's maxBytes is Parquet's alone; a shape comes from
// the column, not the spec.
TEST(Spec, ParquetFieldsTakeMaxBytesAndNoShape) {
  const std::string from = "format: FixedRecord\n    recordBytes: 64";
  EXPECT_TRUE(EditHasProblem(from, "format: WebDataset\n    fields: [{name: jpg, maxBytes: 100}]",
                             "spec.dataset.fields[0].maxBytes: is only used by formats Parquet and Arrow"));
  EXPECT_TRUE(EditHasProblem(from, "format: Parquet\n    fields: [{name: emb, dtype: float32, shape: [4]}]",
                             "spec.dataset.fields[0].shape: is not used by format Parquet"));
  EXPECT_TRUE(EditHasProblem(from, "format: Parquet\n    fields: [{name: text, maxBytes: 0}]",
                             "spec.dataset.fields[0].maxBytes"));
  EXPECT_TRUE(EditHasProblem(from, "format: Parquet", "spec.dataset.fields: required for format Parquet"));
  auto ok = Problems(Edit(from,
                          "format: Parquet\n    fields: [{name: input_ids, maxBytes: 16384}, {name: image.bytes, "
                          "maxBytes: 1048576}, {name: label, dtype: int64}]\n    missingField: Skip"));
  EXPECT_TRUE(ok.empty()) << ::testing::PrintToString(ok);
}

// A Hugging Face Hub repository's split and config are Parquet's, and the
// names are the Hub's.
TEST(Spec, AHubSplitAndConfigAreParquetsAndNamedAsTheHubNamesThem) {
  const std::string from = "format: FixedRecord\n    recordBytes: 64";
  const std::string parquet = "format: Parquet\n    fields: [{name: label}]\n";
  EXPECT_TRUE(EditHasProblem(from, from + "\n    split: train",
                             "spec.dataset.split: is only used by formats Parquet and Arrow"));
  // A saved DatasetDict has splits and no configs.
  const std::string arrow = "format: Arrow\n    fields: [{name: label}]\n";
  EXPECT_TRUE(EditHasProblem(from, arrow + "    split: train\n    config: en",
                             "spec.dataset.config: is only used by format Parquet"));
  auto saved = Problems(Edit(from, arrow + "    split: train"));
  EXPECT_TRUE(saved.empty()) << ::testing::PrintToString(saved);
  EXPECT_TRUE(EditHasProblem(from, parquet + "    config: en", "spec.dataset.config: needs spec.dataset.split"));
  EXPECT_TRUE(
      EditHasProblem(from, parquet + "    split: train/../x", "spec.dataset.split: 'train/../x' is not a split name"));
  EXPECT_TRUE(EditHasProblem(from, parquet + "    split: train\n    config: 'a b'",
                             "spec.dataset.config: 'a b' is not a config name"));
  auto ok = Problems(Edit(from, parquet + "    split: train.clean\n    config: 20231101.en"));
  EXPECT_TRUE(ok.empty()) << ::testing::PrintToString(ok);
}

// Token balancing deals variable-size samples; its fields are checked.
TEST(Spec, TokenBalancingNeedsVariableSizeSamplesAndATolerance) {
  const std::string balance = "globalBatchSize: 8\n    balance: {mode: Tokens}";
  EXPECT_TRUE(
      EditHasProblem("globalBatchSize: 8", balance,
                     "spec.batch.balance.mode: Tokens needs variable-size samples (format MegatronIndexed, "
                     "WebDataset, MDS, TFRecord, Parquet or Arrow); FixedRecord samples all have the same size"));
  EXPECT_TRUE(EditHasProblem("globalBatchSize: 8", "globalBatchSize: 8\n    balance: {mode: Bytes}",
                             "spec.batch.balance.mode: unknown value 'Bytes'; expected one of None, Tokens"));
  EXPECT_TRUE(EditHasProblem("globalBatchSize: 8", "globalBatchSize: 8\n    balance: {mode: Tokens, tolerance: 1.5}",
                             "spec.batch.balance.tolerance: must be between 0 and 1, got 1.5"));
  EXPECT_TRUE(EditHasProblem("globalBatchSize: 8", "globalBatchSize: 8\n    balance: {mode: Tokens, tolerance: -0.1}",
                             "spec.batch.balance.tolerance: must be between 0 and 1"));
  std::string y = Edit("format: FixedRecord\n    recordBytes: 64", "format: MegatronIndexed");
  y.replace(y.find("globalBatchSize: 8"), 18, "globalBatchSize: 8\n    balance: {mode: Tokens, tolerance: 0.05}");
  Diagnostics d;
  auto job = ParseDataLoadJob(y, d);
  ASSERT_OK(job);
  ValidateJobSpec(job->spec, d);
  EXPECT_TRUE(d.ok()) << d.ToString();
  EXPECT_EQ(job->spec.batch.balance.mode, BalanceMode::kTokens);
  EXPECT_EQ(job->spec.batch.balance.tolerance, 0.05);
  // Absent: None, with the default tolerance.
  auto plain = ParseDataLoadJob(MinimalJobYaml(), d);
  ASSERT_OK(plain);
  EXPECT_EQ(plain->spec.batch.balance.mode, BalanceMode::kNone);
  EXPECT_EQ(plain->spec.batch.balance.tolerance, 0.01);
}

TEST(Spec, SelectorIsParsedAndChecked) {
  Diagnostics d;
  auto job = ParseDataLoadJob(Edit("  strategy:",
                                   "  selector:\n    matchLabels: {app: trainer}\n    matchExpressions:\n      - {key: "
                                   "tier, operator: In, values: [gpu]}\n  strategy:"),
                              d);
  ASSERT_OK(job);
  ASSERT_OK(d);
  ASSERT_TRUE(job->spec.selector.has_value());
  EXPECT_EQ(job->spec.selector->match_labels.at("app"), "trainer");
  ASSERT_EQ(job->spec.selector->match_expressions.size(), 1u);
  EXPECT_EQ(job->spec.selector->match_expressions[0].op, "In");
  auto p = Problems(
      Edit("  strategy:", "  selector:\n    matchExpressions:\n      - {key: tier, operator: In}\n  strategy:"));
  EXPECT_TRUE(HasProblem(p, "spec.selector.matchExpressions[0].values: operator In needs at least one value"));
}

TEST(Spec, ParsesABareSpecAsJson) {
  Diagnostics d;
  auto spec = ParseJobSpecText(
      R"({"mesh":{"processes":1,"axes":[{"name":"data","size":1}]},"dataset":{"uri":"/d","format":"FixedRecord","recordBytes":4},"batch":{"globalBatchSize":2}})",
      d);
  ASSERT_OK(spec);
  EXPECT_OK(d);
  EXPECT_EQ(spec->dataset.record_bytes, 4);
}

TEST(Spec, AxesOfSizeOneDoNotMakeAJobPartiallyReplicated) {
  MeshSpec one;
  one.axes = {{"data", 1}, {"model", 8}};
  one.batch_axes = {"data"};
  one.batch_axes_set = true;
  EXPECT_EQ(ImpliedReplicationMode(one), ReplicationMode::kFull);  // one shard: everyone holds the batch
  MeshSpec m;
  m.axes = {{"data", 4}, {"model", 1}};
  m.batch_axes = {"data"};
  m.batch_axes_set = true;
  EXPECT_EQ(ImpliedReplicationMode(m), ReplicationMode::kNone);
  m.axes[1].size = 2;
  EXPECT_EQ(ImpliedReplicationMode(m), ReplicationMode::kPartial);
  m.batch_axes.clear();
  EXPECT_EQ(ImpliedReplicationMode(m), ReplicationMode::kFull);
}

}  // namespace
}  // namespace meshload::planner
