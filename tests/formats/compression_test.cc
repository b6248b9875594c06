// Decompression of MDS shards written by Streaming's MDSWriter with each
// codec it offers (tests/formats/data/mds/<codec>/): every sample of the
// decompressed shard is the bytes Streaming's own reader returned for it
// (expected.json); heads decode from pieces of any size; corrupt,
// truncated and mis-sized data are errors that name the byte offset.
#include "formats/compression.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "formats/mds.h"
#include "tests/formats/fixture_files.h"
#include "tests/testing/status_matchers.h"

namespace meshload::formats {
namespace {

using fixtures::Hex;
using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kMds = std::string(MESHLOAD_FORMATS_DATA) + "/mds/";

std::string Decompressed(Codec codec, const std::string& in, uint64_t size) {
  std::string out(size, '\0');
  EXPECT_OK(Decompress(codec, reinterpret_cast<const uint8_t*>(in.data()), in.size(),
                       reinterpret_cast<uint8_t*>(out.data()), out.size()));
  return out;
}

Status DecompressStatus(Codec codec, const std::string& in, uint64_t size) {
  std::string out(size, '\0');
  return Decompress(codec, reinterpret_cast<const uint8_t*>(in.data()), in.size(),
                    reinterpret_cast<uint8_t*>(out.data()), out.size());
}

class EachCodec : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = kMds + GetParam() + "/";
    auto shards = ParseMdsIndex(Slurp(dir_ + "index.json"), "index.json");
    ASSERT_OK(shards);
    shards_ = *shards;
    expected_ = Json::parse(Slurp(dir_ + "expected.json"));
  }
  std::string dir_;
  std::vector<MdsShard> shards_;
  Json expected_;
};

TEST_P(EachCodec, EverySampleOfEveryShardIsWhatStreamingReads) {
  uint64_t samples = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const MdsShard& shard = shards_[s];
    SCOPED_TRACE(shard.zip_basename);
    ASSERT_FALSE(shard.compression.empty());
    auto codec = ParseCompression(shard.compression);
    ASSERT_OK(codec);
    EXPECT_EQ(CodecName(*codec), GetParam());
    const std::string zip = Slurp(dir_ + shard.zip_basename);
    ASSERT_EQ(zip.size(), shard.zip_bytes);
    const std::string raw = Decompressed(*codec, zip, shard.bytes);
    auto offsets = ParseMdsShardHead(raw.substr(0, MdsShardHeadBytes(shard.samples)), shard);
    ASSERT_OK(offsets);
    const Json& rows = expected_["shards"][s];
    ASSERT_EQ(rows.size(), shard.samples);
    for (uint64_t i = 0; i < shard.samples; ++i) {
      EXPECT_EQ(Hex(std::string_view(raw).substr((*offsets)[i], (*offsets)[i + 1] - (*offsets)[i])),
                rows[i]["raw"].get<std::string>())
          << "sample " << i;
      ++samples;
    }
  }
  EXPECT_EQ(samples, 40u);
}

TEST_P(EachCodec, AHeadDecodesFromPiecesOfAnySize) {
  const MdsShard& shard = shards_[0];
  auto codec = ParseCompression(shard.compression);
  ASSERT_OK(codec);
  const std::string zip = Slurp(dir_ + shard.zip_basename);
  const std::string raw = Decompressed(*codec, zip, shard.bytes);
  const uint64_t want = MdsShardHeadBytes(shard.samples);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, zip.size()}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece));
    auto d = PrefixDecoder::Make(*codec);
    ASSERT_OK(d);
    std::string out;
    bool done = false;
    for (size_t at = 0; at < zip.size() && !done; at += piece) {
      const std::string_view in = std::string_view(zip).substr(at, piece);
      ASSERT_OK((*d)->Feed(in, at + in.size() == zip.size(), want, out, done));
    }
    EXPECT_TRUE(done);
    EXPECT_EQ(out, raw.substr(0, want));
  }
  // Asking for more than the file holds gives the whole file.
  auto d = PrefixDecoder::Make(*codec);
  ASSERT_OK(d);
  std::string out;
  bool done = false;
  ASSERT_OK((*d)->Feed(zip, true, raw.size() + 100, out, done));
  EXPECT_TRUE(done);
  EXPECT_EQ(out, raw);
}

