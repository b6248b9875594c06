// The dataset's facts gathered through the storage sources
// (sidecar/source/dataset_facts.h) for local files: directories, globs and
// file:// URIs, sizes that are not whole records or tokens, .npy headers read
// without the data (source::ReadNpyHeader), and a job resolved with them.
// The same path serves http(s) (http_source_test.cc) and s3
// (s3_source_test.cc, tests/s3/s3_run_test.sh).
#include "sidecar/source/dataset_facts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/npy_bytes.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/sidecar/source/test_support.h"

namespace meshload::sidecar::source {
namespace {

using meshload::testing::NpyWrap;
using meshload::testing::StatusIs;
using meshload::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

planner::DatasetSpec Fixed(const std::string& uri, int64_t record_bytes) {
  planner::DatasetSpec s;
  s.uri = uri;
  s.format = planner::DatasetFormat::kFixedRecord;
  s.record_bytes = record_bytes;
  return s;
}

std::string NpyFile(formats::DType t, const std::vector<uint64_t>& shape, uint64_t data_bytes) {
  auto h = formats::MakeNpyHeader(t, shape);
  EXPECT_OK(h);
  return *h + std::string(data_bytes, '\x01');
}

Result<planner::DatasetIndex> Index(const planner::DatasetSpec& spec, Diagnostics& d) {
  auto sources = SourceRegistry::WithBuiltins({});
  return IndexDataset(spec, *sources, d);
}

// The header of a local file through the file source.
Result<formats::NpyHeader> ReadNpyHeader(const std::string& path) {
  auto file = MakeFileSource({});
  EXPECT_OK(file);
  MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo info, (*file)->Stat(path));
  return source::ReadNpyHeader(**file, path, info.size);
}

TEST(IndexDataset, DirectoryFilesFormOneDatasetInLexicographicOrder) {
  TempDir dir;
  dir.Write("part-10.bin", std::string(3 * 16, 'c'));
  dir.Write("part-02.bin", std::string(2 * 16, 'b'));
  dir.Write("part-01.bin", std::string(1 * 16, 'a'));
  dir.Write(".hidden", "x");
  Diagnostics d;
  auto idx = Index(Fixed(dir.path(), 16), d);
  ASSERT_OK(idx);
  ASSERT_OK(d);
  ASSERT_EQ(idx->files().size(), 3u);
  EXPECT_THAT(idx->files()[0].path, HasSubstr("part-01"));
  EXPECT_THAT(idx->files()[2].path, HasSubstr("part-10"));
  EXPECT_EQ(idx->num_samples(), 6u);
  std::vector<planner::Extent> ex;
  idx->AppendExtents(2, ex);  // the second sample of part-02
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].file, 1u);
  EXPECT_EQ(ex[0].offset, 16u);
  EXPECT_EQ(ex[0].length, 16u);
}

TEST(IndexDataset, GlobsAndFileUris) {
  TempDir dir;
  dir.Write("b.rec", std::string(8, 'b'));
  dir.Write("a.rec", std::string(8, 'a'));
  dir.Write("z.txt", "ignored by the glob");
  Diagnostics d;
  auto idx = Index(Fixed("file://" + dir.path() + "/*.rec", 4), d);
  ASSERT_OK(idx);
  EXPECT_EQ(idx->num_samples(), 4u);
  EXPECT_THAT(idx->files()[0].path, HasSubstr("a.rec"));
  auto none = Index(Fixed(dir.path() + "/*.nothing", 4), d);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().location(), dir.path() + "/*.nothing");
}

TEST(IndexDataset, AFileThatIsNotWholeRecordsIsNamed) {
  TempDir dir;
  std::string f = dir.Write("odd.bin", std::string(100, 'x'));
  Diagnostics d;
  auto idx = Index(Fixed(f, 64), d);
  ASSERT_EQ(d.problems().size(), 1u);
  EXPECT_EQ(d.problems()[0].path, f);
  EXPECT_THAT(d.problems()[0].message,
              HasSubstr("size 100 is not a whole number of 64-byte records (1 records and 36 bytes left over)"));
}

