#include "sidecar/source/parquet_source.h"

#include <algorithm>
#include <cstring>

namespace meshload::sidecar::source {
namespace {

uint64_t Rows(const ParquetRowSource::File& f) { return f.footer->rows(); }

}  // namespace

void ParquetRowSource::Add(const std::string& name, File file) { files_[name] = std::move(file); }

Result<ObjectInfo> ParquetRowSource::Stat(const std::string& uri) {
  auto f = files_.find(uri);
  if (f == files_.end()) return inner_.Stat(uri);
  MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo info, inner_.Stat(f->second.stored_name));
  info.size = Rows(f->second) * f->second.layout.bytes;
  return info;
}

int ParquetRowSource::GroupOf(const File& f, uint64_t row) {
  const std::vector<formats::ParquetRowGroup>& groups = f.footer->row_groups();
  auto it = std::upper_bound(groups.begin(), groups.end(), row,
                             [](uint64_t r, const formats::ParquetRowGroup& g) { return r < g.first_row; });
  return static_cast<int>(it - groups.begin()) - 1;
}

Result<std::shared_ptr<const formats::ParquetRowGroupValues>> ParquetRowSource::Decode(const File& f, int g) {
  const formats::ParquetRowGroup& group = f.footer->row_groups()[static_cast<size_t>(g)];
  // The column chunks of the fields' leaves, in file order, adjacent ones
  // read as one (a row group's chunks follow each other in column order).
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const formats::ParquetField& field : f.fields) {
    for (int leaf : field.leaves) {
      const formats::ParquetColumnChunk& c = group.columns[static_cast<size_t>(leaf)];
      ranges.emplace_back(c.offset, c.offset + c.bytes);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  std::vector<formats::ParquetBytes> bytes;
  uint64_t read = 0;
  for (const auto& [from, to] : merged) {
    auto buf = std::make_shared<std::string>(static_cast<size_t>(to - from), '\0');
    MESHLOAD_RETURN_IF_ERROR(inner_.Read(f.stored_name, from, buf->data(), to - from));
    bytes.push_back({from, *buf, buf});
    read += to - from;
  }
  auto values = formats::ParquetRowGroupValues::Decode(*f.footer, g, f.fields, bytes);
  if (!values.ok()) {
    const Status& st = values.status();
    return Status(st.code(), st.message(),
                  RedactUri(f.stored_name) + (st.location().empty() ? "" : ": ") + st.location());
  }
  chunk_bytes_ += read;
  return std::make_shared<const formats::ParquetRowGroupValues>(std::move(*values));
}

Status ParquetRowSource::ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) {
  auto found = files_.find(uri);
  if (found == files_.end()) return inner_.ReadV(uri, offset, iov);
  const File& f = found->second;
  const uint64_t R = f.layout.bytes;
  uint64_t len = 0;
  for (const iovec& v : iov) len += v.iov_len;
  const uint64_t size = Rows(f) * R;
  if (offset > size || len > size - offset) {
    return DataLoss("range [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                        ") is past the end of its " + std::to_string(Rows(f)) + " rows of " + std::to_string(R) +
                        " bytes",
                    RedactUri(uri) + "@" + std::to_string(offset));
  }
  thread_local std::vector<uint8_t> record;
  thread_local formats::FieldValues values;
  record.resize(static_cast<size_t>(R));
  values.resize(f.fields.size());
  size_t seg = 0;        // the iovec being filled
  uint64_t seg_at = 0;   // bytes of it filled
  uint64_t at = offset;  // the next byte of the file to hand
  std::shared_ptr<const formats::ParquetRowGroupValues> group;
  int g = -1;
  while (at < offset + len) {
    const uint64_t row = at / R;
    const uint64_t in_row = at % R;
    const int rg = GroupOf(f, row);
    if (rg != g) {
      MESHLOAD_ASSIGN_OR_RETURN(group, kept_.Get(Key{&f, rg}, [&] { return Decode(f, rg); }));
      g = rg;
    }
    const uint64_t r = row - f.footer->row_groups()[static_cast<size_t>(g)].first_row;
    for (size_t k = 0; k < f.fields.size(); ++k) values[k] = group->Value(k, r);
    // A whole record that lands in one buffer is written there; else
    // through the scratch record.
    const iovec& v = iov[seg];
    const bool direct = in_row == 0 && v.iov_len - seg_at >= R;
    uint8_t* dest = direct ? static_cast<uint8_t*>(v.iov_base) + seg_at : record.data();
    size_t bad = 0;
    if (Status st = formats::EncodeParquetRecord(f.layout, values, dest, bad); !st.ok()) {
      return Status(st.code(),
                    "row " + std::to_string(row) + " (row group " + std::to_string(g) + "): field " +
                        f.fields[bad].name + " holds " + st.message() + " (spec.dataset.fields[" + std::to_string(bad) +
                        "].maxBytes)",
                    RedactUri(f.stored_name));
    }
    uint64_t n = std::min<uint64_t>(R - in_row, offset + len - at);
    if (direct) {
      seg_at += n;
    } else {
      uint64_t done = 0;
      while (done < n) {
        const iovec& w = iov[seg];
        const uint64_t k = std::min<uint64_t>(w.iov_len - seg_at, n - done);
        std::memcpy(static_cast<uint8_t*>(w.iov_base) + seg_at, record.data() + in_row + done, k);
        done += k;
        seg_at += k;
        if (seg_at == w.iov_len && seg + 1 < iov.size()) {
          ++seg;
          seg_at = 0;
        }
      }
    }
    while (seg < iov.size() && seg_at == iov[seg].iov_len && seg + 1 < iov.size()) {
      ++seg;
      seg_at = 0;
    }
    at += n;
  }
  return Status::Ok();
}

