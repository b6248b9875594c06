// `meshload index`: Energon-compatible .tar.idx files for WebDataset shards
// and DALI tfrecord2idx indexes for TFRecord files (compressed ones: of
// their decompressed bytes),
// from the shards' tar headers read through the sources (ranged reads, so
// a remote shard's data is not downloaded), several shards at once.

#include "tools/index_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/flags.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "formats/compression.h"
#include "formats/tar.h"
#include "formats/tfrecord.h"
#include "formats/webdataset.h"
#include "sidecar/source/source.h"

namespace meshload::tools {
namespace {

using sidecar::source::Source;
using sidecar::source::SourceRegistry;

constexpr const char* kIndexUsage = R"(usage: meshload index [options] URI...

Writes the index each WebDataset shard or TFRecord file needs: for a
shard (.tar), SHARD.tar.idx, as Megatron-Energon's `energon prepare` writes
it (each sample's offset in the tar, then where its members end); for a
TFRecord file (a name with .tfrecord in it, or any file with --format
TFRecord), FILE.idx as DALI's tfrecord2idx writes it (a line "OFFSET
LENGTH" per record; with --compression, the offsets in the bytes the file
decompresses to, as the sidecar reads a TFRecord job with
spec.dataset.compression). The tar headers or record frames are read through the
storage sources by ranged reads, several files at once; a file that has an
index already is left as it is, so an interrupted run is resumed by running
it again.

URI is a file, a directory, a glob or brace ranges
(shards/train-{000000..000127}.tar), as a path or a file://, http(s):// or
s3:// URI (s3: the AWS_* environment gives the endpoint and credentials).

options:
  --output DIR     write the indexes into DIR (by the shard's name) instead
                   of beside the shards; needed for http(s) and s3 shards,
                   whose indexes you then upload beside them
  --jobs N         shards indexed at once (default 4, 16 for remote shards)
  --force          index files that have an index already
  --format FORMAT  WebDataset or TFRecord: index every file the URIs name as
                   that format (default: by name, .tar and .tfrecord)
  --compression C  GZIP or ZLIB: the TFRecord files are compressed, as
                   TensorFlow writes them with that compression_type (each
                   is decompressed as it is read, never held whole)
  --log-level LEVEL  debug, info, warn, error, off (env MESHLOAD_LOG_LEVEL)

exit codes: 0 every shard has its index; 1 a shard could not be indexed
(each is named, with the byte at fault; no partial index is left); 2
invalid arguments or nothing to index
)";

// How much of a shard one read brings in: headers are 512 bytes, and a
// round trip per header would make remote shards slow.
constexpr uint64_t kReadWindow = 1 << 20;

struct Shard {
  Source* source = nullptr;  // the registry's, for the shard's scheme
  std::string name;          // as the source names it
  uint64_t size = 0;
  std::string index_path;               // where its index goes (a local path)
  bool tfrecord = false;                // a TFRecord file, not a tar shard
  std::optional<formats::Codec> codec;  // a compressed TFRecord file's
};

bool LocalFileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string BaseName(const std::string& name) {
  const size_t slash = name.find_last_of('/');
  std::string base = slash == std::string::npos ? name : name.substr(slash + 1);
  return base.substr(0, base.find('?'));
}

// Reads the shard's headers through `source` (a window at a time) and
// returns the index's bytes.
Result<std::string> IndexShard(const Shard& shard, uint64_t* samples) {
  formats::TarWalker walker(shard.name, shard.size);
  formats::ShardSamples found(shard.name);
  std::string window;
  uint64_t window_at = 0;
  while (!walker.done()) {
    const formats::TarWalker::Need need = walker.next();
    if (need.offset < window_at || need.offset + need.bytes > window_at + window.size()) {
      window_at = need.offset;
      window.resize(std::min<uint64_t>(std::max(need.bytes, kReadWindow), shard.size - need.offset));
      MESHLOAD_RETURN_IF_ERROR(shard.source->Read(shard.name, window_at, window.data(), window.size()));
    }
    MESHLOAD_ASSIGN_OR_RETURN(std::optional<formats::TarMember> member,
                              walker.Feed(std::string_view(window).substr(need.offset - window_at, need.bytes)));
    if (member) MESHLOAD_RETURN_IF_ERROR(found.Add(*member));
  }
  std::vector<formats::WebDatasetSample> all = found.Finish();
  *samples = all.size();
  return formats::EnergonTarIndexBytes(formats::ShardSamples::EnergonIndex(all, walker.end_offset()));
}

// Walks a TFRecord file's frames (each record's 12-byte header, its length
// CRC checked; the payloads are skipped, but read in the window) and
// returns its DALI index.
Result<std::string> IndexTfRecordFile(const Shard& shard, uint64_t* records) {
  std::vector<uint64_t> offsets;
  std::string window;
  uint64_t window_at = 0;
  uint64_t at = 0;
  while (at < shard.size) {
    if (shard.size - at < formats::kTfRecordFramingBytes) {
      return DataLoss("a record's framing is cut off by the end of the file", shard.name + "@" + std::to_string(at));
    }
    if (at < window_at || at + 12 > window_at + window.size()) {
      window_at = at;
      window.resize(std::min<uint64_t>(kReadWindow, shard.size - at));
      MESHLOAD_RETURN_IF_ERROR(shard.source->Read(shard.name, window_at, window.data(), window.size()));
    }
    Result<uint64_t> length = formats::TfRecordLength(std::string_view(window).substr(at - window_at, 12),
                                                      sidecar::source::RedactUri(shard.name), at);
    if (!length.ok()) {
      const std::string_view hint = at == 0 ? formats::TfRecordCompressionHint(window) : "";
      if (hint.empty()) return length.status();
      return Status(length.status().code(),
                    length.status().message() + " (the file starts like a " + std::string(hint) +
                        " stream: if TensorFlow wrote it compressed, index it with --compression " + std::string(hint) +
                        ")",
                    length.status().location());
    }
    const uint64_t n = *length;
    if (n > shard.size - at - formats::kTfRecordFramingBytes) {
      return DataLoss("a record of " + std::to_string(n) + " bytes runs past the end of the file",
                      sidecar::source::RedactUri(shard.name) + "@" + std::to_string(at));
    }
    offsets.push_back(at);
    at += n + formats::kTfRecordFramingBytes;
  }
  offsets.push_back(at);
  *records = offsets.size() - 1;
  return formats::TfRecordIndexText(offsets);
}

// Walks a compressed TFRecord file's frames in the bytes it decompresses
// to: the compressed bytes read a window at a time and decoded as they
// come (only the bytes not yet walked past are kept), each frame's length
// CRC checked. Offsets are in the decompressed bytes, where the records
// must end exactly.
Result<std::string> IndexCompressedTfRecordFile(const Shard& shard, uint64_t* records) {
  const std::string shown = sidecar::source::RedactUri(shard.name);
  const std::string decompressed = shown + ".decompressed";
  MESHLOAD_ASSIGN_OR_RETURN(std::unique_ptr<formats::PrefixDecoder> decoder,
                            formats::PrefixDecoder::Make(*shard.codec));
  constexpr size_t kStep = 4 << 20;  // decompressed bytes decoded at a time
  std::string window;                // compressed bytes read, not yet fed
  uint64_t read = 0;
  bool last = shard.size == 0;
  bool ended = false;
  std::string out;      // decompressed bytes not yet walked past
  uint64_t out_at = 0;  // the offset of out[0] in the decompressed file
  // Appends up to kStep decompressed bytes to `out`; `ended` once the
  // stream is over.
  auto more = [&]() -> Status {
    const size_t want = out.size() + kStep;
    while (true) {
      bool done = false;
      Status st = decoder->Feed(window, last, want, out, done);
      if (!st.ok()) return st.WithLocationPrefix(shown);
      window.clear();
      if (out.size() >= want) return Status::Ok();
      if (done) {
        ended = true;
        return Status::Ok();
      }
      if (last) return DataLoss("the compressed stream ends early (truncated)", shown);
      window.resize(std::min<uint64_t>(kReadWindow, shard.size - read));
      MESHLOAD_RETURN_IF_ERROR(shard.source->Read(shard.name, read, window.data(), window.size()));
      read += window.size();
      last = read == shard.size;
    }
  };
  std::vector<uint64_t> offsets;
  uint64_t at = 0;  // the next record's offset
  while (true) {
    while (at >= out_at && at + 12 <= out_at + out.size()) {
      MESHLOAD_ASSIGN_OR_RETURN(
          const uint64_t n, formats::TfRecordLength(std::string_view(out).substr(at - out_at, 12), decompressed, at));
      if (n > (uint64_t{1} << 56)) {
        return DataLoss("a record of " + std::to_string(n) + " bytes", decompressed + "@" + std::to_string(at));
      }
      offsets.push_back(at);
      at += n + formats::kTfRecordFramingBytes;
    }
    const uint64_t keep_from = std::min(at, out_at + out.size());
    out.erase(0, static_cast<size_t>(keep_from - out_at));
    out_at = keep_from;
    if (ended) break;
    MESHLOAD_RETURN_IF_ERROR(more());
  }
  const uint64_t end = out_at + out.size();
  if (at < end) {
    return DataLoss("a record's framing is cut off by the end of the decompressed bytes (" + std::to_string(end) + ")",
                    decompressed + "@" + std::to_string(at));
  }
  if (at > end) {
    return DataLoss("a record runs past the end of the decompressed bytes (" + std::to_string(end) + ")",
                    decompressed + "@" + std::to_string(offsets.back()));
  }
  offsets.push_back(at);
  *records = offsets.size() - 1;
  return formats::TfRecordIndexText(offsets);
}

// Writes `bytes` to `path` whole or not at all (a temporary, then rename).
Status WriteWhole(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      ::unlink(tmp.c_str());
      return Status(StatusCode::kIoError, "cannot write " + tmp);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return IoErrorFromErrno("rename", path, errno);
  }
  return Status::Ok();
}

}  // namespace