TEST(IndexDataset, TokenStreamSamplesSpanFiles) {
  TempDir dir;
  dir.Write("0.tok", std::string(2 * 6, 'a'));  // 6 tokens
  dir.Write("1.tok", std::string(2 * 5, 'b'));  // 5 tokens: 11 in all
  planner::DatasetSpec s;
  s.uri = dir.path();
  s.format = planner::DatasetFormat::kTokenStream;
  s.dtype = formats::DType::kUint16;
  s.sequence_length = 4;  // sample i = tokens [4i, 4i+5): N = floor(10/4) = 2
  Diagnostics d;
  auto idx = Index(s, d);
  ASSERT_OK(idx);
  EXPECT_EQ(idx->num_samples(), 2u);
  EXPECT_EQ(idx->sample_bytes(), 10u);
  std::vector<planner::Extent> ex;
  idx->AppendExtents(1, ex);  // tokens 4..8: 2 in file 0, 3 in file 1
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].file, 0u);
  EXPECT_EQ(ex[0].offset, 8u);
  EXPECT_EQ(ex[0].length, 4u);
  EXPECT_EQ(ex[1].file, 1u);
  EXPECT_EQ(ex[1].offset, 0u);
  EXPECT_EQ(ex[1].length, 6u);
}

TEST(IndexDataset, TokenFileWithAPartialToken) {
  TempDir dir;
  std::string f = dir.Write("t.bin", std::string(7, 'a'));
  planner::DatasetSpec s;
  s.uri = f;
  s.format = planner::DatasetFormat::kTokenStream;
  s.dtype = formats::DType::kUint32;
  s.sequence_length = 1;
  Diagnostics d;
  (void)Index(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.problems()[0].message, HasSubstr("not a whole number of uint32 tokens"));
}

TEST(IndexDataset, NpyFilesMustAgreeAndMatchTheirHeaders) {
  TempDir dir;
  dir.Write("a.npy", NpyFile(formats::DType::kFloat32, {3, 4}, 3 * 4 * 4));
  dir.Write("b.npy", NpyFile(formats::DType::kFloat32, {2, 4}, 2 * 4 * 4));
  planner::DatasetSpec s;
  s.uri = dir.path();
  s.format = planner::DatasetFormat::kNpy;
  Diagnostics d;
  auto idx = Index(s, d);
  ASSERT_OK(idx);
  ASSERT_OK(d);
  EXPECT_EQ(idx->num_samples(), 5u);
  EXPECT_EQ(idx->sample_bytes(), 16u);
  EXPECT_EQ(idx->dtype(), formats::DType::kFloat32);
  std::vector<planner::Extent> ex;
  idx->AppendExtents(4, ex);
  EXPECT_EQ(ex[0].file, 1u);
  EXPECT_EQ(ex[0].offset, idx->files()[1].data_offset + 16);

  // A different trailing shape, a truncated file, and a dtype that contradicts the spec.
  std::string c = dir.Write("c.npy", NpyFile(formats::DType::kFloat32, {2, 5}, 2 * 5 * 4));
  std::string t = dir.Write("d.npy", NpyFile(formats::DType::kFloat32, {2, 4}, 10));
  s.dtype = formats::DType::kFloat64;
  Diagnostics d2;
  (void)Index(s, d2);
  std::string all = d2.ToString();
  EXPECT_THAT(all, HasSubstr(c + ": holds samples of shape (5,)"));
  EXPECT_THAT(all, HasSubstr(t + ": size"));
  EXPECT_THAT(all, HasSubstr("(truncated)"));
  EXPECT_THAT(all, HasSubstr("but spec.dataset.dtype is float64"));
}

TEST(IndexDataset, AMalformedNpyHeaderIsAnErrorNamingTheFile) {
  TempDir dir;
  std::string f = dir.Write("bad.npy", "\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'");
  planner::DatasetSpec s;
  s.uri = f;
  s.format = planner::DatasetFormat::kNpy;
  Diagnostics d;
  (void)Index(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.problems()[0].path.rfind(f, 0), 0u) << d.ToString();
}

