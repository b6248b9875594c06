#include "formats/arrow_ipc.h"

#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/api.h>
#include <arrow/util/compression.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "formats/arrow_columns.h"
#include "formats/parquet.h"

namespace meshload::formats {
namespace {

constexpr uint32_t kContinuation = 0xFFFFFFFFu;
constexpr std::string_view kFileMagic("ARROW1\0\0", 8);

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;  // little-endian, as Arrow's IPC format and the hosts the project builds for
}

/// A flatbuffer table's fields, read by hand: Arrow verifies the buffer
/// first (Message::Open), and every offset is checked against its size.
class FlatTable {
 public:
  FlatTable(const uint8_t* buf, uint64_t size, uint64_t at) : buf_(buf), size_(size), at_(at) {
    if (at_ + 4 > size_) return;
    const int64_t vt = static_cast<int64_t>(at_) - Load<int32_t>(buf_ + at_);
    if (vt < 0 || static_cast<uint64_t>(vt) + 4 > size_) return;
    vtable_ = static_cast<uint64_t>(vt);
    vsize_ = Load<uint16_t>(buf_ + vtable_);
    if (vtable_ + vsize_ > size_) vsize_ = 0;
    ok_ = true;
  }
  bool ok() const { return ok_; }
  /// Field `i`'s byte in the buffer; 0 when absent.
  uint64_t FieldAt(int i, uint64_t width) const {
    const uint64_t slot = 4 + 2 * static_cast<uint64_t>(i);
    if (!ok_ || slot + 2 > vsize_) return 0;
    const uint16_t off = Load<uint16_t>(buf_ + vtable_ + slot);
    if (off == 0 || at_ + off + width > size_) return 0;
    return at_ + off;
  }
  template <typename T>
  T Scalar(int i, T fallback) const {
    const uint64_t p = FieldAt(i, sizeof(T));
    return p ? Load<T>(buf_ + p) : fallback;
  }
  /// A table field's table.
  FlatTable Table(int i) const {
    const uint64_t p = FieldAt(i, 4);
    if (!p) return FlatTable(buf_, size_, size_);
    return FlatTable(buf_, size_, p + Load<uint32_t>(buf_ + p));
  }

 private:
  const uint8_t* buf_;
  uint64_t size_;
  uint64_t at_;
  uint64_t vtable_ = 0;
  uint64_t vsize_ = 0;
  bool ok_ = false;
};

std::string At(uint64_t offset) { return "@" + std::to_string(offset); }

/// A buffer of `bytes`, kept alive by `owner`.
std::shared_ptr<arrow::Buffer> Viewed(std::string_view bytes, std::shared_ptr<const void> owner) {
  return std::shared_ptr<arrow::Buffer>(
      new arrow::Buffer(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int64_t>(bytes.size())),
      [owner = std::move(owner)](arrow::Buffer* b) { delete b; });
}

/// The metadata flatbuffer, copied to memory Arrow's verifier finds
/// aligned, opened as a message with `body`.
Result<std::unique_ptr<arrow::ipc::Message>> OpenMessage(std::string_view metadata,
                                                         std::shared_ptr<arrow::Buffer> body) {
  auto copy = arrow::AllocateBuffer(static_cast<int64_t>(metadata.size()));
  if (!copy.ok()) return Internal("arrow: " + copy.status().ToString());
  if (!metadata.empty()) std::memcpy((*copy)->mutable_data(), metadata.data(), metadata.size());
  auto message = arrow::ipc::Message::Open(std::shared_ptr<arrow::Buffer>(std::move(*copy)), std::move(body));
  if (!message.ok()) return DataLoss(message.status().message());
  return std::move(*message);
}

}  // namespace

