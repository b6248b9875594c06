#include "formats/parquet.h"

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

std::optional<DType> NumberDType(const arrow::DataType& t) {
  switch (t.id()) {
    case arrow::Type::BOOL: return DType::kBool;
    case arrow::Type::INT8: return DType::kInt8;
    case arrow::Type::UINT8: return DType::kUint8;
    case arrow::Type::INT16: return DType::kInt16;
    case arrow::Type::UINT16: return DType::kUint16;
    case arrow::Type::INT32: return DType::kInt32;
    case arrow::Type::UINT32: return DType::kUint32;
    case arrow::Type::INT64: return DType::kInt64;
    case arrow::Type::UINT64: return DType::kUint64;
    case arrow::Type::HALF_FLOAT: return DType::kFloat16;
    case arrow::Type::FLOAT: return DType::kFloat32;
    case arrow::Type::DOUBLE: return DType::kFloat64;
    default: return std::nullopt;
  }
}

bool IsBytes(arrow::Type::type id) {
  return id == arrow::Type::BINARY || id == arrow::Type::STRING || id == arrow::Type::LARGE_BINARY ||
         id == arrow::Type::LARGE_STRING || id == arrow::Type::BINARY_VIEW || id == arrow::Type::STRING_VIEW;
}

bool IsList(arrow::Type::type id) { return id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST; }

/// A chain of fixed-size lists ending in numbers other than bool (`t`
/// itself a number counts, shape []): the shape and dtype; nullopt else.
std::optional<std::pair<std::vector<uint64_t>, DType>> FixedNumbers(const arrow::DataType& t) {
  std::vector<uint64_t> shape;
  const arrow::DataType* at = &t;
  while (at->id() == arrow::Type::FIXED_SIZE_LIST) {
    const auto& fl = static_cast<const arrow::FixedSizeListType&>(*at);
    shape.push_back(static_cast<uint64_t>(fl.list_size()));
    at = fl.value_type().get();
  }
  std::optional<DType> dt = NumberDType(*at);
  if (!dt || *dt == DType::kBool) return std::nullopt;
  return std::make_pair(std::move(shape), *dt);
}

