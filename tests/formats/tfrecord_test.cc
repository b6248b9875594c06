// TFRecord files written by TensorFlow's TFRecordWriter
// (tests/formats/data/tfrecord/): the DALI index tfrecord2idx wrote, the
// frames, the CRCs and every feature of every Example against what a second
// reader returned (expected.json); damaged indexes and records are errors
// naming the file and byte.
#include "formats/tfrecord.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/compression.h"
#include "tests/formats/fixture_files.h"
#include "tests/testing/status_matchers.h"

namespace meshload::formats {
namespace {

using fixtures::Hex;
using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kDir = std::string(MESHLOAD_FORMATS_DATA) + "/tfrecord/";

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // Every length and alignment gives what a byte at a time gives.
  std::string bytes(100, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 37 + 11);
  for (size_t at = 0; at < 9; ++at) {
    for (size_t n = 0; n + at <= bytes.size(); n += 7) {
      uint32_t crc = ~0u;
      for (size_t i = 0; i < n; ++i) {
        crc ^= static_cast<uint8_t>(bytes[at + i]);
        for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
      }
      EXPECT_EQ(Crc32c(bytes.data() + at, n), ~crc) << at << "+" << n;
    }
  }
}

// Long inputs run in three lanes that are joined at the end (8 KiB lanes,
// then 256-byte ones, then the rest): every length around those bounds,
// against a byte at a time.
TEST(Crc32c, ThreeLanesJoinToOneRegister) {
  std::string bytes(3 * 8192 * 2 + 3 * 256 * 2 + 64, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (char& ch : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ch = static_cast<char>(x);
  }
  auto bitwise = [&](size_t at, size_t n) {
    uint32_t crc = ~0u;
    for (size_t i = 0; i < n; ++i) {
      crc ^= static_cast<uint8_t>(bytes[at + i]);
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
    }
    return ~crc;
  };
  for (size_t base : {size_t{3 * 256}, size_t{3 * 8192}, size_t{2 * 3 * 8192}, size_t{3 * 8192 + 3 * 256}}) {
    for (size_t n = base - 9; n <= base + 9 && n <= bytes.size() - 3; ++n) {
      for (size_t at : {0, 3}) EXPECT_EQ(Crc32c(bytes.data() + at, n), bitwise(at, n)) << at << "+" << n;
    }
  }
  EXPECT_EQ(Crc32c(bytes.data(), bytes.size()), bitwise(0, bytes.size()));
}

TEST(TfRecord, EveryFeatureOfEveryRecordIsWhatTheSecondReaderRead) {
  const Json doc = Json::parse(Slurp(kDir + "expected.json"));
  ASSERT_EQ(doc["files"].size(), 3u);
  size_t records = 0;
  for (const Json& file : doc["files"]) {
    const std::string name = file["name"];
    SCOPED_TRACE(name);
    const std::string data = Slurp(kDir + name);
    auto indexed = ParseTfRecordIndex(Slurp(kDir + name + ".idx"), name + ".idx", data.size());
    ASSERT_OK(indexed);
    auto scanned = ScanTfRecords(data, name);
    ASSERT_OK(scanned);
    EXPECT_EQ(*indexed, *scanned);
    EXPECT_EQ(TfRecordIndexText(*scanned), Slurp(kDir + name + ".idx")) << "tfrecord2idx's text, byte for byte";
    ASSERT_EQ(indexed->size(), file["records"].size() + 1);
    for (size_t r = 0; r < file["records"].size(); ++r) {
      const Json& want = file["records"][r];
      const uint64_t at = (*indexed)[r];
      EXPECT_EQ(at, want["offset"].get<uint64_t>());
      EXPECT_EQ((*indexed)[r + 1] - at, want["length"].get<uint64_t>());
      auto payload = TfRecordPayload(std::string_view(data).substr(at, (*indexed)[r + 1] - at), name, at);
      ASSERT_OK(payload);
      std::vector<std::string> names = {"image", "label", "input_ids", "box", "text", "absent"};
      std::vector<std::optional<TfFeature>> got;
      ASSERT_OK(TfExampleFeatures(*payload, names, got, name, at));
      EXPECT_FALSE(got[5].has_value());
      for (size_t i = 0; i + 1 < names.size(); ++i) {
        if (!want["features"].contains(names[i])) {
          EXPECT_FALSE(got[i].has_value()) << names[i];
          continue;
        }
        const Json& feature = want["features"][names[i]];
        ASSERT_TRUE(got[i].has_value()) << names[i];
        if (feature["kind"] == "bytes") {
          ASSERT_EQ(got[i]->kind, TfFeature::Kind::kBytes);
          std::vector<std::string_view> values;
          ASSERT_OK(TfBytesValues(got[i]->list, values));
          ASSERT_EQ(values.size(), feature["values"].size());
          for (size_t k = 0; k < values.size(); ++k) EXPECT_EQ(Hex(values[k]), feature["values"][k]);
        } else if (feature["kind"] == "int64") {
          ASSERT_EQ(got[i]->kind, TfFeature::Kind::kInt64);
          std::vector<int64_t> values;
          ASSERT_OK(TfInt64Values(got[i]->list, values));
          EXPECT_EQ(values, feature["values"].get<std::vector<int64_t>>()) << names[i];
        } else {
          ASSERT_EQ(got[i]->kind, TfFeature::Kind::kFloat);
          std::vector<float> values;
          ASSERT_OK(TfFloatValues(got[i]->list, values));
          ASSERT_EQ(values.size(), feature["values"].size());
          for (size_t k = 0; k < values.size(); ++k) {
            EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(&values[k]), 4)), feature["values"][k]);
          }
        }
      }
      ++records;
    }
  }
  EXPECT_EQ(records, 30u);
}

