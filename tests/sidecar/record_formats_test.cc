// WebDataset, MDS (raw and compressed), TFRecord and Parquet through the step
// loader, on files the formats' own writers made (tests/formats/data/), as
// local files and served over HTTP: for every sample of every step of two
// epochs, on a mesh of 4 processes and after a resize to 8 (and with local
// replicas), each field the sidecar staged equals what the format's own
// reader returned for that sample (the fixtures' expected.json). (S3:
// tests/s3/s3_run_test.sh, through the real server.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "formats/compression.h"
#include "formats/webdataset.h"
#include "planner/fetch_plan.h"
#include "protocol/protocol.h"
#include "sidecar/source/dataset_facts.h"
#include "sidecar/source/decoded_source.h"
#include "sidecar/source/parquet_source.h"
#include "sidecar/step_loader.h"
#include "tests/formats/fixture_files.h"
#include "tests/sidecar/source/test_support.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace meshload::sidecar {
namespace {

using formats::fixtures::Hex;
using formats::fixtures::Slurp;
using meshload::testing::TempDir;
using planner::DatasetFormat;
using planner::Strategy;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kData = MESHLOAD_FORMATS_DATA;

// What the format's own reader returned for each global sample id: per
// field name, the bytes the sidecar must stage (nullopt: the sample lacks
// the field).
using Expected = std::vector<std::map<std::string, std::string>>;

std::string Unhex(const std::string& h) {
  std::string out(h.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

template <typename T>
std::string Bytes(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}

// WebDataset: webdataset's samples, in shard order; `cls` decoded as int64
// from its text, as the job asks for it.
Expected WebDatasetExpected(const std::vector<std::string>& shards) {
  Expected out;
  for (const std::string& shard : shards) {
    const Json doc = Json::parse(Slurp(kData + "/webdataset/" + shard + ".expected.json"));
    for (const Json& s : doc["samples"]) {
      std::map<std::string, std::string> fields;
      for (const auto& [ext, hex] : s["fields"].items()) fields[ext] = Unhex(hex.get<std::string>());
      if (fields.count("cls")) fields["cls"] = Bytes<int64_t>(std::stoll(fields["cls"]));
      out.push_back(std::move(fields));
    }
  }
  return out;
}

// MDS: Streaming's decoded columns, re-encoded as MDS stores them; the
// variable-shape ndarray `tokens` asked for as int32 is its elements (the
// bytes after its shape header).
Expected MdsExpected(const std::string& dir = "raw") {
  Expected out;
  const Json doc = Json::parse(Slurp(kData + "/mds/" + dir + "/expected.json"));
  for (const Json& shard : doc["shards"]) {
    for (const Json& row : shard) {
      std::map<std::string, std::string> fields;
      for (const auto& [col, hex] : row["columns"].items()) fields[col] = Unhex(hex.get<std::string>());
      const auto b = static_cast<uint8_t>(fields["tokens"][0]);
      fields["tokens"] = fields["tokens"].substr(1 + (b >> 2) * (size_t{1} << (b & 3)));
      out.push_back(std::move(fields));
    }
  }
  return out;
}

// TFRecord: the second reader's features (expected.json), as the sidecar
// stages them: a bytes_list's value, an int64_list's values as int64, a
// float_list's as float32.
Expected TfRecordExpected() {
  Expected out;
  const Json doc = Json::parse(Slurp(kData + "/tfrecord/expected.json"));
  for (const Json& file : doc["files"]) {
    for (const Json& record : file["records"]) {
      std::map<std::string, std::string> fields;
      for (const auto& [name, f] : record["features"].items()) {
        std::string bytes;
        for (const Json& v : f["values"]) {
          if (f["kind"] == "int64") {
            bytes += Bytes<int64_t>(v.get<int64_t>());
          } else {
            bytes += Unhex(v.get<std::string>());
          }
        }
        fields[name] = bytes;
      }
      out.push_back(std::move(fields));
    }
  }
  return out;
}

// Parquet: pyarrow's rows (expected.json), as the sidecar stages them, for
// the files `names` in order (each holds the same 60 rows); a null is a
// field the row lacks.
Expected ParquetExpected(size_t files) {
  Expected out;
  const Json doc = Json::parse(Slurp(kData + "/parquet/expected.json"));
  for (size_t k = 0; k < files; ++k) {
    for (const Json& row : doc["rows"]) {
      std::map<std::string, std::string> fields;
      for (const auto& [name, hex] : row.items()) {
        if (!hex.is_null()) fields[name] = Unhex(hex.get<std::string>());
      }
      out.push_back(std::move(fields));
    }
  }
  return out;
}

// The Parquet fields the tests ask for: every kind of column.
std::vector<planner::DatasetField> ParquetFields() {
  std::vector<planner::DatasetField> f(9);
  f[0].name = "input_ids";
  f[0].max_bytes = 4 * 40;
  f[1].name = "text";
  f[1].max_bytes = 64;
  f[2].name = "label";
  f[3].name = "flag";
  f[4].name = "emb";
  f[5].name = "grid";
  f[6].name = "image.bytes";
  f[6].max_bytes = 300;
  f[7].name = "digest";
  f[8].name = "big_ids";
  f[8].max_bytes = 8 * 4;
  return f;
}
const std::vector<std::string> kParquetNames = {"input_ids", "text",        "label",  "flag",   "emb",
                                                "grid",      "image.bytes", "digest", "big_ids"};

void CopyInto(const std::string& from, const std::string& dir) {
  std::filesystem::copy_file(from, dir + "/" + std::filesystem::path(from).filename().string());
}

planner::JobSpec RecordSpec(DatasetFormat format, const std::string& uri, std::vector<planner::DatasetField> fields,
                            int64_t processes, int64_t devices_per_process, Strategy strategy,
                            std::vector<planner::MeshAxis> axes = {}) {
  planner::JobSpec spec;
  spec.mesh.axes = axes.empty() ? std::vector<planner::MeshAxis>{{"data", processes * devices_per_process}} : axes;
  spec.mesh.processes = processes;
  spec.mesh.devices_per_process = devices_per_process;
  spec.mesh.batch_axes = {"data"};
  spec.mesh.batch_axes_set = true;
  spec.strategy = strategy;
  spec.dataset.uri = uri;
  spec.dataset.format = format;
  spec.dataset.fields = std::move(fields);
  spec.batch.global_batch_size = 8;
  spec.shuffle.mode = planner::ShuffleMode::kGlobal;
  spec.shuffle.seed = 36;
  return spec;
}

Result<planner::ResolvedJob> Resolve(const planner::JobSpec& spec) {
  Diagnostics d;
  auto job = source::ResolveReadingDataset(testing::MustValidate(spec), {}, source::Unreachable::kFail, d);
  if (!job.ok()) return Status(job.status().code(), d.ToString() + " " + job.status().ToString());
  return job;
}

// Loads step 0 of process 0 of `job` (compressed files decompressed in
// memory); the load's status.
Status LoadFirstStepOf(const planner::ResolvedJob& job) {
  planner::ShardPlanner planner(job);
  auto sources = source::SourceRegistry::WithBuiltins({});
  auto decoding = source::InstallDecoding(job.dataset, *sources, 1 << 20);
  if (!decoding.ok()) return Internal("no decoding: " + decoding.status().ToString());
  auto parquet = source::InstallParquetRows(job.dataset, *sources, 1 << 20);
  if (!parquet.ok()) return parquet.status();
  const auto layout = staging::ComputeBatchLayout(job, 0);
  auto loader = StepLoader::Create(planner, 0, planner.DefaultLoading(), *sources, layout, {});
  if (!loader.ok()) return Internal("no step loader: " + loader.status().ToString());
  std::vector<uint8_t> slot(layout.slot_bytes);
  std::vector<staging::StagedTensor> staged;
  return (*loader)->Load(0, slot.data(), staged, nullptr);
}

// The same for the job `spec` describes (resolved first: that must work).
Status LoadFirstStep(const planner::JobSpec& spec) {
  auto job = Resolve(spec);
  if (!job.ok()) return Internal("the job does not resolve: " + job.status().ToString());
  return LoadFirstStepOf(*job);
}

// What one step staged on every process of the job: per sample id, each
// field's bytes (a sample on several devices must be the same on each).
struct StepResult {
  std::vector<std::vector<std::string>> samples;
  uint64_t skipped = 0;
};

// Loads `steps` steps on every process of `job` and checks every device's
// slot against the plan: ids, sample counts, offsets; returns the samples.
std::vector<StepResult> LoadAll(const planner::ResolvedJob& job, int64_t steps) {
  planner::ShardPlanner planner(job);
  auto sources = source::SourceRegistry::WithBuiltins({});
  // Compressed shards decompressed in memory, two at a time (the steps
  // reach across all four: they are decompressed again as they come back).
  auto decoding = source::InstallDecoding(job.dataset, *sources, 16 << 10);
  EXPECT_OK(decoding);
  // Parquet row groups decoded, a few at a time (decoded again as they come back).
  auto parquet = source::InstallParquetRows(job.dataset, *sources, 16 << 10);
  EXPECT_OK(parquet);
  std::vector<StepResult> out(static_cast<size_t>(steps));
  for (int64_t p = 0; p < job.mesh.processes(); ++p) {
    const auto layout = staging::ComputeBatchLayout(job, p);
    EXPECT_TRUE(layout.extracts);
    StepLoaderOptions opts;
    opts.reader_threads = 2;
    auto loader = StepLoader::Create(planner, p, planner.DefaultLoading(), *sources, layout, opts);
    EXPECT_OK(loader);
    if (!loader.ok()) return out;
    EXPECT_OK((*loader)->VerifyFiles());
    std::vector<uint8_t> slot(layout.slot_bytes, 0xEE);
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<staging::StagedTensor> staged;
      StepLoadStats stats;
      Status st = (*loader)->Load(step, slot.data(), staged, &stats);
      EXPECT_OK(st) << "process " << p << " step " << step;
      if (!st.ok()) return out;
      StepResult& r = out[static_cast<size_t>(step)];
      r.skipped += stats.samples_skipped;
      const planner::StepPlan plan = planner.PlanStep(step, planner.DefaultLoading(), p);
      for (size_t i = 0; i < plan.devices.size(); ++i) {
        const std::vector<uint64_t>& ids = plan.devices[i].samples;
        EXPECT_EQ(staged[i].ids_checksum, protocol::SampleIdsChecksum(ids.data(), ids.size()));
        EXPECT_LE(staged[i].samples, ids.size());
        for (uint64_t k = 0; k < staged[i].samples; ++k) {
          std::vector<std::string> values;
          for (size_t f = 0; f < layout.fields.size(); ++f) {
            const staging::FieldLayout& field = layout.fields[f];
            const staging::FieldTensor& t = layout.devices[i].fields[f];
            if (field.ragged) {
              const auto* offsets = reinterpret_cast<const int64_t*>(slot.data() + t.offsets_offset);
              const uint64_t es = formats::DTypeSize(field.dtype);
              EXPECT_EQ(offsets[0], 0);
              EXPECT_EQ(static_cast<uint64_t>(offsets[staged[i].samples]) * es, staged[i].values_bytes[f]);
              values.emplace_back(reinterpret_cast<const char*>(slot.data() + t.offset + offsets[k] * es),
                                  (offsets[k + 1] - offsets[k]) * es);
            } else {
              values.emplace_back(reinterpret_cast<const char*>(slot.data() + t.offset + k * field.sample_bytes),
                                  field.sample_bytes);
            }
          }
          r.samples.push_back(std::move(values));
        }
      }
    }
  }
  return out;
}

// Every sample of the step's global batch that has every field is
// delivered with exactly the bytes the format's reader returned, and no
// other sample is.
void ExpectStepsMatch(const planner::ResolvedJob& job, const std::vector<StepResult>& got, const Expected& expected,
                      const std::vector<std::string>& fields, size_t replicas) {
  planner::ShardPlanner planner(job);
  for (size_t step = 0; step < got.size(); ++step) {
    std::multiset<std::vector<std::string>> want, have;
    uint64_t lacking = 0;
    for (uint64_t id : planner.GlobalBatch(static_cast<int64_t>(step))) {
      std::vector<std::string> values;
      for (const std::string& f : fields) {
        const auto it = expected[id].find(f);
        if (it == expected[id].end()) break;
        values.push_back(it->second);
      }
      if (values.size() != fields.size()) {
        ++lacking;
        continue;
      }
      for (size_t r = 0; r < replicas; ++r) want.insert(values);
    }
    for (const auto& values : got[step].samples) have.insert(values);
    EXPECT_EQ(have.size(), want.size()) << "step " << step;
    EXPECT_TRUE(have == want) << "step " << step << ": the staged fields are not the reader's";
    EXPECT_EQ(got[step].skipped, lacking * replicas) << "step " << step;
  }
}

class WebDatasetFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* shard : {"shard-000000", "shard-000001"}) {
      CopyInto(kData + "/webdataset/" + shard + ".tar", dir_.path());
      CopyInto(kData + "/webdataset/" + shard + ".tar.idx", dir_.path());
    }
  }
  TempDir dir_;
};

