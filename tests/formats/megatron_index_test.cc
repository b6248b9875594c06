// The Megatron index parser against files Megatron-LM wrote
// (tests/formats/data/megatron/, made by write_megatron_fixtures.py with
// megatron-core's IndexedDatasetBuilder): every sequence meshload finds
// equals what Megatron's own IndexedDataset returned for it, and each way
// a real file can be damaged is an error naming the file and the byte.

#include "formats/megatron_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/formats/fixture_files.h"
#include "tests/testing/status_matchers.h"

namespace meshload::formats {
namespace {

using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::StatusIs;

const std::string kData = MESHLOAD_FORMATS_DATA "/megatron/";

// Element `k` of sequence `i` of `bin`, as the number Megatron's reader gave.
double Element(const MegatronIndex& index, const std::string& bin, uint64_t i, uint64_t k) {
  const char* p = bin.data() + index.pointers[i] + k * index.dtype.bytes;
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  };
  const std::string_view n = index.dtype.name;
  if (n == "uint8") return load(uint8_t{});
  if (n == "int8") return load(int8_t{});
  if (n == "int16") return load(int16_t{});
  if (n == "uint16") return load(uint16_t{});
  if (n == "int32") return load(int32_t{});
  if (n == "int64") return load(int64_t{});
  if (n == "float32") return load(float{});
  return load(double{});
}

class MegatronFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(MegatronFixture, EverySequenceIsWhatMegatronsReaderReturns) {
  const std::string prefix = kData + GetParam();
  const std::string idx = Slurp(prefix + ".idx"), bin = Slurp(prefix + ".bin");
  const nlohmann::json expected = nlohmann::json::parse(Slurp(prefix + ".expected.json"));
  auto index = ParseMegatronIndex(idx, GetParam() + ".idx");
  ASSERT_OK(index);
  EXPECT_EQ(index->dtype.name, expected["dtype"].get<std::string>());
  EXPECT_EQ(index->document_indices, expected["document_indices"].get<std::vector<int64_t>>());
  EXPECT_EQ(index->documents(), expected["document_indices"].size() - 1);
  EXPECT_OK(CheckMegatronData(*index, GetParam() + ".bin", bin.size()));
  EXPECT_EQ(index->data_bytes_needed, bin.size());
  const auto& sequences = expected["sequences"];
  ASSERT_EQ(index->sequences(), sequences.size());
  for (uint64_t i = 0; i < index->sequences(); ++i) {
    ASSERT_EQ(static_cast<uint64_t>(index->lengths[i]), sequences[i].size()) << "sequence " << i;
    EXPECT_EQ(index->SequenceBytes(i), sequences[i].size() * index->dtype.bytes);
    for (uint64_t k = 0; k < sequences[i].size(); ++k) {
      ASSERT_EQ(Element(*index, bin, i, k), sequences[i][k].get<double>()) << "sequence " << i << " element " << k;
    }
  }
}

// meshload's generator writes indexes with MegatronIndexBytes: for every
// index Megatron wrote, it gives back the very same bytes.
TEST_P(MegatronFixture, WritingTheParsedIndexGivesMegatronsBytesBack) {
  const std::string idx = Slurp(kData + GetParam() + ".idx");
  auto index = ParseMegatronIndex(idx, GetParam() + ".idx");
  ASSERT_OK(index);
  EXPECT_EQ(fixtures::Hex(MegatronIndexBytes(*index)), fixtures::Hex(idx));
  MegatronDType dt;
  ASSERT_TRUE(MegatronDTypeFor(ToDType(index->dtype), dt));
  EXPECT_EQ(dt.code, index->dtype.code);
}

INSTANTIATE_TEST_SUITE_P(WrittenByMegatron, MegatronFixture,
                         ::testing::Values("tokens_uint16", "tokens_int32", "small_uint8", "small_int8", "small_int16",
                                           "small_int64", "small_float32", "small_float64"));

// A real index with one thing changed.
class DamagedMegatronIndex : public ::testing::Test {
 protected:
  Status Parse(const std::string& bytes) { return ParseMegatronIndex(bytes, "d.idx").status(); }
  std::string good_ = Slurp(kData + "tokens_uint16.idx");
};

TEST_F(DamagedMegatronIndex, WrongMagicVersionAndDTypeCodeNameTheirByte) {
  std::string b = good_;
  b[3] = 'X';
  EXPECT_THAT(Parse(b), StatusIs(StatusCode::kInvalidArgument, HasSubstr("not a Megatron indexed dataset index")));
  EXPECT_EQ(Parse(b).ToString().rfind("d.idx@0: ", 0), 0u) << Parse(b).ToString();
  b = good_;
  b[9] = 2;
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("d.idx@9: "), HasSubstr("version 2; only version 1")));
  b = good_;
  b[17] = 9;
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("d.idx@17: "), HasSubstr("unknown dtype code 9")));
  b = good_;
  b[17] = 0;
  EXPECT_THAT(Parse(b).ToString(), HasSubstr("unknown dtype code 0"));
}

TEST_F(DamagedMegatronIndex, ATruncatedIndexAtAnyLengthIsAnErrorNeverACrash) {
  for (size_t n = 0; n < good_.size(); ++n) {
    Status s = Parse(good_.substr(0, n));
    ASSERT_FALSE(s.ok()) << "accepted the first " << n << " bytes";
    EXPECT_THAT(s.ToString(), HasSubstr("d.idx@")) << n;
  }
  EXPECT_THAT(Parse(good_.substr(0, 20)).ToString(), HasSubstr("d.idx@20: a Megatron index is at least 34 bytes"));
}