TEST(IndexDataset, DeclaredSampleCountMustMatchTheFiles) {
  TempDir dir;
  std::string f = dir.Write("r.bin", std::string(40, 'x'));
  planner::DatasetSpec s = Fixed(f, 4);
  s.samples = 11;
  Diagnostics d;
  (void)Index(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.dataset.samples: says 11 but the files at"));
}

TEST(IndexDataset, MissingDataIsNotFoundAndAnUnknownSchemeIsNamed) {
  Diagnostics d;
  auto r = Index(Fixed("/no/such/dir/data.bin", 4), d);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().location(), "/no/such/dir/data.bin");
  auto gs = Index(Fixed("gs://bucket/x", 4), d);
  EXPECT_THAT(gs, StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown URI scheme \"gs\"")));
}

TEST(ReadNpyHeader, ReadsTheHeaderAndNeverTheData) {
  TempDir dir;
  std::string path =
      dir.Write("a.npy", *formats::MakeNpyHeader(formats::DType::kInt64, {2, 3, 4}) + std::string(192, '\0'));
  Result<formats::NpyHeader> h = ReadNpyHeader(path);
  ASSERT_OK(h);
  EXPECT_EQ(h->dtype, formats::DType::kInt64);
  EXPECT_EQ(h->shape, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(h->data_offset, 128u);
  EXPECT_EQ(h->data_bytes, 192u);
  // The shape claims 8 GiB that is not there: sizing the file is the index's job.
  path = dir.Write("header_only.npy", *formats::MakeNpyHeader(formats::DType::kUint16, {1 << 16, 1 << 16}));
  h = ReadNpyHeader(path);
  ASSERT_OK(h);
  EXPECT_EQ(h->data_bytes, uint64_t{1} << 33);
}

TEST(ReadNpyHeader, VersionsTwoAndThreeTinyAndLongHeaders) {
  TempDir dir;
  const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }";
  Result<formats::NpyHeader> h = ReadNpyHeader(dir.Write("v3.npy", NpyWrap(3, dict + "\n") + std::string(48, '\0')));
  ASSERT_OK(h);
  EXPECT_EQ(h->major_version, 3);
  h = ReadNpyHeader(dir.Write("tiny.npy", NpyWrap(1, "{'descr':'|u1','fortran_order':False,'shape':()}\n")));
  ASSERT_OK(h);
  EXPECT_EQ(h->element_count, 1u);
  // Longer than version 1's 65535 limit: the second, header-sized read.
  const std::string long_dict = dict + std::string(70000, ' ');
  h = ReadNpyHeader(dir.Write("long.npy", NpyWrap(2, long_dict + "\n") + std::string(48, '\0')));
  ASSERT_OK(h);
  EXPECT_EQ(h->data_offset, 12 + long_dict.size() + 1);
  EXPECT_EQ(h->data_bytes, 48u);
}

