#include "formats/parquet.h"

#include "formats/arrow_columns.h"

#include <arrow/api.h>
#include <arrow/io/interfaces.h>
#include <arrow/io/memory.h>
#include <arrow/util/byte_size.h>
#include <arrow/util/compression.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/writer.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/size_statistics.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

namespace meshload::formats {
namespace {

constexpr std::string_view kMagic = "PAR1";
constexpr std::string_view kEncryptedMagic = "PARE";

uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;  // little-endian hosts only (the project builds for x86-64 and arm64)
}

}  // namespace

Result<ParquetFooterPlace> LocateParquetFooter(std::string_view tail, uint64_t file_size) {
  if (file_size < kMagic.size() + kParquetTrailerBytes) {
    return DataLoss("a Parquet file has at least 12 bytes (PAR1, its footer's length, PAR1); this one has " +
                        std::to_string(file_size),
                    "@0");
  }
  if (tail.size() < kParquetTrailerBytes || tail.size() > file_size) {
    return Internal("LocateParquetFooter: the tail must be the file's last 8 bytes or more");
  }
  const std::string_view magic = tail.substr(tail.size() - 4);
  const uint64_t magic_at = file_size - 4;
  if (magic == kEncryptedMagic) {
    return InvalidArgument("the file is a Parquet file with an encrypted footer (PARE), which meshload does not read",
                           "@" + std::to_string(magic_at));
  }
  if (magic != kMagic) {
    return DataLoss("not a Parquet file: its last 4 bytes are not PAR1", "@" + std::to_string(magic_at));
  }
  const uint64_t length = LoadLe32(tail.data() + tail.size() - kParquetTrailerBytes);
  const uint64_t end = file_size - kParquetTrailerBytes;
  if (length == 0 || length > end - kMagic.size()) {
    return DataLoss("the footer's length " + std::to_string(length) + " does not fit in the file (" +
                        std::to_string(file_size) + " bytes)",
                    "@" + std::to_string(end));
  }
  return ParquetFooterPlace{end - length, length};
}

// ---------------------------------------------------------------------------
// The footer

struct ParquetFooter::Impl {
  std::shared_ptr<parquet::FileMetaData> metadata;
  parquet::arrow::SchemaManifest manifest;
  std::vector<ParquetRowGroup> row_groups;
  uint64_t file_size = 0;
  bool page_index = false;

  std::shared_ptr<arrow::Schema> schema;  // the manifest's top-level fields

  /// The schema field named `name` (FindArrowField) and the names from the
  /// top to it.
  const parquet::arrow::SchemaField* Find(std::string_view name, std::vector<std::string>* path) const {
    std::vector<std::string> p;
    if (!FindArrowField(schema->fields(), name, &p)) return nullptr;
    const parquet::arrow::SchemaField* at = nullptr;
    for (const parquet::arrow::SchemaField& f : manifest.schema_fields) {
      if (f.field->name() == p[0]) at = &f;
    }
    for (size_t k = 1; at && k < p.size(); ++k) {
      const parquet::arrow::SchemaField* next = nullptr;
      for (const parquet::arrow::SchemaField& c : at->children) {
        if (c.field->name() == p[k]) next = &c;
      }
      at = next;
    }
    if (at && path) *path = std::move(p);
    return at;
  }
};

namespace {

void CollectLeaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
  if (f.is_leaf()) out.push_back(f.column_index);
  for (const parquet::arrow::SchemaField& c : f.children) CollectLeaves(c, out);
}

}  // namespace