TEST_F(DamagedMegatronIndex, CountsLargerThanTheFileAreRefusedBeforeAnythingIsSized) {
  std::string b = good_;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&b[18], &huge, 8);
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("d.idx@34: sequence lengths"), HasSubstr("do not fit")));
  b = good_;
  std::memcpy(&b[26], &huge, 8);
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("document indices"), HasSubstr("a truncated index?")));
}

TEST_F(DamagedMegatronIndex, BytesAfterTheDocumentIndicesAndAMultimodalIndexAreRefused) {
  EXPECT_THAT(Parse(good_ + "xyz").ToString(), HasSubstr("3 bytes after the document indices"));
  auto multimodal = ParseMegatronIndex(Slurp(kData + "multimodal.idx"), "multimodal.idx");
  EXPECT_THAT(multimodal.status(), StatusIs(StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("a multimodal index"), HasSubstr("text datasets only"))));
}

TEST_F(DamagedMegatronIndex, NegativeLengthsBadPointersAndDocumentIndicesNameTheEntry) {
  auto index = ParseMegatronIndex(good_, "d.idx");
  ASSERT_OK(index);
  const uint64_t s = index->sequences(), lengths_at = 34, pointers_at = 34 + 4 * s, docs_at = pointers_at + 8 * s;
  std::string b = good_;
  const int32_t minus = -5;
  std::memcpy(&b[lengths_at + 4 * 3], &minus, 4);
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("d.idx@" + std::to_string(lengths_at + 12) + ": "),
                                         HasSubstr("sequence 3 has a negative length (-5)")));
  uint64_t nonempty = 0;  // a sequence with bytes: one that cannot end past INT64_MAX
  while (index->lengths[nonempty] == 0) ++nonempty;
  b = good_;
  const int64_t far = INT64_MAX - 1;
  std::memcpy(&b[pointers_at + 8 * nonempty], &far, 8);
  EXPECT_THAT(Parse(b).ToString(), HasSubstr("sequence " + std::to_string(nonempty) + " starts at byte"));
  b = good_;
  const int64_t negative = -8;
  std::memcpy(&b[pointers_at], &negative, 8);
  EXPECT_THAT(Parse(b).ToString(), AllOf(HasSubstr("d.idx@" + std::to_string(pointers_at) + ": "),
                                         HasSubstr("sequence 0 starts at byte -8")));
  b = good_;
  const int64_t one = 1;
  std::memcpy(&b[docs_at], &one, 8);
  EXPECT_THAT(Parse(b).ToString(),
              AllOf(HasSubstr("d.idx@" + std::to_string(docs_at) + ": "), HasSubstr("document index 0 is 1")));
  b = good_;
  const int64_t short_of_the_end = static_cast<int64_t>(s) - 1;
  std::memcpy(&b[good_.size() - 8], &short_of_the_end, 8);
  EXPECT_THAT(Parse(b).ToString(), HasSubstr("not the sequence count"));
}

TEST(MegatronData, AnIndexThatPointsPastTheDataFileNamesTheSequence) {
  const std::string idx = Slurp(kData + "tokens_uint16.idx"), bin = Slurp(kData + "tokens_uint16.bin");
  auto index = ParseMegatronIndex(idx, "t.idx");
  ASSERT_OK(index);
  EXPECT_OK(CheckMegatronData(*index, "t.bin", bin.size()));
  Status s = CheckMegatronData(*index, "t.bin", bin.size() - 1);
  EXPECT_THAT(s.ToString(), AllOf(HasSubstr("t.bin: sequence "), HasSubstr("the index points past the data")));
}

TEST(MegatronDType, OnlyMegatronsEightTypesHaveACode) {
  for (DType t : {DType::kUint8, DType::kInt8, DType::kInt16, DType::kUint16, DType::kInt32, DType::kInt64,
                  DType::kFloat32, DType::kFloat64}) {
    EXPECT_TRUE(IsMegatronDType(t)) << DTypeName(t);
  }
  for (DType t : {DType::kBool, DType::kUint32, DType::kUint64, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_FALSE(IsMegatronDType(t)) << DTypeName(t);
  }
}

TEST(MegatronDType, EveryCodeHasItsNameAndWidth) {
  const std::pair<uint8_t, std::pair<std::string_view, uint32_t>> want[] = {
      {1, {"uint8", 1}}, {2, {"int8", 1}},    {3, {"int16", 2}},   {4, {"int32", 4}},
      {5, {"int64", 8}}, {6, {"float64", 8}}, {7, {"float32", 4}}, {8, {"uint16", 2}}};
  for (const auto& [code, nb] : want) {
    MegatronDType d;
    ASSERT_TRUE(MegatronDTypeOf(code, d)) << int(code);
    EXPECT_EQ(d.name, nb.first);
    EXPECT_EQ(d.bytes, nb.second);
  }
  MegatronDType d;
  EXPECT_FALSE(MegatronDTypeOf(0, d));
  EXPECT_FALSE(MegatronDTypeOf(9, d));
}

}  // namespace
}  // namespace meshload::formats
