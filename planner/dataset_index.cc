#include "planner/dataset_index.h"

#include <algorithm>
#include <bit>
#include <cerrno>

#include "planner/format_driver.h"
#include "planner/mixture.h"

namespace meshload::planner {

Result<DatasetIndex> DatasetIndex::FromFiles(const DatasetSpec& spec, std::vector<FileFacts> files,
                                             Diagnostics& diags) {
  const FormatDriver& driver = DriverOf(spec.format);
  DatasetIndex idx;
  idx.format_ = spec.format;
  idx.traits_ = driver.traits();
  idx.indexed_ = true;
  idx.dtype_ = spec.dtype.value_or(formats::DType::kUint8);
  uint64_t total = 0;  // samples or tokens
  for (FileFacts& facts : files) {
    DatasetFile f;
    f.path = facts.path;
    f.size = facts.size;
    f.version = facts.version;
    if (!driver.AddFile(spec, facts, f, idx, diags)) continue;
    f.first = total;
    total += f.count;
    idx.files_.push_back(std::move(f));
  }
  if (idx.files_.empty()) return InvalidArgument("no usable dataset file", spec.uri);
  MESHLOAD_RETURN_IF_ERROR(driver.Finish(spec, total, idx, diags));
  if (idx.traits_.variable_size && !idx.sizes_.empty()) {
    const auto [lo, hi] = std::minmax_element(idx.sizes_.begin(), idx.sizes_.end());
    idx.min_sample_bytes_ = *lo;
    idx.max_sample_bytes_ = *hi;
    long double sum = 0;
    for (uint64_t b : idx.sizes_) sum += static_cast<long double>(b);
    idx.mean_sample_bytes_ = static_cast<double>(sum / static_cast<long double>(idx.sizes_.size()));
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
  const FormatDriver& driver = DriverOf(spec.format);
  DatasetIndex idx;
  idx.format_ = spec.format;
  idx.traits_ = driver.traits();
  idx.indexed_ = false;
  idx.dtype_ = spec.dtype.value_or(formats::DType::kUint8);
  idx.num_samples_ = samples;
  DatasetFile f;
  f.path = spec.uri;
  driver.Virtual(spec, samples, f, idx);
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
  const bool tokens = first.traits_.token_stream;
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
  if (traits_.token_stream) {
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
  if (traits_.token_stream) {
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
