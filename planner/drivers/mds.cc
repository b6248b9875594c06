// MDS: the shards index.json lists (raw, or compressed and read as the raw
// shard they decompress to); sample i of a shard is its row i, by the
// shard's offset table; a field is the column of its name.

#include "planner/drivers/drivers.h"

namespace meshload::planner::drivers {
namespace {

class MdsDecoder final : public RecordDecoder {
 public:
  explicit MdsDecoder(const DatasetIndex& ds) : ds_(ds) {}
  Status Decode(uint64_t id, std::string_view record, uint32_t file, const std::string& file_name, uint64_t offset,
                formats::FieldValues& values, std::string& key) const override {
    const DatasetFile& f = ds_.files()[file];
    key = "row " + std::to_string(id - f.first);
    return formats::MdsSampleValues(record, *f.mds, file_name, offset, f.mds_columns, values);
  }

 private:
  const DatasetIndex& ds_;
};

class MdsDriver final : public RecordDriver {
 public:
  DatasetFormat format() const override { return DatasetFormat::kMDS; }
  std::unique_ptr<const RecordDecoder> MakeDecoder(const DatasetIndex& ds) const override {
    return std::make_unique<MdsDecoder>(ds);
  }

 protected:
  // Each field is the column of its name, decoded the same way in every
  // shard that has it.
  bool ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics& diags) const override {
    IndexParts p = Parts(idx);
    for (size_t i = 0; i < spec.fields.size(); ++i) {
      const DatasetField& field = spec.fields[i];
      const std::string at = "spec.dataset.fields[" + std::to_string(i) + "]";
      std::optional<formats::FieldDecoding> decoding;
      std::string first_shard;
      for (DatasetFile& f : p.files) {
        if (!f.mds) continue;
        int column = -1;
        for (size_t c = 0; c < f.mds->columns.size(); ++c) {
          if (f.mds->columns[c].name == field.name) column = static_cast<int>(c);
        }
        f.mds_columns.push_back(column);
        if (column < 0) continue;
        const formats::MdsColumn& col = f.mds->columns[static_cast<size_t>(column)];
        auto d = formats::MdsFieldDecoding(field.name, field.dtype, col);
        if (!d.ok()) {
          diags.Add(at, d.status().message() + " (shard " + f.path + ")");
          return false;
        }
        if (!decoding) {
          decoding = std::move(*d);
          first_shard = f.path;
        } else if (!(*decoding == *d)) {
          diags.Add(at, "column '" + field.name + "' is encoded '" + col.encoding + "' in " + f.path +
                            " but differently in " + first_shard + "; every shard must agree");
          return false;
        }
      }
      if (!decoding) {
        std::string columns;
        if (!p.files.empty() && p.files.front().mds) {
          for (const formats::MdsColumn& c : p.files.front().mds->columns)
            columns += (columns.empty() ? "" : ", ") + c.name;
        }
        diags.Add(at + ".name", "no shard has a column '" + field.name + "' (the columns are: " + columns + ")");
        return false;
      }
      p.fields.push_back(std::move(*decoding));
    }
    return true;
  }

  // A field with a dtype is taken as one value of it.
  formats::FieldDecoding VirtualField(const DatasetField& field) const override {
    formats::FieldDecoding d = formats::WebDatasetFieldDecoding(field.name, field.dtype);
    if (field.dtype) d.kind = formats::FieldDecoding::Kind::kScalar;
    return d;
  }
};

}  // namespace

const FormatDriver& MDS() {
  static const MdsDriver driver;
  return driver;
}

}  // namespace meshload::planner::drivers