Result<ParquetFooter> ParquetFooter::Parse(std::string_view footer, uint64_t file_size) {
  if (footer.size() > UINT32_MAX) return DataLoss("a footer of " + std::to_string(footer.size()) + " bytes");
  if (file_size < footer.size() + kParquetTrailerBytes + kMagic.size()) {
    return Internal("ParquetFooter::Parse: the footer does not fit in the file's size");
  }
  const uint64_t footer_at = file_size - kParquetTrailerBytes - footer.size();
  auto impl = std::make_shared<Impl>();
  impl->file_size = file_size;
  const std::string where = "footer@" + std::to_string(footer_at);
  Status parsed = GuardArrow(
      [&]() -> Status {
        impl->metadata = parquet::FileMetaData::Make(footer.data(), static_cast<int64_t>(footer.size()));
        return Status::Ok();
      },
      "the footer does not parse");
  if (!parsed.ok()) return parsed.WithLocationPrefix(where);
  Status st = GuardArrow(
      [&]() -> Status {
        const parquet::FileMetaData& md = *impl->metadata;
        if (md.is_encryption_algorithm_set()) {
          return InvalidArgument("the file's columns are encrypted, which meshload does not read");
        }
        parquet::ArrowReaderProperties props;
        arrow::Status as =
            parquet::arrow::SchemaManifest::Make(md.schema(), md.key_value_metadata(), props, &impl->manifest);
        if (!as.ok()) return InvalidArgument("its schema has no Arrow equivalent: " + as.ToString());
        arrow::FieldVector top;
        for (const parquet::arrow::SchemaField& f : impl->manifest.schema_fields) top.push_back(f.field);
        impl->schema = arrow::schema(std::move(top));
        if (md.num_rows() < 0 || md.num_row_groups() < 0) return DataLoss("a negative row count");
        uint64_t rows = 0;
        impl->row_groups.resize(static_cast<size_t>(md.num_row_groups()));
        for (int g = 0; g < md.num_row_groups(); ++g) {
          const std::unique_ptr<parquet::RowGroupMetaData> rg = md.RowGroup(g);
          ParquetRowGroup& out = impl->row_groups[static_cast<size_t>(g)];
          if (rg->num_rows() < 0) return DataLoss("row group " + std::to_string(g) + " has a negative row count");
          if (rg->num_columns() != md.num_columns()) {
            return DataLoss("row group " + std::to_string(g) + " has " + std::to_string(rg->num_columns()) +
                            " columns, the schema " + std::to_string(md.num_columns()));
          }
          out.rows = static_cast<uint64_t>(rg->num_rows());
          out.first_row = rows;
          rows += out.rows;
          out.columns.resize(static_cast<size_t>(rg->num_columns()));
          for (int c = 0; c < rg->num_columns(); ++c) {
            const std::unique_ptr<parquet::ColumnChunkMetaData> cc = rg->ColumnChunk(c);
            const std::string where =
                "row group " + std::to_string(g) + ", column " + md.schema()->Column(c)->path()->ToDotString();
            ParquetColumnChunk& ch = out.columns[static_cast<size_t>(c)];
            const int64_t data_at = cc->data_page_offset();
            int64_t start = data_at;
            if (cc->has_dictionary_page() && cc->dictionary_page_offset() > 0 && cc->dictionary_page_offset() < start) {
              start = cc->dictionary_page_offset();
            }
            if (start < static_cast<int64_t>(kMagic.size()) || cc->total_compressed_size() <= 0 ||
                cc->num_values() < 0 || cc->total_uncompressed_size() < 0 ||
                static_cast<uint64_t>(start) + static_cast<uint64_t>(cc->total_compressed_size()) > footer_at) {
              return DataLoss(where + " says it is " + std::to_string(cc->total_compressed_size()) + " bytes at byte " +
                              std::to_string(start) + ", which is not within the file's " + std::to_string(footer_at) +
                              " bytes before its footer");
            }
            ch.offset = static_cast<uint64_t>(start);
            ch.bytes = static_cast<uint64_t>(cc->total_compressed_size());
            ch.uncompressed_bytes = static_cast<uint64_t>(cc->total_uncompressed_size());
            ch.values = static_cast<uint64_t>(cc->num_values());
            ch.codec = arrow::util::Codec::GetCodecAsString(cc->compression());
            std::transform(ch.codec.begin(), ch.codec.end(), ch.codec.begin(),
                           [](unsigned char x) { return static_cast<char>(std::toupper(x)); });
            if (!cc->can_decompress()) {
              return InvalidArgument(where + " is compressed with " + ch.codec +
                                     ", which this build of libparquet cannot decompress");
            }
            if (const std::shared_ptr<parquet::SizeStatistics> ss = cc->size_statistics()) {
              if (ss->unencoded_byte_array_data_bytes && *ss->unencoded_byte_array_data_bytes >= 0) {
                ch.unencoded_bytes = static_cast<uint64_t>(*ss->unencoded_byte_array_data_bytes);
              }
            }
            if (cc->GetOffsetIndexLocation()) impl->page_index = true;
          }
        }
        if (rows != static_cast<uint64_t>(md.num_rows())) {
          return DataLoss("the row groups hold " + std::to_string(rows) + " rows, the footer says " +
                          std::to_string(md.num_rows()));
        }
        return Status::Ok();
      },
      "the footer is not a valid Parquet footer");
  if (!st.ok()) return st.WithLocationPrefix(where);
  return ParquetFooter(std::move(impl));
}