TEST(ReadNpyHeader, ErrorsNameTheFileAndTheByteOffset) {
  TempDir dir;
  std::string path =
      dir.Write("fortran.npy",
                NpyWrap(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }\n") + std::string(48, '\0'));
  Result<formats::NpyHeader> h = ReadNpyHeader(path);
  EXPECT_THAT(h, StatusIs(StatusCode::kInvalidArgument, HasSubstr("fortran_order must be False")));
  EXPECT_EQ(h.status().location(), path + "@44");
  path = dir.Write("text.npy", "hello, world\n");
  h = ReadNpyHeader(path);
  EXPECT_THAT(h.status().message(), HasSubstr("not an .npy file"));
  EXPECT_EQ(h.status().location(), path + "@0");
  const std::string full = *formats::MakeNpyHeader(formats::DType::kUint16, {1000, 2049});
  path = dir.Write("cut.npy", full.substr(0, 70));
  h = ReadNpyHeader(path);
  EXPECT_THAT(h, StatusIs(StatusCode::kDataLoss, HasSubstr("truncated: header needs 128 bytes, have 70")));
  EXPECT_EQ(h.status().location(), path + "@70");
  path = dir.Write("empty.npy", "");
  EXPECT_EQ(ReadNpyHeader(path).status().location(), path + "@0");
  EXPECT_EQ(ReadNpyHeader(dir.path() + "/missing.npy").status().code(), StatusCode::kNotFound);
}

// MegatronIndexed on files megatron-core's IndexedDatasetBuilder wrote
// (tests/formats/data/megatron/): the URI is the prefix, either file of
// the pair, or a directory holding pairs.
const std::string kMegatron = MESHLOAD_FORMATS_DATA "/megatron/";

planner::DatasetSpec Megatron(const std::string& uri) {
  planner::DatasetSpec s;
  s.uri = uri;
  s.format = planner::DatasetFormat::kMegatronIndexed;
  return s;
}

std::string SlurpFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(IndexDataset, AMegatronPrefixIsOneSamplePerSequenceOfItsOwnSize) {
  const nlohmann::json expected = nlohmann::json::parse(SlurpFile(kMegatron + "tokens_uint16.expected.json"));
  for (const std::string& uri : {kMegatron + "tokens_uint16", kMegatron + "tokens_uint16.idx",
                                 kMegatron + "tokens_uint16.bin", "file://" + kMegatron + "tokens_uint16"}) {
    Diagnostics d;
    auto index = Index(Megatron(uri), d);
    ASSERT_OK(index) << uri << ": " << d.ToString();
    EXPECT_TRUE(d.ok()) << d.ToString();
    const auto& sequences = expected["sequences"];
    ASSERT_EQ(index->num_samples(), sequences.size()) << uri;
    EXPECT_TRUE(index->variable_size());
    EXPECT_EQ(index->dtype(), formats::DType::kUint16);
    EXPECT_EQ(index->sample_bytes(), 0u);
    ASSERT_EQ(index->files().size(), 1u);
    EXPECT_EQ(index->files()[0].path, kMegatron + "tokens_uint16.bin");
    uint64_t total = 0, largest = 0, smallest = UINT64_MAX;
    for (uint64_t i = 0; i < index->num_samples(); ++i) {
      const uint64_t bytes = sequences[i].size() * 2;
      ASSERT_EQ(index->SampleBytes(i), bytes) << "sample " << i;
      std::vector<planner::Extent> e;
      index->AppendExtents(i, e);
      ASSERT_EQ(e.size(), 1u);
      EXPECT_EQ(e[0].length, bytes);
      total += bytes;
      largest = std::max(largest, bytes);
      smallest = std::min(smallest, bytes);
    }
    EXPECT_EQ(index->max_sample_bytes(), largest);
    EXPECT_EQ(index->min_sample_bytes(), smallest);
    EXPECT_DOUBLE_EQ(index->mean_sample_bytes(), static_cast<double>(total) / static_cast<double>(sequences.size()));
    EXPECT_EQ(index->LargestBytes(index->num_samples()), total);
    EXPECT_EQ(index->LargestBytes(1), largest);
  }
}

TEST(IndexDataset, MegatronSequencesAreReadAsTheirBytesAndNeighboursCoalesce) {
  Diagnostics d;
  auto index = Index(Megatron(kMegatron + "tokens_int32"), d);
  ASSERT_OK(index) << d.ToString();
  const std::string bin = SlurpFile(kMegatron + "tokens_int32.bin");
  // Every sequence, in any order: one range covering the whole file.
  std::vector<uint64_t> ids;
  for (uint64_t i = index->num_samples(); i-- > 0;) ids.push_back(i);
  std::vector<planner::Extent> ranges;
  EXPECT_EQ(index->CoalescedExtents(ids, ranges), bin.size());
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].offset, 0u);
  // Two sequences with a non-empty one between them: two ranges, of
  // exactly their bytes (empty sequences take no bytes, so they do not
  // separate their neighbours).
  std::vector<uint64_t> non_empty;
  for (uint64_t i = 0; i < index->num_samples(); ++i) {
    if (index->SampleBytes(i) > 0) non_empty.push_back(i);
  }
  ASSERT_GE(non_empty.size(), 3u);
  const uint64_t a = non_empty[0], b = non_empty[2];
  ids = {b, a};
  EXPECT_EQ(index->CoalescedExtents(ids, ranges), index->SampleBytes(a) + index->SampleBytes(b));
  EXPECT_EQ(ranges.size(), 2u);
  EXPECT_EQ(index->BytesOf(ids.data(), ids.size()), index->SampleBytes(a) + index->SampleBytes(b));
}