void ParquetRowSource::Prefetch(const std::string& uri, const Range* ranges, size_t count) {
  if (files_.count(uri) == 0) inner_.Prefetch(uri, ranges, count);
}

Result<formats::ParquetFooter> ReadParquetFooter(Source& source, const std::string& name, uint64_t size) {
  const std::string where = RedactUri(name);
  if (size < formats::kParquetTrailerBytes) {
    return formats::LocateParquetFooter(std::string_view(), size).status().WithLocationPrefix(where);
  }
  std::string tail(static_cast<size_t>(std::min<uint64_t>(size, formats::kParquetTailBytes)), '\0');
  MESHLOAD_RETURN_IF_ERROR(source.Read(name, size - tail.size(), tail.data(), tail.size()));
  auto place = formats::LocateParquetFooter(tail, size);
  if (!place.ok()) return place.status().WithLocationPrefix(where);
  std::string footer;
  const uint64_t tail_at = size - tail.size();
  if (place->offset >= tail_at) {
    footer = tail.substr(static_cast<size_t>(place->offset - tail_at), static_cast<size_t>(place->length));
  } else {
    // A footer longer than the first read: the rest of it, in one more.
    footer.resize(static_cast<size_t>(place->length));
    MESHLOAD_RETURN_IF_ERROR(source.Read(name, place->offset, footer.data(), footer.size()));
  }
  auto parsed = formats::ParquetFooter::Parse(footer, size);
  if (!parsed.ok()) return parsed.status().WithLocationPrefix(where);
  return parsed;
}

Result<formats::ArrowIpcFile> ReadArrowIpcIndex(Source& source, const std::string& name, uint64_t size) {
  auto read = [&](uint64_t offset, uint64_t length) -> Result<std::string> {
    std::string bytes(static_cast<size_t>(length), '\0');
    MESHLOAD_RETURN_IF_ERROR(source.Read(name, offset, bytes.data(), bytes.size()));
    return bytes;
  };
  auto index = formats::ArrowIpcFile::Index(read, size);
  if (!index.ok()) return index.status().WithLocationPrefix(RedactUri(name));
  return index;
}