uint64_t ParquetFooter::rows() const { return static_cast<uint64_t>(impl_->metadata->num_rows()); }
const std::vector<ParquetRowGroup>& ParquetFooter::row_groups() const { return impl_->row_groups; }
size_t ParquetFooter::leaves() const { return static_cast<size_t>(impl_->metadata->num_columns()); }
std::string ParquetFooter::LeafPath(size_t leaf) const {
  return impl_->metadata->schema()->Column(static_cast<int>(leaf))->path()->ToDotString();
}
bool ParquetFooter::has_page_index() const { return impl_->page_index; }
std::string ParquetFooter::created_by() const { return impl_->metadata->created_by(); }

std::vector<std::string> ParquetFooter::FieldNames() const {
  std::vector<std::string> out;
  for (const parquet::arrow::SchemaField& f : impl_->manifest.schema_fields) out.push_back(f.field->name());
  return out;
}

std::string ParquetFooter::Columns() const {
  std::string out;
  for (const parquet::arrow::SchemaField& f : impl_->manifest.schema_fields) {
    if (!out.empty()) out += ", ";
    out += f.field->name() + ": " + f.field->type()->ToString();
  }
  return out;
}

Result<ParquetField> ParquetFooter::Field(std::string_view name) const {
  const parquet::arrow::SchemaField* f = impl_->Find(name, nullptr);
  if (!f) {
    return InvalidArgument("the file has no column " + std::string(name) + " (its columns: " + Columns() +
                           "; a struct's member is named by its dotted path, e.g. image.bytes)");
  }
  std::vector<int> leaves;
  CollectLeaves(*f, leaves);
  return ClassifyArrowField(name, *f->field, std::move(leaves));
}

std::vector<std::pair<std::string, std::string>> ParquetFooter::TypedColumns() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const parquet::arrow::SchemaField& f : impl_->manifest.schema_fields)
    out.emplace_back(f.field->name(), f.field->type()->ToString());
  return out;
}

// ---------------------------------------------------------------------------
// Decoding a row group

namespace {

/// Bytes a caller read, served to libparquet as a file: a read of bytes
/// nobody read is an error naming them.
class ReadBytesFile final : public arrow::io::RandomAccessFile {
 public:
  ReadBytesFile(std::vector<ParquetBytes> parts, int64_t size) : parts_(std::move(parts)), size_(size) {
    std::sort(parts_.begin(), parts_.end(),
              [](const ParquetBytes& a, const ParquetBytes& b) { return a.offset < b.offset; });
  }
  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }
  arrow::Result<int64_t> Tell() const override { return pos_; }
  arrow::Status Seek(int64_t position) override {
    pos_ = position;
    return arrow::Status::OK();
  }
  arrow::Result<int64_t> GetSize() override { return size_; }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    ARROW_ASSIGN_OR_RAISE(int64_t n, ReadAt(pos_, nbytes, true, out));
    pos_ += n;
    return n;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_ASSIGN_OR_RAISE(auto b, ReadAt(pos_, nbytes, true));
    pos_ += b->size();
    return b;
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, bool allow_short_read, void* out) override {
    ARROW_ASSIGN_OR_RAISE(auto b, ReadAt(position, nbytes, allow_short_read));
    if (b->size() > 0) std::memcpy(out, b->data(), static_cast<size_t>(b->size()));
    return b->size();
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    return ReadAt(position, nbytes, true, out);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes,
                                                       bool allow_short_read) override {
    if (position < 0 || nbytes < 0) return arrow::Status::Invalid("a negative read");
    const int64_t end = std::min(position + nbytes, size_);
    if (end <= position) return std::make_shared<arrow::Buffer>(nullptr, 0);
    // The part that holds `position`; one that ends before the read does
    // gives what it has, and the rest is named as not read.
    for (const ParquetBytes& p : parts_) {
      const int64_t from = static_cast<int64_t>(p.offset);
      const int64_t to = from + static_cast<int64_t>(p.bytes.size());
      if (position >= from && position < to) {
        if (to < end) {
          if (!allow_short_read) return Missing(to, end);
          NoteMissing(to, end);
        }
        const int64_t n = std::min(end, to) - position;
        auto owner = p.owner;
        return std::shared_ptr<arrow::Buffer>(
            new arrow::Buffer(reinterpret_cast<const uint8_t*>(p.bytes.data() + (position - from)), n),
            [owner](arrow::Buffer* b) { delete b; });
      }
    }
    return Missing(position, end);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes) override {
    return ReadAt(position, nbytes, true);
  }

  /// The bytes libparquet asked for that nobody read since the last
  /// ClearMissing() (empty: none).
  const std::string& missing() const { return missing_; }
  void ClearMissing() { missing_.clear(); }

 private:
  void NoteMissing(int64_t from, int64_t to) {
    if (missing_.empty()) missing_ = "bytes " + std::to_string(from) + " to " + std::to_string(to);
  }
  arrow::Status Missing(int64_t from, int64_t to) {
    NoteMissing(from, to);
    return arrow::Status::IOError("meshload: bytes ", from, " to ", to, " were not read");
  }

  std::vector<ParquetBytes> parts_;
  const int64_t size_;
  int64_t pos_ = 0;
  bool closed_ = false;
  std::string missing_;
};

}  // namespace