TEST(IndexDataset, AMegatronDirectoryIsItsPairsInNameOrderAndAnUnpairedFileIsNamed) {
  TempDir dir;
  for (const char* ext : {".idx", ".bin"}) {
    dir.Write(std::string("b") + ext, SlurpFile(kMegatron + "tokens_uint16" + ext));
    dir.Write(std::string("a") + ext, SlurpFile(kMegatron + "small_uint8" + ext));
  }
  dir.Write("README.md", "not part of the dataset");
  Diagnostics d;
  auto mixed = Index(Megatron(dir.path()), d);
  EXPECT_FALSE(d.ok());
  EXPECT_THAT(d.ToString(),
              AllOf(HasSubstr("b.idx@17: holds uint16 elements, but " + dir.path() + "/a.bin holds uint8"),
                    HasSubstr("every file of a dataset must agree")));
  // Same dtype: a.* is now uint16 too.
  for (const char* ext : {".idx", ".bin"})
    dir.Write(std::string("a") + ext, SlurpFile(kMegatron + "tokens_uint16" + ext));
  Diagnostics ok;
  auto index = Index(Megatron(dir.path()), ok);
  ASSERT_OK(index) << ok.ToString();
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  ASSERT_EQ(index->files().size(), 2u);
  EXPECT_EQ(index->files()[0].path, dir.path() + "/a.bin");
  EXPECT_EQ(index->files()[1].first, index->files()[0].count);
  EXPECT_EQ(index->num_samples(), 2 * index->files()[0].count);
  std::vector<planner::Extent> e;
  index->AppendExtents(index->files()[0].count + 5, e);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].file, 1u);
  EXPECT_EQ(e[0].length, index->SampleBytes(5));

  dir.Write("c.bin", "orphan");
  dir.Write("d.idx", SlurpFile(kMegatron + "small_uint8.idx"));
  Diagnostics unpaired;
  EXPECT_FALSE(Index(Megatron(dir.path()), unpaired).ok() && unpaired.ok());
  EXPECT_THAT(unpaired.ToString(), AllOf(HasSubstr(dir.path() + "/c.bin: has no " + dir.path() + "/c.idx beside it"),
                                         HasSubstr(dir.path() + "/d.idx: has no " + dir.path() + "/d.bin beside it")));
}

