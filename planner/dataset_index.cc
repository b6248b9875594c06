#include "planner/dataset_index.h"

#include <algorithm>
#include <bit>
#include <cerrno>

#include "planner/mixture.h"

namespace meshload::planner {
namespace {

// spec.dataset.fields[].shape, when given (ValidateJobSpec checked each dimension).
std::optional<std::vector<uint64_t>> TfShape(const DatasetField& field) {
  if (!field.shape_set) return std::nullopt;
  return std::vector<uint64_t>(field.shape.begin(), field.shape.end());
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

uint64_t Product(const std::vector<uint64_t>& v, size_t from) {
  uint64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

}  // namespace

bool DatasetIndex::ResolveFields(const DatasetSpec& spec, DatasetIndex& idx, Diagnostics& diags) {
  idx.fields_.clear();
  if (spec.format == DatasetFormat::kWebDataset) {
    for (const DatasetField& field : spec.fields) {
      idx.fields_.push_back(formats::WebDatasetFieldDecoding(field.name, field.dtype));
    }
    return true;
  }
  if (spec.format == DatasetFormat::kTFRecord) {
    // Each field is the feature of its name; its kind is checked record by
    // record (an Example has no schema).
    bool ok = true;
    for (size_t i = 0; i < spec.fields.size(); ++i) {
      auto d = formats::TfRecordFieldDecoding(spec.fields[i].name, spec.fields[i].dtype, TfShape(spec.fields[i]));
      if (!d.ok()) {
        diags.Add("spec.dataset.fields[" + std::to_string(i) + "].dtype", d.status().message());
        ok = false;
        continue;
      }
      idx.fields_.push_back(std::move(*d));
    }
    return ok;
  }
  // MDS: each field is the column of its name, decoded the same way in
  // every shard that has it.
  bool ok = true;
  for (size_t i = 0; i < spec.fields.size(); ++i) {
    const DatasetField& field = spec.fields[i];
    const std::string at = "spec.dataset.fields[" + std::to_string(i) + "]";
    std::optional<formats::FieldDecoding> decoding;
    std::string first_shard;
    for (DatasetFile& f : idx.files_) {
      if (!f.mds) continue;
      int column = -1;
      for (size_t c = 0; c < f.mds->columns.size(); ++c) {
        if (f.mds->columns[c].name == field.name) column = static_cast<int>(c);
      }
      f.mds_columns.push_back(column);
      if (column < 0) continue;
      auto d = formats::MdsFieldDecoding(field.name, field.dtype, f.mds->columns[static_cast<size_t>(column)]);
      if (!d.ok()) {
        diags.Add(at, d.status().message() + " (shard " + f.path + ")");
        ok = false;
        break;
      }
      if (!decoding) {
        decoding = std::move(*d);
        first_shard = f.path;
      } else if (!(*decoding == *d)) {
        diags.Add(at, "column '" + field.name + "' is encoded '" +
                          f.mds->columns[static_cast<size_t>(column)].encoding + "' in " + f.path +
                          " but differently in " + first_shard + "; every shard must agree");
        ok = false;
        break;
      }
    }
    if (ok && !decoding) {
      std::string columns;
      if (!idx.files_.empty() && idx.files_.front().mds) {
        for (const formats::MdsColumn& c : idx.files_.front().mds->columns)
          columns += (columns.empty() ? "" : ", ") + c.name;
      }
      diags.Add(at + ".name", "no shard has a column '" + field.name + "' (the columns are: " + columns + ")");
      ok = false;
    }
    if (!ok) break;
    idx.fields_.push_back(std::move(*decoding));
  }
  return ok;
}

Result<DatasetIndex> DatasetIndex::FromFiles(const DatasetSpec& spec, std::vector<FileFacts> files,
                                             Diagnostics& diags) {
  DatasetIndex idx;
  idx.format_ = spec.format;
  idx.indexed_ = true;
  idx.dtype_ = spec.dtype.value_or(formats::DType::kUint8);
  uint64_t total = 0;  // samples or tokens
  for (FileFacts& facts : files) {
    const std::string& p = facts.path;
    DatasetFile f;
    f.path = p;
    f.size = facts.size;
    f.version = facts.version;
    switch (spec.format) {
      case DatasetFormat::kFixedRecord: {
        const uint64_t rb = static_cast<uint64_t>(spec.record_bytes);
        if (f.size % rb != 0) {
          diags.Add(p, "size " + std::to_string(f.size) + " is not a whole number of " + std::to_string(rb) +
                           "-byte records (" + std::to_string(f.size / rb) + " records and " +
                           std::to_string(f.size % rb) + " bytes left over); check spec.dataset.recordBytes");
        }
        f.count = f.size / rb;
        break;
      }
      case DatasetFormat::kTokenStream: {
        const uint64_t tb = formats::DTypeSize(idx.dtype_);
        if (f.size % tb != 0) {
          diags.Add(p, "size " + std::to_string(f.size) + " is not a whole number of " +
                           std::string(formats::DTypeName(idx.dtype_)) + " tokens (" + std::to_string(tb) +
                           " bytes each); check spec.dataset.dtype");
        }
        f.count = f.size / tb;
        break;
      }
      case DatasetFormat::kNpy: {
        Result<formats::NpyHeader>& h = facts.npy;
        if (!h.ok()) {
          diags.Add(h.status());
          continue;
        }
        if (h->shape.empty()) {
          diags.Add(p, "holds a 0-dimensional array; samples run along axis 0, so it needs at least 1 dimension");
          continue;
        }
        if (spec.dtype && *spec.dtype != h->dtype) {
          diags.Add(p, "dtype is " + std::string(formats::DTypeName(h->dtype)) + " ('" + h->descr +
                           "') but spec.dataset.dtype is " + std::string(formats::DTypeName(*spec.dtype)));
        }
        if (!idx.files_.empty() && idx.files_.front().npy) {
          const formats::NpyHeader& first = *idx.files_.front().npy;
          std::vector<uint64_t> a(first.shape.begin() + 1, first.shape.end());
          std::vector<uint64_t> b(h->shape.begin() + 1, h->shape.end());
          if (a != b || first.dtype != h->dtype) {
            diags.Add(p, "holds samples of shape " + ShapeString(b) + " and dtype " +
                             std::string(formats::DTypeName(h->dtype)) + ", but " + idx.files_.front().path +
                             " holds " + ShapeString(a) + " " + std::string(formats::DTypeName(first.dtype)) +
                             "; every file of a dataset must agree");
          }
        }
        if (f.size != h->data_offset + h->data_bytes) {
          diags.Add(p, "size " + std::to_string(f.size) + " does not match its npy header, which says " +
                           std::to_string(h->data_offset) + " header bytes + " + std::to_string(h->data_bytes) +
                           " data bytes = " + std::to_string(h->data_offset + h->data_bytes) +
                           (f.size < h->data_offset + h->data_bytes ? " (truncated)" : " (trailing bytes)"));
        }
        f.data_offset = h->data_offset;
        f.count = h->shape[0];
        f.npy = std::move(*h);
        break;
      }
      case DatasetFormat::kMegatronIndexed: {
        Result<formats::MegatronIndex>& m = facts.megatron;
        if (!m.ok()) {
          diags.Add(m.status());
          continue;
        }
        if (Status st = formats::CheckMegatronData(*m, p, f.size); !st.ok()) {
          diags.Add(st);
          continue;
        }
        const formats::DType dt = formats::ToDType(m->dtype);
        // The dtype is the .idx's code at byte 17 (formats/megatron_index.h).
        const std::string dtype_at =
            (p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0 ? p.substr(0, p.size() - 4) + ".idx" : p) + "@17";
        if (spec.dtype && *spec.dtype != dt) {
          diags.Add(dtype_at, "the index says its dtype is " + std::string(m->dtype.name) +
                                  " but spec.dataset.dtype is " + std::string(formats::DTypeName(*spec.dtype)));
        }
        if (!idx.files_.empty() && idx.dtype_ != dt) {
          diags.Add(dtype_at, "holds " + std::string(m->dtype.name) + " elements, but " + idx.files_.front().path +
                                  " holds " + std::string(formats::DTypeName(idx.dtype_)) +
                                  "; every file of a dataset must agree");
          continue;
        }
        idx.dtype_ = dt;
        f.count = m->sequences();
        idx.offsets_.reserve(idx.offsets_.size() + f.count);
        idx.sizes_.reserve(idx.sizes_.size() + f.count);
        for (uint64_t i = 0; i < f.count; ++i) {
          const uint64_t at = static_cast<uint64_t>(m->pointers[i]);
          if (i > 0 && at < idx.offsets_.back()) idx.offsets_ascending_ = false;
          idx.offsets_.push_back(at);
          idx.sizes_.push_back(m->SequenceBytes(i));
        }
        break;
      }
      case DatasetFormat::kWebDataset:
      case DatasetFormat::kMDS:
      case DatasetFormat::kTFRecord: {
        Result<std::vector<uint64_t>>& r = facts.records;
        if (!r.ok()) {
          diags.Add(r.status());
          continue;
        }
        if (r->empty()) {
          diags.Add(p, "its index lists no offsets");
          continue;
        }
        f.count = r->size() - 1;
        idx.offsets_.reserve(idx.offsets_.size() + f.count);
        idx.sizes_.reserve(idx.sizes_.size() + f.count);
        for (uint64_t i = 0; i < f.count; ++i) {
          idx.offsets_.push_back((*r)[i]);
          idx.sizes_.push_back((*r)[i + 1] - (*r)[i]);
        }
        f.mds = std::move(facts.mds);
        f.stored = std::move(facts.stored);
        break;
      }
    }
    f.first = total;
    total += f.count;
    idx.files_.push_back(std::move(f));
  }
  if (idx.files_.empty()) return InvalidArgument("no usable dataset file", spec.uri);

  switch (spec.format) {
    case DatasetFormat::kFixedRecord: {
      idx.num_samples_ = total;
      idx.sample_bytes_ = static_cast<uint64_t>(spec.record_bytes);
      idx.sample_shape_ = {idx.sample_bytes_ / formats::DTypeSize(idx.dtype_)};
      break;
    }
    case DatasetFormat::kTokenStream: {
      idx.token_bytes_ = formats::DTypeSize(idx.dtype_);
      idx.sequence_length_ = static_cast<uint64_t>(spec.sequence_length);
      idx.num_samples_ = total >= 1 ? (total - 1) / idx.sequence_length_ : 0;
      idx.sample_bytes_ = (idx.sequence_length_ + 1) * idx.token_bytes_;
      idx.sample_shape_ = {idx.sequence_length_ + 1};
      break;
    }
    case DatasetFormat::kNpy: {
      const formats::NpyHeader& h = *idx.files_.front().npy;
      idx.dtype_ = h.dtype;
      idx.num_samples_ = total;
      idx.sample_shape_.assign(h.shape.begin() + 1, h.shape.end());
      idx.sample_bytes_ = Product(h.shape, 1) * formats::DTypeSize(h.dtype);
      if (spec.record_bytes > 0 && static_cast<uint64_t>(spec.record_bytes) != idx.sample_bytes_) {
        diags.Add("spec.dataset.recordBytes",
                  std::to_string(spec.record_bytes) + " disagrees with the npy files, whose samples are " +
                      std::to_string(idx.sample_bytes_) + " bytes (shape " + ShapeString(idx.sample_shape_) + ", " +
                      std::string(formats::DTypeName(h.dtype)) + ")");
      }
      break;
    }
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kMDS:
    case DatasetFormat::kTFRecord:
      idx.dtype_ = formats::DType::kUint8;
      idx.missing_field_ = spec.missing_field;
      if (!ResolveFields(spec, idx, diags)) return InvalidArgument("the fields cannot be read", spec.uri);
      [[fallthrough]];
    case DatasetFormat::kMegatronIndexed: {
      idx.num_samples_ = total;
      idx.sample_bytes_ = 0;
      if (!idx.sizes_.empty()) {
        const auto [lo, hi] = std::minmax_element(idx.sizes_.begin(), idx.sizes_.end());
        idx.min_sample_bytes_ = *lo;
        idx.max_sample_bytes_ = *hi;
        long double sum = 0;
        for (uint64_t b : idx.sizes_) sum += static_cast<long double>(b);
        idx.mean_sample_bytes_ = static_cast<double>(sum / static_cast<long double>(idx.sizes_.size()));
      }
      break;
    }
  }
  if (spec.samples && static_cast<uint64_t>(*spec.samples) != idx.num_samples_) {
    diags.Add("spec.dataset.samples", "says " + std::to_string(*spec.samples) + " but the files at " + spec.uri +
                                          " hold " + std::to_string(idx.num_samples_) +
                                          " samples; remove it or correct it");
  }
  idx.parts_ = {{"", 0, idx.num_samples_}};
  return idx;
}

DatasetIndex DatasetIndex::Virtual(const DatasetSpec& spec, uint64_t samples) {
  DatasetIndex idx;
  idx.format_ = spec.format;
  idx.indexed_ = false;
  idx.dtype_ = spec.dtype.value_or(formats::DType::kUint8);
  idx.num_samples_ = samples;
  DatasetFile f;
  f.path = spec.uri;
  switch (spec.format) {
    case DatasetFormat::kFixedRecord:
      idx.sample_bytes_ = static_cast<uint64_t>(spec.record_bytes);
      idx.sample_shape_ = {idx.sample_bytes_ / formats::DTypeSize(idx.dtype_)};
      f.count = samples;
      f.size = samples * idx.sample_bytes_;
      break;
    case DatasetFormat::kTokenStream:
      idx.token_bytes_ = formats::DTypeSize(idx.dtype_);
      idx.sequence_length_ = static_cast<uint64_t>(spec.sequence_length);
      idx.sample_bytes_ = (idx.sequence_length_ + 1) * idx.token_bytes_;
      idx.sample_shape_ = {idx.sequence_length_ + 1};
      f.count = samples * idx.sequence_length_ + 1;
      f.size = f.count * idx.token_bytes_;
      break;
    case DatasetFormat::kNpy:
      idx.sample_bytes_ = spec.record_bytes > 0 ? static_cast<uint64_t>(spec.record_bytes) : 0;
      if (idx.sample_bytes_) idx.sample_shape_ = {idx.sample_bytes_ / formats::DTypeSize(idx.dtype_)};
      f.count = samples;
      f.size = samples * idx.sample_bytes_;
      break;
    case DatasetFormat::kMegatronIndexed:
      // Sizes come only from the index: unknown here.
      f.count = samples;
      break;
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kMDS:
    case DatasetFormat::kTFRecord:
      // Sizes and MDS column encodings come only from the shards: a field
      // with a dtype is taken as one value of it (a TFRecord list's values,
      // ragged).
      f.count = samples;
      idx.missing_field_ = spec.missing_field;
      for (const DatasetField& field : spec.fields) {
        formats::FieldDecoding d = formats::WebDatasetFieldDecoding(field.name, field.dtype);
        if (spec.format == DatasetFormat::kMDS && field.dtype) d.kind = formats::FieldDecoding::Kind::kScalar;
        if (spec.format == DatasetFormat::kTFRecord) {
          auto tf = formats::TfRecordFieldDecoding(field.name, field.dtype, TfShape(field));
          if (tf.ok()) d = std::move(*tf);
        }
        idx.fields_.push_back(std::move(d));
      }
      break;
  }
  idx.files_.push_back(std::move(f));
  idx.parts_ = {{"", 0, idx.num_samples_}};
  return idx;
}

Result<DatasetIndex> DatasetIndex::Combine(std::vector<DatasetIndex> datasets, const std::vector<std::string>& names,
                                           const std::vector<std::string>& paths, Diagnostics& diags) {
  MESHLOAD_CHECK(!datasets.empty() && datasets.size() == names.size() && names.size() == paths.size(),
                 "Combine needs a name and a path per dataset");
  DatasetIndex out = datasets.front();
  out.files_.clear();
  out.offsets_.clear();
  out.sizes_.clear();
  out.parts_.clear();
  const DatasetIndex& first = datasets.front();
  const bool tokens = first.format_ == DatasetFormat::kTokenStream;
  const uint64_t T = first.sequence_length_;
  uint64_t next_id = 0;
  long double bytes = 0;
  uint64_t sized = 0;
  for (size_t d = 0; d < datasets.size(); ++d) {
    DatasetIndex& ds = datasets[d];
    const std::string against = " but " + paths[0] + " (" + names[0] + ") ";
    if (ds.indexed_ != first.indexed_) {
      return InvalidArgument("the datasets of a mixture are all read or all planned from their samples", paths[d]);
    }
    if (ds.dtype_ != first.dtype_) {
      diags.Add(paths[d], "holds " + std::string(formats::DTypeName(ds.dtype_)) + " elements," + against + "holds " +
                              std::string(formats::DTypeName(first.dtype_)) + "; the datasets of a mixture must agree");
    } else if (ds.sample_shape_ != first.sample_shape_ || ds.sample_bytes_ != first.sample_bytes_) {
      diags.Add(paths[d], "has samples of " + std::to_string(ds.sample_bytes_) + " bytes," + against + "has " +
                              std::to_string(first.sample_bytes_) + "; the datasets of a mixture must agree");
    } else if (ds.fields_ != first.fields_) {
      diags.Add(paths[d], "decodes its fields otherwise than " + paths[0] + " (" + names[0] +
                              ", e.g. an MDS column of another encoding); the datasets of a mixture must agree");
    }
    // Where its ids (and, for TokenStream, its tokens) start.
    const uint64_t first_file = out.files_.size();
    uint64_t shift = next_id;
    if (tokens) shift = next_id * T;
    for (DatasetFile& f : ds.files_) {
      f.first += shift;
      out.files_.push_back(std::move(f));
    }
    out.parts_.push_back({names[d], next_id, ds.num_samples_});
    if (tokens) {
      uint64_t count = 0;
      for (size_t f = first_file; f < out.files_.size(); ++f) count += out.files_[f].count;
      next_id = (next_id * T + count + T - 1) / T;  // the next multiple of T past its tokens
    } else {
      next_id += ds.num_samples_;
    }
    out.offsets_.insert(out.offsets_.end(), ds.offsets_.begin(), ds.offsets_.end());
    out.sizes_.insert(out.sizes_.end(), ds.sizes_.begin(), ds.sizes_.end());
    out.offsets_ascending_ = out.offsets_ascending_ && ds.offsets_ascending_;
    if (!ds.sizes_.empty()) {
      out.min_sample_bytes_ = sized ? std::min(out.min_sample_bytes_, ds.min_sample_bytes_) : ds.min_sample_bytes_;
      out.max_sample_bytes_ = std::max(out.max_sample_bytes_, ds.max_sample_bytes_);
      bytes += static_cast<long double>(ds.mean_sample_bytes_) * static_cast<long double>(ds.sizes_.size());
      sized += ds.sizes_.size();
    }
  }
  out.num_samples_ = out.parts_.back().first + out.parts_.back().samples;
  if (sized) out.mean_sample_bytes_ = static_cast<double>(bytes / static_cast<long double>(sized));
  if (!diags.ok()) return InvalidArgument("the datasets of the mixture disagree", paths[0]);
  return out;
}

size_t DatasetIndex::PartOf(uint64_t i) const {
  auto it = std::upper_bound(parts_.begin(), parts_.end(), i, [](uint64_t s, const Part& p) { return s < p.first; });
  return static_cast<size_t>(std::distance(parts_.begin(), it)) - 1;
}

Result<DatasetIndex> DatasetIndex::CutIntoRows(DatasetIndex documents, const JobSpec& spec, Diagnostics& diags) {
  MESHLOAD_CHECK(spec.tokens.has_value() && !documents.rows_, "CutIntoRows needs spec.tokens and documents");
  const TokensSpec& tokens = *spec.tokens;
  if (!documents.indexed_) {
    return InvalidArgument("the rows are cut from the documents' lengths, which only the dataset's index gives",
                           "spec.tokens");
  }
  const std::optional<uint64_t> max_token = MaxTokenOf(documents.dtype_);
  const std::string dtype(formats::DTypeName(documents.dtype_));
  if (!max_token) {
    diags.Add("spec.tokens", "needs documents of token ids (an integer dtype), but the dataset holds " + dtype);
    return diags.ToStatus();
  }
  auto fits = [&](const std::string& path, int64_t token) {
    if (static_cast<uint64_t>(token) > *max_token) {
      diags.Add(path, std::to_string(token) + " does not fit the dataset's " + dtype + " tokens (0 to " +
                          std::to_string(*max_token) + ")");
    }
  };
  if (tokens.end_of_document) fits("spec.tokens.endOfDocument.token", tokens.end_of_document->token);
  if (tokens.mode == TokensMode::kPack) fits("spec.tokens.padToken", tokens.pad_token);
  if (!diags.ok()) return diags.ToStatus();

  const uint64_t tb = formats::DTypeSize(documents.dtype_);
  std::vector<uint64_t> doc_tokens(documents.sizes_.size());
  for (size_t i = 0; i < doc_tokens.size(); ++i) doc_tokens[i] = documents.sizes_[i] / tb;
  std::vector<TokenRows::Dataset> datasets;
  for (size_t d = 0; d < documents.parts_.size(); ++d) {
    const Part& p = documents.parts_[d];
    const uint64_t seed = spec.mixture ? MixtureDatasetSeed(spec.shuffle.seed, d) : spec.shuffle.seed;
    datasets.push_back({p.first, p.samples, seed, DatasetPath(spec, d)});
  }
  documents.token_bytes_ = tb;
  MESHLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const TokenRows> rows,
                            TokenRows::Build(
                                tokens, spec.shuffle, datasets, doc_tokens,
                                [&documents](uint64_t doc) { return documents.DescribeDocument(doc); }, diags));
  DatasetIndex out = std::move(documents);
  out.documents_ = out.num_samples_;
  out.document_parts_ = out.parts_;
  out.parts_.clear();
  for (size_t d = 0; d < out.document_parts_.size(); ++d) {
    out.parts_.push_back(
        {out.document_parts_[d].name, rows->row_first(d), rows->row_first(d + 1) - rows->row_first(d)});
  }
  out.num_samples_ = rows->rows();
  out.sample_bytes_ = rows->row_tokens() * tb;
  out.sample_shape_ = {rows->row_tokens()};
  out.rows_ = std::move(rows);
  return out;
}

std::string DatasetIndex::DescribeDocument(uint64_t doc) const {
  auto it =
      std::upper_bound(files_.begin(), files_.end(), doc, [](uint64_t s, const DatasetFile& f) { return s < f.first; });
  const DatasetFile& f = *std::prev(it);
  return "sequence " + std::to_string(doc - f.first) + " of " + f.path;
}

Extent DatasetIndex::DocumentExtent(uint64_t doc, uint64_t offset, uint64_t tokens) const {
  auto it =
      std::upper_bound(files_.begin(), files_.end(), doc, [](uint64_t s, const DatasetFile& f) { return s < f.first; });
  const uint32_t fi = static_cast<uint32_t>(std::distance(files_.begin(), it) - 1);
  return {fi, offsets_[doc] + offset * token_bytes_, tokens * token_bytes_};
}

void DatasetIndex::AppendExtents(uint64_t i, std::vector<Extent>& out) const {
  if (rows_) {
    thread_local std::vector<RowPiece> pieces;
    pieces.clear();
    rows_->AppendPieces(i, pieces);
    for (const RowPiece& p : pieces) {
      if (p.tokens > 0) out.push_back(DocumentExtent(p.doc, p.offset, p.tokens));
    }
    return;
  }
  if (format_ == DatasetFormat::kTokenStream) {
    uint64_t token = i * sequence_length_;
    uint64_t left = sequence_length_ + 1;
    // The last file whose first token is <= token (empty files share `first`
    // with their successor and are skipped by upper_bound).
    auto it = std::upper_bound(files_.begin(), files_.end(), token,
                               [](uint64_t t, const DatasetFile& f) { return t < f.first; });
    size_t fi = static_cast<size_t>(std::distance(files_.begin(), it)) - 1;
    while (left > 0 && fi < files_.size()) {
      const DatasetFile& f = files_[fi];
      uint64_t in_file = token - f.first;
      uint64_t n = std::min(left, f.count - in_file);
      if (n > 0) {
        out.push_back({static_cast<uint32_t>(fi), f.data_offset + in_file * token_bytes_, n * token_bytes_});
      }
      left -= n;
      token += n;
      ++fi;
    }
    return;
  }
  auto it =
      std::upper_bound(files_.begin(), files_.end(), i, [](uint64_t s, const DatasetFile& f) { return s < f.first; });
  size_t fi = static_cast<size_t>(std::distance(files_.begin(), it)) - 1;
  const DatasetFile& f = files_[fi];
  if (variable_size()) {
    if (!sizes_.empty()) out.push_back({static_cast<uint32_t>(fi), offsets_[i], sizes_[i]});
    return;
  }
  out.push_back({static_cast<uint32_t>(fi), f.data_offset + (i - f.first) * sample_bytes_, sample_bytes_});
}

uint64_t DatasetIndex::BytesOf(const uint64_t* ids, size_t count) const {
  if (!variable_size()) return count * sample_bytes_;
  if (sizes_.empty()) return 0;
  uint64_t total = 0;
  for (size_t k = 0; k < count; ++k) total += sizes_[ids[k]];
  return total;
}

uint64_t DatasetIndex::LargestBytes(uint64_t k) const {
  if (!variable_size()) return k * sample_bytes_;
  if (sizes_.empty() || k == 0) return 0;
  if (k >= sizes_.size()) {
    uint64_t total = 0;
    for (uint64_t b : sizes_) total += b;
    return total;
  }
  std::vector<uint64_t> v = sizes_;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end(), std::greater<>());
  uint64_t total = 0;
  for (uint64_t j = 0; j < k; ++j) total += v[j];
  return total;
}

void RadixSort(std::vector<uint64_t>& v) {
  if (v.size() < 64) {
    std::sort(v.begin(), v.end());
    return;
  }
  uint64_t max = 0;
  for (uint64_t x : v) max |= x;
  const int bits = 64 - std::countl_zero(max | 1);
  // As few passes of at most 12 bits as the largest value needs.
  const int passes = (bits + 11) / 12;
  const int digit = (bits + passes - 1) / passes;
  const size_t kBuckets = size_t{1} << digit;
  std::vector<uint64_t> tmp(v.size());
  std::vector<size_t> count(kBuckets);
  for (int shift = 0; shift < bits; shift += digit) {
    std::fill(count.begin(), count.end(), 0);
    for (uint64_t x : v) ++count[(x >> shift) & (kBuckets - 1)];
    size_t sum = 0;
    for (size_t& c : count) {
      const size_t n = c;
      c = sum;
      sum += n;
    }
    for (uint64_t x : v) tmp[count[(x >> shift) & (kBuckets - 1)]++] = x;
    v.swap(tmp);
  }
}

uint64_t DatasetIndex::CoalescedExtents(std::vector<uint64_t>& ids, std::vector<Extent>& out) const {
  out.clear();
  out.reserve(ids.size());
  RadixSort(ids);
  // Sorted ids visit files in order, so a cursor replaces the per-sample
  // binary search, and extents arrive in (file, offset) order: one linear
  // merge of touching ranges suffices.
  auto emit = [&out](uint32_t file, uint64_t offset, uint64_t length) {
    if (!out.empty()) {
      Extent& prev = out.back();
      if (prev.file == file && offset <= prev.offset + prev.length) {
        prev.length = std::max(prev.offset + prev.length, offset + length) - prev.offset;
        return;
      }
    }
    out.push_back({file, offset, length});
  };
  size_t fi = 0;
  const size_t nfiles = files_.size();
  if (rows_) {
    // A row's pieces are runs of documents anywhere in the files.
    for (uint64_t id : ids) AppendExtents(id, out);
    return CoalesceExtents(out);
  }
  if (format_ == DatasetFormat::kTokenStream) {
    for (uint64_t id : ids) {
      uint64_t token = id * sequence_length_;
      uint64_t left = sequence_length_ + 1;
      while (fi + 1 < nfiles && token >= files_[fi].first + files_[fi].count) ++fi;
      for (size_t f = fi; left > 0 && f < nfiles; ++f) {
        const DatasetFile& file = files_[f];
        const uint64_t in_file = token - file.first;
        const uint64_t n = std::min(left, file.count - in_file);
        if (n > 0) emit(static_cast<uint32_t>(f), file.data_offset + in_file * token_bytes_, n * token_bytes_);
        left -= n;
        token += n;
      }
    }
  } else if (variable_size()) {
    if (!sizes_.empty()) {
      for (uint64_t id : ids) {
        while (fi + 1 < nfiles && id >= files_[fi].first + files_[fi].count) ++fi;
        if (offsets_ascending_) {
          emit(static_cast<uint32_t>(fi), offsets_[id], sizes_[id]);
        } else {
          out.push_back({static_cast<uint32_t>(fi), offsets_[id], sizes_[id]});
        }
      }
      // An index may place sequences in any order in its .bin: then sort.
      if (!offsets_ascending_) CoalesceExtents(out);
    }
  } else {
    for (uint64_t id : ids) {
      while (fi + 1 < nfiles && id >= files_[fi].first + files_[fi].count) ++fi;
      const DatasetFile& file = files_[fi];
      emit(static_cast<uint32_t>(fi), file.data_offset + (id - file.first) * sample_bytes_, sample_bytes_);
    }
  }
  uint64_t total = 0;
  for (const Extent& e : out) total += e.length;
  return total;
}

uint64_t CoalesceExtents(std::vector<Extent>& extents) {
  if (extents.empty()) return 0;
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
  size_t w = 0;
  for (size_t r = 1; r < extents.size(); ++r) {
    Extent& cur = extents[w];
    const Extent& next = extents[r];
    if (next.file == cur.file && next.offset <= cur.offset + cur.length) {
      cur.length = std::max(cur.offset + cur.length, next.offset + next.length) - cur.offset;
    } else {
      extents[++w] = next;
    }
  }
  extents.resize(w + 1);
  uint64_t total = 0;
  for (const auto& e : extents) total += e.length;
  return total;
}

}  // namespace meshload::planner
