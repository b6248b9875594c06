#include "tools/synthetic_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/compression.h"
#include "formats/fields.h"
#include "formats/megatron_index.h"
#include "formats/mds.h"
#include "formats/tar.h"
#include "formats/tfrecord.h"
#include "formats/webdataset.h"
#include "formats/npy.h"
#include "formats/arrow_ipc.h"
#include "formats/parquet.h"
#include "planner/dataset_index.h"
#include "planner/sampler.h"

namespace meshload::tools {
namespace {

uint64_t Word(uint64_t i, uint64_t k) { return k == 0 ? i : planner::Mix64(i * 0x9E3779B97F4A7C15ull + k); }

void FillRecord(uint64_t i, uint8_t* out, uint64_t bytes) {
  for (uint64_t j = 0; j < bytes; j += 8) {
    const uint64_t w = Word(i, j / 8);
    const uint64_t n = std::min<uint64_t>(8, bytes - j);
    for (uint64_t b = 0; b < n; ++b) out[j + b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

void FillTokens(uint64_t first_token, uint64_t count, size_t token_bytes, uint8_t* out) {
  for (uint64_t t = 0; t < count; ++t) {
    const uint64_t v = planner::Mix64(first_token + t);
    for (size_t b = 0; b < token_bytes; ++b) out[t * token_bytes + b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

Status WriteAll(std::ofstream& out, const std::string& path, const uint8_t* data, size_t n) {
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) return IoErrorFromErrno("write", path, errno);
  return Status::Ok();
}

// The number a decoded field `f` of sample `id` holds, as text.
std::string SyntheticNumberText(uint64_t id, size_t f, formats::DType t) {
  const uint64_t v = planner::Mix64(id * 16 + f);
  switch (t) {
    case formats::DType::kBool: return std::to_string(v % 2);
    case formats::DType::kFloat16:
    case formats::DType::kBFloat16:
    case formats::DType::kFloat32:
    case formats::DType::kFloat64: {
      const double d = static_cast<double>(v % 1000) / 4.0;  // exact in every float type
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", d);
      return buf;
    }
    default: return std::to_string(v % 100);  // fits every integer type
  }
}

// A field of bytes of sample `id`: 256 to 8192 bytes of the record pattern.
std::string SyntheticBlob(uint64_t id, size_t f) {
  const uint64_t key = id * 16 + f;
  std::string b(256 + planner::Mix64(key ^ 0x5A5A) % 7937, '\0');
  FillRecord(key, reinterpret_cast<uint8_t*>(b.data()), b.size());
  return b;
}

// A ustar header for a regular file member.
std::string TarHeader(const std::string& name, uint64_t size) {
  std::string h(formats::kTarBlock, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 99));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

// WebDataset: part-NNNNN.tar shards of KEY.FIELD members (decoded fields as
// text, the others blobs) with Energon's part-NNNNN.tar.idx beside each.
// MDS: index.json and shard.NNNNN.mds raw shards, a column per field
// (bytes, or the field's dtype as an MDS scalar).
Result<std::string> GenerateRecords(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                    int files) {
  const bool mds = spec.format == planner::DatasetFormat::kMDS;
  if (spec.fields.empty()) return InvalidArgument("name the fields to generate", "spec.dataset.fields");
  // MDSWriter sorts columns by name; WebDataset members come in field order.
  std::vector<size_t> order(spec.fields.size());
  for (size_t f = 0; f < order.size(); ++f) order[f] = f;
  if (mds) {
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return spec.fields[a].name < spec.fields[b].name; });
    for (const planner::DatasetField& f : spec.fields) {
      if (f.dtype && (*f.dtype == formats::DType::kBool || *f.dtype == formats::DType::kBFloat16)) {
        return InvalidArgument("MDS has no " + std::string(formats::DTypeName(*f.dtype)) + " encoding to generate",
                               "spec.dataset.fields");
      }
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard.", 0) == 0 || n == "index.json") std::filesystem::remove(e.path());
  }
  // The value of field f of sample id, as the file stores it.
  auto value = [&](uint64_t id, size_t f) -> Result<std::string> {
    const planner::DatasetField& field = spec.fields[f];
    if (!field.dtype) return SyntheticBlob(id, f);
    std::string text = SyntheticNumberText(id, f, *field.dtype);
    if (!mds) return text;
    std::string bytes(formats::DTypeSize(*field.dtype), '\0');
    uint64_t written = 0;
    MESHLOAD_RETURN_IF_ERROR(formats::DecodeFieldValue(formats::WebDatasetFieldDecoding(field.name, field.dtype), text,
                                                       reinterpret_cast<uint8_t*>(bytes.data()), bytes.size(), written,
                                                       "synthetic", 0));
    return bytes;
  };
  nlohmann::json shards = nlohmann::json::array();
  uint64_t next = 0;
  for (int part = 0; part < files; ++part) {
    const uint64_t count = samples / static_cast<uint64_t>(files) +
                           (static_cast<uint64_t>(part) < samples % static_cast<uint64_t>(files) ? 1 : 0);
    char name[64];
    std::snprintf(name, sizeof name, mds ? "shard.%05d.mds" : "part-%05d.tar", part);
    const std::string path = dir + "/" + name;
    std::string body;
    std::vector<uint64_t> offsets;
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t id = next + k;
      offsets.push_back(body.size());
      if (mds) {
        std::string sizes, data;
        for (size_t f : order) {
          MESHLOAD_ASSIGN_OR_RETURN(std::string v, value(id, f));
          if (!spec.fields[f].dtype) {
            const uint32_t n = static_cast<uint32_t>(v.size());
            sizes.append(reinterpret_cast<const char*>(&n), 4);
          }
          data += v;
        }
        body += sizes + data;
        continue;
      }
      char key[32];
      std::snprintf(key, sizeof key, "sample%09llu", static_cast<unsigned long long>(id));
      for (size_t f : order) {
        MESHLOAD_ASSIGN_OR_RETURN(std::string v, value(id, f));
        body += TarHeader(std::string(key) + "." + spec.fields[f].name, v.size());
        body += v;
        body.resize((body.size() + formats::kTarBlock - 1) / formats::kTarBlock * formats::kTarBlock, '\0');
      }
    }
    offsets.push_back(body.size());
    std::string file;
    if (mds) {
      nlohmann::json names = nlohmann::json::array(), encodings = nlohmann::json::array(),
                     sizes = nlohmann::json::array();
      for (size_t f : order) {
        const planner::DatasetField& field = spec.fields[f];
        names.push_back(field.name);
        encodings.push_back(field.dtype ? std::string(formats::DTypeName(*field.dtype)) : "bytes");
        sizes.push_back(field.dtype ? nlohmann::json(formats::DTypeSize(*field.dtype)) : nlohmann::json());
      }
      nlohmann::json shard = {{"column_encodings", encodings},
                              {"column_names", names},
                              {"column_sizes", sizes},
                              {"compression", nullptr},
                              {"format", "mds"},
                              {"hashes", nlohmann::json::array()},
                              {"samples", count},
                              {"size_limit", nullptr},
                              {"version", 2},
                              {"zip_data", nullptr}};
      const std::string config = shard.dump();
      const uint64_t head = formats::MdsShardHeadBytes(count) + config.size();
      const uint32_t n = static_cast<uint32_t>(count);
      file.append(reinterpret_cast<const char*>(&n), 4);
      for (uint64_t o : offsets) {
        const uint32_t at = static_cast<uint32_t>(head + o);
        file.append(reinterpret_cast<const char*>(&at), 4);
      }
      file += config + body;
      shard["raw_data"] = {{"basename", name}, {"bytes", file.size()}, {"hashes", nlohmann::json::object()}};
      shards.push_back(std::move(shard));
    } else {
      file = body + std::string(2 * formats::kTarBlock, '\0');
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, reinterpret_cast<const uint8_t*>(file.data()), file.size()));
    if (!mds) {
      const std::string idx = formats::EnergonTarIndexBytes(offsets);
      std::ofstream iout(path + ".idx", std::ios::binary | std::ios::trunc);
      if (!iout) return IoErrorFromErrno("create", path + ".idx", errno);
      MESHLOAD_RETURN_IF_ERROR(WriteAll(iout, path + ".idx", reinterpret_cast<const uint8_t*>(idx.data()), idx.size()));
    }
    next += count;
  }
  if (mds) {
    const std::string index = nlohmann::json({{"version", 2}, {"shards", shards}}).dump();
    std::ofstream out(dir + "/index.json", std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", dir + "/index.json", errno);
    MESHLOAD_RETURN_IF_ERROR(
        WriteAll(out, dir + "/index.json", reinterpret_cast<const uint8_t*>(index.data()), index.size()));
  }
  return dir;  // WebDataset: the folder's .tar shards
}
// TFRecord: part-NNNNN.tfrecord files of tf.train.Example records, each
// field a feature (a bytes_list of the field's blob; an int64_list or
// float_list of 1 to 8 values of the sample's numbers), with their DALI
// index part-NNNNN.tfrecord.idx.
Result<std::string> GenerateTfRecords(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                      int files) {
  if (spec.fields.empty()) return InvalidArgument("name the fields to generate", "spec.dataset.fields");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("part-", 0) == 0) std::filesystem::remove(e.path());
  }
  uint64_t next = 0;
  for (int part = 0; part < files; ++part) {
    const uint64_t count = samples / static_cast<uint64_t>(files) +
                           (static_cast<uint64_t>(part) < samples % static_cast<uint64_t>(files) ? 1 : 0);
    // compression: GZIP or ZLIB files as TensorFlow writes them, their
    // indexes giving offsets in the decompressed bytes.
    char name[64];
    std::snprintf(name, sizeof name, "part-%05d.tfrecord%s", part,
                  spec.compression == planner::FileCompression::kGZIP   ? ".gz"
                  : spec.compression == planner::FileCompression::kZLIB ? ".zlib"
                                                                        : "");
    const std::string path = dir + "/" + name;
    std::string body;
    std::vector<uint64_t> offsets;
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t id = next + k;
      formats::TfExampleWriter example;
      for (size_t f = 0; f < spec.fields.size(); ++f) {
        const planner::DatasetField& field = spec.fields[f];
        const uint64_t n = 1 + (id * 7 + f) % 8;
        if (!field.dtype) {
          example.AddBytes(field.name, SyntheticBlob(id, f));
        } else if (*field.dtype == formats::DType::kInt64) {
          std::vector<int64_t> v(n);
          for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>((id * 2654435761u + i * 40503u) % 100003) - 7;
          example.AddInt64s(field.name, v);
        } else {
          std::vector<float> v(n);
          for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>(id) * 0.25f + static_cast<float>(i);
          example.AddFloats(field.name, v);
        }
      }
      offsets.push_back(body.size());
      body += formats::TfRecordFrame(example.Serialize());
    }
    offsets.push_back(body.size());
    if (spec.compression != planner::FileCompression::kNone) {
      MESHLOAD_ASSIGN_OR_RETURN(
          body, formats::Compress(
                    spec.compression == planner::FileCompression::kGZIP ? formats::Codec::kGzip : formats::Codec::kZlib,
                    body));
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, reinterpret_cast<const uint8_t*>(body.data()), body.size()));
    const std::string idx = formats::TfRecordIndexText(offsets);
    std::ofstream iout(path + ".idx", std::ios::binary | std::ios::trunc);
    if (!iout) return IoErrorFromErrno("create", path + ".idx", errno);
    MESHLOAD_RETURN_IF_ERROR(WriteAll(iout, path + ".idx", reinterpret_cast<const uint8_t*>(idx.data()), idx.size()));
    next += count;
  }
  return dir;
}

// Parquet: part-NNNNN.parquet files written by libparquet, 64 rows a row
// group; Arrow: a Dataset's folder as save_to_disk leaves it,
// data-NNNNN-of-MMMMM.arrow IPC streams (64 rows a record batch) and the
// state.json that lists them. A column per field: without a dtype, binary
// (the field's blob, cut to its maxBytes); with a dtype and maxBytes, a list
// of 0 to maxBytes of the sample's numbers; with a dtype alone, one number.
Result<std::string> GenerateColumnar(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                     int files) {
  if (spec.fields.empty()) return InvalidArgument("name the fields to generate", "spec.dataset.fields");
  uint64_t next = 0;
  std::string state;  // Arrow: state.json's _data_files
  for (int part = 0; part < files; ++part) {
    const uint64_t count = samples / static_cast<uint64_t>(files) +
                           (static_cast<uint64_t>(part) < samples % static_cast<uint64_t>(files) ? 1 : 0);
    std::vector<formats::ParquetColumnToWrite> columns(spec.fields.size());
    for (size_t f = 0; f < spec.fields.size(); ++f) {
      const planner::DatasetField& field = spec.fields[f];
      formats::ParquetColumnToWrite& c = columns[f];
      c.name = field.name;
      c.dtype = field.dtype.value_or(formats::DType::kUint8);
      c.kind = !field.dtype      ? formats::ParquetValueKind::kBytes
               : field.max_bytes ? formats::ParquetValueKind::kList
                                 : formats::ParquetValueKind::kScalar;
      const uint64_t es = formats::DTypeSize(c.dtype);
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t id = next + k;
        std::string v;
        if (c.kind == formats::ParquetValueKind::kBytes) {
          v = SyntheticBlob(id, f);
          if (field.max_bytes) v.resize(std::min<uint64_t>(v.size(), static_cast<uint64_t>(*field.max_bytes)));
        } else {
          const uint64_t room =
              c.kind == formats::ParquetValueKind::kList ? static_cast<uint64_t>(*field.max_bytes) / es : 1;
          const uint64_t n = c.kind == formats::ParquetValueKind::kList ? planner::Mix64(id * 31 + f) % (room + 1) : 1;
          v.resize(n * es);
          FillRecord(id * 16 + f, reinterpret_cast<uint8_t*>(v.data()), v.size());
          if (c.dtype == formats::DType::kBool) {
            for (char& b : v) b = static_cast<char>(b & 1);
          } else if (c.dtype == formats::DType::kFloat16 || c.dtype == formats::DType::kFloat32 ||
                     c.dtype == formats::DType::kFloat64) {
            // Finite numbers only: a NaN's bits need not come back as written.
            for (uint64_t i = 0; i < n; ++i) {
              const double x = static_cast<double>((id * 7 + i) % 1000) / 8;
              if (c.dtype == formats::DType::kFloat64) {
                std::memcpy(v.data() + i * es, &x, es);
              } else if (c.dtype == formats::DType::kFloat32) {
                const float y = static_cast<float>(x);
                std::memcpy(v.data() + i * es, &y, es);
              } else {
                const uint16_t h = static_cast<uint16_t>(0x3c00 + (id + i) % 512);  // 1.0 and up
                std::memcpy(v.data() + i * es, &h, es);
              }
            }
          }
        }
        c.values.push_back(std::move(v));
      }
    }
    const bool arrow = spec.format == planner::DatasetFormat::kArrow;
    MESHLOAD_ASSIGN_OR_RETURN(
        std::string bytes, arrow ? formats::ArrowIpcStreamBytes(columns, 64) : formats::ParquetFileBytes(columns, 64));
    char name[64];
    if (arrow) {
      std::snprintf(name, sizeof name, "data-%05d-of-%05d.arrow", part, files);
    } else {
      std::snprintf(name, sizeof name, "part-%05d.parquet", part);
    }
    const std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (arrow) state += std::string(part ? ", " : "") + "{\"filename\": \"" + name + "\"}";
    next += count;
  }
  if (spec.format == planner::DatasetFormat::kArrow) {
    // The Dataset's folder as save_to_disk leaves it: state.json lists the files.
    const std::string path = dir + "/state.json";
    std::ofstream out(path, std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    out << "{\"_data_files\": [" << state << "], \"_split\": null}\n";
    if (!out.flush()) return IoErrorFromErrno("write", path, errno);
  }
  return dir;
}

uint64_t ParquetSampleBytes(const planner::DatasetSpec& spec) {
  uint64_t b = 0;  // a row's record: each field's room and length word
  for (const planner::DatasetField& f : spec.fields) {
    b += 4 + (f.max_bytes ? static_cast<uint64_t>(*f.max_bytes) : f.dtype ? formats::DTypeSize(*f.dtype) : 4352);
  }
  return b;
}

// The samples of file `f` of `files` when `total` are dealt out (the
// first files take one more).
uint64_t CountOfFile(uint64_t total, int files, int f) {
  return total / static_cast<uint64_t>(files) +
         (static_cast<uint64_t>(f) < total % static_cast<uint64_t>(files) ? 1 : 0);
}

std::string PartPath(const std::string& dir, int f, const char* ext) {
  char name[64];
  std::snprintf(name, sizeof name, "part-%05d.%s", f, ext);
  return dir + "/" + name;
}

formats::DType DTypeOf(const planner::DatasetSpec& spec) {
  return spec.dtype.value_or(spec.format == planner::DatasetFormat::kMegatronIndexed ? formats::DType::kUint16
                                                                                     : formats::DType::kUint8);
}

uint64_t RecordSampleBytes(const planner::DatasetSpec& spec) {
  uint64_t b = 0;  // the mean: a blob of about 4 KiB per field of bytes, and the tar headers
  for (const planner::DatasetField& f : spec.fields) b += (f.dtype ? 8 : 4352) + 1024;
  return b;
}

uint64_t FixedSampleBytes(const planner::DatasetSpec& spec) {
  return spec.record_bytes > 0 ? static_cast<uint64_t>(spec.record_bytes) : 1024;
}

// FixedRecord (part-NNNNN.bin) and Npy (part-NNNNN.npy): each sample the
// FixedRecord pattern of its id.
Result<std::string> GenerateFixed(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                  int files) {
  const formats::DType dtype = DTypeOf(spec);
  const size_t es = formats::DTypeSize(dtype);
  const uint64_t rb = FixedSampleBytes(spec);
  if (rb % es != 0)
    return InvalidArgument("recordBytes is not a whole number of " + std::string(formats::DTypeName(dtype)),
                           "spec.dataset.recordBytes");
  const bool npy = spec.format == planner::DatasetFormat::kNpy;
  std::vector<uint8_t> buf;
  uint64_t next = 0;
  for (int f = 0; f < files; ++f) {
    const uint64_t count = CountOfFile(samples, files, f);
    const std::string path = PartPath(dir, f, npy ? "npy" : "bin");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    if (npy) {
      MESHLOAD_ASSIGN_OR_RETURN(std::string header, formats::MakeNpyHeader(dtype, {count, rb / es}));
      MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, reinterpret_cast<const uint8_t*>(header.data()), header.size()));
    }
    const uint64_t chunk = std::max<uint64_t>(1, (4ull << 20) / rb);
    for (uint64_t done = 0; done < count; done += chunk) {
      const uint64_t n = std::min(chunk, count - done);
      buf.resize(n * rb);
      for (uint64_t k = 0; k < n; ++k) FillRecord(next + done + k, buf.data() + k * rb, rb);
      MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, buf.data(), buf.size()));
    }
    next += count;
  }
  return dir;
}