Result<std::shared_ptr<const formats::ColumnarFile>> ReadColumnarFile(planner::DatasetFormat format, Source& source,
                                                                      const std::string& name, uint64_t size) {
  if (format == planner::DatasetFormat::kArrow) {
    MESHLOAD_ASSIGN_OR_RETURN(formats::ArrowIpcFile index, ReadArrowIpcIndex(source, name, size));
    return std::shared_ptr<const formats::ColumnarFile>(std::make_shared<formats::ArrowIpcFile>(std::move(index)));
  }
  MESHLOAD_ASSIGN_OR_RETURN(formats::ParquetFooter footer, ReadParquetFooter(source, name, size));
  return std::shared_ptr<const formats::ColumnarFile>(std::make_shared<formats::ParquetFooter>(std::move(footer)));
}

Result<std::vector<std::unique_ptr<ParquetRowSource>>> InstallParquetRows(const planner::DatasetIndex& ds,
                                                                          SourceRegistry& sources,
                                                                          uint64_t capacity_bytes) {
  struct Found {
    Source* source = nullptr;
    std::string name;
    Result<ParquetRowSource::File> file = Status(StatusCode::kNotFound, "not read");
  };
  std::vector<Found> found;
  std::vector<size_t> of_file;
  for (size_t i = 0; i < ds.files().size(); ++i) {
    const planner::DatasetFile& f = ds.files()[i];
    if (!f.parquet) continue;
    MESHLOAD_ASSIGN_OR_RETURN(auto at, sources.For(f.path));
    found.push_back({at.first, std::move(at.second), Status(StatusCode::kNotFound, "not read")});
    of_file.push_back(i);
  }
  if (found.empty()) return std::vector<std::unique_ptr<ParquetRowSource>>{};
  ForEachObject(*found.front().source, found.size(), [&](size_t k) {
    const planner::DatasetFile& f = ds.files()[of_file[k]];
    const planner::ParquetFile& pf = *f.parquet;
    // The footer the job was resolved with, else read again (and checked).
    Result<std::shared_ptr<const formats::ColumnarFile>> footer =
        pf.footer ? Result<std::shared_ptr<const formats::ColumnarFile>>(pf.footer)
                  : ReadColumnarFile(ds.format(), *found[k].source, found[k].name, pf.stored_size);
    if (!footer.ok()) {
      found[k].file = footer.status();
      return;
    }
    ParquetRowSource::File file;
    file.stored_name = found[k].name;
    file.layout = pf.layout;
    for (const formats::ParquetField& want : pf.fields) {
      auto got = (*footer)->Field(want.name);
      if (!got.ok() || got->type != want.type || got->leaves != want.leaves) {
        found[k].file =
            DataLoss("column " + want.name + " changed after the job was resolved (it was " + want.type + ")",
                     RedactUri(f.path));
        return;
      }
      file.fields.push_back(std::move(*got));
    }
    if ((*footer)->rows() != pf.rows) {
      found[k].file = DataLoss("holds " + std::to_string((*footer)->rows()) + " rows; it held " +
                                   std::to_string(pf.rows) + " when the job was resolved",
                               RedactUri(f.path));
      return;
    }
    file.footer = std::move(*footer);
    found[k].file = std::move(file);
  });
  std::map<Source*, std::unique_ptr<ParquetRowSource>> by_source;
  for (Found& fd : found) {
    if (!fd.file.ok()) return fd.file.status();
    auto& rows = by_source[fd.source];
    if (!rows) rows = std::make_unique<ParquetRowSource>(*fd.source, capacity_bytes);
    rows->Add(fd.name, std::move(*fd.file));
  }
  std::vector<std::unique_ptr<ParquetRowSource>> out;
  for (auto& [inner, rows] : by_source) {
    sources.Interpose(inner, rows.get());
    out.push_back(std::move(rows));
  }
  return out;
}

}  // namespace meshload::sidecar::source
