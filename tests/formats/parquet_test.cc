// Parquet through Arrow C++, against files pyarrow's writer made
// (tests/formats/write_parquet_fixtures.py) and what pyarrow's reader returns
// for every row.
#include "formats/parquet.h"
#include "formats/parquet_record.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/formats/fixture_files.h"

namespace meshload::formats {
namespace {

using fixtures::Hex;
using fixtures::Slurp;

const std::string kDir = std::string(MESHLOAD_FORMATS_DATA) + "/parquet/";

const std::vector<std::string> kFields = {"input_ids", "text",        "label",      "score",  "flag",   "emb",
                                          "grid",      "image.bytes", "image.path", "digest", "big_ids"};

nlohmann::json Expected() { return nlohmann::json::parse(Slurp(kDir + "expected.json")); }

Result<ParquetFooter> FooterOf(const std::string& file) {
  const std::string tail = file.substr(file.size() - std::min<size_t>(file.size(), kParquetTailBytes));
  MESHLOAD_ASSIGN_OR_RETURN(ParquetFooterPlace place, LocateParquetFooter(tail, file.size()));
  return ParquetFooter::Parse(std::string_view(file).substr(place.offset, place.length), file.size());
}

/// Exactly the column chunks of `fields` in row group `g`, each a copy of
/// its own (so that a read of any other byte is seen).
std::vector<ParquetBytes> ChunksOf(const std::string& file, const ParquetFooter& footer, int g,
                                   const std::vector<ParquetField>& fields) {
  std::vector<ParquetBytes> out;
  for (const ParquetField& f : fields) {
    for (int leaf : f.leaves) {
      const ParquetColumnChunk& c = footer.row_groups()[g].columns[leaf];
      auto copy = std::make_shared<std::string>(file.substr(c.offset, c.bytes));
      out.push_back({c.offset, *copy, copy});
    }
  }
  return out;
}

TEST(Parquet, EveryRowOfEveryFileIsWhatPyarrowReads) {
  const nlohmann::json want = Expected();
  for (const auto& [name, info] : want["files"].items()) {
    SCOPED_TRACE(name);
    const std::string file = Slurp(kDir + name);
    auto footer = FooterOf(file);
    ASSERT_TRUE(footer.ok()) << footer.status().ToString();
    EXPECT_EQ(footer->rows(), 60u);
    const uint64_t per_group = info["row_group_size"].get<uint64_t>();
    ASSERT_EQ(footer->row_groups().size(), (60 + per_group - 1) / per_group);
    EXPECT_EQ(footer->has_page_index(), name != "rg7-dict-snappy.parquet");
    std::vector<ParquetField> fields;
    for (const std::string& f : kFields) {
      auto field = footer->Field(f);
      ASSERT_TRUE(field.ok()) << f << ": " << field.status().ToString();
      fields.push_back(*field);
    }
    uint64_t row = 0;
    for (size_t g = 0; g < footer->row_groups().size(); ++g) {
      const ParquetRowGroup& rg = footer->row_groups()[g];
      EXPECT_EQ(rg.first_row, row);
      auto values = ParquetRowGroupValues::Decode(*footer, static_cast<int>(g), fields,
                                                  ChunksOf(file, *footer, static_cast<int>(g), fields));
      ASSERT_TRUE(values.ok()) << values.status().ToString();
      ASSERT_EQ(values->rows(), rg.rows);
      EXPECT_GT(values->bytes(), 0u);
      for (uint64_t r = 0; r < rg.rows; ++r, ++row) {
        for (size_t f = 0; f < fields.size(); ++f) {
          const nlohmann::json& w = want["rows"][row][kFields[f]];
          const std::optional<std::string_view> v = values->Value(f, r);
          if (w.is_null()) {
            EXPECT_FALSE(v.has_value()) << "row " << row << " " << kFields[f];
          } else {
            ASSERT_TRUE(v.has_value()) << "row " << row << " " << kFields[f];
            EXPECT_EQ(Hex(*v), w.get<std::string>()) << "row " << row << " " << kFields[f];
          }
        }
      }
    }
    EXPECT_EQ(row, 60u);
  }
}

size_t ThreadsOfThisProcess() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

// The sidecar's reader threads decode; Arrow must not hand the work (or the
// reads of the bytes already in memory) to thread pools of its own, which
// would run beside the staging threads unbounded and unseen.
TEST(Parquet, DecodingStartsNoThreadOfArrowsOwn) {
  const size_t before = ThreadsOfThisProcess();
  for (const std::string name : {"rg7-dict-snappy.parquet", "rg25-plain-zstd-v2.parquet", "rg1000-gzip.parquet"}) {
    const std::string file = Slurp(kDir + name);
    auto footer = FooterOf(file);
    ASSERT_TRUE(footer.ok()) << footer.status().ToString();
    std::vector<ParquetField> fields;
    for (const std::string& f : kFields) fields.push_back(*footer->Field(f));
    for (size_t g = 0; g < footer->row_groups().size(); ++g) {
      auto values = ParquetRowGroupValues::Decode(*footer, static_cast<int>(g), fields,
                                                  ChunksOf(file, *footer, static_cast<int>(g), fields));
      ASSERT_TRUE(values.ok()) << values.status().ToString();
    }
  }
  EXPECT_EQ(ThreadsOfThisProcess(), before);
}

TEST(Parquet, ColumnsBecomeFieldsByTheirArrowType) {
  const std::string file = Slurp(kDir + "rg7-dict-snappy.parquet");
  auto footer = FooterOf(file);
  ASSERT_TRUE(footer.ok()) << footer.status().ToString();
  const auto field = [&](const char* n) {
    auto f = footer->Field(n);
    EXPECT_TRUE(f.ok()) << n << ": " << f.status().ToString();
    return f.ok() ? *f : ParquetField{};
  };
  ParquetField f = field("input_ids");
  EXPECT_EQ(f.kind, ParquetValueKind::kList);
  EXPECT_EQ(f.dtype, DType::kInt32);
  EXPECT_TRUE(f.ragged());
  EXPECT_EQ(f.type, "list<element: int32>");
  f = field("text");
  EXPECT_EQ(f.kind, ParquetValueKind::kBytes);
  EXPECT_EQ(f.dtype, DType::kUint8);
  f = field("label");
  EXPECT_EQ(f.kind, ParquetValueKind::kScalar);
  EXPECT_EQ(f.dtype, DType::kInt64);
  EXPECT_EQ(f.row_bytes(), 8u);
  f = field("flag");
  EXPECT_EQ(f.dtype, DType::kBool);
  f = field("emb");
  EXPECT_EQ(f.kind, ParquetValueKind::kFixedList);
  EXPECT_EQ(f.shape, (std::vector<uint64_t>{4}));
  EXPECT_EQ(f.row_bytes(), 16u);
  f = field("grid");
  EXPECT_EQ(f.shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(f.dtype, DType::kInt16);
  EXPECT_FALSE(f.ragged());
  f = field("digest");
  EXPECT_EQ(f.kind, ParquetValueKind::kFixedList);
  EXPECT_EQ(f.shape, (std::vector<uint64_t>{8}));
  f = field("image.bytes");
  EXPECT_EQ(f.kind, ParquetValueKind::kBytes);
  EXPECT_EQ(f.leaves.size(), 1u);
  EXPECT_EQ(footer->LeafPath(static_cast<size_t>(f.leaves[0])), "image.bytes");
  f = field("big_ids");
  EXPECT_EQ(f.kind, ParquetValueKind::kList);
  EXPECT_EQ(f.dtype, DType::kInt64);
}

TEST(Parquet, ColumnsMeshloadCannotDeliverAreRefusedByNameAndType) {
  const std::string file = Slurp(kDir + "rg7-dict-snappy.parquet");
  auto footer = FooterOf(file);
  ASSERT_TRUE(footer.ok()) << footer.status().ToString();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"ts", "column ts is timestamp[ms]"},
      {"price", "column price is decimal128(9, 2)"},
      {"tags", "column tags is list<element: string>"},
      {"attrs", "column attrs is map<string, int32"},
      {"kind", "column kind is dictionary<values=string"},
      {"image", "name one of its members as the field (image.bytes, image.path)"},
  };
  for (const auto& [name, message] : refused) {
    auto f = footer->Field(name);
    ASSERT_FALSE(f.ok()) << name;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(message), std::string::npos) << f.status().ToString();
  }
  auto missing = footer->Field("image.caption");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no column image.caption (its columns: input_ids: list<element: int32>"),
            std::string::npos)
      << missing.status().ToString();
}