template <typename F>
Status Guard(F&& f, std::string_view what) {
  try {
    return f();
  } catch (const std::exception& e) {
    return DataLoss(std::string(what) + ": " + e.what());
  }
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

  /// The schema field named `name` and the names from the top to it.
  const parquet::arrow::SchemaField* Find(std::string_view name, std::vector<std::string>* path) const {
    for (const parquet::arrow::SchemaField& f : manifest.schema_fields) {
      if (f.field->name() == name) {
        if (path) *path = {std::string(name)};
        return &f;
      }
    }
    // A struct's member by its dotted path: the longest top-level name
    // first (a column may have a dot in its name).
    for (size_t dot = name.rfind('.'); dot != std::string_view::npos && dot > 0; dot = name.rfind('.', dot - 1)) {
      std::vector<std::string> p;
      const parquet::arrow::SchemaField* top = Find(name.substr(0, dot), &p);
      if (!top) continue;
      const parquet::arrow::SchemaField* at = top;
      std::string_view rest = name.substr(dot + 1);
      while (at && !rest.empty()) {
        if (at->field->type()->id() != arrow::Type::STRUCT) {
          at = nullptr;
          break;
        }
        const parquet::arrow::SchemaField* next = nullptr;
        // The longest member name that matches.
        for (const parquet::arrow::SchemaField& c : at->children) {
          const std::string& n = c.field->name();
          if (rest.substr(0, n.size()) == n && (rest.size() == n.size() || rest[n.size()] == '.') &&
              (!next || n.size() > next->field->name().size())) {
            next = &c;
          }
        }
        if (!next) {
          at = nullptr;
          break;
        }
        p.push_back(next->field->name());
        rest = rest.size() == next->field->name().size() ? std::string_view()
                                                         : rest.substr(next->field->name().size() + 1);
        at = next;
      }
      if (at) {
        if (path) *path = std::move(p);
        return at;
      }
      if (dot == 0) break;
    }
    return nullptr;
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
  Status parsed = Guard(
      [&]() -> Status {
        impl->metadata = parquet::FileMetaData::Make(footer.data(), static_cast<int64_t>(footer.size()));
        return Status::Ok();
      },
      "the footer does not parse");
  if (!parsed.ok()) return parsed.WithLocationPrefix(where);
  Status st = Guard(
      [&]() -> Status {
        const parquet::FileMetaData& md = *impl->metadata;
        if (md.is_encryption_algorithm_set()) {
          return InvalidArgument("the file's columns are encrypted, which meshload does not read");
        }
        parquet::ArrowReaderProperties props;
        arrow::Status as =
            parquet::arrow::SchemaManifest::Make(md.schema(), md.key_value_metadata(), props, &impl->manifest);
        if (!as.ok()) return InvalidArgument("its schema has no Arrow equivalent: " + as.ToString());
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
  ParquetField out;
  out.name = std::string(name);
  const arrow::DataType& t = *f->field->type();
  out.type = t.ToString();
  CollectLeaves(*f, out.leaves);
  const auto refuse = [&](std::string_view why) {
    return InvalidArgument("column " + out.name + " is " + out.type + ": " + std::string(why));
  };
  if (IsBytes(t.id())) {
    out.kind = ParquetValueKind::kBytes;
  } else if (t.id() == arrow::Type::FIXED_SIZE_BINARY) {
    out.kind = ParquetValueKind::kFixedList;
    out.shape = {static_cast<uint64_t>(static_cast<const arrow::FixedSizeBinaryType&>(t).byte_width())};
  } else if (std::optional<DType> dt = NumberDType(t)) {
    out.kind = ParquetValueKind::kScalar;
    out.dtype = *dt;
  } else if (t.id() == arrow::Type::FIXED_SIZE_LIST) {
    auto fixed = FixedNumbers(t);
    if (!fixed) return refuse("a fixed-size list is a field when it holds numbers (or fixed-size lists of numbers)");
    out.kind = ParquetValueKind::kFixedList;
    out.shape = std::move(fixed->first);
    out.dtype = fixed->second;
  } else if (IsList(t.id())) {
    auto fixed = FixedNumbers(*static_cast<const arrow::BaseListType&>(t).value_type());
    if (!fixed) return refuse("a list is a field when it holds numbers (bool excepted) or fixed-size lists of them");
    out.kind = ParquetValueKind::kList;
    out.dtype = fixed->second;
  } else if (t.id() == arrow::Type::STRUCT) {
    std::string members;
    for (const parquet::arrow::SchemaField& c : f->children)
      members += (members.empty() ? "" : ", ") + out.name + "." + c.field->name();
    return refuse("name one of its members as the field (" + members + ")");
  } else if (t.id() == arrow::Type::DICTIONARY) {
    return refuse("dictionary-typed columns are not delivered; write the column with its value type");
  } else {
    return refuse(
        "meshload delivers binary and string columns, numbers, lists and fixed-size lists of numbers, and struct "
        "members");
  }
  if (out.leaves.size() != 1) return refuse("a field is one leaf column");
  return out;
}

std::string ParquetFooter::SchemaDifference(const ParquetFooter& other) const {
  const auto& mine = impl_->manifest.schema_fields;
  const auto& theirs = other.impl_->manifest.schema_fields;
  for (const parquet::arrow::SchemaField& f : mine) {
    const parquet::arrow::SchemaField* o = other.impl_->Find(f.field->name(), nullptr);
    if (!o) return "column " + f.field->name() + ": missing there";
    if (!f.field->type()->Equals(*o->field->type())) {
      return "column " + f.field->name() + ": " + f.field->type()->ToString() + " here, " +
             o->field->type()->ToString() + " there";
    }
  }
  for (const parquet::arrow::SchemaField& o : theirs) {
    if (!impl_->Find(o.field->name(), nullptr)) return "column " + o.field->name() + ": only there";
  }
  return "";
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

/// One field's decoded arrays (a chunked array: one chunk unless a row
/// group's values pass 2 GiB) and how to find a row's bytes in them.
struct ParquetRowGroupValues::Column {
  struct Piece {
    int64_t first_row = 0;
    std::shared_ptr<arrow::Array> array;
    std::vector<uint8_t> bools;  // a bool column's values, a byte each
  };
  ParquetField field;
  std::vector<Piece> pieces;

  std::optional<std::string_view> Value(uint64_t row) const {
    size_t k = pieces.size() - 1;
    while (k > 0 && pieces[k].first_row > static_cast<int64_t>(row)) --k;
    const Piece& p = pieces[k];
    const int64_t i = static_cast<int64_t>(row) - p.first_row;
    const arrow::Array& a = *p.array;
    if (a.IsNull(i)) return std::nullopt;
    switch (field.kind) {
      case ParquetValueKind::kBytes:
        switch (a.type_id()) {
          case arrow::Type::BINARY:
          case arrow::Type::STRING: return static_cast<const arrow::BinaryArray&>(a).GetView(i);
          case arrow::Type::LARGE_BINARY:
          case arrow::Type::LARGE_STRING: return static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
          default: return static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
        }
      case ParquetValueKind::kScalar: {
        if (field.dtype == DType::kBool) return std::string_view(reinterpret_cast<const char*>(&p.bools[i]), 1);
        const size_t w = DTypeSize(field.dtype);
        const uint8_t* base = a.data()->buffers[1]->data();
        return std::string_view(reinterpret_cast<const char*>(base + (a.offset() + i) * w), w);
      }
      case ParquetValueKind::kFixedList:
        if (a.type_id() == arrow::Type::FIXED_SIZE_BINARY)
          return static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i);
        return ElementsOf(a, i, i + 1);
      case ParquetValueKind::kList: {
        int64_t from = 0, to = 0;
        std::shared_ptr<arrow::Array> values;
        if (a.type_id() == arrow::Type::LIST) {
          const auto& l = static_cast<const arrow::ListArray&>(a);
          from = l.value_offset(i);
          to = l.value_offset(i + 1);
          values = l.values();
        } else {
          const auto& l = static_cast<const arrow::LargeListArray&>(a);
          from = l.value_offset(i);
          to = l.value_offset(i + 1);
          values = l.values();
        }
        return ElementsOf(*values, from, to);
      }
    }
    return std::nullopt;
  }

  /// Elements [from, to) of a chain of fixed-size lists ending in numbers
  /// (`a` itself numbers when the chain is empty): one run of bytes.
  std::string_view ElementsOf(const arrow::Array& a, int64_t from, int64_t to) const {
    if (a.type_id() == arrow::Type::FIXED_SIZE_LIST) {
      const auto& fl = static_cast<const arrow::FixedSizeListArray&>(a);
      const int64_t n = fl.value_length();
      return ElementsOf(*fl.values(), fl.value_offset(from), fl.value_offset(from) + (to - from) * n);
    }
    const size_t w = DTypeSize(field.dtype);
    const uint8_t* base = a.data()->buffers[1] ? a.data()->buffers[1]->data() : nullptr;
    if (to <= from || base == nullptr) return std::string_view();
    return std::string_view(reinterpret_cast<const char*>(base + (a.offset() + from) * w),
                            static_cast<size_t>(to - from) * w);
  }
};

namespace {

/// Nulls inside a list's or fixed-size list's values (below the row): a
/// number meshload cannot deliver.
bool NullsBelow(const arrow::Array& a) {
  std::shared_ptr<arrow::Array> values;
  if (a.type_id() == arrow::Type::LIST) {
    values = static_cast<const arrow::ListArray&>(a).values();
  } else if (a.type_id() == arrow::Type::LARGE_LIST) {
    values = static_cast<const arrow::LargeListArray&>(a).values();
  } else if (a.type_id() == arrow::Type::FIXED_SIZE_LIST) {
    values = static_cast<const arrow::FixedSizeListArray&>(a).values();
  } else {
    return false;
  }
  return values->null_count() > 0 || NullsBelow(*values);
}

}  // namespace

Result<ParquetRowGroupValues> ParquetRowGroupValues::Decode(const ParquetFooter& footer, int group,
                                                            const std::vector<ParquetField>& fields,
                                                            const std::vector<ParquetBytes>& bytes) {
  const ParquetFooter::Impl& impl = *footer.impl_;
  if (group < 0 || static_cast<size_t>(group) >= impl.row_groups.size()) {
    return OutOfRange("row group " + std::to_string(group) + " of a file of " + std::to_string(impl.row_groups.size()));
  }
  const std::string where = "row group " + std::to_string(group);
  const auto size = static_cast<int64_t>(impl.file_size);
  ParquetRowGroupValues out;
  out.rows_ = impl.row_groups[static_cast<size_t>(group)].rows;
  // One reader over the bytes read, for every field (the footer is the one
  // parsed: nothing is read to open it).
  auto file = std::make_shared<ReadBytesFile>(bytes, size);
  std::unique_ptr<parquet::arrow::FileReader> reader;
  Status opened = Guard(
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
    auto col = std::make_shared<Column>();
    col->field = field;
    std::shared_ptr<arrow::Table> table;
    Status st = Guard(
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
    int64_t first = 0;
    for (const std::shared_ptr<arrow::Array>& chunk : ca->chunks()) {
      std::shared_ptr<arrow::Array> a = chunk;
      for (size_t k = 1; k < path.size(); ++k) {
        const auto& s = static_cast<const arrow::StructArray&>(*a);
        const int idx = s.struct_type()->GetFieldIndex(path[k]);
        if (idx < 0) return Internal("libparquet's struct has no member " + path[k], where);
        // The member's values with the struct's nulls applied.
        auto flat = s.GetFlattenedField(idx);
        if (!flat.ok()) return DataLoss(flat.status().ToString(), where);
        a = std::move(*flat);
      }
      if (NullsBelow(*a)) {
        return DataLoss(
            "column " + field.name + " holds a null number inside a list; meshload delivers lists of numbers", where);
      }
      ParquetRowGroupValues::Column::Piece piece;
      piece.first_row = first;
      if (field.kind == ParquetValueKind::kScalar && field.dtype == DType::kBool) {
        const auto& b = static_cast<const arrow::BooleanArray&>(*a);
        piece.bools.resize(static_cast<size_t>(b.length()));
        for (int64_t i = 0; i < b.length(); ++i)
          piece.bools[static_cast<size_t>(i)] = b.IsValid(i) && b.Value(i) ? 1 : 0;
        out.bytes_ += piece.bools.size();
      }
      first += a->length();
      out.bytes_ += static_cast<uint64_t>(arrow::util::TotalBufferSize(*a));
      piece.array = std::move(a);
      col->pieces.push_back(std::move(piece));
    }
    if (static_cast<uint64_t>(first) != out.rows_ || col->pieces.empty()) {
      if (out.rows_ == 0 && col->pieces.empty()) {
        out.columns_.push_back(std::move(col));
        continue;
      }
      return DataLoss("column " + field.name + " decodes to " + std::to_string(first) + " rows, the footer says " +
                          std::to_string(out.rows_),
                      where);
    }
    out.columns_.push_back(std::move(col));
  }
  return out;
}

std::optional<std::string_view> ParquetRowGroupValues::Value(size_t f, uint64_t row) const {
  return columns_[f]->Value(row);
}

// ---------------------------------------------------------------------------
// Writing

namespace {

std::shared_ptr<arrow::DataType> ArrowTypeOf(DType t) {
  switch (t) {
    case DType::kBool: return arrow::boolean();
    case DType::kInt8: return arrow::int8();
    case DType::kUint8: return arrow::uint8();
    case DType::kInt16: return arrow::int16();
    case DType::kUint16: return arrow::uint16();
    case DType::kInt32: return arrow::int32();
    case DType::kUint32: return arrow::uint32();
    case DType::kInt64: return arrow::int64();
    case DType::kUint64: return arrow::uint64();
    case DType::kFloat16: return arrow::float16();
    case DType::kFloat32: return arrow::float32();
    case DType::kFloat64: return arrow::float64();
    case DType::kBFloat16: return nullptr;
  }
  return nullptr;
}

/// `n` numbers of `dtype` from their bytes back to back.
Result<std::shared_ptr<arrow::Array>> Numbers(DType dtype, const std::string& bytes, int64_t n) {
  std::shared_ptr<arrow::DataType> type = ArrowTypeOf(dtype);
  if (!type) return InvalidArgument(std::string(DTypeName(dtype)) + " has no Parquet type");
  if (dtype == DType::kBool) {
    arrow::BooleanBuilder b;
    for (int64_t i = 0; i < n; ++i) {
      if (!b.Append(bytes[static_cast<size_t>(i)] != 0).ok()) return Internal("arrow: append");
    }
    std::shared_ptr<arrow::Array> out;
    if (!b.Finish(&out).ok()) return Internal("arrow: finish");
    return out;
  }
  return arrow::MakeArray(arrow::ArrayData::Make(type, n, {nullptr, arrow::Buffer::FromString(bytes)}));
}

}  // namespace

Result<std::string> ParquetFileBytes(const std::vector<ParquetColumnToWrite>& columns, uint64_t rows_per_group) {
  std::vector<std::shared_ptr<arrow::Field>> fields;
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  for (const ParquetColumnToWrite& c : columns) {
    const auto n = static_cast<int64_t>(c.values.size());
    const size_t es = DTypeSize(c.dtype);
    std::shared_ptr<arrow::Array> a;
    if (c.kind == ParquetValueKind::kBytes) {
      arrow::BinaryBuilder b;
      for (const std::string& v : c.values) {
        if (!b.Append(v).ok()) return Internal("arrow: append", c.name);
      }
      if (!b.Finish(&a).ok()) return Internal("arrow: finish", c.name);
    } else if (c.kind == ParquetValueKind::kScalar) {
      std::string all;
      for (const std::string& v : c.values) {
        if (v.size() != es) return InvalidArgument("a value of " + std::to_string(v.size()) + " bytes", c.name);
        all += v;
      }
      MESHLOAD_ASSIGN_OR_RETURN(a, Numbers(c.dtype, all, n));
    } else if (c.kind == ParquetValueKind::kList) {
      std::string all;
      std::vector<int32_t> offsets = {0};
      for (const std::string& v : c.values) {
        if (v.size() % es != 0) return InvalidArgument("a list of " + std::to_string(v.size()) + " bytes", c.name);
        all += v;
        offsets.push_back(static_cast<int32_t>(all.size() / es));
      }
      MESHLOAD_ASSIGN_OR_RETURN(auto values, Numbers(c.dtype, all, static_cast<int64_t>(all.size() / es)));
      auto off = arrow::MakeArray(arrow::ArrayData::Make(
          arrow::int32(), n + 1,
          {nullptr, arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(offsets.data()),
                                                          offsets.size() * sizeof(int32_t)))}));
      auto list = arrow::ListArray::FromArrays(*off, *values);
      if (!list.ok()) return Internal("arrow: " + list.status().ToString(), c.name);
      a = *list;
    } else {
      return InvalidArgument("fixed-size lists are not written", c.name);
    }
    fields.push_back(arrow::field(c.name, a->type()));
    arrays.push_back(std::move(a));
  }
  const std::shared_ptr<arrow::Table> table = arrow::Table::Make(arrow::schema(fields), arrays);
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
