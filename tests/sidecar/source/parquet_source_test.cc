// Parquet files read as their rows' records (sidecar/source/parquet_source.h),
// over local files and HTTP, against what pyarrow's reader returns for each
// row of files pyarrow's writer made (tests/formats/data/parquet/).
#include "sidecar/source/parquet_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/formats/fixture_files.h"
#include "tests/sidecar/source/test_support.h"

namespace meshload::sidecar::source {
namespace {

using formats::fixtures::Hex;
using formats::fixtures::Slurp;

const std::string kDir = std::string(MESHLOAD_FORMATS_DATA) + "/parquet/";
const std::vector<std::string> kFields = {"input_ids", "text",        "label",      "score",  "flag",   "emb",
                                          "grid",      "image.bytes", "image.path", "digest", "big_ids"};
constexpr uint64_t kMaxBytes = 4096;  // what the job allows a ragged field's value

nlohmann::json Rows() { return nlohmann::json::parse(Slurp(kDir + "expected.json"))["rows"]; }

/// The File of object `name` of `inner`, its footer read through it.
ParquetRowSource::File FileOf(Source& inner, const std::string& name, uint64_t max_bytes = kMaxBytes) {
  ParquetRowSource::File f;
  f.stored_name = name;
  auto info = inner.Stat(name);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  std::string tail(std::min<uint64_t>(info->size, formats::kParquetTailBytes), '\0');
  EXPECT_TRUE(inner.Read(name, info->size - tail.size(), tail.data(), tail.size()).ok());
  auto place = formats::LocateParquetFooter(tail, info->size);
  EXPECT_TRUE(place.ok()) << place.status().ToString();
  auto footer = formats::ParquetFooter::Parse(
      std::string_view(tail).substr(tail.size() - formats::kParquetTrailerBytes - place->length, place->length),
      info->size);
  EXPECT_TRUE(footer.ok()) << footer.status().ToString();
  f.footer = std::make_shared<formats::ParquetFooter>(std::move(*footer));
  std::vector<uint64_t> rooms;
  for (const std::string& n : kFields) {
    auto field = f.footer->Field(n);
    EXPECT_TRUE(field.ok()) << field.status().ToString();
    rooms.push_back(field->ragged() ? max_bytes : field->row_bytes());
    f.fields.push_back(*field);
  }
  f.layout = formats::ParquetRecordLayout::Make(rooms);
  return f;
}

void ExpectRecord(const formats::ParquetRecordLayout& layout, std::string_view record, const nlohmann::json& want,
                  uint64_t row) {
  formats::FieldValues values;
  ASSERT_TRUE(formats::ParquetRecordValues(layout, record, values).ok()) << "row " << row;
  for (size_t f = 0; f < kFields.size(); ++f) {
    const nlohmann::json& w = want[kFields[f]];
    if (w.is_null()) {
      EXPECT_FALSE(values[f].has_value()) << "row " << row << " " << kFields[f];
    } else {
      ASSERT_TRUE(values[f].has_value()) << "row " << row << " " << kFields[f];
      EXPECT_EQ(Hex(*values[f]), w.get<std::string>()) << "row " << row << " " << kFields[f];
    }
  }
}

TEST(ParquetRowSource, EveryRowReadAsItsRecordIsWhatPyarrowReadsInAnyOrderAndCut) {
  const nlohmann::json rows = Rows();
  auto inner = MakeFileSource({});
  ASSERT_TRUE(inner.ok());
  for (const std::string name : {"rg7-dict-snappy.parquet", "rg25-plain-zstd-v2.parquet", "rg1000-gzip.parquet"}) {
    SCOPED_TRACE(name);
    ParquetRowSource src(**inner, 64 << 20);
    const std::string path = kDir + name;
    src.Add("rows:" + name, FileOf(**inner, path));
    const ParquetRowSource::File f = FileOf(**inner, path);
    const uint64_t R = f.layout.bytes;
    auto info = src.Stat("rows:" + name);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->size, 60 * R);
    // All rows in one read.
    std::string all(60 * R, '\0');
    ASSERT_TRUE(src.Read("rows:" + name, 0, all.data(), all.size()).ok());
    for (uint64_t r = 0; r < 60; ++r) ExpectRecord(f.layout, std::string_view(all).substr(r * R, R), rows[r], r);
    // Rows one at a time in a shuffled order.
    std::vector<uint64_t> order(60);
    for (uint64_t r = 0; r < 60; ++r) order[r] = r;
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    for (uint64_t r : order) {
      std::string one(R, '\0');
      ASSERT_TRUE(src.Read("rows:" + name, r * R, one.data(), R).ok());
      ExpectRecord(f.layout, one, rows[r], r);
    }
    // A read from the middle of a record, cut into uneven buffers.
    const uint64_t from = 5 * R + 3, len = 9 * R - 10;
    std::string cut(len, '\0');
    std::vector<iovec> iov;
    for (uint64_t at = 0, k = 1; at < len; k = k * 3 + 1) {
      const uint64_t n = std::min<uint64_t>(k, len - at);
      iov.push_back({cut.data() + at, static_cast<size_t>(n)});
      at += n;
    }
    ASSERT_TRUE(src.ReadV("rows:" + name, from, iov).ok());
    // The records it holds whole (6 to 12), and the first one's length word
    // of its second field (the bytes a record leaves unused are unspecified).
    for (uint64_t r = 6; r < 13; ++r) {
      ExpectRecord(f.layout, std::string_view(cut).substr(r * R - from, R), rows[r], r);
    }
    EXPECT_TRUE(cut.substr(f.layout.at[1] - 3, 4) == all.substr(5 * R + f.layout.at[1], 4));
    // Each row group decoded once (the bound holds them all), and only the
    // fields' column chunks read.
    EXPECT_EQ(src.decodes(), f.footer->row_groups().size());
    uint64_t chunks = 0;
    for (const formats::ParquetRowGroup& g : f.footer->row_groups()) {
      for (const formats::ParquetField& field : f.fields) chunks += g.columns[field.leaves[0]].bytes;
    }
    EXPECT_EQ(src.chunk_bytes_read(), chunks);
    // Other objects read through.
    std::string head(4, '\0');
    ASSERT_TRUE(src.Read(path, 0, head.data(), 4).ok());
    EXPECT_EQ(head, "PAR1");
  }
}

TEST(ParquetRowSource, OverHttpTheRowsAreTheSame) {
  const nlohmann::json rows = Rows();
  const std::string bytes = Slurp(kDir + "rg25-plain-zstd-v2.parquet");
  testing::TestHttpServer server;
  server.Get("/d/a.parquet",
             [&](const httplib::Request& req, httplib::Response& res) { testing::ServeBytes(bytes, req, res); });
  server.Start();
  auto inner = MakeHttpSource(testing::FastOptions(nullptr));
  ASSERT_TRUE(inner.ok());
  const std::string url = server.Url("/d/a.parquet");
  ParquetRowSource src(**inner, 64 << 20);
  const ParquetRowSource::File f = FileOf(**inner, url);
  src.Add("rows", FileOf(**inner, url));
  const uint64_t R = f.layout.bytes;
  std::string all(60 * R, '\0');
  ASSERT_TRUE(src.Read("rows", 0, all.data(), all.size()).ok());
  for (uint64_t r = 0; r < 60; ++r) ExpectRecord(f.layout, std::string_view(all).substr(r * R, R), rows[r], r);
  EXPECT_TRUE(src.LatencyBound());
}

TEST(ParquetRowSource, RowGroupsPastTheBoundAreDecodedAgainAndConcurrentReadsDecodeOnce) {
  auto inner = MakeFileSource({});
  ASSERT_TRUE(inner.ok());
  const std::string path = kDir + "rg7-dict-snappy.parquet";
  const ParquetRowSource::File f = FileOf(**inner, path);
  const uint64_t R = f.layout.bytes;
  {
    // A bound of nothing keeps only the group being read.
    ParquetRowSource src(**inner, 0);
    src.Add("rows", FileOf(**inner, path));
    std::string one(R, '\0');
    for (uint64_t r : {0, 1, 7, 8, 0}) ASSERT_TRUE(src.Read("rows", r * R, one.data(), R).ok());
    EXPECT_EQ(src.decodes(), 3u);  // group 0, group 1, group 0 again
  }
  ParquetRowSource src(**inner, 64 << 20);
  src.Add("rows", FileOf(**inner, path));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::string all(60 * R, '\0');
      if (!src.Read("rows", 0, all.data(), all.size()).ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(src.decodes(), f.footer->row_groups().size());
}

TEST(ParquetRowSource, AValueLongerThanItsFieldAllowsNamesTheFileRowAndField) {
  auto inner = MakeFileSource({});
  ASSERT_TRUE(inner.ok());
  const std::string path = kDir + "rg7-dict-snappy.parquet";
  ParquetRowSource src(**inner, 64 << 20);
  const ParquetRowSource::File f = FileOf(**inner, path, 64);
  src.Add("rows", f);
  // Row 0's input_ids hold more than 16 int32 tokens.
  std::string one(f.layout.bytes, '\0');
  Status st = src.Read("rows", 0, one.data(), one.size());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(st.location(), path);
  EXPECT_NE(st.message().find("row 0 (row group 0): field input_ids holds a value of "), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("more than the 64 its field allows (spec.dataset.fields[0].maxBytes)"), std::string::npos)
      << st.ToString();
  // Past the last row.
  st = src.Read("rows", 60 * f.layout.bytes - 1, one.data(), 2);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
}

TEST(ParquetRowSource, ACorruptColumnChunkNamesTheFileRowGroupAndColumn) {
  const std::string dir = ::testing::TempDir() + "/parquet_source_corrupt";
  std::filesystem::create_directories(dir);
  std::string bytes = Slurp(kDir + "rg25-plain-zstd-v2.parquet");
  auto inner = MakeFileSource({});
  ASSERT_TRUE(inner.ok());
  const ParquetRowSource::File good = FileOf(**inner, kDir + "rg25-plain-zstd-v2.parquet");
  const formats::ParquetColumnChunk& c = good.footer->row_groups()[1].columns[good.fields[1].leaves[0]];
  for (uint64_t at = c.offset + c.bytes / 2; at < c.offset + c.bytes; ++at) bytes[at] = static_cast<char>(~bytes[at]);
  const std::string path = dir + "/bad.parquet";
  { std::ofstream(path, std::ios::binary) << bytes; }
  ParquetRowSource src(**inner, 64 << 20);
  src.Add("rows", FileOf(**inner, path));
  std::string one(good.layout.bytes, '\0');
  ASSERT_TRUE(src.Read("rows", 0, one.data(), one.size()).ok());  // row group 0 is intact
  Status st = src.Read("rows", 30 * good.layout.bytes, one.data(), one.size());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.location(), path + ": row group 1") << st.ToString();
  EXPECT_NE(st.message().find("column text does not decode"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace meshload::sidecar::source