TEST(Parquet, AFileOfAnotherSchemaNamesTheColumnThatDiffers) {
  auto a = FooterOf(Slurp(kDir + "rg7-dict-snappy.parquet"));
  auto b = FooterOf(Slurp(kDir + "schema-int64.parquet"));
  auto c = FooterOf(Slurp(kDir + "rg1000-gzip.parquet"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->SchemaDifference(*c), "");
  EXPECT_EQ(a->SchemaDifference(*b), "column input_ids: list<element: int32> here, list<element: int64> there");
}

TEST(Parquet, ADamagedEndOrFooterIsAnErrorNamingTheByte) {
  const std::string file = Slurp(kDir + "rg7-dict-snappy.parquet");
  // Cut short: the end is no longer PAR1.
  const std::string cut = file.substr(0, file.size() - 100);
  auto r = FooterOf(cut);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().ToString().find("not a Parquet file: its last 4 bytes are not PAR1"), std::string::npos);
  EXPECT_NE(r.status().ToString().find("@" + std::to_string(cut.size() - 4)), std::string::npos)
      << r.status().ToString();
  // A footer length past the file's start.
  std::string longer = file;
  longer[file.size() - 6] = '\x7f';
  r = FooterOf(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not fit in the file"), std::string::npos) << r.status().ToString();
  // An encrypted footer.
  std::string pare = file;
  pare.replace(file.size() - 4, 4, "PARE");
  r = FooterOf(pare);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("encrypted footer"), std::string::npos);
  // Footer bytes overwritten: an error, never a crash, whatever is hit.
  const std::string tail = file.substr(file.size() - 8);
  auto place = LocateParquetFooter(tail, file.size());
  ASSERT_TRUE(place.ok());
  for (uint64_t at = 0; at < place->length; at += 7) {
    std::string bad = file;
    bad[place->offset + at] = static_cast<char>(bad[place->offset + at] ^ 0x5a);
    auto f = ParquetFooter::Parse(std::string_view(bad).substr(place->offset, place->length), bad.size());
    if (!f.ok()) {
      EXPECT_NE(f.status().ToString().find("footer@" + std::to_string(place->offset)), std::string::npos);
    }
  }
  // The file shorter than its footer says: the last chunk ends past it.
  auto f =
      ParquetFooter::Parse(std::string_view(file).substr(place->offset, place->length), place->length + 8 + 4 + 100);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("row group 0, column input_ids.list.element says it is"), std::string::npos)
      << f.status().ToString();
}

