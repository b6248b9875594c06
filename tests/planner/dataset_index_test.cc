#include "planner/dataset_index.h"

#include <gtest/gtest.h>

#include "planner/npy.h"
#include "tests/planner/test_util.h"

namespace meshload {
namespace {

using testing::TempDir;

DatasetSpec Fixed(const std::string& uri, int64_t record_bytes) {
  DatasetSpec s;
  s.uri = uri;
  s.format = DatasetFormat::kFixedRecord;
  s.record_bytes = record_bytes;
  return s;
}

std::string NpyFile(DType t, const std::vector<uint64_t>& shape, uint64_t data_bytes) {
  auto h = MakeNpyHeader(t, shape);
  EXPECT_TRUE(h.ok());
  return *h + std::string(data_bytes, '\x01');
}

TEST(DatasetIndex, DirectoryFilesFormOneDatasetInLexicographicOrder) {
  TempDir dir;
  dir.Write("part-10.bin", std::string(3 * 16, 'c'));
  dir.Write("part-02.bin", std::string(2 * 16, 'b'));
  dir.Write("part-01.bin", std::string(1 * 16, 'a'));
  dir.Write(".hidden", "x");
  Diagnostics d;
  auto idx = DatasetIndex::Build(Fixed(dir.path(), 16), d);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  ASSERT_TRUE(d.ok()) << d.ToString();
  ASSERT_EQ(idx->files().size(), 3u);
  EXPECT_NE(idx->files()[0].path.find("part-01"), std::string::npos);
  EXPECT_NE(idx->files()[2].path.find("part-10"), std::string::npos);
  EXPECT_EQ(idx->num_samples(), 6u);
  std::vector<Extent> ex;
  idx->AppendExtents(2, ex);  // the second sample of part-02
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].file, 1u);
  EXPECT_EQ(ex[0].offset, 16u);
  EXPECT_EQ(ex[0].length, 16u);
}

TEST(DatasetIndex, GlobsAndFileUris) {
  TempDir dir;
  dir.Write("b.rec", std::string(8, 'b'));
  dir.Write("a.rec", std::string(8, 'a'));
  dir.Write("z.txt", "ignored by the glob");
  Diagnostics d;
  auto idx = DatasetIndex::Build(Fixed("file://" + dir.path() + "/*.rec", 4), d);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(idx->num_samples(), 4u);
  EXPECT_NE(idx->files()[0].path.find("a.rec"), std::string::npos);
  auto none = DatasetIndex::Build(Fixed(dir.path() + "/*.nothing", 4), d);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().location(), dir.path() + "/*.nothing");
}

TEST(DatasetIndex, AFileThatIsNotWholeRecordsIsNamed) {
  TempDir dir;
  std::string f = dir.Write("odd.bin", std::string(100, 'x'));
  Diagnostics d;
  auto idx = DatasetIndex::Build(Fixed(f, 64), d);
  ASSERT_EQ(d.problems().size(), 1u);
  EXPECT_EQ(d.problems()[0].path, f);
  EXPECT_NE(d.problems()[0].message.find("size 100 is not a whole number of 64-byte records (1 records and 36 bytes left over)"),
            std::string::npos);
}

TEST(DatasetIndex, TokenStreamSamplesSpanFiles) {
  TempDir dir;
  dir.Write("0.tok", std::string(2 * 6, 'a'));  // 6 tokens
  dir.Write("1.tok", std::string(2 * 5, 'b'));  // 5 tokens: 11 in all
  DatasetSpec s;
  s.uri = dir.path();
  s.format = DatasetFormat::kTokenStream;
  s.dtype = DType::kUint16;
  s.sequence_length = 4;  // sample i = tokens [4i, 4i+5): N = floor(10/4) = 2
  Diagnostics d;
  auto idx = DatasetIndex::Build(s, d);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->num_samples(), 2u);
  EXPECT_EQ(idx->sample_bytes(), 10u);
  std::vector<Extent> ex;
  idx->AppendExtents(1, ex);  // tokens 4..8: 2 in file 0, 3 in file 1
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].file, 0u);
  EXPECT_EQ(ex[0].offset, 8u);
  EXPECT_EQ(ex[0].length, 4u);
  EXPECT_EQ(ex[1].file, 1u);
  EXPECT_EQ(ex[1].offset, 0u);
  EXPECT_EQ(ex[1].length, 6u);
}

