// Parquet and Arrow: the rows of columnar files (formats/columnar.h: Parquet
// files, Arrow IPC files as datasets.Dataset.save_to_disk writes them), read
// through Arrow C++ by the sidecar (sidecar/source/parquet_source.h) as
// records of fixed size (formats/parquet_record.h); each file's footer (an
// Arrow file's record batch headers) gives its rows, and a field is the
// column of its name (a struct's member by its dotted path), delivered as
// its type says. One driver class, registered once per format.

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

class ColumnarDecoder final : public RecordDecoder {
 public:
  explicit ColumnarDecoder(const DatasetIndex& ds) : ds_(ds) {}
  Status Decode(uint64_t id, std::string_view record, uint32_t file, const std::string& file_name, uint64_t offset,
                formats::FieldValues& values, std::string& key) const override {
    const DatasetFile& f = ds_.files()[file];
    key = "row " + std::to_string(id - f.first);
    if (!f.parquet) return Internal("a columnar file without its footer's facts", file_name);
    Status st = formats::ParquetRecordValues(f.parquet->layout, record, values);
    if (!st.ok()) {
      // The record's byte within the file of records, for the message.
      const uint64_t at = st.location().empty() ? 0 : std::stoull(st.location().substr(1));
      return Status(st.code(), key + ": " + st.message(), file_name + "@" + std::to_string(offset + at));
    }
    return Status::Ok();
  }

 private:
  const DatasetIndex& ds_;
};

/// How a column's values become the field: as stored (bytes), one number,
/// a fixed shape of numbers, or a list's numbers.
formats::FieldDecoding Decoding(const std::string& name, const formats::ParquetField& c) {
  formats::FieldDecoding d;
  d.name = name;
  d.dtype = c.dtype;
  switch (c.kind) {
    case formats::ParquetValueKind::kBytes: d.kind = formats::FieldDecoding::Kind::kBytes; break;
    case formats::ParquetValueKind::kScalar: d.kind = formats::FieldDecoding::Kind::kScalar; break;
    case formats::ParquetValueKind::kFixedList:
      d.kind = formats::FieldDecoding::Kind::kNdarrayFixed;
      d.shape = c.shape;
      break;
    case formats::ParquetValueKind::kList: d.kind = formats::FieldDecoding::Kind::kValues; break;
  }
  return d;
}

class ColumnarDriver final : public RecordDriver {
 public:
  explicit ColumnarDriver(DatasetFormat format) : format_(format) {}
  DatasetFormat format() const override { return format_; }
  FormatTraits traits() const override {
    FormatTraits t = RecordDriver::traits();
    t.splits = true;  // a Hub repository's, a saved DatasetDict's
    t.hub_repository = format_ == DatasetFormat::kParquet;
    return t;
  }
  std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const override {
    return std::make_unique<ColumnarDecoder>(ds);
  }

  bool AddFile(const DatasetSpec&, DatasetIndex::FileFacts& facts, DatasetFile& f, DatasetIndex& idx,
               Diagnostics& diags) const override {
    if (!facts.parquet.ok()) {
      diags.Add(facts.parquet.status());
      return false;
    }
    IndexParts p = Parts(idx);
    const uint64_t R = facts.parquet->layout.bytes;
    f.count = facts.parquet->rows;
    p.offsets.reserve(p.offsets.size() + f.count);
    p.sizes.reserve(p.sizes.size() + f.count);
    for (uint64_t i = 0; i < f.count; ++i) {
      p.offsets.push_back(i * R);
      p.sizes.push_back(R);
    }
    f.parquet = std::move(*facts.parquet);
    return true;
  }

 protected:
  void CheckField(const DatasetField& f, const std::string& at, Diagnostics& d) const override {
    if (f.shape_set) {
      d.Add(at + ".shape", "is not used by format " + std::string(ToString(format_)) +
                               " (a fixed-size list's shape comes from its column); remove it");
    }
  }

  // Each field is the column of its name, the same in every file (the
  // sidecar's reading of the footers checked that).
  bool ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics& diags) const override {
    const std::vector<DatasetFile>& files = idx.files();
    if (files.empty() || !files[0].parquet) return true;  // no file: nothing to resolve against
    const ParquetFile& first = *files[0].parquet;
    bool ok = true;
    for (size_t i = 0; i < spec.fields.size() && i < first.fields.size(); ++i) {
      const DatasetField& field = spec.fields[i];
      const formats::ParquetField& c = first.fields[i];
      const std::string at = "spec.dataset.fields[" + std::to_string(i) + "]";
      if (field.dtype && (c.kind == formats::ParquetValueKind::kBytes || *field.dtype != c.dtype)) {
        diags.Add(at + ".dtype",
                  std::string(formats::DTypeName(*field.dtype)) + " is not column " + c.name + "'s type (" + c.type +
                      (c.kind == formats::ParquetValueKind::kBytes ? ", delivered as its bytes: remove dtype"
                                                                   : ": " + std::string(formats::DTypeName(c.dtype))) +
                      ")");
        ok = false;
      }
      if (c.ragged() && !field.max_bytes) {
        diags.Add(at + ".maxBytes",
                  "required: column " + c.name + " is " + c.type + ", a ragged field whose rows' sizes " +
                      (format_ == DatasetFormat::kArrow ? "an Arrow batch's header" : "a Parquet footer") +
                      " does not give; give the most bytes one row's value takes");
        ok = false;
      } else if (!c.ragged() && field.max_bytes) {
        diags.Add(at + ".maxBytes", "is not used: column " + c.name + " is " + c.type + ", " +
                                        std::to_string(c.row_bytes()) + " bytes every row; remove it");
        ok = false;
      }
      Parts(idx).fields.push_back(Decoding(field.name, c));
    }
    for (size_t k = 1; k < files.size(); ++k) {
      if (files[k].parquet && files[k].parquet->layout.bytes != first.layout.bytes) {
        diags.Add(files[k].path, "its columns differ from " + files[0].path + "'s");
        ok = false;
      }
    }
    return ok;
  }

  // A virtual index knows no column types: a dtype's numbers ragged, else bytes.
  formats::FieldDecoding VirtualField(const DatasetField& field) const override {
    formats::FieldDecoding d;
    d.name = field.name;
    if (field.dtype) {
      d.kind = formats::FieldDecoding::Kind::kValues;
      d.dtype = *field.dtype;
    }
    return d;
  }

 private:
  DatasetFormat format_;
};

}  // namespace

const FormatDriver& Parquet() {
  static const ColumnarDriver driver(DatasetFormat::kParquet);
  return driver;
}

const FormatDriver& Arrow() {
  static const ColumnarDriver driver(DatasetFormat::kArrow);
  return driver;
}

}  // namespace meshload::planner::drivers