TEST_P(EachCodec, CorruptTruncatedAndMisSizedDataAreErrorsNamingTheOffset) {
  const MdsShard& shard = shards_[0];
  auto codec = ParseCompression(shard.compression);
  ASSERT_OK(codec);
  const std::string zip = Slurp(dir_ + shard.zip_basename);

  const Status truncated = DecompressStatus(*codec, zip.substr(0, zip.size() - 9), shard.bytes);
  EXPECT_EQ(truncated.code(), StatusCode::kDataLoss) << truncated.ToString();
  EXPECT_THAT(truncated.ToString(), AllOf(HasSubstr("corrupt " + GetParam()), HasSubstr("@")));

  // Bytes in the middle of the stream overwritten: the codec's checks (a
  // frame, block or stream checksum, or the stream's structure) or the
  // size the index gives catch it.
  std::string damaged = zip;
  for (size_t i = zip.size() / 2; i < zip.size() / 2 + 16; ++i) damaged[i] = static_cast<char>(damaged[i] ^ 0x5a);
  std::string out(shard.bytes, '\0');
  const Status st = Decompress(*codec, reinterpret_cast<const uint8_t*>(damaged.data()), damaged.size(),
                               reinterpret_cast<uint8_t*>(out.data()), out.size());
  if (st.ok()) {
    // A codec without a checksum (raw snappy, brotli) can decode damaged
    // literals to bytes of the right length: they differ from the raw shard.
    EXPECT_NE(out, Decompressed(*codec, zip, shard.bytes));
  } else {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_THAT(st.ToString(), HasSubstr("@"));
  }

  EXPECT_THAT(DecompressStatus(*codec, zip, shard.bytes + 1).ToString(),
              HasSubstr("not the " + std::to_string(shard.bytes + 1) + " the index gives"));
  EXPECT_THAT(DecompressStatus(*codec, zip, shard.bytes - 1).ToString(),
              HasSubstr("more than the " + std::to_string(shard.bytes - 1) + " bytes the index gives"));
  EXPECT_EQ(DecompressStatus(*codec, "", shard.bytes).code(), StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(Streaming, EachCodec, ::testing::Values("zstd", "gz", "bz2", "br", "snappy"),
                         [](const auto& info) { return info.param; });

TEST(Compression, NamesAreMdsNamesWithOrWithoutALevel) {
  EXPECT_EQ(*ParseCompression("zstd"), Codec::kZstd);
  EXPECT_EQ(*ParseCompression("zstd:19"), Codec::kZstd);
  EXPECT_EQ(*ParseCompression("gz:9"), Codec::kGzip);
  EXPECT_EQ(*ParseCompression("bz2"), Codec::kBzip2);
  EXPECT_EQ(*ParseCompression("br:11"), Codec::kBrotli);
  EXPECT_EQ(*ParseCompression("snappy"), Codec::kSnappy);
  auto lz4 = ParseCompression("lz4:3");
  ASSERT_FALSE(lz4.ok());
  EXPECT_EQ(lz4.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(lz4.status().ToString(), AllOf(HasSubstr("'lz4:3'"), HasSubstr("br, bz2, gz, snappy, zlib, zstd")));
}

TEST(Compression, TrailingBytesAfterTheStreamAreAnError) {
  const std::string zip = Slurp(kMds + "gz/shard.00000.mds.gz");
  auto shards = ParseMdsIndex(Slurp(kMds + "gz/index.json"), "index.json");
  ASSERT_OK(shards);
  // A second gzip member is data (gzip's multi-member form); junk is not.
  const Status junk = DecompressStatus(Codec::kGzip, zip + "junk", (*shards)[0].bytes);
  EXPECT_EQ(junk.code(), StatusCode::kDataLoss) << junk.ToString();
  std::string twice(2 * (*shards)[0].bytes, '\0');
  EXPECT_OK(Decompress(Codec::kGzip, reinterpret_cast<const uint8_t*>((zip + zip).data()), 2 * zip.size(),
                       reinterpret_cast<uint8_t*>(twice.data()), twice.size()));
}

}  // namespace
}  // namespace meshload::formats