TEST(IndexDataset, ADamagedMegatronDatasetIsAnErrorNamingTheFileAndByte) {
  TempDir dir;
  std::string idx = SlurpFile(kMegatron + "tokens_uint16.idx");
  const std::string bin = SlurpFile(kMegatron + "tokens_uint16.bin");
  dir.Write("t.idx", idx);
  dir.Write("t.bin", bin.substr(0, bin.size() - 2));  // the last sequence runs past the data
  Diagnostics d;
  EXPECT_FALSE(Index(Megatron(dir.path() + "/t"), d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr(dir.path() + "/t.bin"));
  dir.Write("t.bin", bin);
  dir.Write("t.idx", idx.substr(0, 40));
  Diagnostics truncated;
  EXPECT_FALSE(Index(Megatron(dir.path() + "/t"), truncated).ok());
  EXPECT_THAT(truncated.ToString(), HasSubstr(dir.path() + "/t.idx@"));
  dir.Write("t.idx", idx);
  planner::DatasetSpec wrong = Megatron(dir.path() + "/t");
  wrong.dtype = formats::DType::kInt32;
  Diagnostics dtype;
  EXPECT_FALSE(Index(wrong, dtype).ok() && dtype.ok());
  EXPECT_THAT(dtype.ToString(), HasSubstr(dir.path() + "/t.idx@17: the index says its dtype is uint16 but "
                                                       "spec.dataset.dtype is int32"));
  Diagnostics none;
  EXPECT_THAT(Index(Megatron(dir.path() + "/nothing"), none).status().code(), StatusCode::kNotFound);
}

TEST(ResolveWithSources, LocalFilesAreIndexedAndUnreachableDataFallsBackOnlyWhenAsked) {
  TempDir dir;
  dir.Write("r.bin", std::string(64 * 16, 'x'));
  planner::JobSpec spec;
  spec.mesh.processes = 1;
  spec.mesh.devices_per_process = 1;
  spec.mesh.axes = {{"data", 1}};
  spec.dataset = Fixed(dir.path(), 16);
  spec.batch.global_batch_size = 8;
  auto sources = SourceRegistry::WithBuiltins({});
  Diagnostics d;
  auto job = ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {}, Unreachable::kFail, d);
  ASSERT_OK(job) << d.ToString() << job.status().ToString();
  EXPECT_TRUE(job->dataset.indexed());
  EXPECT_EQ(job->samples, 64u);

  spec.dataset.uri = dir.path() + "/elsewhere";
  spec.dataset.samples = 80;
  Diagnostics planned;
  auto virtual_job = ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {},
                                        Unreachable::kUseDeclaredSamples, planned);
  ASSERT_OK(virtual_job) << planned.ToString();
  EXPECT_FALSE(virtual_job->dataset.indexed());
  EXPECT_EQ(virtual_job->samples, 80u);
  Diagnostics failed;
  EXPECT_FALSE(
      ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {}, Unreachable::kFail, failed).ok());
  EXPECT_THAT(failed.ToString(), HasSubstr("spec.dataset.uri"));
}

// Declared samples stand in for data that cannot be reached from here, never
// for data that was read and is wrong: a damaged Megatron index or an MDS
// index with an encoding meshload does not read is an error (as the sidecar
// will find it), named by its file and byte, without advice to declare a
// size that would not fix it.
TEST(ResolveWithSources, DataThatWasReadAndIsWrongIsAnErrorEvenWithDeclaredSamples) {
  TempDir dir;
  const std::string src = std::string(MESHLOAD_FORMATS_DATA) + "/megatron/tokens_uint16";
  std::ifstream idx_in(src + ".idx", std::ios::binary), bin_in(src + ".bin", std::ios::binary);
  std::string idx((std::istreambuf_iterator<char>(idx_in)), {}), bin((std::istreambuf_iterator<char>(bin_in)), {});
  idx.replace(0, 4, "XXXX");
  dir.Write("d.idx", idx);
  dir.Write("d.bin", bin);
  planner::JobSpec spec;
  spec.mesh.processes = 1;
  spec.mesh.devices_per_process = 1;
  spec.mesh.axes = {{"data", 1}};
  spec.dataset = Megatron(dir.path() + "/d");
  spec.dataset.samples = 40;
  spec.batch.global_batch_size = 4;
  auto sources = SourceRegistry::WithBuiltins({});
  Diagnostics d;
  auto job =
      ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {}, Unreachable::kUseDeclaredSamples, d);
  EXPECT_FALSE(job.ok()) << "a damaged index was planned from the declared samples";
  EXPECT_THAT(d.ToString(), HasSubstr(dir.path() + "/d.idx@0: not a Megatron indexed dataset index"));
  EXPECT_THAT(d.ToString(), ::testing::Not(HasSubstr("make the data reachable")));

  // An MDS column of an encoding meshload does not read: the index.json names it.
  TempDir mds;
  const std::string raw = std::string(MESHLOAD_FORMATS_DATA) + "/mds/raw";
  for (const auto& e : std::filesystem::directory_iterator(raw)) {
    std::filesystem::copy_file(e.path(), mds.path() + "/" + e.path().filename().string());
  }
  std::ifstream in(mds.path() + "/index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  index["shards"][0]["column_encodings"][0] = "bogus";
  std::ofstream(mds.path() + "/index.json") << index.dump();
  planner::JobSpec m = spec;
  m.dataset = planner::DatasetSpec{};
  m.dataset.uri = mds.path();
  m.dataset.format = planner::DatasetFormat::kMDS;
  m.dataset.fields = {planner::DatasetField{"label", formats::DType::kInt64}};
  m.dataset.samples = 10;
  Diagnostics md;
  EXPECT_FALSE(
      ResolveWithSources(meshload::testing::MustValidate(m), *sources, {}, Unreachable::kUseDeclaredSamples, md).ok());
  EXPECT_THAT(md.ToString(), HasSubstr(mds.path() + "/index.json: shards[0].column_encodings[0]: unknown MDS "
                                                    "encoding 'bogus'"));
  EXPECT_THAT(md.ToString(), ::testing::Not(HasSubstr("spec.dataset.uri")));
  EXPECT_THAT(md.ToString(), ::testing::Not(HasSubstr("make the data reachable")));
}

