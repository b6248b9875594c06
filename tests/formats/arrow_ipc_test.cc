// Arrow IPC files through Arrow C++: datasets' save_to_disk's streams
// (tests/formats/write_saved_fixtures.py) against what pyarrow's stream
// reader and load_from_disk read, and Arrow's own writer's variants (the
// file format, the pre-0.15 prefix, compressed bodies); bad bytes are
// errors naming the byte offset.
#include "formats/arrow_ipc.h"

#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/api.h>
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/parquet.h"
#include "tests/formats/fixture_files.h"

namespace meshload::formats {
namespace {

using fixtures::Slurp;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kDir = std::string(MESHLOAD_FORMATS_DATA) + "/saved/";

/// Reads of `file`, counted.
struct Reader {
  const std::string& file;
  int reads = 0;
  ArrowIpcFile::ReadAt fn() {
    return [this](uint64_t offset, uint64_t length) -> Result<std::string> {
      ++reads;
      if (offset > file.size()) return OutOfRange("past the end");
      return file.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
    };
  }
};

Result<ArrowIpcFile> IndexOf(const std::string& file) {
  Reader r{file};
  return ArrowIpcFile::Index(r.fn(), file.size());
}

/// Every row of `fields` in `file`, decoded batch by batch from exactly
/// each batch's message.
Result<std::vector<std::vector<std::optional<std::string>>>> RowsOf(const std::string& file,
                                                                    const std::vector<std::string>& names) {
  MESHLOAD_ASSIGN_OR_RETURN(ArrowIpcFile index, IndexOf(file));
  std::vector<ParquetField> fields;
  for (const std::string& n : names) {
    MESHLOAD_ASSIGN_OR_RETURN(ParquetField f, index.Field(n));
    fields.push_back(std::move(f));
  }
  std::vector<std::vector<std::optional<std::string>>> out;
  for (size_t g = 0; g < index.row_groups().size(); ++g) {
    const ParquetColumnChunk& c = index.row_groups()[g].columns[0];
    auto copy = std::make_shared<std::string>(file.substr(c.offset, c.bytes));
    MESHLOAD_ASSIGN_OR_RETURN(
        ParquetRowGroupValues values,
        ParquetRowGroupValues::Decode(index, static_cast<int>(g), fields, {{c.offset, *copy, copy}}));
    for (uint64_t r = 0; r < values.rows(); ++r) {
      std::vector<std::optional<std::string>> row;
      for (size_t f = 0; f < fields.size(); ++f) {
        auto v = values.Value(f, r);
        row.push_back(v ? std::optional<std::string>(std::string(*v)) : std::nullopt);
      }
      out.push_back(std::move(row));
    }
  }
  return out;
}

std::string Int32s(const nlohmann::json& list) {
  std::string out;
  for (const nlohmann::json& v : list) {
    const int32_t x = v.get<int32_t>();
    out.append(reinterpret_cast<const char*>(&x), 4);
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(ArrowIpc, SaveToDiskFilesIndexAsPyarrowReadsThemAndDecodeAsLoadFromDiskDoes) {
  const nlohmann::json exp = nlohmann::json::parse(Slurp(kDir + "expected.json"));
  size_t row = 0;
  for (const char* name : {"data-00000-of-00003.arrow", "data-00001-of-00003.arrow", "data-00002-of-00003.arrow"}) {
    SCOPED_TRACE(name);
    const std::string file = Slurp(kDir + "tokens/train/" + name);
    Reader reader{file};
    auto index = ArrowIpcFile::Index(reader.fn(), file.size());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    EXPECT_EQ(reader.reads, 1);  // a small file: its messages' metadata in one read
    std::vector<uint64_t> batches;
    for (const ParquetRowGroup& g : index->row_groups()) batches.push_back(g.rows);
    EXPECT_EQ(batches, exp["batches"]["tokens/train"][name].get<std::vector<uint64_t>>());
    EXPECT_EQ(index->FieldNames(), (std::vector<std::string>{"input_ids", "text", "label"}));
    EXPECT_EQ(index->kind(), "Arrow IPC");
    auto rows = RowsOf(file, {"input_ids", "text", "label"});
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    for (const auto& r : *rows) {
      const nlohmann::json& want = exp["saved"]["tokens"]["train"][row++];
      EXPECT_EQ(r[0], Int32s(want["input_ids"]));
      EXPECT_EQ(r[1], Unhex(want["text"].get<std::string>()));
      const int64_t label = want["label"].get<int64_t>();
      EXPECT_EQ(r[2], std::string(reinterpret_cast<const char*>(&label), 8));
    }
  }
  EXPECT_EQ(row, 50u);
  // The Image feature's struct member.
  auto images = RowsOf(Slurp(kDir + "images/data-00000-of-00001.arrow"), {"image.bytes", "label"});
  ASSERT_TRUE(images.ok()) << images.status().ToString();
  ASSERT_EQ(images->size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ((*images)[i][0], Unhex(exp["saved"]["images"][""][i]["image"]));
}

/// `table` written by Arrow's IPC writer: a stream, or the file format.
std::string Written(const arrow::Table& table, int64_t rows_per_batch, bool file_format,
                    const arrow::ipc::IpcWriteOptions& options = arrow::ipc::IpcWriteOptions::Defaults()) {
  auto sink = *arrow::io::BufferOutputStream::Create();
  auto writer = file_format ? *arrow::ipc::MakeFileWriter(sink, table.schema(), options)
                            : *arrow::ipc::MakeStreamWriter(sink, table.schema(), options);
  EXPECT_TRUE(writer->WriteTable(table, rows_per_batch).ok());
  EXPECT_TRUE(writer->Close().ok());
  return (*sink->Finish())->ToString();
}

std::shared_ptr<arrow::Table> Numbers(int64_t n) {
  arrow::Int64Builder ids;
  arrow::StringBuilder text;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(ids.Append(i * 3).ok());
    EXPECT_TRUE(text.Append("row " + std::to_string(i) + std::string(static_cast<size_t>(i % 5), 'x')).ok());
  }
  auto schema = arrow::schema({arrow::field("id", arrow::int64()), arrow::field("text", arrow::utf8())});
  return arrow::Table::Make(schema, {*ids.Finish(), *text.Finish()});
}

void ExpectNumbers(const std::string& file, int64_t n, size_t batches) {
  auto index = IndexOf(file);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->rows(), static_cast<uint64_t>(n));
  EXPECT_EQ(index->row_groups().size(), batches);
  auto rows = RowsOf(file, {"id", "text"});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = i * 3;
    EXPECT_EQ((*rows)[static_cast<size_t>(i)][0], std::string(reinterpret_cast<const char*>(&id), 8));
    EXPECT_EQ((*rows)[static_cast<size_t>(i)][1],
              "row " + std::to_string(i) + std::string(static_cast<size_t>(i % 5), 'x'));
  }
}

TEST(ArrowIpc, TheFileFormatTheOldPrefixAndCompressedBodiesRead) {
  const auto table = Numbers(1000);
  ExpectNumbers(Written(*table, 64, false), 1000, 16);
  ExpectNumbers(Written(*table, 64, true), 1000, 16);  // "ARROW1", the same messages, a footer
  arrow::ipc::IpcWriteOptions legacy = arrow::ipc::IpcWriteOptions::Defaults();
  legacy.write_legacy_ipc_format = true;  // no 0xFFFFFFFF before the length
  ExpectNumbers(Written(*table, 100, false, legacy), 1000, 10);
  arrow::ipc::IpcWriteOptions zstd = arrow::ipc::IpcWriteOptions::Defaults();
  zstd.codec = *arrow::util::Codec::Create(arrow::Compression::ZSTD);
  const std::string compressed = Written(*table, 250, false, zstd);
  ExpectNumbers(compressed, 1000, 4);
  EXPECT_EQ(IndexOf(compressed)->row_groups()[0].columns[0].codec, "ZSTD");
  // Many small batches: read 64 KiB at a time, not once per batch.
  const auto big = Numbers(100000);
  const std::string many = Written(*big, 100, false);
  Reader reader{many};
  auto index = ArrowIpcFile::Index(reader.fn(), many.size());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->row_groups().size(), 1000u);
  EXPECT_LT(reader.reads, static_cast<int>(many.size() / kArrowIpcReadBytes) + 3);
  EXPECT_GE(reader.reads, static_cast<int>(many.size() / kArrowIpcReadBytes));
}

std::string ErrorOf(const std::string& file) {
  auto index = IndexOf(file);
  return index.ok() ? "indexed" : index.status().ToString();
}

TEST(ArrowIpc, BadBytesAreErrorsNamingTheByteOffset) {
  const std::string good = Written(*Numbers(100), 10, false);
  auto index = IndexOf(good);
  ASSERT_TRUE(index.ok());
  const ParquetColumnChunk& second = index->row_groups()[1].columns[0];
  // Cut inside the second batch's body.
  EXPECT_THAT(ErrorOf(good.substr(0, second.offset + second.bytes - 8)),
              AllOf(HasSubstr("@" + std::to_string(second.offset)), HasSubstr("passes the file's end")));
  // A length that is no length.
  std::string bad = good;
  const int32_t huge = 0x7FFFFFF0;
  std::memcpy(bad.data() + second.offset + 4, &huge, 4);
  EXPECT_THAT(ErrorOf(bad), AllOf(HasSubstr("@" + std::to_string(second.offset)), HasSubstr("metadata length")));
  // Metadata that is not a message.
  bad = good;
  for (size_t i = second.offset + 8; i < second.offset + 40; ++i) bad[i] = static_cast<char>(0xA5);
  EXPECT_THAT(ErrorOf(bad), AllOf(HasSubstr("@" + std::to_string(second.offset)), HasSubstr("does not verify")));
  // A batch with no schema before it.
  const ParquetColumnChunk& first = index->row_groups()[0].columns[0];
  EXPECT_THAT(ErrorOf(good.substr(first.offset)), AllOf(HasSubstr("@0"), HasSubstr("before the schema")));
  // Not Arrow at all; empty.
  EXPECT_THAT(ErrorOf("PAR1 and more bytes than a prefix"), AllOf(HasSubstr("@0"), HasSubstr("metadata length")));
  EXPECT_THAT(ErrorOf(""), HasSubstr("holds no schema"));
  // A body whose offsets point outside it: the batch does not decode.
  bad = good;
  uint64_t needed = 0;
  auto message = ParseArrowIpcMessage(std::string_view(good).substr(first.offset), first.offset, good.size(), needed);
  ASSERT_TRUE(message.ok());
  for (uint64_t i = first.offset + message->metadata_bytes; i < message->end(); ++i) bad[i] = static_cast<char>(0x7F);
  auto rows = RowsOf(bad, {"id", "text"});
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(rows.status().ToString(), HasSubstr("record batch 0"));
  // A column of a type meshload does not deliver, by name.
  auto ts = arrow::schema({arrow::field("t", arrow::timestamp(arrow::TimeUnit::SECOND))});
  arrow::TimestampBuilder tb(arrow::timestamp(arrow::TimeUnit::SECOND), arrow::default_memory_pool());
  ASSERT_TRUE(tb.Append(1).ok());
  const std::string stamped = Written(*arrow::Table::Make(ts, {*tb.Finish()}), 1, false);
  auto stamped_index = IndexOf(stamped);
  ASSERT_TRUE(stamped_index.ok());
  EXPECT_THAT(stamped_index->Field("t").status().ToString(), HasSubstr("column t is timestamp[s]"));
}

}  // namespace
}  // namespace meshload::formats
