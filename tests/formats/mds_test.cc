// The MDS parsers against datasets MosaicML Streaming's MDSWriter wrote
// (tests/formats/data/mds/, made by write_mds_fixtures.py): every sample's
// bytes and every column's bytes meshload finds are what Streaming's own
// reader returned, and each way a real index or shard can be damaged is an
// error naming the field or the byte.

#include "formats/mds.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/formats/fixture_files.h"
#include "tests/testing/status_matchers.h"

namespace meshload::formats {
namespace {

using fixtures::Hex;
using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kData = MESHLOAD_FORMATS_DATA "/mds/";

TEST(MdsWrittenByStreaming, EverySampleAndColumnIsWhatStreamingsReaderReturns) {
  auto shards = ParseMdsIndex(Slurp(kData + "raw/index.json"), "raw/index.json");
  ASSERT_OK(shards);
  const nlohmann::json expected = nlohmann::json::parse(Slurp(kData + "raw/expected.json"));
  ASSERT_EQ(shards->size(), expected["shards"].size());
  ASSERT_GT(shards->size(), 1u) << "the fixture is meant to span shards";
  uint64_t total = 0;
  for (size_t s = 0; s < shards->size(); ++s) {
    const MdsShard& shard = (*shards)[s];
    EXPECT_TRUE(shard.compression.empty());
    ASSERT_EQ(shard.columns.size(), 6u);
    EXPECT_EQ(shard.columns[0].name, "box");  // sorted by name, as MDSWriter writes them
    EXPECT_EQ(shard.columns[0].size, 8u);
    EXPECT_FALSE(shard.columns[5].size);  // tokens: a variable-shape ndarray
    const std::string file = Slurp(kData + "raw/" + shard.basename);
    ASSERT_EQ(file.size(), shard.bytes);
    auto offsets = ParseMdsShardHead(std::string_view(file).substr(0, MdsShardHeadBytes(shard.samples)), shard);
    ASSERT_OK(offsets);
    const auto& rows = expected["shards"][s];
    ASSERT_EQ(rows.size(), shard.samples);
    for (uint64_t i = 0; i < shard.samples; ++i) {
      const std::string_view sample = std::string_view(file).substr((*offsets)[i], (*offsets)[i + 1] - (*offsets)[i]);
      EXPECT_EQ(Hex(sample), rows[i]["raw"].get<std::string>()) << "shard " << s << " sample " << i;
      auto fields = ParseMdsSample(sample, shard, (*offsets)[i]);
      ASSERT_OK(fields);
      for (size_t c = 0; c < shard.columns.size(); ++c) {
        EXPECT_EQ(Hex(sample.substr((*fields)[c].offset, (*fields)[c].size)),
                  rows[i]["columns"][shard.columns[c].name].get<std::string>())
            << "shard " << s << " sample " << i << " column " << shard.columns[c].name;
      }
    }
    total += shard.samples;
  }
  EXPECT_EQ(total, 40u);
}

TEST(MdsWrittenByStreaming, CompressedShardsSayTheirCompressionAndFile) {
  auto shards = ParseMdsIndex(Slurp(kData + "zstd/index.json"), "zstd/index.json");
  ASSERT_OK(shards);
  for (const MdsShard& s : *shards) {
    EXPECT_EQ(s.compression, "zstd");
    EXPECT_EQ(s.zip_basename, s.basename + ".zstd");
    EXPECT_EQ(Slurp(kData + "zstd/" + s.zip_basename).size(), s.zip_bytes);
  }
}

// The real index with one thing changed.
class DamagedMdsIndex : public ::testing::Test {
 protected:
  std::string Parse(const nlohmann::json& j) { return ParseMdsIndex(j.dump(), "index.json").status().ToString(); }
  nlohmann::json good_ = nlohmann::json::parse(Slurp(kData + "raw/index.json"));
};

TEST_F(DamagedMdsIndex, EachBrokenFieldIsNamedByItsPath) {
  EXPECT_THAT(ParseMdsIndex("{nope", "index.json").status().ToString(), HasSubstr("index.json: not JSON"));
  nlohmann::json j = good_;
  j["version"] = 1;
  EXPECT_THAT(Parse(j), HasSubstr("index.json: version: MDS index version 1; version 2 is read"));
  j = good_;
  j["shards"][1]["column_encodings"][1] = "foo";
  EXPECT_THAT(Parse(j), HasSubstr("shards[1].column_encodings[1]: unknown MDS encoding 'foo' (column 'image')"));
  j = good_;
  j["shards"][0]["column_sizes"][2] = 4;  // label is an int: 8 bytes
  EXPECT_THAT(Parse(j), HasSubstr("shards[0].column_sizes[2]: 4 for encoding 'int', which is 8 bytes"));
  j = good_;
  j["shards"][0]["column_sizes"][1] = 3;  // image is bytes: variable
  EXPECT_THAT(Parse(j), HasSubstr("shards[0].column_sizes[1]: 3 for encoding 'bytes', which is variable"));
  j = good_;
  j["shards"][0]["column_names"].erase(0);
  EXPECT_THAT(Parse(j), HasSubstr("differ in length (5, 6, 6)"));
  j = good_;
  j["shards"][2]["raw_data"]["basename"] = "../../etc/passwd";
  EXPECT_THAT(Parse(j), HasSubstr("shards[2].raw_data.basename: '../../etc/passwd' is not a file in the dataset's"));
  j = good_;
  j["shards"][0]["format"] = "xsv";
  EXPECT_THAT(Parse(j), HasSubstr("shards[0].format: 'xsv'; meshload reads MDS shards"));
  j = good_;
  j["shards"][0]["compression"] = "zstd";
  EXPECT_THAT(Parse(j), HasSubstr("shards[0].zip_data: a compressed shard without its file"));
  j = good_;
  j["shards"][0].erase("samples");
  EXPECT_THAT(Parse(j), HasSubstr("shards[0].samples: missing"));
}

class DamagedMdsShard : public ::testing::Test {
 protected:
  void SetUp() override {
    auto shards = ParseMdsIndex(Slurp(kData + "raw/index.json"), "index.json");
    ASSERT_OK(shards);
    shard_ = (*shards)[0];
    file_ = Slurp(kData + "raw/" + shard_.basename);
  }
  std::string Head(const std::string& f) { return ParseMdsShardHead(f, shard_).status().ToString(); }
  MdsShard shard_;
  std::string file_;
};

TEST_F(DamagedMdsShard, AHeadThatDisagreesWithTheIndexNamesItsByte) {
  std::string b = file_;
  b[0] = static_cast<char>(b[0] + 1);
  EXPECT_THAT(Head(b), AllOf(HasSubstr(shard_.basename + "@0: "), HasSubstr("the index says")));
  b = file_;
  ASSERT_GT(shard_.samples, 1u);
  std::memcpy(&b[12], &b[4], 4);  // sample 2 starts where sample 0 does, before sample 1
  EXPECT_THAT(Head(b), AllOf(HasSubstr(shard_.basename + "@12: "), HasSubstr("(the one before)")));
  b = file_;
  const uint32_t zero = 0;
  std::memcpy(&b[4], &zero, 4);
  EXPECT_THAT(Head(b), AllOf(HasSubstr("@4: "), HasSubstr("(the end of the offsets)")));
  MdsShard longer = shard_;
  longer.bytes += 1;
  EXPECT_THAT(ParseMdsShardHead(file_, longer).status().ToString(), HasSubstr("but the shard has"));
  EXPECT_THAT(Head(file_.substr(0, 6)), HasSubstr("cut short"));
  MdsShard huge = shard_;
  huge.samples = uint64_t{1} << 40;
  EXPECT_THAT(ParseMdsShardHead(file_, huge).status().ToString(), HasSubstr("whose offsets alone take"));
}

TEST_F(DamagedMdsShard, ASampleCutShortOrWithBytesLeftOverNamesItsByte) {
  auto offsets = ParseMdsShardHead(file_, shard_);
  ASSERT_OK(offsets);
  const std::string_view s0 = std::string_view(file_).substr((*offsets)[0], (*offsets)[1] - (*offsets)[0]);
  ASSERT_OK(ParseMdsSample(s0, shard_, (*offsets)[0]));
  EXPECT_THAT(ParseMdsSample(s0.substr(0, s0.size() - 1), shard_, (*offsets)[0]).status().ToString(),
              AllOf(HasSubstr(shard_.basename + "@"), HasSubstr("bytes but the sample has")));
  EXPECT_THAT(ParseMdsSample(s0.substr(0, 2), shard_, (*offsets)[0]).status().ToString(),
              HasSubstr("the sample ends in the size of column"));
  EXPECT_THAT(ParseMdsSample(std::string(s0) + "zz", shard_, (*offsets)[0]).status().ToString(),
              HasSubstr("2 bytes after the sample's last column"));
}

TEST(MdsEncodings, StreamingsNamesAreKnownAndOthersAreNot) {
  for (const char* e : {"bytes", "str", "int", "ndarray", "ndarray:int32", "ndarray:uint16:4", "float16", "str_int",
                        "jpeg", "list[png]", "pkl", "json", "jpegarray"}) {
    EXPECT_TRUE(IsMdsEncoding(e)) << e;
  }
  for (const char* e : {"foo", "bytes:x", "", "Int", "ndarrays"}) EXPECT_FALSE(IsMdsEncoding(e)) << e;
  EXPECT_EQ(MdsScalarSize("int"), 8u);
  EXPECT_EQ(MdsScalarSize("float16"), 2u);
  EXPECT_FALSE(MdsScalarSize("bytes"));
  EXPECT_FALSE(MdsScalarSize("ndarray:uint16:4"));
}

}  // namespace
}  // namespace meshload::formats