Result<ArrowIpcMessage> ParseArrowIpcMessage(std::string_view bytes, uint64_t offset, uint64_t file_size,
                                             uint64_t& needed) {
  needed = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint64_t left = offset <= file_size ? file_size - offset : 0;
  ArrowIpcMessage m;
  m.offset = offset;
  if (left < 4) return DataLoss("the file ends inside a message's prefix", At(offset));
  if (bytes.size() < std::min<uint64_t>(8, left)) {
    needed = std::min<uint64_t>(8, left);
    return OutOfRange("a message's prefix", At(offset));
  }
  uint64_t prefix = 4;
  int32_t length = Load<int32_t>(p);
  if (static_cast<uint32_t>(length) == kContinuation) {
    if (left < 8) return DataLoss("the file ends inside a message's prefix", At(offset));
    prefix = 8;
    length = Load<int32_t>(p + 4);
  }
  m.prefix_bytes = prefix;
  if (length == 0) {
    m.type = ArrowIpcMessage::Type::kEnd;
    m.metadata_bytes = prefix;
    return m;
  }
  if (length < 0 || static_cast<uint64_t>(length) > kArrowIpcMaxMetadataBytes) {
    return DataLoss("a message's metadata length " + std::to_string(length) +
                        " is not one (an Arrow IPC message starts with 0xFFFFFFFF and its metadata's length, at most "
                        "64 MiB)",
                    At(offset));
  }
  m.metadata_bytes = prefix + static_cast<uint64_t>(length);
  if (m.metadata_bytes > left) {
    return DataLoss("a message's metadata of " + std::to_string(length) + " bytes passes the file's end at byte " +
                        std::to_string(file_size),
                    At(offset));
  }
  if (bytes.size() < m.metadata_bytes) {
    needed = m.metadata_bytes;
    return OutOfRange("a message's metadata", At(offset));
  }
  const std::string_view metadata = bytes.substr(prefix, static_cast<size_t>(length));
  auto message = OpenMessage(metadata, nullptr);
  if (!message.ok()) return DataLoss("a message's metadata does not verify: " + message.status().message(), At(offset));
  const int64_t body = (*message)->body_length();
  if (body < 0 || static_cast<uint64_t>(body) > left - m.metadata_bytes) {
    return DataLoss("a message's body of " + std::to_string(body) + " bytes passes the file's end at byte " +
                        std::to_string(file_size),
                    At(offset));
  }
  m.body_bytes = static_cast<uint64_t>(body);
  switch ((*message)->type()) {
    case arrow::ipc::MessageType::SCHEMA: m.type = ArrowIpcMessage::Type::kSchema; break;
    case arrow::ipc::MessageType::DICTIONARY_BATCH: m.type = ArrowIpcMessage::Type::kDictionaryBatch; break;
    case arrow::ipc::MessageType::RECORD_BATCH: {
      m.type = ArrowIpcMessage::Type::kRecordBatch;
      // Message { version: short, header_type: ubyte, header: table, bodyLength: long };
      // RecordBatch { length: long, nodes, buffers, compression: BodyCompression { codec: byte } }.
      const auto* meta = reinterpret_cast<const uint8_t*>(metadata.data());
      const uint64_t n = metadata.size();
      const FlatTable root(meta, n, n >= 4 ? Load<uint32_t>(meta) : n);
      const FlatTable batch = root.Table(2);
      const int64_t rows = batch.Scalar<int64_t>(0, 0);
      if (!root.ok() || !batch.ok() || rows < 0) {
        return DataLoss("a record batch's metadata gives no row count", At(offset));
      }
      m.rows = static_cast<uint64_t>(rows);
      const FlatTable compression = batch.Table(3);
      if (compression.ok()) {
        const int8_t codec = compression.Scalar<int8_t>(0, 0);
        m.codec = codec == 0 ? "LZ4_FRAME" : codec == 1 ? "ZSTD" : "codec " + std::to_string(codec);
      }
      break;
    }
    default: m.type = ArrowIpcMessage::Type::kOther;
  }
  return m;
}

// ---------------------------------------------------------------------------
// The index

struct ArrowIpcFile::Impl {
  std::shared_ptr<arrow::Schema> schema;
  std::vector<ParquetRowGroup> batches;
  std::vector<ArrowIpcMessage> messages;  // one per batch
  uint64_t rows = 0;
};