TEST(ResolveWithSources, AMixtureDatasetThatCannotBeReadIsToldToDeclareItsOwnSamples) {
  TempDir dir;
  dir.Write("a/r.bin", std::string(64 * 16, 'x'));
  planner::JobSpec spec;
  spec.mesh.processes = 1;
  spec.mesh.devices_per_process = 1;
  spec.mesh.axes = {{"data", 1}};
  spec.dataset = Fixed(dir.path(), 16);
  spec.batch.global_batch_size = 8;
  planner::MixtureSpec mix;
  mix.datasets.resize(2);
  mix.datasets[0].name = "present";
  mix.datasets[0].uri = dir.path() + "/a";
  mix.datasets[0].weight = 1;
  mix.datasets[1].name = "absent";
  mix.datasets[1].uri = dir.path() + "/b";
  mix.datasets[1].weight = 1;
  spec.mixture = mix;
  auto sources = SourceRegistry::WithBuiltins({});
  Diagnostics d;
  auto job =
      ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {}, Unreachable::kUseDeclaredSamples, d);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.mixture.datasets[1].uri"));
  EXPECT_THAT(d.ToString(), HasSubstr("give its size with spec.mixture.datasets[1].samples"));
  // A mixture refuses both of these: no hint may name them.
  EXPECT_THAT(d.ToString(), ::testing::Not(HasSubstr("spec.dataset.samples")));
  EXPECT_THAT(d.ToString(), ::testing::Not(HasSubstr("--samples")));
}

// A mixture's remote datasets are indexed at once: the server answers the
// first dataset only once the second one has been asked for (else, after
// 5 s, 404), which one dataset after the other never does.
TEST(ResolveWithSources, AMixturesRemoteDatasetsAreIndexedAtOnce) {
  const std::string a(64 * 16, 'a'), b(64 * 16, 'b');
  std::mutex mu;
  std::condition_variable asked;
  bool b_asked = false;
  testing::TestHttpServer server;
  server.Get("/a.bin", [&](const httplib::Request& req, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu);
    if (!asked.wait_for(lock, std::chrono::seconds(5), [&] { return b_asked; })) {
      res.status = 404;
      return;
    }
    lock.unlock();
    testing::ServeBytes(a, req, res);
  });
  server.Get("/b.bin", [&](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      b_asked = true;
    }
    asked.notify_all();
    testing::ServeBytes(b, req, res);
  });
  server.Start();
  planner::JobSpec spec;
  spec.mesh.processes = 1;
  spec.mesh.devices_per_process = 1;
  spec.mesh.axes = {{"data", 1}};
  spec.dataset = Fixed(server.Url("/a.bin"), 16);
  spec.batch.global_batch_size = 8;
  planner::MixtureSpec mix;
  mix.datasets.resize(2);
  mix.datasets[0] = {"a", server.Url("/a.bin"), 1, std::nullopt};
  mix.datasets[1] = {"b", server.Url("/b.bin"), 1, std::nullopt};
  spec.mixture = mix;
  auto sources = SourceRegistry::WithBuiltins({});
  Diagnostics d;
  const auto start = std::chrono::steady_clock::now();
  auto job = ResolveWithSources(meshload::testing::MustValidate(spec), *sources, {}, Unreachable::kFail, d);
  ASSERT_OK(job) << d.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  ASSERT_EQ(job->dataset.parts().size(), 2u);
  EXPECT_EQ(job->dataset.parts()[0].name, "a");
  EXPECT_EQ(job->dataset.parts()[0].samples, 64u);
  EXPECT_EQ(job->dataset.parts()[1].name, "b");
  EXPECT_EQ(job->dataset.parts()[1].first, 64u);
}