TEST(Parquet, ACorruptPageIsAnErrorNamingTheRowGroupAndColumn) {
  const std::string name = "rg25-plain-zstd-v2.parquet";
  std::string file = Slurp(kDir + name);
  auto footer = FooterOf(file);
  ASSERT_TRUE(footer.ok());
  auto field = footer->Field("text");
  ASSERT_TRUE(field.ok());
  const ParquetColumnChunk& c = footer->row_groups()[1].columns[field->leaves[0]];
  for (uint64_t at = c.offset + c.bytes / 2; at < c.offset + c.bytes; ++at)
    file[at] = static_cast<char>(file[at] ^ 0xff);
  auto values = ParquetRowGroupValues::Decode(*footer, 1, {*field}, ChunksOf(file, *footer, 1, {*field}));
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(values.status().ToString().find("row group 1"), std::string::npos) << values.status().ToString();
  EXPECT_NE(values.status().ToString().find("column text does not decode"), std::string::npos)
      << values.status().ToString();
}

TEST(Parquet, DecodingBytesThatWereNotReadNamesThem) {
  const std::string file = Slurp(kDir + "rg7-dict-snappy.parquet");
  auto footer = FooterOf(file);
  ASSERT_TRUE(footer.ok());
  auto ids = footer->Field("input_ids");
  auto text = footer->Field("text");
  ASSERT_TRUE(ids.ok() && text.ok());
  // Only input_ids' chunk, and text asked for too.
  auto values = ParquetRowGroupValues::Decode(*footer, 2, {*ids, *text}, ChunksOf(file, *footer, 2, {*ids}));
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().code(), StatusCode::kOutOfRange);
  const ParquetColumnChunk& c = footer->row_groups()[2].columns[text->leaves[0]];
  EXPECT_NE(values.status().message().find("decoding column text needs bytes " + std::to_string(c.offset)),
            std::string::npos)
      << values.status().ToString();
  // Half of the chunk.
  std::vector<ParquetBytes> half = ChunksOf(file, *footer, 2, {*ids});
  half[0].bytes = half[0].bytes.substr(0, half[0].bytes.size() / 2);
  values = ParquetRowGroupValues::Decode(*footer, 2, {*ids}, half);
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().code(), StatusCode::kOutOfRange) << values.status().ToString();
}

}  // namespace
}  // namespace meshload::formats