Result<ParquetRowGroupValues> ParquetFooter::DecodeGroup(int group, const std::vector<ParquetField>& fields,
                                                         const std::vector<ParquetBytes>& bytes) const {
  const ParquetFooter::Impl& impl = *impl_;
  if (group < 0 || static_cast<size_t>(group) >= impl.row_groups.size()) {
    return OutOfRange("row group " + std::to_string(group) + " of a file of " + std::to_string(impl.row_groups.size()));
  }
  const std::string where = "row group " + std::to_string(group);
  const auto size = static_cast<int64_t>(impl.file_size);
  const uint64_t rows = impl.row_groups[static_cast<size_t>(group)].rows;
  uint64_t values_bytes = 0;
  std::vector<std::shared_ptr<const ParquetRowGroupValues::Column>> columns;
  // One reader over the bytes read, for every field (the footer is the one
  // parsed: nothing is read to open it).
  auto file = std::make_shared<ReadBytesFile>(bytes, size);
  std::unique_ptr<parquet::arrow::FileReader> reader;
  Status opened = GuardArrow(
      [&]() -> Status {
        parquet::ReaderProperties rp = parquet::default_reader_properties();
        std::unique_ptr<parquet::ParquetFileReader> pf = parquet::ParquetFileReader::Open(file, rp, impl.metadata);
        parquet::ArrowReaderProperties ap;
        // Decoded on the calling thread: no column decoded on Arrow's CPU
        // pool, and no read handed to its I/O pool (pre-buffering reads
        // through ReadAsync, which runs on that pool: the bytes are in
        // memory already).
        ap.set_use_threads(false);
        ap.set_pre_buffer(false);
        auto fr = parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(pf), ap);
        if (!fr.ok()) return DataLoss(fr.status().ToString());
        reader = std::move(*fr);
        return Status::Ok();
      },
      "libparquet");
  if (!opened.ok()) return DataLoss("the row group's reader does not open: " + opened.message(), where);
  for (const ParquetField& field : fields) {
    std::vector<std::string> path;
    if (!impl.Find(field.name, &path)) return InvalidArgument("no column " + field.name, where);
    file->ClearMissing();
    std::shared_ptr<arrow::Table> table;
    Status st = GuardArrow(
        [&]() -> Status {
          auto t = reader->ReadRowGroup(group, field.leaves);
          if (!t.ok()) return DataLoss(t.status().ToString());
          table = std::move(*t);
          return Status::Ok();
        },
        "libparquet");
    if (!file->missing().empty()) {
      return OutOfRange("decoding column " + field.name + " needs " + file->missing() + ", which were not read", where);
    }
    if (!st.ok()) return DataLoss("column " + field.name + " does not decode: " + st.message(), where);
    // The top-level column, then the struct members down the path.
    std::shared_ptr<arrow::ChunkedArray> ca = table->GetColumnByName(path[0]);
    if (!ca) return Internal("libparquet's table has no column " + path[0], where);
    MESHLOAD_ASSIGN_OR_RETURN(auto col, ArrowColumn(field, path, ca->chunks(), rows, values_bytes, where));
    columns.push_back(std::move(col));
  }
  return ParquetRowGroupValues(rows, values_bytes, std::move(columns));
}

// ---------------------------------------------------------------------------
// Writing

Result<std::string> ParquetFileBytes(const std::vector<ParquetColumnToWrite>& columns, uint64_t rows_per_group) {
  MESHLOAD_ASSIGN_OR_RETURN(const std::shared_ptr<arrow::Table> table, ArrowTableOf(columns));
  auto sink = arrow::io::BufferOutputStream::Create();
  if (!sink.ok()) return Internal("arrow: " + sink.status().ToString());
  parquet::WriterProperties::Builder props;
  props.compression(parquet::Compression::SNAPPY);
  arrow::Status st =
      parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), *sink,
                                 static_cast<int64_t>(std::max<uint64_t>(rows_per_group, 1)), props.build());
  if (!st.ok()) return Internal("libparquet: " + st.ToString());
  auto buffer = (*sink)->Finish();
  if (!buffer.ok()) return Internal("arrow: " + buffer.status().ToString());
  return (*buffer)->ToString();
}

}  // namespace meshload::formats