Result<ArrowIpcFile> ArrowIpcFile::Index(const ReadAt& read, uint64_t file_size) {
  // A window of the file's bytes, read again only when a message's
  // metadata is not in it.
  std::string window;
  uint64_t window_at = 0;
  auto bytes_at = [&](uint64_t at, uint64_t want) -> Result<std::string_view> {
    if (at < window_at || at + want > window_at + window.size()) {
      const uint64_t n = std::min(std::max(want, kArrowIpcReadBytes), file_size - at);
      MESHLOAD_ASSIGN_OR_RETURN(window, read(at, n));
      window_at = at;
      if (window.size() < std::min(want, n)) return DataLoss("the file ends before byte " + std::to_string(at + want));
    }
    return std::string_view(window).substr(static_cast<size_t>(at - window_at));
  };
  auto impl = std::make_shared<Impl>();
  uint64_t pos = 0;
  {
    MESHLOAD_ASSIGN_OR_RETURN(std::string_view head, bytes_at(0, std::min<uint64_t>(8, file_size)));
    if (head.substr(0, 6) == kFileMagic.substr(0, 6)) pos = kFileMagic.size();
  }
  std::string schema_metadata;
  while (pos < file_size) {
    MESHLOAD_ASSIGN_OR_RETURN(std::string_view bytes, bytes_at(pos, std::min<uint64_t>(8, file_size - pos)));
    uint64_t needed = 0;
    Result<ArrowIpcMessage> m = ParseArrowIpcMessage(bytes, pos, file_size, needed);
    if (!m.ok() && needed > 0) {
      MESHLOAD_ASSIGN_OR_RETURN(bytes, bytes_at(pos, needed));
      m = ParseArrowIpcMessage(bytes, pos, file_size, needed);
    }
    if (!m.ok()) return m.status();
    if (m->type == ArrowIpcMessage::Type::kEnd) break;
    const std::string where = At(pos);
    switch (m->type) {
      case ArrowIpcMessage::Type::kSchema: {
        if (impl->schema) return DataLoss("a second schema message; a file holds one", where);
        const uint64_t prefix = m->prefix_bytes;
        MESHLOAD_ASSIGN_OR_RETURN(
            auto message,
            OpenMessage(bytes.substr(static_cast<size_t>(prefix), static_cast<size_t>(m->metadata_bytes - prefix)),
                        nullptr));
        arrow::ipc::DictionaryMemo memo;
        auto schema = arrow::ipc::ReadSchema(*message, &memo);
        if (!schema.ok()) return DataLoss("the schema does not read: " + schema.status().message(), where);
        impl->schema = std::move(*schema);
        break;
      }
      case ArrowIpcMessage::Type::kRecordBatch: {
        if (!impl->schema) return DataLoss("a record batch before the schema", where);
        if (m->codec != "UNCOMPRESSED") {
          auto type = arrow::util::Codec::GetCompressionType(m->codec == "LZ4_FRAME" ? "lz4" : "zstd");
          if (m->codec.starts_with("codec ") || !type.ok() || !arrow::util::Codec::IsAvailable(*type)) {
            return InvalidArgument("record batch " + std::to_string(impl->batches.size()) + " is compressed with " +
                                       m->codec + ", which this build of Arrow cannot decompress",
                                   where);
          }
        }
        ParquetRowGroup g;
        g.rows = m->rows;
        g.first_row = impl->rows;
        ParquetColumnChunk c;
        c.offset = m->offset;
        c.bytes = m->end() - m->offset;
        c.uncompressed_bytes = c.bytes;
        c.values = m->rows;
        c.codec = m->codec;
        g.columns.push_back(std::move(c));
        impl->rows += m->rows;
        impl->batches.push_back(std::move(g));
        impl->messages.push_back(*m);
        break;
      }
      case ArrowIpcMessage::Type::kDictionaryBatch:
        // Only a dictionary-typed column needs it, and such a column is not
        // delivered (ClassifyArrowField).
        break;
      default:
        return DataLoss("a message that is neither a schema nor a batch; an Arrow IPC file of a table holds no other",
                        where);
    }
    pos = m->end();
  }
  if (!impl->schema) return DataLoss("the file holds no schema message; it is not an Arrow IPC stream or file", "@0");
  return ArrowIpcFile(std::move(impl));
}

uint64_t ArrowIpcFile::rows() const { return impl_->rows; }
const std::vector<ParquetRowGroup>& ArrowIpcFile::row_groups() const { return impl_->batches; }

std::vector<std::string> ArrowIpcFile::FieldNames() const {
  std::vector<std::string> out;
  for (const std::shared_ptr<arrow::Field>& f : impl_->schema->fields()) out.push_back(f->name());
  return out;
}

std::vector<std::pair<std::string, std::string>> ArrowIpcFile::TypedColumns() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::shared_ptr<arrow::Field>& f : impl_->schema->fields())
    out.emplace_back(f->name(), f->type()->ToString());
  return out;
}

std::string ArrowIpcFile::Columns() const {
  std::string out;
  for (const auto& [name, type] : TypedColumns()) out += (out.empty() ? "" : ", ") + name + ": " + type;
  return out;
}

Result<ParquetField> ArrowIpcFile::Field(std::string_view name) const {
  const arrow::Field* f = FindArrowField(impl_->schema->fields(), name, nullptr);
  if (!f) {
    return InvalidArgument("the file has no column " + std::string(name) + " (its columns: " + Columns() +
                           "; a struct's member is named by its dotted path, e.g. image.bytes)");
  }
  // A batch is read whole: its message is every field's one chunk.
  return ClassifyArrowField(name, *f, {0});
}