// WebDataset and MDS through http(s): the same indexes as from the files,
// the shards named by a brace range of URLs, the MDS dataset by its folder
// URL (its index.json, then each shard's offset table by a ranged read).
TEST(IndexDataset, WebDatasetAndMdsOverHttpAreTheSameIndexesAsFromFiles) {
  const std::string data = MESHLOAD_FORMATS_DATA;
  testing::TestHttpServer server;
  std::vector<std::string> served;
  served.reserve(16);  // the handlers keep pointers into it
  for (const char* f :
       {"webdataset/shard-000000.tar", "webdataset/shard-000000.tar.idx", "webdataset/shard-000001.tar",
        "webdataset/shard-000001.tar.idx", "webdataset/shard-000002.tar", "mds/raw/index.json",
        "mds/raw/shard.00000.mds", "mds/raw/shard.00001.mds", "mds/raw/shard.00002.mds", "mds/raw/shard.00003.mds"}) {
    served.push_back(SlurpFile(data + "/" + f));
    const std::string* bytes = &served.back();
    server.Get(std::string("/") + f,
               [bytes](const httplib::Request& req, httplib::Response& res) { testing::ServeBytes(*bytes, req, res); });
  }
  server.Start();
  struct Case {
    planner::DatasetFormat format;
    std::string local, remote;
    uint64_t samples;
  };
  for (const Case& c : {Case{planner::DatasetFormat::kWebDataset, data + "/webdataset/shard-{000000..000001}.tar",
                             server.Url("/webdataset/shard-{000000..000001}.tar"), 21},
                        Case{planner::DatasetFormat::kMDS, data + "/mds/raw", server.Url("/mds/raw/"), 40}}) {
    planner::DatasetSpec spec;
    spec.format = c.format;
    spec.fields = {{c.format == planner::DatasetFormat::kMDS ? "image" : "jpg", std::nullopt}};
    Diagnostics d;
    spec.uri = c.local;
    auto local = Index(spec, d);
    ASSERT_OK(local) << d.ToString();
    spec.uri = c.remote;
    auto remote = Index(spec, d);
    ASSERT_OK(remote) << d.ToString();
    ASSERT_EQ(remote->num_samples(), c.samples);
    ASSERT_EQ(local->num_samples(), c.samples);
    std::vector<planner::Extent> a, b;
    for (uint64_t i = 0; i < c.samples; ++i) {
      a.clear();
      b.clear();
      local->AppendExtents(i, a);
      remote->AppendExtents(i, b);
      ASSERT_EQ(a.size(), 1u);
      ASSERT_EQ(b.size(), 1u);
      EXPECT_EQ(a[0].file, b[0].file);
      EXPECT_EQ(a[0].offset, b[0].offset);
      EXPECT_EQ(a[0].length, b[0].length) << "sample " << i;
    }
    EXPECT_THAT(remote->files()[0].path, HasSubstr("http://127.0.0.1:"));
  }
  // A shard served without its index is refused naming it and the command.
  planner::DatasetSpec spec;
  spec.format = planner::DatasetFormat::kWebDataset;
  spec.fields = {{"jpg", std::nullopt}};
  spec.uri = server.Url("/webdataset/shard-{000000..000002}.tar");
  Diagnostics d;
  auto missing = Index(spec, d);
  EXPECT_FALSE(missing.ok() && d.ok());
  EXPECT_THAT(d.ToString(), AllOf(HasSubstr("shard-000002.tar"), HasSubstr("meshload index")));
}

}  // namespace
}  // namespace meshload::sidecar::source
