#include "sidecar/source/decoded_source.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "formats/compression.h"

namespace meshload::sidecar::source {

Status ReadStored(Source& source, const std::string& stored_name, const planner::StoredFile& stored, uint8_t* out,
                  uint64_t size) {
  MESHLOAD_ASSIGN_OR_RETURN(formats::Codec codec, formats::ParseCompression(stored.compression));
  std::vector<uint8_t> in(static_cast<size_t>(stored.size));
  MESHLOAD_RETURN_IF_ERROR(source.Read(stored_name, 0, in.data(), in.size()));
  return formats::Decompress(codec, in.data(), in.size(), out, static_cast<size_t>(size))
      .WithLocationPrefix(RedactUri(stored_name));
}

Result<std::string> ReadStoredHead(Source& source, const std::string& stored_name, const planner::StoredFile& stored,
                                   uint64_t want) {
  MESHLOAD_ASSIGN_OR_RETURN(formats::Codec codec, formats::ParseCompression(stored.compression));
  MESHLOAD_ASSIGN_OR_RETURN(std::unique_ptr<formats::PrefixDecoder> decoder, formats::PrefixDecoder::Make(codec));
  std::string out;
  std::string in;
  uint64_t at = 0;
  uint64_t piece = 64 << 10;  // doubles: a head that compresses well takes one read
  bool done = false;
  while (!done) {
    const uint64_t n = std::min(piece, stored.size - at);
    in.resize(static_cast<size_t>(n));
    if (n > 0) MESHLOAD_RETURN_IF_ERROR(source.Read(stored_name, at, in.data(), n));
    at += n;
    const bool last = at == stored.size;
    MESHLOAD_RETURN_IF_ERROR(
        decoder->Feed(in, last, static_cast<size_t>(want), out, done).WithLocationPrefix(RedactUri(stored_name)));
    if (last) break;
    piece = std::min<uint64_t>(piece * 2, 16 << 20);
  }
  return out;
}

Result<uint64_t> DecompressedSize(Source& source, const std::string& stored_name, const planner::StoredFile& stored) {
  MESHLOAD_ASSIGN_OR_RETURN(formats::Codec codec, formats::ParseCompression(stored.compression));
  MESHLOAD_ASSIGN_OR_RETURN(std::unique_ptr<formats::PrefixDecoder> decoder, formats::PrefixDecoder::Make(codec));
  constexpr size_t kStep = 4 << 20;  // decompressed bytes decoded (and dropped) at a time
  std::string in;
  std::string out;
  uint64_t at = 0;
  uint64_t total = 0;
  bool last = stored.size == 0;
  while (true) {
    bool done = false;
    out.clear();
    MESHLOAD_RETURN_IF_ERROR(decoder->Feed(in, last, kStep, out, done).WithLocationPrefix(RedactUri(stored_name)));
    in.clear();
    total += out.size();
    if (out.size() >= kStep) continue;  // more may be pending without more input
    if (done) return total;
    const uint64_t n = std::min<uint64_t>(kStep, stored.size - at);
    in.resize(static_cast<size_t>(n));
    if (n > 0) MESHLOAD_RETURN_IF_ERROR(source.Read(stored_name, at, in.data(), n));
    at += n;
    last = at == stored.size;
  }
}

void DecodingSource::Add(const std::string& name, const std::string& stored_name, const planner::StoredFile& stored,
                         uint64_t size) {
  files_[name] = File{stored_name, stored, size};
}

Result<ObjectInfo> DecodingSource::Stat(const std::string& uri) {
  auto it = files_.find(uri);
  if (it == files_.end()) return inner_.Stat(uri);
  MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo info, inner_.Stat(it->second.stored_name));
  info.size = it->second.size;
  return info;
}

Result<std::shared_ptr<const std::vector<uint8_t>>> DecodingSource::Bytes(const std::string& name, const File& f) {
  return kept_.Get(name, [&]() -> Result<std::shared_ptr<const std::vector<uint8_t>>> {
    auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(f.size));
    MESHLOAD_RETURN_IF_ERROR(ReadStored(inner_, f.stored_name, f.stored, bytes->data(), f.size));
    return std::shared_ptr<const std::vector<uint8_t>>(std::move(bytes));
  });
}

Status DecodingSource::ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) {
  auto f = files_.find(uri);
  if (f == files_.end()) return inner_.ReadV(uri, offset, iov);
  uint64_t len = 0;
  for (const iovec& v : iov) len += v.iov_len;
  if (offset > f->second.size || len > f->second.size - offset) {
    return DataLoss("range [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                        ") is past the end of its " + std::to_string(f->second.size) + " decompressed bytes",
                    RedactUri(uri) + "@" + std::to_string(offset));
  }
  MESHLOAD_ASSIGN_OR_RETURN(auto bytes, Bytes(uri, f->second));
  const uint8_t* at = bytes->data() + offset;
  for (const iovec& v : iov) {
    std::memcpy(v.iov_base, at, v.iov_len);
    at += v.iov_len;
  }
  return Status::Ok();
}

void DecodingSource::Prefetch(const std::string& uri, const Range* ranges, size_t count) {
  if (files_.count(uri) == 0) inner_.Prefetch(uri, ranges, count);
}

Result<std::vector<std::unique_ptr<DecodingSource>>> InstallDecoding(const planner::DatasetIndex& ds,
                                                                     SourceRegistry& sources, uint64_t capacity_bytes) {
  std::map<Source*, std::unique_ptr<DecodingSource>> by_source;
  for (const planner::DatasetFile& f : ds.files()) {
    if (!f.stored) continue;
    MESHLOAD_ASSIGN_OR_RETURN(auto read, sources.For(f.path));
    MESHLOAD_ASSIGN_OR_RETURN(auto stored, sources.For(f.stored->path));
    if (read.first != stored.first) {
      return InvalidArgument("is stored on another kind of storage than " + RedactUri(f.path),
                             RedactUri(f.stored->path));
    }
    auto& d = by_source[read.first];
    if (!d) d = std::make_unique<DecodingSource>(*read.first, capacity_bytes);
    d->Add(read.second, stored.second, *f.stored, f.size);
  }
  std::vector<std::unique_ptr<DecodingSource>> out;
  for (auto& [inner, d] : by_source) {
    sources.Interpose(inner, d.get());
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace meshload::sidecar::source
