// The tar walker and the WebDataset grouping against shards webdataset's
// TarWriter wrote (tests/formats/data/webdataset/, made by
// write_webdataset_fixtures.py): every sample and field meshload finds is
// what webdataset's own reader returned, the index meshload computes is
// byte for byte the `.tar.idx` Energon's prepare wrote, and each way a real
// shard can be damaged is an error naming the file and the byte.

#include "formats/webdataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/tar.h"
#include "tests/formats/fixture_files.h"
#include "tests/testing/status_matchers.h"

namespace meshload::formats {
namespace {

using fixtures::Hex;
using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kData = MESHLOAD_FORMATS_DATA "/webdataset/";

struct Walked {
  std::vector<WebDatasetSample> samples;
  uint64_t end = 0;
  int members = 0;
};

// Walks `bytes` as the sources will: reading only what the walker asks for.
Result<Walked> Walk(const std::string& bytes, const std::string& name) {
  TarWalker walker(name, bytes.size());
  ShardSamples samples(name);
  Walked w;
  while (!walker.done()) {
    const TarWalker::Need need = walker.next();
    MESHLOAD_ASSIGN_OR_RETURN(std::optional<TarMember> m,
                              walker.Feed(std::string_view(bytes).substr(need.offset, need.bytes)));
    if (m) {
      ++w.members;
      MESHLOAD_RETURN_IF_ERROR(samples.Add(*m));
    }
  }
  w.samples = samples.Finish();
  w.end = walker.end_offset();
  return w;
}

class WebDatasetShard : public ::testing::TestWithParam<std::string> {};

TEST_P(WebDatasetShard, EverySampleAndFieldIsWhatWebdatasetsReaderReturns) {
  const std::string tar = Slurp(kData + GetParam() + ".tar");
  const nlohmann::json expected = nlohmann::json::parse(Slurp(kData + GetParam() + ".expected.json"));
  auto walked = Walk(tar, GetParam() + ".tar");
  ASSERT_OK(walked);
  const auto& want = expected["samples"];
  ASSERT_EQ(walked->samples.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const WebDatasetSample& s = walked->samples[i];
    EXPECT_EQ(s.key, want[i]["key"].get<std::string>()) << "sample " << i;
    ASSERT_EQ(s.fields.size(), want[i]["fields"].size()) << "sample " << i;
    for (const auto& [ext, hex] : want[i]["fields"].items()) {
      auto it = s.fields.find(ext);
      ASSERT_NE(it, s.fields.end()) << "sample " << i << " has no field " << ext;
      EXPECT_EQ(Hex(std::string_view(tar).substr(it->second.data_offset, it->second.size)), hex.get<std::string>())
          << "sample " << i << " field " << ext;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WrittenByTarWriter, WebDatasetShard,
                         ::testing::Values("shard-000000", "shard-000001", "shard-000002"));

TEST(EnergonIndex, MeshloadsIndexIsTheOneEnergonsPrepareWrote) {
  for (const std::string shard : {"shard-000000", "shard-000001"}) {
    const std::string tar = Slurp(kData + shard + ".tar"), idx = Slurp(kData + shard + ".tar.idx");
    auto walked = Walk(tar, shard + ".tar");
    ASSERT_OK(walked);
    const std::vector<uint64_t> ours = ShardSamples::EnergonIndex(walked->samples, walked->end);
    EXPECT_EQ(EnergonTarIndexBytes(ours), idx) << shard;
    auto theirs = ParseEnergonTarIndex(idx, shard + ".tar.idx", tar.size());
    ASSERT_OK(theirs);
    EXPECT_EQ(*theirs, ours);
  }
}

TEST(EnergonIndex, ADamagedIndexNamesItsByte) {
  const std::string idx = Slurp(kData + "shard-000000.tar.idx");
  const uint64_t tar_bytes = Slurp(kData + "shard-000000.tar").size();
  EXPECT_THAT(ParseEnergonTarIndex(idx.substr(0, idx.size() - 3), "s.tar.idx", tar_bytes).status().ToString(),
              AllOf(HasSubstr("s.tar.idx@96: "), HasSubstr("a truncated index?")));
  EXPECT_THAT(ParseEnergonTarIndex("", "s.tar.idx", tar_bytes).status().ToString(), HasSubstr("at least"));
  std::string b = idx;
  std::memcpy(&b[16], &b[0], 8);  // entry 2 = entry 0
  EXPECT_THAT(ParseEnergonTarIndex(b, "s.tar.idx", tar_bytes).status().ToString(),
              AllOf(HasSubstr("s.tar.idx@16: "), HasSubstr("below the one before it")));
  uint64_t members_end = 0;
  std::memcpy(&members_end, &idx[idx.size() - 8], 8);
  EXPECT_OK(ParseEnergonTarIndex(idx, "s.tar.idx", members_end));
  EXPECT_THAT(
      ParseEnergonTarIndex(idx, "s.tar.idx", members_end - 1).status().ToString(),
      AllOf(HasSubstr("s.tar.idx@" + std::to_string(idx.size() - 8) + ": "), HasSubstr("past the end of the shard")));
}

// DALI's text index (shard-00000N.idx, written by DALI's tools/wds2idx.py
// from nvidia-dali 2.4.0) gives the very offsets Energon's prepare wrote.
TEST(DaliIndex, DalisIndexGivesTheOffsetsOfEnergonsIndex) {
  for (const std::string shard : {"shard-000000", "shard-000001"}) {
    const std::string tar = Slurp(kData + shard + ".tar");
    auto energon = ParseEnergonTarIndex(Slurp(kData + shard + ".tar.idx"), shard + ".tar.idx", tar.size());
    ASSERT_OK(energon);
    auto dali = ParseDaliTarIndex(Slurp(kData + shard + ".idx"), shard + ".idx", tar.size());
    ASSERT_OK(dali);
    EXPECT_EQ(*dali, *energon) << shard;
  }
}

TEST(DaliIndex, ADamagedIndexNamesItsByte) {
  const std::string idx = Slurp(kData + "shard-000000.idx");
  const uint64_t tar_bytes = Slurp(kData + "shard-000000.tar").size();
  auto error = [&](const std::string& text, uint64_t bytes = 0) {
    return ParseDaliTarIndex(text, "s.idx", bytes ? bytes : tar_bytes).status().ToString();
  };
  EXPECT_THAT(error("v1.1 12\n" + idx.substr(idx.find('\n') + 1)),
              AllOf(HasSubstr("s.idx@0: "), HasSubstr("version 'v1.1'; meshload reads version v1.2")));
  EXPECT_THAT(error("hello\n"), HasSubstr("not a DALI WebDataset index"));
  const size_t last_line = idx.rfind('\n', idx.size() - 2) + 1;
  EXPECT_THAT(error(idx.substr(0, last_line)),
              AllOf(HasSubstr("s.idx@" + std::to_string(last_line) + ": "), HasSubstr("lists 11")));
  std::string three = idx;
  three.replace(idx.find(' ', idx.find('\n') + 1) + 1, 4, "1537");  // the first member's data, not block-aligned
  EXPECT_THAT(error(three), HasSubstr("is not a member's data after the one before it"));
  EXPECT_THAT(error(idx, 4096), HasSubstr("inside the shard (4096 bytes)"));
  std::string odd = idx;
  odd.insert(idx.find('\n') + 1, "jpg ");  // a member of 5 fields
  EXPECT_THAT(error(odd), HasSubstr("sample 0: 17 fields where each member has 4"));
}

TEST(WebDatasetNames, SplitAsWebdatasetAndEnergonSplitThem) {
  // What Python's re gives for webdataset's pattern on each name.
  const struct {
    const char* name;
    bool splits;
    const char* key;
    const char* ext;
  } cases[] = {
      {"a/b.c.d", true, "a/b", "c.d"},         {"noext", false, "", ""},
      {"dir/.hidden", true, "dir/", "hidden"}, {"X.JPG", true, "X", "jpg"},
      {"a.b/c.d", true, "a.b/c", "d"},         {".x", false, "", ""},
      {"a/__k__/b.c", true, "a/__k__/b", "c"},
  };
  for (const auto& c : cases) {
    std::string key, ext;
    ASSERT_EQ(SplitWebDatasetName(c.name, key, ext), c.splits) << c.name;
    if (!c.splits) continue;
    EXPECT_EQ(key, c.key) << c.name;
    EXPECT_EQ(ext, c.ext) << c.name;
  }
  EXPECT_TRUE(IsWebDatasetMetadata("__meta__"));
  EXPECT_TRUE(IsWebDatasetMetadata("__index__/x.json"));
  EXPECT_FALSE(IsWebDatasetMetadata("__meta__.json"));  // re.match of `__[^/]*__($|/)` fails on it too
  EXPECT_FALSE(IsWebDatasetMetadata("a/__meta__"));
}

TEST(WebDatasetNames, ShardListsExpandAsBraceexpandExpandsThem) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ExpandShardPattern("s/train-{000000..000002}.tar"),
            (V{"s/train-000000.tar", "s/train-000001.tar", "s/train-000002.tar"}));
  EXPECT_EQ(ExpandShardPattern("{a,b}-{8..10}.tar"),
            (V{"a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar"}));
  EXPECT_EQ(ExpandShardPattern("x{3..1}"), (V{"x3", "x2", "x1"}));
  EXPECT_EQ(ExpandShardPattern("plain.tar"), (V{"plain.tar"}));
  EXPECT_EQ(ExpandShardPattern("open{1..2"), (V{"open{1..2"}));
  EXPECT_EQ(ExpandShardPattern("{x}-{1,2}"), (V{"{x}-1", "{x}-2"}));
}

// A real shard with one thing changed.
class DamagedShard : public ::testing::Test {
 protected:
  std::string tar_ = Slurp(kData + "shard-000001.tar");
};

TEST_F(DamagedShard, ABadHeaderChecksumNamesTheHeader) {
  std::string b = tar_;
  b[1024 + 10] ^= 1;  // the second header block: the first member's real header after its PAX one
  auto w = Walk(b, "s.tar");
  EXPECT_THAT(w.status().ToString(), AllOf(HasSubstr("s.tar@1024: "), HasSubstr("bad header checksum")));
}

TEST_F(DamagedShard, ATruncatedShardAtAnyBlockIsAnErrorOrAShorterArchiveNeverACrash) {
  auto whole = Walk(tar_, "s.tar");
  ASSERT_OK(whole);
  for (size_t n = 0; n < tar_.size(); n += 256) {
    auto w = Walk(tar_.substr(0, n), "s.tar");
    if (!w.ok()) {
      EXPECT_THAT(w.status().ToString(), HasSubstr("s.tar@")) << n;
      continue;
    }
    // Cut at a member boundary: the members before the cut; cut in the
    // end blocks: the whole archive.
    EXPECT_EQ(w->end, std::min<uint64_t>(n, whole->end)) << n;
  }
  uint64_t big = 0;  // a member with data beyond its first 100 bytes
  for (const auto& s : whole->samples) {
    for (const auto& [ext, f] : s.fields) {
      if (big == 0 && f.size > 200) big = f.data_offset;
    }
  }
  ASSERT_NE(big, 0u);
  auto mid_data = Walk(tar_.substr(0, big + 100), "s.tar");
  EXPECT_THAT(mid_data.status().ToString(), AllOf(HasSubstr("s.tar@" + std::to_string(big - 512) + ": "),
                                                  HasSubstr("runs past the end of the file")));
  auto mid_header = Walk(tar_.substr(0, 1024 + 100), "s.tar");
  EXPECT_THAT(mid_header.status().ToString(), AllOf(HasSubstr("s.tar@1024: "), HasSubstr("a truncated archive?")));
}

TEST_F(DamagedShard, ABrokenPaxRecordNamesItsByte) {
  std::string b = tar_;
  // The first PAX header's data starts at 512 with "NN mtime=..."; a length
  // that runs past the record's newline.
  ASSERT_EQ(b.substr(512, 3), b.substr(512, 2) + " ") << b.substr(512, 20);
  b[512] = '9';
  b[513] = '9';
  // The header's checksum does not cover the data; the record is what breaks.
  auto w = Walk(b, "s.tar");
  EXPECT_THAT(w.status().ToString(), AllOf(HasSubstr("s.tar@512: "), HasSubstr("PAX record")));
}

TEST(TarWalker, AnEmptyFileAndEndBlocksOnlyAreEmptyArchivesAndLessThanAHeaderIsTruncated) {
  auto empty = Walk("", "e.tar");
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->samples.empty());
  EXPECT_THAT(Walk(std::string(100, 'a'), "short.tar").status().ToString(),
              AllOf(HasSubstr("short.tar@0: "), HasSubstr("ends 100 bytes into a header")));
  auto zeros = Walk(std::string(1024, '\0'), "z.tar");
  ASSERT_OK(zeros);
  EXPECT_EQ(zeros->end, 0u);
  EXPECT_EQ(zeros->members, 0);
}

}  // namespace
}  // namespace meshload::formats