TEST(TfRecord, AnIndexThatIsNotTheFilesIsRefusedByLine) {
  const std::string data = Slurp(kDir + "part-00000.tfrecord");
  const uint64_t size = data.size();
  auto error = [&](const std::string& text) {
    auto r = ParseTfRecordIndex(text, "f.idx", size);
    return r.ok() ? std::string("(parsed)") : r.status().ToString();
  };
  EXPECT_THAT(error("0 172\n172 x\n"), AllOf(HasSubstr("f.idx"), HasSubstr("line 2 is not \"OFFSET LENGTH\"")));
  EXPECT_THAT(error("0 172\n180 875\n"),
              HasSubstr("line 2 puts a record at byte 180 where the one before ended at 172"));
  EXPECT_THAT(error("0 172\n"), HasSubstr("its records end at byte 172 of a " + std::to_string(size) + "-byte file"));
  EXPECT_THAT(error("0 8\n"), HasSubstr("a record of 8 bytes"));
  EXPECT_THAT(error("0 " + std::to_string(size + 1) + "\n"), HasSubstr("line 1 gives a record of"));
  auto empty = ParseTfRecordIndex("", "e.idx", 0);
  ASSERT_OK(empty);
  EXPECT_EQ(*empty, std::vector<uint64_t>{0});
}

// The same records TensorFlow wrote again with TFRecordOptions GZIP and
// ZLIB: each decompresses to exactly the uncompressed file, its index
// (offsets in the decompressed bytes) is that file's, and the first bytes
// say which option wrote it.
TEST(TfRecordCompressed, GzipAndZlibFilesDecompressToTheUncompressedFiles) {
  struct Kind {
    const char* folder;
    const char* suffix;
    Codec codec;
    const char* hint;
  };
  for (const Kind& k : {Kind{"gzip", ".gz", Codec::kGzip, "GZIP"}, Kind{"zlib", ".zlib", Codec::kZlib, "ZLIB"}}) {
    for (const char* file : {"part-00000.tfrecord", "part-00001.tfrecord", "part-00002.tfrecord"}) {
      SCOPED_TRACE(std::string(k.folder) + "/" + file);
      const std::string raw = Slurp(kDir + file);
      const std::string path = kDir + k.folder + "/" + file + k.suffix;
      const std::string zipped = Slurp(path);
      EXPECT_LT(zipped.size(), raw.size());
      EXPECT_EQ(TfRecordCompressionHint(zipped), k.hint);
      std::string out(raw.size(), '\0');
      ASSERT_OK(Decompress(k.codec, reinterpret_cast<const uint8_t*>(zipped.data()), zipped.size(),
                           reinterpret_cast<uint8_t*>(out.data()), out.size()));
      EXPECT_TRUE(out == raw);
      auto offsets = ParseTfRecordIndex(Slurp(path + ".idx"), path + ".idx", std::nullopt);
      ASSERT_OK(offsets);
      auto scanned = ScanTfRecords(raw, file);
      ASSERT_OK(scanned);
      EXPECT_EQ(*offsets, *scanned);
      EXPECT_EQ(offsets->back(), raw.size());
      // The other codec does not read it.
      const Codec other = k.codec == Codec::kGzip ? Codec::kZlib : Codec::kGzip;
      Status wrong = Decompress(other, reinterpret_cast<const uint8_t*>(zipped.data()), zipped.size(),
                                reinterpret_cast<uint8_t*>(out.data()), out.size());
      EXPECT_EQ(wrong.code(), StatusCode::kDataLoss) << wrong.ToString();
      // What meshload writes for such a job reads back the same.
      auto again = Compress(k.codec, raw);
      ASSERT_OK(again);
      EXPECT_EQ(TfRecordCompressionHint(*again), k.hint);
      std::string back(raw.size(), '\0');
      ASSERT_OK(Decompress(k.codec, reinterpret_cast<const uint8_t*>(again->data()), again->size(),
                           reinterpret_cast<uint8_t*>(back.data()), back.size()));
      EXPECT_TRUE(back == raw);
    }
  }
  EXPECT_EQ(TfRecordCompressionHint(Slurp(kDir + "part-00000.tfrecord")), "");
  EXPECT_EQ(TfRecordCompressionHint("x"), "");
  EXPECT_EQ(Compress(Codec::kZstd, "abc").status().code(), StatusCode::kInvalidArgument);
  // Without a file size the records still follow each other from byte 0.
  auto gap = ParseTfRecordIndex("0 172\n180 875\n", "f.idx", std::nullopt);
  EXPECT_THAT(gap.status().ToString(), HasSubstr("line 2 puts a record at byte 180 where the one before ended at 172"));
  auto fine = ParseTfRecordIndex("0 172\n172 875\n", "f.idx", std::nullopt);
  ASSERT_OK(fine);
  EXPECT_EQ(*fine, (std::vector<uint64_t>{0, 172, 1047}));
}