TEST_F(WebDatasetFixture, EveryFieldIsWhatWebdatasetReadsOverTwoEpochsAndAResize) {
  const Expected expected = WebDatasetExpected({"shard-000000", "shard-000001"});
  ASSERT_EQ(expected.size(), 21u);
  const std::vector<planner::DatasetField> fields = {{"jpg", std::nullopt}, {"cls", formats::DType::kInt64}};
  struct Mesh {
    int64_t processes, devices;
    Strategy strategy;
    std::vector<planner::MeshAxis> axes;
    size_t replicas;
  };
  for (const Mesh& m : {Mesh{4, 1, Strategy::kPerProcess, {}, 1}, Mesh{8, 1, Strategy::kPerProcess, {}, 1},
                        Mesh{8, 1, Strategy::kGlobalLoad, {}, 1}, Mesh{2, 2, Strategy::kPerDevice, {}, 1},
                        Mesh{2, 2, Strategy::kPerProcess, {{"data", 2}, {"model", 2}}, 2},
                        Mesh{2, 2, Strategy::kPerDevice, {{"data", 2}, {"model", 2}}, 2}}) {
    SCOPED_TRACE(std::to_string(m.processes) + " processes " + std::string(ToString(m.strategy)));
    auto spec = RecordSpec(DatasetFormat::kWebDataset, dir_.path() + "/shard-{000000..000001}.tar", fields, m.processes,
                           m.devices, m.strategy, m.axes);
    if (m.replicas > 1) spec.mesh.batch_axes = {"data"};
    auto job = Resolve(spec);
    ASSERT_OK(job);
    EXPECT_EQ(job->samples, 21u);
    EXPECT_EQ(job->steps_per_epoch, 2u);
    const auto got = LoadAll(*job, 4);  // two epochs
    ExpectStepsMatch(*job, got, expected, {"jpg", "cls"}, m.replicas);
  }
}

// Shards indexed by DALI's wds2idx.py alone (SHARD.idx, no .tar.idx).
TEST_F(WebDatasetFixture, ShardsWithDalisIndexAloneAreReadTheSame) {
  for (const char* shard : {"shard-000000", "shard-000001"}) {
    std::filesystem::remove(dir_.path() + "/" + shard + ".tar.idx");
    CopyInto(kData + "/webdataset/" + shard + ".idx", dir_.path());
  }
  auto job = Resolve(RecordSpec(DatasetFormat::kWebDataset, dir_.path(),
                                {{"jpg", std::nullopt}, {"cls", formats::DType::kInt64}}, 2, 2, Strategy::kPerProcess));
  ASSERT_OK(job);
  EXPECT_EQ(job->samples, 21u);
  ExpectStepsMatch(*job, LoadAll(*job, 4), WebDatasetExpected({"shard-000000", "shard-000001"}), {"jpg", "cls"}, 1);
}

TEST_F(WebDatasetFixture, SamplesWithoutAFieldAreSkippedWhenTheJobSaysSoAndCounted) {
  const Expected expected = WebDatasetExpected({"shard-000000", "shard-000001"});
  auto spec = RecordSpec(DatasetFormat::kWebDataset, dir_.path(), {{"json", std::nullopt}, {"jpg", std::nullopt}}, 4, 1,
                         Strategy::kPerProcess);
  spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
  auto job = Resolve(spec);
  ASSERT_OK(job);
  const auto got = LoadAll(*job, 4);
  ExpectStepsMatch(*job, got, expected, {"json", "jpg"}, 1);
  uint64_t skipped = 0;
  for (const auto& s : got) skipped += s.skipped;
  EXPECT_GT(skipped, 0u) << "a third of the samples have a json member";
}