TEST(DatasetIndex, TokenFileWithAPartialToken) {
  TempDir dir;
  std::string f = dir.Write("t.bin", std::string(7, 'a'));
  DatasetSpec s;
  s.uri = f;
  s.format = DatasetFormat::kTokenStream;
  s.dtype = DType::kUint32;
  s.sequence_length = 1;
  Diagnostics d;
  (void)DatasetIndex::Build(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.problems()[0].message.find("not a whole number of uint32 tokens"), std::string::npos);
}

TEST(DatasetIndex, NpyFilesMustAgreeAndMatchTheirHeaders) {
  TempDir dir;
  dir.Write("a.npy", NpyFile(DType::kFloat32, {3, 4}, 3 * 4 * 4));
  dir.Write("b.npy", NpyFile(DType::kFloat32, {2, 4}, 2 * 4 * 4));
  DatasetSpec s;
  s.uri = dir.path();
  s.format = DatasetFormat::kNpy;
  Diagnostics d;
  auto idx = DatasetIndex::Build(s, d);
  ASSERT_TRUE(idx.ok());
  ASSERT_TRUE(d.ok()) << d.ToString();
  EXPECT_EQ(idx->num_samples(), 5u);
  EXPECT_EQ(idx->sample_bytes(), 16u);
  EXPECT_EQ(idx->dtype(), DType::kFloat32);
  std::vector<Extent> ex;
  idx->AppendExtents(4, ex);
  EXPECT_EQ(ex[0].file, 1u);
  EXPECT_EQ(ex[0].offset, idx->files()[1].data_offset + 16);

  // A different trailing shape, a truncated file, and a dtype that contradicts the spec.
  std::string c = dir.Write("c.npy", NpyFile(DType::kFloat32, {2, 5}, 2 * 5 * 4));
  std::string t = dir.Write("d.npy", NpyFile(DType::kFloat32, {2, 4}, 10));
  s.dtype = DType::kFloat64;
  Diagnostics d2;
  (void)DatasetIndex::Build(s, d2);
  std::string all = d2.ToString();
  EXPECT_NE(all.find(c + ": holds samples of shape (5,)"), std::string::npos) << all;
  EXPECT_NE(all.find(t + ": size"), std::string::npos) << all;
  EXPECT_NE(all.find("(truncated)"), std::string::npos) << all;
  EXPECT_NE(all.find("but spec.dataset.dtype is float64"), std::string::npos) << all;
}

TEST(DatasetIndex, AMalformedNpyHeaderIsAnErrorNamingTheFile) {
  TempDir dir;
  std::string f = dir.Write("bad.npy", "\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'");
  DatasetSpec s;
  s.uri = f;
  s.format = DatasetFormat::kNpy;
  Diagnostics d;
  (void)DatasetIndex::Build(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.problems()[0].path.rfind(f, 0), 0u) << d.ToString();
}

TEST(DatasetIndex, DeclaredSampleCountMustMatchTheFiles) {
  TempDir dir;
  std::string f = dir.Write("r.bin", std::string(40, 'x'));
  DatasetSpec s = Fixed(f, 4);
  s.samples = 11;
  Diagnostics d;
  (void)DatasetIndex::Build(s, d);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.ToString().find("spec.dataset.samples: says 11 but the files at"), std::string::npos);
}

TEST(DatasetIndex, MissingDataIsNotFoundAndRemoteUrisAreNotListed) {
  Diagnostics d;
  auto r = DatasetIndex::Build(Fixed("/no/such/dir/data.bin", 4), d);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(DatasetIndex::IsLocalUri("https://example.com/d.bin"));
  EXPECT_FALSE(DatasetIndex::IsLocalUri("s3://bucket/d"));
  EXPECT_TRUE(DatasetIndex::IsLocalUri("file:///d"));
  EXPECT_EQ(DatasetIndex::Build(Fixed("s3://bucket/x", 4), d).status().code(), StatusCode::kUnavailable);
}

TEST(CoalesceExtents, MergesTouchingAndOverlappingRangesOfOneFileOnly) {
  std::vector<Extent> ex = {{0, 20, 10}, {0, 0, 10}, {0, 10, 10}, {1, 30, 5}, {0, 35, 5}, {0, 38, 4}};
  uint64_t total = CoalesceExtents(ex);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].offset, 0u);
  EXPECT_EQ(ex[0].length, 30u);
  EXPECT_EQ(ex[1].offset, 35u);
  EXPECT_EQ(ex[1].length, 7u);
  EXPECT_EQ(ex[2].file, 1u);
  EXPECT_EQ(total, 42u);
}

}  // namespace
}  // namespace meshload