// MegatronIndexed: part-NNNNN.bin with part-NNNNN.idx, sequence i of
// SyntheticSequenceLength(i) tokens, one document each.
Result<std::string> GenerateMegatron(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                     int files) {
  const formats::DType dtype = DTypeOf(spec);
  const size_t es = formats::DTypeSize(dtype);
  formats::MegatronIndex index;
  if (!formats::MegatronDTypeFor(dtype, index.dtype)) {
    return InvalidArgument(std::string(formats::DTypeName(dtype)) + " is not a Megatron indexed dataset type",
                           "spec.dataset.dtype");
  }
  std::vector<uint8_t> buf;
  uint64_t next = 0;
  for (int f = 0; f < files; ++f) {
    const uint64_t count = CountOfFile(samples, files, f);
    const std::string bin = PartPath(dir, f, "bin");
    std::ofstream out(bin, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", bin, errno);
    index.lengths.clear();
    index.pointers.clear();
    index.document_indices.clear();
    int64_t at = 0;
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t id = next + k;
      const uint64_t n = SyntheticSequenceLength(id);
      buf.resize(n * es);
      FillTokens(id << 32, n, es, buf.data());
      MESHLOAD_RETURN_IF_ERROR(WriteAll(out, bin, buf.data(), buf.size()));
      index.lengths.push_back(static_cast<int32_t>(n));
      index.pointers.push_back(at);
      index.document_indices.push_back(static_cast<int64_t>(k));  // one document per sequence
      at += static_cast<int64_t>(n * es);
    }
    index.document_indices.push_back(static_cast<int64_t>(count));
    out.close();
    const std::string idx = PartPath(dir, f, "idx");
    std::ofstream iout(idx, std::ios::binary | std::ios::trunc);
    if (!iout) return IoErrorFromErrno("create", idx, errno);
    const std::string bytes = formats::MegatronIndexBytes(index);
    MESHLOAD_RETURN_IF_ERROR(WriteAll(iout, idx, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    next += count;
  }
  return dir;
}

// TokenStream: part-NNNNN.tok files of one token stream, token g Mix64(g).
Result<std::string> GenerateTokens(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                   int files) {
  const size_t es = formats::DTypeSize(DTypeOf(spec));
  const uint64_t T = static_cast<uint64_t>(spec.sequence_length);
  const uint64_t tokens = samples * T + 1;  // exactly `samples` samples
  std::vector<uint8_t> buf;
  uint64_t next = 0;
  for (int f = 0; f < files; ++f) {
    const uint64_t count = CountOfFile(tokens, files, f);
    const std::string path = PartPath(dir, f, "tok");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return IoErrorFromErrno("create", path, errno);
    const uint64_t chunk = (4ull << 20) / es;
    for (uint64_t done = 0; done < count; done += chunk) {
      const uint64_t n = std::min(chunk, count - done);
      buf.resize(n * es);
      FillTokens(next + done, n, es, buf.data());
      MESHLOAD_RETURN_IF_ERROR(WriteAll(out, path, buf.data(), buf.size()));
    }
    next += count;
  }
  return dir;
}

// The first byte of `bytes` (sample `id` of its dataset, `n` tokens of
// `es` bytes) that is not token t = Mix64(base + t), or -1.
int64_t FirstTokenMismatch(uint64_t base, uint64_t n, size_t es, const uint8_t* bytes) {
  for (uint64_t t = 0; t < n; ++t) {
    const uint64_t v = planner::Mix64(base + t);
    for (size_t b = 0; b < es; ++b) {
      if (bytes[t * es + b] != static_cast<uint8_t>(v >> (8 * b))) return static_cast<int64_t>(t * es + b);
    }
  }
  return -1;
}

int64_t FixedMismatch(const planner::DatasetIndex& index, uint64_t, uint64_t id, const uint8_t* bytes) {
  const uint64_t sb = index.sample_bytes();
  for (uint64_t j = 0; j < sb; j += 8) {
    const uint64_t w = Word(id, j / 8);
    const uint64_t n = std::min<uint64_t>(8, sb - j);
    for (uint64_t b = 0; b < n; ++b) {
      if (bytes[j + b] != static_cast<uint8_t>(w >> (8 * b))) return static_cast<int64_t>(j + b);
    }
  }
  return -1;
}

int64_t TokensMismatch(const planner::DatasetIndex& index, uint64_t, uint64_t id, const uint8_t* bytes) {
  const size_t es = formats::DTypeSize(index.dtype());
  const uint64_t tokens = index.sample_bytes() / es;
  return FirstTokenMismatch(id * (tokens - 1), tokens, es, bytes);
}

int64_t MegatronMismatch(const planner::DatasetIndex& index, uint64_t global_id, uint64_t id, const uint8_t* bytes) {
  const size_t es = formats::DTypeSize(index.dtype());
  const uint64_t n = index.SampleBytes(global_id) / es;
  if (n != SyntheticSequenceLength(id)) return 0;
  return FirstTokenMismatch(id << 32, n, es, bytes);
}

// Each format's test data: how its files are written, the bytes of a sample
// (the mean), and how a delivered sample's bytes are checked (by its id;
// the record formats' samples are checked field by field instead, by the
// formats' own decoding). One line per format.
struct Generator {
  Result<std::string> (*write)(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples, int files);
  uint64_t (*sample_bytes)(const planner::DatasetSpec& spec);
  int64_t (*first_mismatch)(const planner::DatasetIndex& index, uint64_t global_id, uint64_t id, const uint8_t* bytes);
};

const Generator* FindGenerator(planner::DatasetFormat format) {
  using F = planner::DatasetFormat;
  static const std::map<F, Generator> generators = {
      {F::kFixedRecord, {GenerateFixed, FixedSampleBytes, FixedMismatch}},
      {F::kTokenStream,
       {GenerateTokens,
        [](const planner::DatasetSpec& spec) {
          return static_cast<uint64_t>(std::max<int64_t>(spec.sequence_length, 1)) *
                 formats::DTypeSize(spec.dtype.value_or(formats::DType::kUint8));
        },
        TokensMismatch}},
      {F::kNpy, {GenerateFixed, FixedSampleBytes, FixedMismatch}},
      {F::kMegatronIndexed,
       {GenerateMegatron, [](const planner::DatasetSpec& spec) { return 1024 * formats::DTypeSize(DTypeOf(spec)); },
        MegatronMismatch}},
      {F::kWebDataset, {GenerateRecords, RecordSampleBytes, FixedMismatch}},
      {F::kMDS, {GenerateRecords, RecordSampleBytes, FixedMismatch}},
      {F::kTFRecord, {GenerateTfRecords, RecordSampleBytes, FixedMismatch}},
      {F::kParquet, {GenerateColumnar, ParquetSampleBytes, FixedMismatch}},
      {F::kArrow, {GenerateColumnar, ParquetSampleBytes, FixedMismatch}},
  };
  auto it = generators.find(format);
  return it == generators.end() ? nullptr : &it->second;
}

const Generator& GeneratorOf(planner::DatasetFormat format) {
  const Generator* g = FindGenerator(format);
  MESHLOAD_CHECK(g != nullptr, "a dataset format without a generator: " + std::string(ToString(format)));
  return *g;
}

}  // namespace

uint64_t SyntheticSampleBytes(const planner::DatasetSpec& spec) {
  const Generator* g = FindGenerator(spec.format);
  return g ? g->sample_bytes(spec) : 0;
}

Result<std::string> GenerateSyntheticDataset(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                             int files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create the dataset directory: " + ec.message(), dir);
  if (samples == 0) return InvalidArgument("a dataset needs at least one sample");
  if (FindGenerator(spec.format) == nullptr) {
    return InvalidArgument("meshload generates no " + std::string(ToString(spec.format)) +
                               " test data: give the files with --dataset PATH",
                           "spec.dataset.format");
  }
  if (files < 1) files = 1;
  if (static_cast<uint64_t>(files) > samples) files = static_cast<int>(samples);
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("part-", 0) == 0) std::filesystem::remove(e.path(), ec);
  }
  return GeneratorOf(spec.format).write(spec, dir, samples, files);
}

uint64_t SyntheticSequenceLength(uint64_t id) {
  const uint64_t h = planner::Mix64(id ^ 0x5EED5EED5EED5EEDull);
  return h % 16 == 0 ? 0 : 1 + (h >> 4) % 2048;  // one in 16 empty, as real corpora have empty documents
}

int64_t FirstMismatch(const planner::DatasetIndex& index, uint64_t global_id, const uint8_t* bytes) {
  // A mixture's datasets were each generated on their own: the content is
  // the sample's within its dataset.
  const uint64_t id = global_id - index.parts()[index.PartOf(global_id)].first;
  return GeneratorOf(index.format()).first_mismatch(index, global_id, id, bytes);
}

}  // namespace meshload::tools