TEST_F(WebDatasetFixture, ASampleWithoutAFieldFailsItsStepNamingShardKeyAndOffset) {
  auto spec =
      RecordSpec(DatasetFormat::kWebDataset, dir_.path(), {{"json", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  // Sample 0 (train/000000) has a json member, sample 1 does not.
  const Status st = LoadFirstStep(spec);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), HasSubstr("shard-000000.tar@"));
  EXPECT_THAT(st.ToString(), HasSubstr("sample 1 ('train/000001') has no field 'json'"));
  EXPECT_THAT(st.ToString(), HasSubstr("missingField: Skip"));
}

TEST_F(WebDatasetFixture, AShardWithoutItsIndexIsRefusedWithTheCommandThatWritesIt) {
  CopyInto(kData + "/webdataset/shard-000002.tar", dir_.path());
  auto spec = RecordSpec(DatasetFormat::kWebDataset, dir_.path(), {{"jpg", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  auto job = Resolve(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().ToString(), HasSubstr("shard-000002.tar"));
  EXPECT_THAT(job.status().ToString(), HasSubstr("meshload index " + dir_.path()));

  // The index meshload writes for it (what `meshload index` writes) makes
  // its samples readable like the others.
  const std::string tar = Slurp(dir_.path() + "/shard-000002.tar");
  formats::TarWalker walker("shard-000002.tar", tar.size());
  formats::ShardSamples samples("shard-000002.tar");
  while (!walker.done()) {
    auto m = walker.Feed(std::string_view(tar).substr(walker.next().offset, walker.next().bytes));
    ASSERT_OK(m);
    if (*m) {
      ASSERT_OK(samples.Add(**m));
    }
  }
  std::ofstream(dir_.path() + "/shard-000002.tar.idx", std::ios::binary)
      << formats::EnergonTarIndexBytes(formats::ShardSamples::EnergonIndex(samples.Finish(), walker.end_offset()));
  auto indexed = Resolve(spec);
  ASSERT_OK(indexed);
  EXPECT_EQ(indexed->samples, 26u);
  const Expected expected = WebDatasetExpected({"shard-000000", "shard-000001", "shard-000002"});
  ExpectStepsMatch(*indexed, LoadAll(*indexed, 6), expected, {"jpg"}, 1);
}

TEST_F(WebDatasetFixture, ADamagedTarHeaderIsAnErrorNamingTheShardAndByte) {
  // Sample 3's first header (from the index) gets a wrong checksum.
  const std::string idx = Slurp(dir_.path() + "/shard-000000.tar.idx");
  uint64_t at = 0;
  std::memcpy(&at, idx.data() + 3 * 8, 8);
  std::fstream f(dir_.path() + "/shard-000000.tar", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at + 10));
  f.put('\x7f');
  f.close();
  auto spec = RecordSpec(DatasetFormat::kWebDataset, dir_.path(), {{"jpg", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  const Status st = LoadFirstStep(spec);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), HasSubstr("shard-000000.tar@" + std::to_string(at)));
  EXPECT_THAT(st.ToString(), HasSubstr("bad header checksum"));
}

TEST_F(WebDatasetFixture, AFieldThatIsNotANumberOfItsDtypeIsAnError) {
  auto spec = RecordSpec(DatasetFormat::kWebDataset, dir_.path(), {{"jpg", formats::DType::kInt32}}, 1, 1,
                         Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  const Status st = LoadFirstStep(spec);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), HasSubstr("not a number of type int32"));
  EXPECT_THAT(st.ToString(), HasSubstr("shard-000000.tar@"));
}

class Mds : public ::testing::TestWithParam<std::string> {};

// raw/: shards as they are; the others compressed with each of Streaming's
// codecs, read as the shards they decompress to.
TEST_P(Mds, EveryColumnIsWhatStreamingReadsOverTwoEpochsAndAResize) {
  const Expected expected = MdsExpected(GetParam());
  ASSERT_EQ(expected.size(), 40u);
  const std::vector<planner::DatasetField> fields = {
      {"image", std::nullopt},          {"label", formats::DType::kInt64},   {"tokens", formats::DType::kInt32},
      {"box", formats::DType::kUint16}, {"score", formats::DType::kFloat32}, {"text", std::nullopt}};
  for (int64_t processes : {4, 8}) {
    for (Strategy s : {Strategy::kPerProcess, Strategy::kGlobalLoad}) {
      SCOPED_TRACE(std::to_string(processes) + " processes " + std::string(ToString(s)));
      auto job = Resolve(RecordSpec(DatasetFormat::kMDS, kData + "/mds/" + GetParam(), fields, processes, 1, s));
      ASSERT_OK(job);
      EXPECT_EQ(job->dataset.files().front().stored.has_value(), GetParam() != "raw");
      EXPECT_EQ(job->samples, 40u);
      const auto layout = staging::ComputeBatchLayout(*job, 0);
      ASSERT_EQ(layout.fields.size(), 6u);
      EXPECT_TRUE(layout.fields[0].ragged);
      EXPECT_FALSE(layout.fields[1].ragged);
      EXPECT_TRUE(layout.fields[2].ragged);
      EXPECT_EQ(layout.fields[2].dtype, formats::DType::kInt32);
      EXPECT_EQ(layout.fields[3].sample_shape, std::vector<uint64_t>{4});
      EXPECT_EQ(layout.devices[0].fields[3].shape, (std::vector<int64_t>{8 / processes, 4}));
      ExpectStepsMatch(*job, LoadAll(*job, 10), expected, {"image", "label", "tokens", "box", "score", "text"}, 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Streaming, Mds, ::testing::Values("raw", "zstd", "gz", "bz2", "br", "snappy"),
                         [](const auto& info) { return info.param; });

TEST(MdsCompressed, AnUnknownCodecIsRefusedByNameBeforeTheJobStarts) {
  TempDir dir;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/mds/zstd")) CopyInto(e.path(), dir.path());
  std::string index = Slurp(dir.path() + "/index.json");
  for (size_t at = index.find("\"zstd\""); at != std::string::npos; at = index.find("\"zstd\"", at)) {
    index.replace(at, 6, "\"lz4\"");
  }
  std::ofstream(dir.path() + "/index.json") << index;
  auto job =
      Resolve(RecordSpec(DatasetFormat::kMDS, dir.path(), {{"image", std::nullopt}}, 1, 1, Strategy::kPerProcess));
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().ToString(), AllOf(HasSubstr("shard.00000.mds.zstd"), HasSubstr("unknown compression 'lz4'"),
                                             HasSubstr("br, bz2, gz, snappy, zlib, zstd")));
}

TEST(MdsCompressed, ACorruptOrMisSizedShardIsAnErrorNamingItsFile) {
  TempDir dir;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/mds/zstd")) CopyInto(e.path(), dir.path());
  // Damage near its end: found when the head is decompressed (one zstd
  // block holds the whole of this small shard), else when a step reads the
  // shard; either way an error naming the compressed file and a byte
  // offset, and nothing delivered.
  const std::string path = dir.path() + "/shard.00001.mds.zstd";
  std::string zip = Slurp(path);
  for (size_t i = zip.size() - 64; i < zip.size() - 8; ++i) zip[i] = static_cast<char>(zip[i] ^ 0x33);
  std::ofstream(path, std::ios::binary) << zip;
  auto spec = RecordSpec(DatasetFormat::kMDS, dir.path(), {{"image", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  spec.batch.global_batch_size = 40;
  auto job = Resolve(spec);
  Status st = job.status();
  if (job.ok()) {
    st = LoadFirstStepOf(*job);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  }
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), AllOf(HasSubstr("shard.00001.mds.zstd@"), HasSubstr("corrupt zstd data")));

  // A compressed file whose size is not index.json's: refused at the start.
  std::ofstream(path, std::ios::binary | std::ios::app) << "x";
  auto resized = Resolve(spec);
  ASSERT_FALSE(resized.ok());
  EXPECT_THAT(resized.status().ToString(),
              AllOf(HasSubstr("shard.00001.mds.zstd"), HasSubstr("index.json says " + std::to_string(zip.size()))));
}

// A compressed shard is one cache block whatever the shuffle: it is
// decompressed whole; raw shards follow the sampler's blocks.
TEST(MdsCompressed, AShardIsOneBlockUnderEveryShuffle) {
  for (const std::string codec : {"raw", "zstd"}) {
    auto spec = RecordSpec(DatasetFormat::kMDS, kData + "/mds/" + codec, {{"image", std::nullopt}}, 1, 1,
                           Strategy::kPerProcess);
    spec.shuffle.mode = planner::ShuffleMode::kWindow;
    spec.shuffle.block_size = 4;
    spec.shuffle.window_blocks = 2;
    auto job = Resolve(spec);
    ASSERT_OK(job);
    const planner::BlockMap blocks(*job, planner::BlockGeometry{1024, 2048});
    for (size_t f = 0; f < job->dataset.files().size(); ++f) {
      if (codec == "raw") {
        EXPECT_GT(blocks.Blocks(f), 1u);
      } else {
        EXPECT_EQ(blocks.starts(f), std::vector<uint64_t>{0});
        EXPECT_EQ(blocks.Blocks(f), 1u);
        EXPECT_EQ(blocks.Extent(f, 0).second, job->dataset.files()[f].size);
      }
    }
  }
}

// TFRecord files TensorFlow wrote, indexed by tfrecord2idx: every feature
// is what the second reader read, over two epochs, on 4 and 8 processes.
TEST(TfRecord, EveryFeatureIsWhatTheReaderReadsOverTwoEpochsAndAResize) {
  const Expected expected = TfRecordExpected();
  ASSERT_EQ(expected.size(), 30u);
  const std::vector<planner::DatasetField> fields = {{"image", std::nullopt},
                                                     {"label", formats::DType::kInt64},
                                                     {"input_ids", formats::DType::kInt64},
                                                     {"box", formats::DType::kFloat32}};
  for (int64_t processes : {4, 8}) {
    for (Strategy s : {Strategy::kPerProcess, Strategy::kGlobalLoad}) {
      SCOPED_TRACE(std::to_string(processes) + " processes " + std::string(ToString(s)));
      auto job = Resolve(RecordSpec(DatasetFormat::kTFRecord, kData + "/tfrecord/*.tfrecord", fields, processes, 1, s));
      ASSERT_OK(job);
      EXPECT_EQ(job->samples, 30u);
      const auto layout = staging::ComputeBatchLayout(*job, 0);
      ASSERT_EQ(layout.fields.size(), 4u);
      for (const auto& f : layout.fields) EXPECT_TRUE(f.ragged) << f.name;
      EXPECT_EQ(layout.fields[1].dtype, formats::DType::kInt64);
      EXPECT_EQ(layout.fields[3].dtype, formats::DType::kFloat32);
      // 4 epochs of 30 samples in batches of 8: two epochs and more.
      ExpectStepsMatch(*job, LoadAll(*job, 8), expected, {"image", "label", "input_ids", "box"}, 1);
    }
  }
  // Record 17 has no `text`: left out and counted under missingField Skip.
  auto spec = RecordSpec(DatasetFormat::kTFRecord, kData + "/tfrecord/*.tfrecord",
                         {{"text", std::nullopt}, {"label", formats::DType::kInt64}}, 2, 1, Strategy::kPerProcess);
  spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
  auto job = Resolve(spec);
  ASSERT_OK(job);
  ExpectStepsMatch(*job, LoadAll(*job, 8), expected, {"text", "label"}, 1);
}

// A list of a fixed shape (tf.io.FixedLenFeature's) is a dense field:
// `label` one int64 a sample ([]), `box` four floats ([4]); every value is
// the second reader's, and a record whose list has another count is an
// error naming the file, the record and the counts.
TEST(TfRecord, ListsOfAFixedShapeAreDense) {
  const Expected expected = TfRecordExpected();
  const std::vector<planner::DatasetField> fields = {{"image", std::nullopt},
                                                     {"label", formats::DType::kInt64, {}, {}, true},
                                                     {"box", formats::DType::kFloat32, {4}, {}, true}};
  for (int64_t processes : {4, 8}) {
    SCOPED_TRACE(std::to_string(processes) + " processes");
    auto job = Resolve(RecordSpec(DatasetFormat::kTFRecord, kData + "/tfrecord/*.tfrecord", fields, processes, 1,
                                  Strategy::kPerProcess));
    ASSERT_OK(job);
    const auto layout = staging::ComputeBatchLayout(*job, 0);
    ASSERT_EQ(layout.fields.size(), 3u);
    EXPECT_TRUE(layout.fields[0].ragged);
    EXPECT_FALSE(layout.fields[1].ragged);
    EXPECT_EQ(layout.fields[1].sample_shape, std::vector<uint64_t>{});
    EXPECT_EQ(layout.fields[1].sample_bytes, 8u);
    EXPECT_FALSE(layout.fields[2].ragged);
    EXPECT_EQ(layout.fields[2].sample_shape, std::vector<uint64_t>{4});
    EXPECT_EQ(layout.fields[2].sample_bytes, 16u);
    ExpectStepsMatch(*job, LoadAll(*job, 8), expected, {"image", "label", "box"}, 1);
  }

  // input_ids has one value in the first record and more in others.
  auto spec = RecordSpec(DatasetFormat::kTFRecord, kData + "/tfrecord/*.tfrecord",
                         {{"input_ids", formats::DType::kInt64, {1}, {}, true}}, 1, 1, Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  spec.batch.global_batch_size = 30;
  const Status st = LoadFirstStep(spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();  // the job's shape, not damage
  EXPECT_THAT(st.ToString(), AllOf(HasSubstr(".tfrecord@"), HasSubstr("feature 'input_ids' has "),
                                   HasSubstr(" values where its shape takes 1")));

  // A shape needs a dtype and TFRecord; no more than 2^24 values.
  Diagnostics d;
  auto no_dtype = spec;
  no_dtype.dataset.fields = {{"image", std::nullopt, {2}, {}, true}};
  planner::ValidateJobSpec(no_dtype, d);
  auto mds = RecordSpec(DatasetFormat::kMDS, kData + "/mds/raw", {{"box", formats::DType::kFloat32, {4}, {}, true}}, 1,
                        1, Strategy::kPerProcess);
  planner::ValidateJobSpec(mds, d);
  auto huge = spec;
  huge.dataset.fields = {{"box", formats::DType::kFloat32, {4096, 4097}, {}, true}};
  planner::ValidateJobSpec(huge, d);
  EXPECT_THAT(d.ToString(), AllOf(HasSubstr("spec.dataset.fields[0].shape: needs a dtype"),
                                  HasSubstr("spec.dataset.fields[0].shape: is only used by format TFRecord"),
                                  HasSubstr("holds more than 16777216 (2^24) values a sample")));
}

TEST(TfRecord, DamageAndMismatchesAreErrorsNamingTheFileAndRecord) {
  TempDir dir;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/tfrecord")) {
    if (e.is_regular_file() && e.path().extension() != ".json") CopyInto(e.path(), dir.path());
  }
  auto spec = RecordSpec(DatasetFormat::kTFRecord, dir.path(), {{"image", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  spec.batch.global_batch_size = 30;

  // A feature of another kind than the job asks for.
  auto as_float = spec;
  as_float.dataset.fields = {{"label", formats::DType::kFloat32}};
  EXPECT_THAT(LoadFirstStep(as_float).ToString(),
              AllOf(HasSubstr("part-00000.tfrecord@0"),
                    HasSubstr("feature 'label' is an int64_list, and the job asks for a float_list (dtype float32)")));
  auto as_int32 = spec;
  as_int32.dataset.fields = {{"label", formats::DType::kInt32}};
  Diagnostics d;
  planner::ValidateJobSpec(as_int32, d);
  EXPECT_THAT(d.ToString(),
              AllOf(HasSubstr("spec.dataset.fields[0].dtype"), HasSubstr("int32 is not a TFRecord feature's type")));

  // A flipped payload byte: the data CRC, naming the file and the record.
  const std::string path = dir.path() + "/part-00001.tfrecord";
  std::string data = Slurp(path);
  uint64_t third = 0;  // the third record's offset, from its index
  {
    std::istringstream lines(Slurp(path + ".idx"));
    uint64_t o = 0, l = 0;
    for (int i = 0; i < 3 && lines >> o >> l; ++i) third = o;
  }
  ASSERT_GT(third, 0u);
  data[third + 30] = static_cast<char>(data[third + 30] ^ 0x40);
  std::ofstream(path, std::ios::binary) << data;
  const Status st = LoadFirstStep(spec);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_THAT(st.ToString(),
              AllOf(HasSubstr("part-00001.tfrecord@" + std::to_string(third)), HasSubstr("bad data CRC")));

  // A file without its index: refused with the command that writes it.
  std::filesystem::remove(dir.path() + "/part-00002.tfrecord.idx");
  auto job = Resolve(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().ToString(),
              AllOf(HasSubstr("part-00002.tfrecord"), HasSubstr("meshload index " + dir.path())));
}

// The same records in files TensorFlow wrote compressed (GZIP, ZLIB):
// read as the bytes they decompress to (each file a stored file, named
// FILE.decompressed), every feature the second reader's over two epochs on
// 4 and 8 processes.
TEST(TfRecordCompressed, GzipAndZlibFilesDeliverWhatTheReaderReads) {
  const Expected expected = TfRecordExpected();
  const std::vector<planner::DatasetField> fields = {{"image", std::nullopt},
                                                     {"label", formats::DType::kInt64, {}, {}, true},
                                                     {"input_ids", formats::DType::kInt64},
                                                     {"box", formats::DType::kFloat32, {4}, {}, true}};
  for (const auto& [folder, compression, codec] :
       {std::tuple{"gzip/*.gz", planner::FileCompression::kGZIP, "gz"},
        std::tuple{"zlib/*.zlib", planner::FileCompression::kZLIB, "zlib"}}) {
    for (int64_t processes : {4, 8}) {
      SCOPED_TRACE(std::string(folder) + " on " + std::to_string(processes) + " processes");
      auto spec = RecordSpec(DatasetFormat::kTFRecord, kData + "/tfrecord/" + folder, fields, processes, 1,
                             Strategy::kPerProcess);
      spec.dataset.compression = compression;
      auto job = Resolve(spec);
      ASSERT_OK(job);
      EXPECT_EQ(job->samples, 30u);
      ASSERT_EQ(job->dataset.files().size(), 3u);
      for (const planner::DatasetFile& f : job->dataset.files()) {
        ASSERT_TRUE(f.stored.has_value()) << f.path;
        EXPECT_EQ(f.stored->compression, codec);
        EXPECT_EQ(f.path, f.stored->path + ".decompressed");
        const std::string raw = std::filesystem::path(f.stored->path).filename().string();
        EXPECT_EQ(f.size, std::filesystem::file_size(kData + "/tfrecord/" + raw.substr(0, raw.rfind('.'))));
        EXPECT_EQ(f.stored->size, std::filesystem::file_size(f.stored->path));
      }
      ExpectStepsMatch(*job, LoadAll(*job, 8), expected, {"image", "label", "input_ids", "box"}, 1);
    }
  }
}

// A compressed file read with the wrong option (or none), and damage inside
// one: errors naming the file and what to set, before the job starts where
// the first bytes show it, else at the read, with nothing delivered.
TEST(TfRecordCompressed, AWrongCompressionOrDamageIsAnErrorNamingTheFile) {
  TempDir dir;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/tfrecord/gzip")) CopyInto(e.path(), dir.path());
  auto spec = RecordSpec(DatasetFormat::kTFRecord, dir.path() + "/*.gz", {{"image", std::nullopt}}, 1, 1,
                         Strategy::kPerProcess);
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  spec.batch.global_batch_size = 30;

  // Read as uncompressed: the index does not fit the file, which looks
  // like gzip.
  auto none = Resolve(spec);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().ToString(),
              AllOf(HasSubstr("part-00000.tfrecord.gz.idx"), HasSubstr("-byte file"),
                    HasSubstr("starts like a GZIP stream"), HasSubstr("set spec.dataset.compression: GZIP")));
  // Read as ZLIB: its first bytes are not a zlib stream.
  auto as_zlib = spec;
  as_zlib.dataset.compression = planner::FileCompression::kZLIB;
  auto zlib = Resolve(as_zlib);
  ASSERT_FALSE(zlib.ok());
  EXPECT_THAT(zlib.status().ToString(), AllOf(HasSubstr("part-00000.tfrecord.gz"), HasSubstr("corrupt zlib data"),
                                              HasSubstr("read with spec.dataset.compression: ZLIB")));
  // Damage past the first record: found when a step reads the file.
  spec.dataset.compression = planner::FileCompression::kGZIP;
  const std::string path = dir.path() + "/part-00001.tfrecord.gz";
  std::string zip = Slurp(path);
  for (size_t i = zip.size() / 2; i < zip.size() / 2 + 16; ++i) zip[i] = static_cast<char>(zip[i] ^ 0x5a);
  std::ofstream(path, std::ios::binary) << zip;
  auto job = Resolve(spec);
  ASSERT_OK(job);
  const Status st = LoadFirstStepOf(*job);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_THAT(st.ToString(), HasSubstr("part-00001.tfrecord.gz"));

  // compression is TFRecord's only.
  Diagnostics d;
  auto mds =
      RecordSpec(DatasetFormat::kMDS, kData + "/mds/raw", {{"image", std::nullopt}}, 1, 1, Strategy::kPerProcess);
  mds.dataset.compression = planner::FileCompression::kGZIP;
  planner::ValidateJobSpec(mds, d);
  EXPECT_THAT(d.ToString(), HasSubstr("spec.dataset.compression: is only used by format TFRecord"));
}

// A GZIP file rewritten after its index was (here without its last record)
// is refused before the job starts, naming the index and the command that
// writes it again; a file of several gzip members, whose trailer gives the
// last member's size only, is counted whole and read.
TEST(TfRecordCompressed, AStaleIndexIsRefusedBeforeTheJobStartsAndSeveralMembersAreRead) {
  TempDir dir;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/tfrecord/gzip")) CopyInto(e.path(), dir.path());
  auto spec = RecordSpec(DatasetFormat::kTFRecord, dir.path() + "/*.gz", {{"image", std::nullopt}}, 1, 1,
                         Strategy::kPerProcess);
  spec.dataset.compression = planner::FileCompression::kGZIP;
  spec.shuffle.mode = planner::ShuffleMode::kNone;
  spec.batch.global_batch_size = 30;
  const std::string raw = Slurp(kData + "/tfrecord/part-00001.tfrecord");
  const std::string path = dir.path() + "/part-00001.tfrecord.gz";

  // The same bytes in two members.
  const std::string_view bytes(raw);
  auto first = formats::Compress(formats::Codec::kGzip, bytes.substr(0, bytes.size() / 2));
  auto second = formats::Compress(formats::Codec::kGzip, bytes.substr(bytes.size() / 2));
  ASSERT_OK(first);
  ASSERT_OK(second);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << *first << *second;
  auto members = Resolve(spec);
  ASSERT_OK(members);
  EXPECT_OK(LoadFirstStepOf(*members));

  // Without its last record, the old index kept.
  uint64_t last_record = 0;
  {
    std::istringstream lines(Slurp(kData + "/tfrecord/part-00001.tfrecord.idx"));
    uint64_t o = 0, l = 0;
    while (lines >> o >> l) last_record = o;
  }
  ASSERT_GT(last_record, 0u);
  auto shorter = formats::Compress(formats::Codec::kGzip, bytes.substr(0, last_record));
  ASSERT_OK(shorter);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << *shorter;
  auto stale = Resolve(spec);
  ASSERT_FALSE(stale.ok());
  EXPECT_THAT(stale.status().ToString(), AllOf(HasSubstr("part-00001.tfrecord.gz.idx"),
                                               HasSubstr("the records end at byte " + std::to_string(raw.size())),
                                               HasSubstr("decompresses to " + std::to_string(last_record) + " bytes"),
                                               HasSubstr("meshload index --compression GZIP " + dir.path())));
}

TEST(Mds, ColumnsAndShardsItCannotReadAreRefusedByName) {
  auto error = [](const std::string& uri, std::vector<planner::DatasetField> fields) {
    auto job = Resolve(RecordSpec(DatasetFormat::kMDS, uri, std::move(fields), 1, 1, Strategy::kPerProcess));
    return job.ok() ? std::string("(resolved)") : job.status().ToString();
  };
  EXPECT_THAT(error(kData + "/mds/raw", {{"caption", std::nullopt}}),
              AllOf(HasSubstr("no shard has a column 'caption'"), HasSubstr("box, image, label")));
  EXPECT_THAT(error(kData + "/mds/raw", {{"text", formats::DType::kInt64}}),
              HasSubstr("column 'text' is encoded 'str'"));
  EXPECT_THAT(error(kData + "/mds/raw", {{"label", formats::DType::kInt32}}), HasSubstr("its values are int64"));
  EXPECT_THAT(error(kData + "/mds/raw", {{"tokens", formats::DType::kInt64}}), HasSubstr("its elements are int32"));
  TempDir empty;
  EXPECT_THAT(error(empty.path(), {{"image", std::nullopt}}), HasSubstr("has no index.json"));
}

// Parquet files pyarrow wrote (three row-group sizes, dictionary and plain
// encodings, snappy, zstd and gzip): every column is what pyarrow's reader
// read, over two epochs, on 4 and 8 processes; rows with a null are left
// out and counted under missingField Skip.
TEST(Parquet, EveryColumnIsWhatPyarrowReadsOverTwoEpochsAndAResize) {
  const Expected expected = ParquetExpected(3);
  for (int64_t processes : {4, 8}) {
    for (Strategy s : {Strategy::kPerProcess, Strategy::kGlobalLoad}) {
      SCOPED_TRACE(std::to_string(processes) + " processes " + std::string(ToString(s)));
      auto spec = RecordSpec(DatasetFormat::kParquet, kData + "/parquet/rg*.parquet", ParquetFields(), processes, 1, s);
      spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
      auto job = Resolve(spec);
      ASSERT_OK(job);
      EXPECT_EQ(job->samples, 180u);
      const auto layout = staging::ComputeBatchLayout(*job, 0);
      ASSERT_EQ(layout.fields.size(), 9u);
      EXPECT_TRUE(layout.fields[0].ragged);
      EXPECT_EQ(layout.fields[0].dtype, formats::DType::kInt32);
      EXPECT_FALSE(layout.fields[2].ragged);
      EXPECT_EQ(layout.fields[2].dtype, formats::DType::kInt64);
      EXPECT_EQ(layout.fields[3].dtype, formats::DType::kBool);
      EXPECT_EQ(layout.fields[4].sample_shape, (std::vector<uint64_t>{4}));
      EXPECT_EQ(layout.fields[5].sample_shape, (std::vector<uint64_t>{2, 3}));
      EXPECT_EQ(layout.fields[7].sample_shape, (std::vector<uint64_t>{8}));
      EXPECT_TRUE(layout.fields[8].ragged);
      ExpectStepsMatch(*job, LoadAll(*job, 2 * 180 / 8 + 1), expected, kParquetNames, 1);
    }
  }
}

TEST(Parquet, ColumnsFieldsAndFilesItCannotReadAreRefusedByNameBeforeTheJobStarts) {
  auto error = [](const std::string& uri, std::vector<planner::DatasetField> fields) {
    auto job = Resolve(RecordSpec(DatasetFormat::kParquet, uri, std::move(fields), 2, 1, Strategy::kPerProcess));
    return job.ok() ? std::string("resolved") : job.status().ToString();
  };
  const std::string one = kData + "/parquet/rg7-dict-snappy.parquet";
  std::vector<planner::DatasetField> f(1);
  f[0].name = "tags";
  EXPECT_THAT(error(one, f),
              AllOf(HasSubstr("rg7-dict-snappy.parquet"), HasSubstr("column tags is list<element: string>"),
                    HasSubstr("spec.dataset.fields[0]")));
  f[0].name = "caption";
  EXPECT_THAT(error(one, f), AllOf(HasSubstr("no column caption"), HasSubstr("its columns: input_ids")));
  f[0].name = "input_ids";  // ragged, without maxBytes
  EXPECT_THAT(error(one, f),
              AllOf(HasSubstr("spec.dataset.fields[0].maxBytes"), HasSubstr("required: column input_ids")));
  f[0].name = "label";
  f[0].max_bytes = 8;  // dense, with maxBytes
  EXPECT_THAT(error(one, f), AllOf(HasSubstr("spec.dataset.fields[0].maxBytes"), HasSubstr("is not used")));
  f[0].max_bytes.reset();
  f[0].dtype = formats::DType::kInt32;  // not the column's type
  EXPECT_THAT(error(one, f),
              AllOf(HasSubstr("spec.dataset.fields[0].dtype"), HasSubstr("int32 is not column label's type")));
  // A file of another schema among them: named, with the column.
  f[0].dtype.reset();
  f[0].name = "input_ids";
  f[0].max_bytes = 160;
  EXPECT_THAT(error(kData + "/parquet/*.parquet", f),
              AllOf(HasSubstr("schema-int64.parquet"), HasSubstr("column input_ids is list<element: int64> here")));
  // Not a Parquet file.
  TempDir dir;
  { std::ofstream(dir.path() + "/a.parquet") << "not parquet at all"; }
  EXPECT_THAT(error(dir.path() + "/a.parquet", f), AllOf(HasSubstr("a.parquet@"), HasSubstr("not a Parquet file")));
}

// A row whose value is larger than its field's maxBytes fails its step
// naming the file, the row and the field.
TEST(Parquet, ARowOverItsFieldsMaxBytesFailsItsStepNamingFileRowAndField) {
  std::vector<planner::DatasetField> f(1);
  f[0].name = "input_ids";
  f[0].max_bytes = 8;
  auto spec =
      RecordSpec(DatasetFormat::kParquet, kData + "/parquet/rg7-dict-snappy.parquet", f, 1, 1, Strategy::kPerProcess);
  spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
  const Status st = LoadFirstStep(spec);
  EXPECT_THAT(st.ToString(), AllOf(HasSubstr("rg7-dict-snappy.parquet"), HasSubstr("field input_ids holds a value of "),
                                   HasSubstr("spec.dataset.fields[0].maxBytes")));
}

// The footers read to resolve the job are those the rows are read with:
// installing the Parquet rows reads nothing more from storage.
TEST(Parquet, TheRowsAreReadWithTheFootersTheJobWasResolvedWith) {
  source::testing::TestHttpServer server;
  const std::string bytes = Slurp(kData + "/parquet/rg7-dict-snappy.parquet");
  server.Get("/p/a.parquet", [&bytes](const httplib::Request& req, httplib::Response& res) {
    source::testing::ServeBytes(bytes, req, res);
  });
  server.Start();
  std::vector<planner::DatasetField> f(1);
  f[0].name = "label";
  auto job = Resolve(RecordSpec(DatasetFormat::kParquet, server.Url("/p/a.parquet"), f, 1, 1, Strategy::kPerProcess));
  ASSERT_OK(job);
  const int resolving = server.requests();
  EXPECT_GE(resolving, 1);
  auto sources = source::SourceRegistry::WithBuiltins({});
  auto rows = source::InstallParquetRows(job->dataset, *sources, 1 << 20);
  ASSERT_OK(rows);
  EXPECT_EQ(server.requests(), resolving);
  EXPECT_OK(LoadFirstStepOf(*job));
  EXPECT_GT(server.requests(), resolving);  // the row groups' column chunks
}

// What `meshload plan --compare` says a Parquet job fetches under a shuffle
// (planner/fetch_plan.h: row groups as blocks, their wanted column chunks
// fetched, kept decoded within the capacity) is what the sidecar's row
// source does over an epoch: each group once when they all fit, or read in
// file order; again and again under a global shuffle with room for a few.
TEST(Parquet, TheFetchEstimateIsWhatTheRowSourceDecodes) {
  std::vector<planner::DatasetField> f(2);
  f[0].name = "input_ids";
  f[0].max_bytes = 160;
  f[1].name = "label";
  for (planner::ShuffleMode mode : {planner::ShuffleMode::kNone, planner::ShuffleMode::kGlobal}) {
    for (uint64_t capacity : {uint64_t{1} << 20, uint64_t{3000}}) {
      SCOPED_TRACE(std::string(ToString(mode)) + ", capacity " + std::to_string(capacity));
      auto spec = RecordSpec(DatasetFormat::kParquet, kData + "/parquet/rg*.parquet", f, 1, 1, Strategy::kPerProcess);
      spec.shuffle.mode = mode;
      spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
      spec.batch.global_batch_size = 4;
      auto job = Resolve(spec);
      ASSERT_OK(job);
      planner::ShardPlanner planner(*job);
      const planner::FetchEstimate est = planner::EstimateFetch(planner, planner.DefaultLoading(), 0,
                                                                planner::BlockGeometry{}, 0, 1ull << 20, capacity);
      EXPECT_EQ(est.blocks, 13u);
      auto sources = source::SourceRegistry::WithBuiltins({});
      auto rows = source::InstallParquetRows(job->dataset, *sources, capacity);
      ASSERT_OK(rows);
      ASSERT_EQ(rows->size(), 1u);
      const auto layout = staging::ComputeBatchLayout(*job, 0);
      StepLoaderOptions opts;
      opts.reader_threads = 1;
      auto loader = StepLoader::Create(planner, 0, planner.DefaultLoading(), *sources, layout, opts);
      ASSERT_OK(loader);
      std::vector<uint8_t> slot(layout.slot_bytes);
      for (int64_t step = 0; step < static_cast<int64_t>(job->steps_per_epoch); ++step) {
        std::vector<staging::StagedTensor> staged;
        ASSERT_OK((*loader)->Load(step, slot.data(), staged, nullptr));
      }
      const uint64_t fetched = (*rows)[0]->chunk_bytes_read();
      if (capacity > 3000 || mode == planner::ShuffleMode::kNone) {
        EXPECT_EQ(est.capacity_fetched_bytes, est.fetched_bytes);
        EXPECT_EQ(fetched, est.fetched_bytes);
        EXPECT_EQ((*rows)[0]->decodes(), 13u);
      } else {
        EXPECT_GT(est.capacity_fetched_bytes, 3 * est.fetched_bytes);
        EXPECT_GT(fetched, 3 * est.fetched_bytes);
        EXPECT_NEAR(static_cast<double>(fetched), static_cast<double>(est.capacity_fetched_bytes),
                    0.25 * static_cast<double>(est.capacity_fetched_bytes));
      }
    }
  }
}

// A Hugging Face Hub repository's split, as `datasets.load_dataset` read
// it (tests/formats/data/hub/expected.json): per row input_ids (int32),
// text, label (int64) and image bytes, as the sidecar stages them.
// Rows as the fixture writers of Hugging Face datasets wrote them
// (input_ids, text in hex, label, image bytes in hex), as the sidecar
// stages them.
Expected DatasetsRows(const Json& rows) {
  Expected out;
  for (const Json& row : rows) {
    std::map<std::string, std::string> fields;
    if (row.contains("input_ids")) {
      std::string ids;
      for (const Json& t : row["input_ids"]) ids += Bytes(t.get<int32_t>());
      fields["input_ids"] = ids;
    }
    if (row.contains("text")) fields["text"] = Unhex(row["text"].get<std::string>());
    if (row.contains("label")) fields["label"] = Bytes(row["label"].get<int64_t>());
    if (row.contains("image")) fields["image.bytes"] = Unhex(row["image"].get<std::string>());
    out.push_back(std::move(fields));
  }
  return out;
}

Expected HubExpected(const std::string& repo, const std::string& config, const std::string& split) {
  return DatasetsRows(Json::parse(Slurp(kData + "/hub/expected.json"))["repositories"][repo][config][split]);
}

std::vector<planner::DatasetField> HubTokenFields() {
  std::vector<planner::DatasetField> f(3);
  f[0].name = "input_ids";
  f[0].max_bytes = 4 * 23;
  f[1].name = "text";
  f[1].max_bytes = 64;
  f[2].name = "label";
  return f;
}
const std::vector<std::string> kHubTokenNames = {"input_ids", "text", "label"};

// The Image feature's bytes (a PNG of at most 1 KiB here) and the label.
std::vector<planner::DatasetField> ImageFields() {
  std::vector<planner::DatasetField> f(2);
  f[0].name = "image.bytes";
  f[0].max_bytes = 1024;
  f[1].name = "label";
  return f;
}

planner::JobSpec HubSpec(const std::string& repo, const std::string& split, const std::string& config,
                         std::vector<planner::DatasetField> fields, int64_t processes) {
  planner::JobSpec spec =
      RecordSpec(DatasetFormat::kParquet, repo, std::move(fields), processes, 1, Strategy::kPerProcess);
  spec.dataset.split = split;
  spec.dataset.config = config;
  return spec;
}

// Repositories laid out as push_to_hub lays them out: the split the job
// names (of the config it names, or the card's default) is what
// load_dataset reads, row for row, over two epochs, on 4 and 8 processes.
TEST(HubRepository, EachSplitIsWhatLoadDatasetReadsOverTwoEpochsAndAResize) {
  struct Case {
    std::string repo, config, split, expected_config;
    std::vector<planner::DatasetField> fields;
    std::vector<std::string> names;
    size_t files;
  };
  const std::vector<planner::DatasetField> image = ImageFields();
  const std::vector<Case> cases = {
      {"tokens", "", "train", "default", HubTokenFields(), kHubTokenNames, 3},
      {"tokens", "", "test", "default", HubTokenFields(), kHubTokenNames, 1},
      {"configs", "", "train", "en", HubTokenFields(), kHubTokenNames, 2},  // en is marked default
      {"configs", "fr", "train", "fr", HubTokenFields(), kHubTokenNames, 1},
      {"default-layout", "", "train", "default", HubTokenFields(), kHubTokenNames, 2},  // no README.md
      {"images", "", "train", "default", image, {"image.bytes", "label"}, 1},
  };
  for (const Case& c : cases) {
    const Expected expected = HubExpected(c.repo, c.expected_config, c.split);
    for (int64_t processes : {4, 8}) {
      if (static_cast<int64_t>(expected.size()) < processes) continue;  // images: 6 rows
      SCOPED_TRACE(c.repo + " " + c.config + " " + c.split + " on " + std::to_string(processes) + " processes");
      planner::JobSpec spec = HubSpec(kData + "/hub/" + c.repo, c.split, c.config, c.fields, processes);
      spec.batch.global_batch_size =
          std::min<int64_t>(8, static_cast<int64_t>(expected.size()) / processes * processes);
      auto job = Resolve(spec);
      ASSERT_OK(job);
      EXPECT_EQ(job->samples, expected.size());
      EXPECT_EQ(job->dataset.files().size(), c.files);
      for (const planner::DatasetFile& f : job->dataset.files()) {
        EXPECT_EQ(f.path.rfind(kData + "/hub/" + c.repo + "/", 0), 0u) << f.path;
      }
      const int64_t steps = 2 * static_cast<int64_t>(expected.size()) / spec.batch.global_batch_size + 1;
      ExpectStepsMatch(*job, LoadAll(*job, steps), expected, c.names, 1);
    }
  }
}

TEST(HubRepository, ASplitConfigOrCardItCannotReadIsAnErrorNamingTheRepositoryAndWhatItHas) {
  auto error = [](const std::string& repo, const std::string& split, const std::string& config) {
    auto job = Resolve(HubSpec(repo, split, config, HubTokenFields(), 2));
    return job.ok() ? std::string("resolved") : job.status().ToString();
  };
  const std::string tokens = kData + "/hub/tokens";
  EXPECT_THAT(error(tokens, "validation", ""),
              AllOf(HasSubstr(tokens + "/README.md"),
                    HasSubstr("config default has no split validation (its splits: train, test; spec.dataset.split)")));
  EXPECT_THAT(error(kData + "/hub/configs", "train", "de"),
              AllOf(HasSubstr("configs/README.md"), HasSubstr("has no config de (its configs: en, fr")));
  EXPECT_THAT(error(kData + "/hub/default-layout", "test", ""),
              AllOf(HasSubstr("default-layout"), HasSubstr("has no split test: no README.md names configs"),
                    HasSubstr("data/test-*")));
  // Files named for their split at the root, without a card.
  TempDir flat;
  std::filesystem::copy_file(kData + "/hub/default-layout/data/train-00000-of-00002.parquet",
                             flat.path() + "/train.parquet");
  std::filesystem::copy_file(kData + "/hub/default-layout/data/validation-00000-of-00001.parquet",
                             flat.path() + "/validation.parquet");
  for (const auto& [split, rows] : {std::pair<std::string, uint64_t>{"train", 7}, {"validation", 5}}) {
    planner::JobSpec spec = HubSpec(flat.path(), split, "", HubTokenFields(), 2);
    spec.batch.global_batch_size = 2;
    auto job = Resolve(spec);
    ASSERT_OK(job);
    ASSERT_EQ(job->dataset.files().size(), 1u);
    EXPECT_EQ(job->dataset.files()[0].path, flat.path() + "/" + split + ".parquet");
    EXPECT_EQ(job->samples, rows);
  }
  // A shard missing: the card's count of the split's rows differs.
  TempDir dir;
  std::filesystem::copy(tokens, dir.path(), std::filesystem::copy_options::recursive);
  std::filesystem::remove(dir.path() + "/data/train-00001-of-00003.parquet");
  EXPECT_THAT(
      error(dir.path(), "train", ""),
      AllOf(HasSubstr(dir.path() + "/README.md"),
            HasSubstr("dataset_info gives config default split train 50 examples, but its 2 files hold 33 rows")));
  // A card pointing at files that are not there.
  std::filesystem::remove(dir.path() + "/data/test-00000-of-00001.parquet");
  EXPECT_THAT(error(dir.path(), "test", ""),
              AllOf(HasSubstr("config default split test: data_files path 'data/test-*' matches no file")));
  // A damaged card names its line.
  { std::ofstream(dir.path() + "/README.md") << "---\nconfigs:\n- config_name: default\n  data_files: [x\n---\n"; }
  EXPECT_THAT(error(dir.path(), "train", ""),
              AllOf(HasSubstr(dir.path() + "/README.md:5"), HasSubstr("not valid YAML")));
}

// A dataset that datasets' save_to_disk wrote, as load_from_disk read it
// (tests/formats/data/saved/expected.json; split "" for a Dataset).
Expected SavedExpected(const std::string& dataset, const std::string& split) {
  return DatasetsRows(Json::parse(Slurp(kData + "/saved/expected.json"))["saved"][dataset][split]);
}

planner::JobSpec SavedSpec(const std::string& uri, const std::string& split, std::vector<planner::DatasetField> fields,
                           int64_t processes) {
  planner::JobSpec spec =
      RecordSpec(DatasetFormat::kArrow, uri, std::move(fields), processes, 1, Strategy::kPerProcess);
  spec.dataset.split = split;
  return spec;
}

// Datasets save_to_disk wrote (Arrow IPC streams of several record batches,
// state.json, a DatasetDict's dataset_dict.json): each split, and a
// Dataset's folder, is what load_from_disk reads, row for row, over two
// epochs, on 4 and 8 processes; the index is the files' record batches.
TEST(SavedDataset, EachSplitIsWhatLoadFromDiskReadsOverTwoEpochsAndAResize) {
  struct Case {
    std::string dataset, split;
    std::vector<planner::DatasetField> fields;
    std::vector<std::string> names;
    size_t files;
  };
  const std::vector<planner::DatasetField> image = ImageFields();
  const std::vector<Case> cases = {
      {"tokens", "train", HubTokenFields(), kHubTokenNames, 3},
      {"tokens", "test", HubTokenFields(), kHubTokenNames, 1},
      {"images", "", image, {"image.bytes", "label"}, 1},
  };
  const Json doc = Json::parse(Slurp(kData + "/saved/expected.json"));
  for (const Case& c : cases) {
    const Expected expected = SavedExpected(c.dataset, c.split);
    const std::string folder = c.dataset + (c.split.empty() ? "" : "/" + c.split);
    for (int64_t processes : {4, 8}) {
      if (static_cast<int64_t>(expected.size()) < processes) continue;  // images: 6 rows
      SCOPED_TRACE(folder + " on " + std::to_string(processes) + " processes");
      planner::JobSpec spec = SavedSpec(kData + "/saved/" + c.dataset, c.split, c.fields, processes);
      spec.batch.global_batch_size =
          std::min<int64_t>(8, static_cast<int64_t>(expected.size()) / processes * processes);
      auto job = Resolve(spec);
      ASSERT_OK(job);
      EXPECT_EQ(job->samples, expected.size());
      ASSERT_EQ(job->dataset.files().size(), c.files);
      for (const planner::DatasetFile& f : job->dataset.files()) {
        // The files state.json lists, each with its record batches as
        // pyarrow's stream reader reads them.
        const std::string name = f.path.substr(f.path.rfind('/') + 1);
        EXPECT_EQ(f.path, kData + "/saved/" + folder + "/" + name);
        ASSERT_TRUE(f.parquet.has_value());
        std::vector<uint64_t> batches;
        uint64_t fetched = 0;  // a batch's message once, whatever the fields
        for (const planner::ParquetFile::RowGroup& g : f.parquet->row_groups) {
          batches.push_back(g.rows);
          fetched += g.chunk_bytes;
        }
        EXPECT_EQ(batches, doc["batches"][folder][name].get<std::vector<uint64_t>>()) << name;
        EXPECT_LE(fetched, f.parquet->stored_size) << name;
        EXPECT_GT(fetched, f.parquet->stored_size / 2) << name;
      }
      const int64_t steps = 2 * static_cast<int64_t>(expected.size()) / spec.batch.global_batch_size + 1;
      ExpectStepsMatch(*job, LoadAll(*job, steps), expected, c.names, 1);
    }
  }
  // The Arrow files named directly (a glob), without state.json.
  planner::JobSpec spec = SavedSpec(kData + "/saved/tokens/train/*.arrow", "", HubTokenFields(), 2);
  spec.batch.global_batch_size = 2;
  auto job = Resolve(spec);
  ASSERT_OK(job);
  EXPECT_EQ(job->samples, 50u);
  ExpectStepsMatch(*job, LoadAll(*job, 25), SavedExpected("tokens", "train"), kHubTokenNames, 1);
}

TEST(SavedDataset, ADatasetItCannotReadIsAnErrorNamingTheFileAndWhatItHas) {
  auto error = [](const std::string& uri, const std::string& split) {
    auto job = Resolve(SavedSpec(uri, split, HubTokenFields(), 2));
    return job.ok() ? std::string("resolved") : job.status().ToString();
  };
  const std::string tokens = kData + "/saved/tokens";
  EXPECT_THAT(error(tokens, ""), AllOf(HasSubstr(tokens), HasSubstr("is a DatasetDict of splits train, test"),
                                       HasSubstr("spec.dataset.split")));
  EXPECT_THAT(error(tokens, "validation"),
              AllOf(HasSubstr("has no split validation (dataset_dict.json lists train, test)")));
  EXPECT_THAT(error(kData + "/saved/images", "train"), HasSubstr("has no dataset_dict.json"));
  TempDir dir;
  std::filesystem::copy(tokens, dir.path(), std::filesystem::copy_options::recursive);
  // A file state.json lists is missing.
  std::filesystem::remove(dir.path() + "/train/data-00001-of-00003.arrow");
  EXPECT_THAT(error(dir.path(), "train"), AllOf(HasSubstr(dir.path() + "/train/data-00001-of-00003.arrow"),
                                                HasSubstr("is listed by state.json's _data_files, and is not there")));
  // A damaged state.json names its key.
  { std::ofstream(dir.path() + "/test/state.json") << R"({"_data_files": [{"filename": "../x.arrow"}]})"; }
  EXPECT_THAT(error(dir.path(), "test"), AllOf(HasSubstr(dir.path() + "/test/state.json: _data_files[0].filename"),
                                               HasSubstr("is not a file of the dataset's folder")));
  // A truncated Arrow file names the byte where its message ends early.
  const std::string a = kData + "/saved/tokens/test/data-00000-of-00001.arrow";
  const std::string bytes = Slurp(a);
  TempDir cut;
  { std::ofstream(cut.path() + "/data.arrow", std::ios::binary) << bytes.substr(0, bytes.size() - 200); }
  EXPECT_THAT(error(cut.path(), ""), AllOf(HasSubstr(cut.path() + "/data.arrow@"), HasSubstr("passes the file's end")));
  // A file that is not Arrow IPC.
  { std::ofstream(cut.path() + "/data.arrow", std::ios::binary) << "PAR1 not an arrow stream at all"; }
  EXPECT_THAT(error(cut.path(), ""), AllOf(HasSubstr(cut.path() + "/data.arrow@0"), HasSubstr("metadata length")));
  // A column of a type meshload does not deliver is refused by name.
  std::vector<planner::DatasetField> fields = HubTokenFields();
  fields[0].name = "nope";
  auto job = Resolve(SavedSpec(tokens, "test", fields, 2));
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().ToString(),
              AllOf(HasSubstr("has no column nope"), HasSubstr("input_ids: list<item: int32>")));
}

// The same files served over HTTP as an object store serves them (ranged
// GETs; no listing, so a folder is an MDS dataset's index.json or a saved
// DatasetDict's JSON files, and files are brace ranges): every format's
// fields are its reader's, on 4 processes and after a resize to 8, over two
// epochs.
TEST(RecordFormatsOverHttp, EveryFieldIsTheReadersOnFourAndEightProcesses) {
  source::testing::TestHttpServer server;
  std::deque<std::string> served;  // the handlers keep pointers into it
  for (const char* dir : {"webdataset", "mds/raw", "mds/zstd", "tfrecord", "tfrecord/gzip", "parquet", "saved/tokens",
                          "saved/tokens/test"}) {
    for (const auto& e : std::filesystem::directory_iterator(kData + "/" + dir)) {
      if (!e.is_regular_file()) continue;
      const std::string name = std::string("/") + dir + "/" + e.path().filename().string();
      served.push_back(Slurp(e.path().string()));
      const std::string* bytes = &served.back();
      server.Get(name, [bytes](const httplib::Request& req, httplib::Response& res) {
        source::testing::ServeBytes(*bytes, req, res);
      });
    }
  }
  server.Start();
  const std::vector<planner::DatasetField> mds_fields = {
      {"image", std::nullopt}, {"label", formats::DType::kInt64}, {"tokens", formats::DType::kInt32}};
  struct Case {
    DatasetFormat format;
    std::string uri;
    std::vector<planner::DatasetField> fields;
    std::vector<std::string> names;
    Expected expected;
    planner::FileCompression compression = planner::FileCompression::kNone;
  };
  const std::vector<Case> cases = {
      {DatasetFormat::kWebDataset,
       server.Url("/webdataset/shard-{000000..000001}.tar"),
       {{"jpg", std::nullopt}, {"cls", formats::DType::kInt64}},
       {"jpg", "cls"},
       WebDatasetExpected({"shard-000000", "shard-000001"})},
      {DatasetFormat::kMDS, server.Url("/mds/raw/"), mds_fields, {"image", "label", "tokens"}, MdsExpected("raw")},
      {DatasetFormat::kMDS, server.Url("/mds/zstd/"), mds_fields, {"image", "label", "tokens"}, MdsExpected("zstd")},
      {DatasetFormat::kTFRecord,
       server.Url("/tfrecord/part-{00000..00002}.tfrecord"),
       {{"image", std::nullopt},
        {"label", formats::DType::kInt64, {}, {}, true},
        {"input_ids", formats::DType::kInt64}},
       {"image", "label", "input_ids"},
       TfRecordExpected()},
      {DatasetFormat::kTFRecord,
       server.Url("/tfrecord/gzip/part-{00000..00002}.tfrecord.gz"),
       {{"image", std::nullopt}, {"label", formats::DType::kInt64, {}, {}, true}, {"box", formats::DType::kFloat32}},
       {"image", "label", "box"},
       TfRecordExpected(),
       planner::FileCompression::kGZIP},
      {DatasetFormat::kParquet, server.Url("/parquet/rg25-plain-zstd-v2.parquet"), ParquetFields(), kParquetNames,
       ParquetExpected(1)},
      // A DatasetDict's split: its files from dataset_dict.json and test/state.json.
      {DatasetFormat::kArrow, server.Url("/saved/tokens"), HubTokenFields(), kHubTokenNames,
       SavedExpected("tokens", "test")}};
  for (const Case& c : cases) {
    for (int64_t processes : {4, 8}) {
      SCOPED_TRACE(c.uri + " on " + std::to_string(processes) + " processes");
      auto spec = RecordSpec(c.format, c.uri, c.fields, processes, 1, Strategy::kPerProcess);
      spec.dataset.compression = c.compression;
      if (c.format == DatasetFormat::kArrow) spec.dataset.split = "test";
      // Parquet rows with a null column are left out (pyarrow's nulls).
      if (c.format == DatasetFormat::kParquet) spec.dataset.missing_field = planner::MissingFieldPolicy::kSkip;
      auto job = Resolve(spec);
      ASSERT_OK(job);
      ASSERT_EQ(job->samples, c.expected.size());
      const int64_t two_epochs = static_cast<int64_t>(2 * c.expected.size() / 8 + 1);
      ExpectStepsMatch(*job, LoadAll(*job, two_epochs), c.expected, c.names, 1);
    }
  }
  EXPECT_GT(server.requests(), 0);
}

}  // namespace
}  // namespace meshload::sidecar