namespace meshload::formats {
namespace {

TEST(ParquetRecord, ValuesAndNullsGoThroughARecordOfFixedSize) {
  const ParquetRecordLayout layout = ParquetRecordLayout::Make({8, 0, 16});
  EXPECT_EQ(layout.bytes, 4 + 8 + 4 + 0 + 4 + 16u);
  EXPECT_EQ(layout.at, (std::vector<uint64_t>{0, 12, 16}));
  std::string record(layout.bytes, '\x55');
  const FieldValues in = {std::string_view("12345678"), std::nullopt, std::string_view("abc")};
  size_t bad = 99;
  ASSERT_TRUE(EncodeParquetRecord(layout, in, reinterpret_cast<uint8_t*>(record.data()), bad).ok());
  FieldValues out;
  ASSERT_TRUE(ParquetRecordValues(layout, record, out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(*out[0], "12345678");
  EXPECT_FALSE(out[1].has_value());
  EXPECT_EQ(*out[2], "abc");
  // An empty value is not a null.
  ASSERT_TRUE(EncodeParquetRecord(layout, {std::string_view(), std::string_view(), std::string_view()},
                                  reinterpret_cast<uint8_t*>(record.data()), bad)
                  .ok());
  ASSERT_TRUE(ParquetRecordValues(layout, record, out).ok());
  EXPECT_TRUE(out[1].has_value() && out[1]->empty());
}

TEST(ParquetRecord, AValueLongerThanItsRoomAndADamagedLengthAreErrors) {
  const ParquetRecordLayout layout = ParquetRecordLayout::Make({8, 4});
  std::string record(layout.bytes, '\0');
  size_t bad = 99;
  Status st = EncodeParquetRecord(layout, {std::string_view("1"), std::string_view("12345")},
                                  reinterpret_cast<uint8_t*>(record.data()), bad);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(bad, 1u);
  EXPECT_EQ(st.message(), "a value of 5 bytes, more than the 4 its field allows");
  // A length word past the room.
  std::string damaged(layout.bytes, '\0');
  damaged[layout.at[1]] = 9;
  FieldValues out;
  st = ParquetRecordValues(layout, damaged, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.location(), "@" + std::to_string(layout.at[1]));
  EXPECT_EQ(ParquetRecordValues(layout, damaged.substr(1), out).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace meshload::formats

namespace meshload::formats {
namespace {

// What meshload writes (run --generate-dataset) reads back through the same
// footer and decoding as any file: every value, row groups of the size asked.
TEST(ParquetWriter, AFileWrittenReadsBackValueForValue) {
  std::vector<ParquetColumnToWrite> columns(4);
  columns[0] = {"blob", ParquetValueKind::kBytes, DType::kUint8, {}};
  columns[1] = {"ids", ParquetValueKind::kList, DType::kInt32, {}};
  columns[2] = {"label", ParquetValueKind::kScalar, DType::kInt64, {}};
  columns[3] = {"flag", ParquetValueKind::kScalar, DType::kBool, {}};
  for (int64_t r = 0; r < 100; ++r) {
    columns[0].values.push_back(std::string(static_cast<size_t>(r % 7), static_cast<char>('a' + r % 26)));
    std::string ids;
    for (int32_t i = 0; i < r % 5; ++i) {
      const int32_t v = static_cast<int32_t>(r * 100 + i);
      ids.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    columns[1].values.push_back(ids);
    const int64_t label = r * r - 50;
    columns[2].values.emplace_back(reinterpret_cast<const char*>(&label), sizeof label);
    columns[3].values.push_back(std::string(1, static_cast<char>(r % 2)));
  }
  auto bytes = ParquetFileBytes(columns, 30);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto footer = FooterOf(*bytes);
  ASSERT_TRUE(footer.ok()) << footer.status().ToString();
  EXPECT_EQ(footer->rows(), 100u);
  ASSERT_EQ(footer->row_groups().size(), 4u);  // 30, 30, 30, 10
  std::vector<ParquetField> fields;
  for (const auto& c : columns) {
    auto f = footer->Field(c.name);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->kind, c.kind) << c.name;
    EXPECT_EQ(f->dtype, c.dtype) << c.name;
    fields.push_back(*f);
  }
  for (size_t g = 0; g < 4; ++g) {
    auto values = ParquetRowGroupValues::Decode(*footer, static_cast<int>(g), fields,
                                                ChunksOf(*bytes, *footer, static_cast<int>(g), fields));
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    for (uint64_t r = 0; r < values->rows(); ++r) {
      const uint64_t row = footer->row_groups()[g].first_row + r;
      for (size_t f = 0; f < columns.size(); ++f) {
        auto v = values->Value(f, r);
        ASSERT_TRUE(v.has_value());
        EXPECT_EQ(*v, columns[f].values[row]) << columns[f].name << " row " << row;
      }
    }
  }
  // A column whose values are not whole numbers of its type is refused.
  columns[2].values[5] = "abc";
  EXPECT_EQ(ParquetFileBytes(columns, 30).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshload::formats