Result<ParquetRowGroupValues> ArrowIpcFile::DecodeGroup(int group, const std::vector<ParquetField>& fields,
                                                        const std::vector<ParquetBytes>& bytes) const {
  const Impl& impl = *impl_;
  if (group < 0 || static_cast<size_t>(group) >= impl.batches.size()) {
    return OutOfRange("record batch " + std::to_string(group) + " of a file of " + std::to_string(impl.batches.size()));
  }
  const std::string where = "record batch " + std::to_string(group);
  const ArrowIpcMessage& m = impl.messages[static_cast<size_t>(group)];
  const ParquetBytes* part = nullptr;
  for (const ParquetBytes& b : bytes) {
    if (b.offset <= m.offset && b.offset + b.bytes.size() >= m.end()) part = &b;
  }
  if (!part) {
    return OutOfRange("decoding it needs bytes " + std::to_string(m.offset) + " to " + std::to_string(m.end()) +
                          ", which were not read",
                      where);
  }
  const std::string_view message =
      part->bytes.substr(static_cast<size_t>(m.offset - part->offset), static_cast<size_t>(m.end() - m.offset));
  const uint64_t prefix = m.prefix_bytes;
  auto opened = OpenMessage(message.substr(prefix, static_cast<size_t>(m.metadata_bytes - prefix)),
                            Viewed(message.substr(static_cast<size_t>(m.metadata_bytes)), part->owner));
  if (!opened.ok()) return DataLoss("its message does not open: " + opened.status().message(), where);
  // The wanted top-level columns only, decoded on the calling thread.
  std::set<int> wanted;
  std::vector<std::vector<std::string>> paths;
  for (const ParquetField& field : fields) {
    std::vector<std::string> path;
    if (!FindArrowField(impl.schema->fields(), field.name, &path))
      return InvalidArgument("no column " + field.name, where);
    wanted.insert(impl.schema->GetFieldIndex(path[0]));
    paths.push_back(std::move(path));
  }
  arrow::ipc::IpcReadOptions options;
  options.use_threads = false;
  options.included_fields.assign(wanted.begin(), wanted.end());
  arrow::ipc::DictionaryMemo memo;
  std::shared_ptr<arrow::RecordBatch> batch;
  Status st = GuardArrow(
      [&]() -> Status {
        auto b = arrow::ipc::ReadRecordBatch(**opened, impl.schema, &memo, options);
        if (!b.ok()) return DataLoss(b.status().message());
        batch = std::move(*b);
        return Status::Ok();
      },
      "arrow");
  if (!st.ok()) return DataLoss("it does not decode: " + st.message(), where);
  if (static_cast<uint64_t>(batch->num_rows()) != m.rows) {
    return DataLoss(
        "it decodes to " + std::to_string(batch->num_rows()) + " rows, its header says " + std::to_string(m.rows),
        where);
  }
  // Arrow checks a batch's buffers against its body as it reads; the
  // offsets inside them are checked here, before a row is looked up.
  arrow::Status valid = batch->ValidateFull();
  if (!valid.ok()) return DataLoss("it is not a valid batch: " + valid.message(), where);
  uint64_t values_bytes = 0;
  std::vector<std::shared_ptr<const ParquetRowGroupValues::Column>> columns;
  for (size_t k = 0; k < fields.size(); ++k) {
    std::shared_ptr<arrow::Array> top = batch->GetColumnByName(paths[k][0]);
    if (!top) return Internal("the decoded batch has no column " + paths[k][0], where);
    MESHLOAD_ASSIGN_OR_RETURN(auto col, ArrowColumn(fields[k], paths[k], {top}, m.rows, values_bytes, where));
    columns.push_back(std::move(col));
  }
  return ParquetRowGroupValues(m.rows, values_bytes, std::move(columns));
}

// ---------------------------------------------------------------------------
// Writing

Result<std::string> ArrowIpcStreamBytes(const std::vector<ParquetColumnToWrite>& columns, uint64_t rows_per_batch) {
  MESHLOAD_ASSIGN_OR_RETURN(const std::shared_ptr<arrow::Table> table, ArrowTableOf(columns));
  auto sink = arrow::io::BufferOutputStream::Create();
  if (!sink.ok()) return Internal("arrow: " + sink.status().ToString());
  auto writer = arrow::ipc::MakeStreamWriter(*sink, table->schema());
  if (!writer.ok()) return Internal("arrow: " + writer.status().ToString());
  arrow::Status st = (*writer)->WriteTable(*table, static_cast<int64_t>(std::max<uint64_t>(rows_per_batch, 1)));
  if (st.ok()) st = (*writer)->Close();
  if (!st.ok()) return Internal("arrow: " + st.ToString());
  auto buffer = (*sink)->Finish();
  if (!buffer.ok()) return Internal("arrow: " + buffer.status().ToString());
  return (*buffer)->ToString();
}

}  // namespace meshload::formats