TEST(TfRecord, ABadCrcIsAnErrorNamingTheFileAndRecord) {
  std::string data = Slurp(kDir + "part-00001.tfrecord");
  auto offsets = ScanTfRecords(data, "part-00001.tfrecord");
  ASSERT_OK(offsets);
  const uint64_t at = (*offsets)[3], end = (*offsets)[4];
  std::string damaged = data;
  damaged[at + 20] = static_cast<char>(damaged[at + 20] ^ 1);  // in the payload
  auto payload = TfRecordPayload(std::string_view(damaged).substr(at, end - at), "part-00001.tfrecord", at);
  ASSERT_FALSE(payload.ok());
  EXPECT_EQ(payload.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(payload.status().ToString(),
              AllOf(HasSubstr("part-00001.tfrecord@" + std::to_string(at)), HasSubstr("bad data CRC")));
  damaged = data;
  damaged[at + 2] = static_cast<char>(damaged[at + 2] ^ 1);  // in the length
  payload = TfRecordPayload(std::string_view(damaged).substr(at, end - at), "part-00001.tfrecord", at);
  EXPECT_THAT(payload.status().ToString(), HasSubstr("bad length CRC"));
  auto scanned = ScanTfRecords(damaged, "part-00001.tfrecord");
  EXPECT_THAT(scanned.status().ToString(),
              AllOf(HasSubstr("part-00001.tfrecord@" + std::to_string(at)), HasSubstr("bad length CRC")));
  EXPECT_THAT(ScanTfRecords(data.substr(0, data.size() - 3), "t").status().ToString(), HasSubstr("past the end"));
}

TEST(TfRecord, WrittenExamplesReadBackPackedOrNot) {
  TfExampleWriter w;
  w.AddBytes("image", std::string("\x00\x01\xff", 3));
  w.AddInt64s("ids", {0, -1, 1ll << 40, 127, 128});
  w.AddFloats("box", {0.5f, -2.0f});
  w.AddInt64s("empty", {});
  const std::string record = TfRecordFrame(w.Serialize());
  auto payload = TfRecordPayload(record, "w", 0);
  ASSERT_OK(payload);
  std::vector<std::optional<TfFeature>> got;
  ASSERT_OK(TfExampleFeatures(*payload, {"ids", "box", "image", "empty"}, got, "w", 0));
  std::vector<int64_t> ids;
  ASSERT_OK(TfInt64Values(got[0]->list, ids));
  EXPECT_EQ(ids, (std::vector<int64_t>{0, -1, 1ll << 40, 127, 128}));
  std::vector<float> box;
  ASSERT_OK(TfFloatValues(got[1]->list, box));
  EXPECT_EQ(box, (std::vector<float>{0.5f, -2.0f}));
  std::vector<std::string_view> image;
  ASSERT_OK(TfBytesValues(got[2]->list, image));
  ASSERT_EQ(image.size(), 1u);
  EXPECT_EQ(image[0], std::string_view("\x00\x01\xff", 3));
  std::vector<int64_t> none;
  ASSERT_OK(TfInt64Values(got[3]->list, none));
  EXPECT_TRUE(none.empty());

  // Unpacked values (each its own field, as older writers may emit them).
  const std::string unpacked_ints("\x08\x05\x08\x7f", 4);        // value: 5, value: 127
  const std::string unpacked_floats("\x0d\x00\x00\x80\x3f", 5);  // value: 1.0f
  std::vector<int64_t> u;
  ASSERT_OK(TfInt64Values(unpacked_ints, u));
  EXPECT_EQ(u, (std::vector<int64_t>{5, 127}));
  std::vector<float> uf;
  ASSERT_OK(TfFloatValues(unpacked_floats, uf));
  EXPECT_EQ(uf, std::vector<float>{1.0f});
}

TEST(TfRecord, AMalformedExampleIsAnErrorNamingTheRecord) {
  std::vector<std::optional<TfFeature>> got;
  // Features (field 1, length 10) longer than the message.
  const Status st = TfExampleFeatures(std::string("\x0a\x0a\x0a", 3), {"x"}, got, "f.tfrecord", 172);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_THAT(st.ToString(), AllOf(HasSubstr("f.tfrecord@172"), HasSubstr("not a well-formed tf.train.Example")));
  // A group (wire type 3) is not part of an Example.
  EXPECT_THAT(TfExampleFeatures(std::string("\x0b", 1), {"x"}, got, "f", 0).ToString(), HasSubstr("wire type 3"));
  std::vector<float> f;
  EXPECT_THAT(TfFloatValues(std::string("\x0a\x03\x00\x00\x00", 5), f).ToString(),
              HasSubstr("packed floats of 3 bytes"));
}

}  // namespace
}  // namespace meshload::formats