int RunIndex(const std::vector<std::string>& args) {
  FlagParser flags("index", kIndexUsage);
  std::vector<std::string> uris;
  flags.Positional(&uris);
  std::string output, log_level;
  std::optional<int64_t> jobs;
  bool force = false;
  std::string format, compression;
  flags.String({"--format"}, &format);
  flags.String({"--compression"}, &compression);
  flags.String({"--output"}, &output);
  flags.OptionalInt({"--jobs"}, &jobs);
  flags.Bool({"--force"}, &force);
  flags.String({"--log-level"}, &log_level);
  if (int rc = flags.Parse(args); rc >= 0) return rc;
  if (Status st = ConfigureLoggingFromFlags(log_level, log_level.empty() ? "" : "json"); !st.ok()) {
    return UsageError(st.message());
  }
  if (uris.empty()) return UsageError("no shards given\n\n" + std::string(kIndexUsage));
  if (jobs && (*jobs < 1 || *jobs > 256)) return UsageError("--jobs: expected 1 to 256");
  if (!format.empty() && format != "WebDataset" && format != "TFRecord") {
    return UsageError("--format: expected WebDataset or TFRecord, got '" + format + "'");
  }
  std::optional<formats::Codec> codec;
  if (!compression.empty()) {
    if (compression != "GZIP" && compression != "ZLIB") {
      return UsageError("--compression: expected GZIP or ZLIB (TensorFlow's compression_type), got '" + compression +
                        "'");
    }
    if (format == "WebDataset") return UsageError("--compression: only TFRecord files are read compressed");
    codec = compression == "GZIP" ? formats::Codec::kGzip : formats::Codec::kZlib;
  }
  if (!output.empty() && !LocalFileExists(output)) return UsageError("--output " + output + ": no such directory");

  bool remote = false;  // meshload writes no objects: their indexes go to --output
  for (const std::string& u : uris) remote = remote || SourceRegistry::SchemeOf(u) != "file";
  Result<sidecar::source::SourceOptions> sopts = sidecar::source::SourceOptionsForUris(uris);
  if (!sopts.ok()) {
    std::cerr << "meshload index: " << sopts.status().ToString() << "\n";
    return 2;
  }
  if (remote && output.empty()) {
    return UsageError(
        "remote shards: give --output DIR for their indexes (meshload writes no objects), then "
        "upload them beside the shards");
  }
  auto sources = SourceRegistry::WithBuiltins(std::move(*sopts));

  // The shards, in the order given (brace ranges expanded, globs listed).
  std::vector<Shard> shards;
  for (const std::string& pattern : uris) {
    for (const std::string& uri : formats::ExpandShardPattern(pattern)) {
      auto found = sources->For(uri);
      if (!found.ok()) {
        std::cerr << "meshload index: " << found.status().ToString() << "\n";
        return 2;
      }
      auto listed = found->first->List(found->second);
      if (!listed.ok()) {
        std::cerr << "meshload index: " << sidecar::source::RedactUri(uri) << ": " << listed.status().ToString()
                  << "\n";
        return 2;
      }
      for (const Source::Listed& o : *listed) {
        const std::string base = BaseName(o.name);
        if (base.ends_with(".idx") || base.ends_with(".tmp")) continue;  // an index: not data
        const bool tfrecord = format.empty() ? base.find(".tfrecord") != std::string::npos : format == "TFRecord";
        if (!tfrecord && (format.empty() ? !base.ends_with(".tar") : false)) continue;  // not a shard
        shards.push_back({found->first, o.name, o.size, output.empty() ? o.name + ".idx" : output + "/" + base + ".idx",
                          tfrecord, tfrecord ? codec : std::nullopt});
      }
    }
  }
  if (shards.empty()) {
    return UsageError("no .tar shards or .tfrecord files found in " + sidecar::source::RedactUri(uris.front()));
  }

  const size_t threads = static_cast<size_t>(jobs.value_or(remote ? 16 : 4));
  std::atomic<size_t> next{0}, done{0}, failed{0}, skipped{0};
  Mutex out_mu;
  auto say = [&](const std::string& line) {
    MutexLock lock(out_mu);
    std::cerr << line << "\n";
  };
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shards.size();) {
      const Shard& s = shards[i];
      const std::string shown = sidecar::source::RedactUri(s.name);
      if (!force && LocalFileExists(s.index_path)) {
        ++skipped;
        say("[" + std::to_string(++done) + "/" + std::to_string(shards.size()) + "] " + shown + ": has an index");
        continue;
      }
      uint64_t samples = 0;
      Result<std::string> bytes = !s.tfrecord ? IndexShard(s, &samples)
                                  : s.codec   ? IndexCompressedTfRecordFile(s, &samples)
                                              : IndexTfRecordFile(s, &samples);
      Status st = bytes.ok() ? WriteWhole(s.index_path, *bytes) : bytes.status();
      if (!st.ok()) {
        ++failed;
        // A damaged shard gets no index: one left from before describes
        // bytes the shard no longer has (--force got here past it).
        const bool removed = !bytes.ok() && LocalFileExists(s.index_path) && ::unlink(s.index_path.c_str()) == 0;
        say("[" + std::to_string(++done) + "/" + std::to_string(shards.size()) + "] " + shown +
            ": cannot index: " + st.ToString() + (removed ? "; its old index removed" : ""));
        continue;
      }
      say("[" + std::to_string(++done) + "/" + std::to_string(shards.size()) + "] " + shown + ": " +
          std::to_string(samples) + (s.tfrecord ? " records -> " : " samples -> ") + s.index_path);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 0; t < std::min(threads, shards.size()); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  std::cout << "meshload index: " << shards.size() - failed - skipped << " indexed, " << skipped << " had an index, "
            << failed << " failed\n";
  return failed > 0 ? 1 : 0;
}

}  // namespace meshload::tools
