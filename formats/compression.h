/// \file
/// Decompression of whole stored objects: the codecs MosaicML Streaming
/// writes MDS shards with (streaming/base/compression.py): zstd (the `zstd`
/// package's frames), gz (gzip members), bz2, br (a raw brotli stream) and
/// snappy (the raw, unframed format of `snappy.compress`), each named as
/// index.json's `compression` names it, with or without a level ("zstd:7");
/// and zlib streams (RFC 1950), as TensorFlow writes a TFRecord file with
/// compression_type ZLIB (its GZIP files are gzip members).
///
/// Pure: bytes in, bytes out, no I/O (the sources read the compressed
/// bytes). Errors are kDataLoss with the compressed byte offset the
/// decoder stopped at ("@1234" as the location, so a caller's file name
/// prefixes it), and the codec's own message.
///
/// Thread safety: the functions are thread-safe; a Decoder is used by one
/// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace meshload::formats {

enum class Codec { kZstd, kGzip, kBzip2, kBrotli, kSnappy, kZlib };

/// The codec of a compression name as MDS's index.json gives it ("zstd",
/// "zstd:7", "gz:9", "bz2", "br:11", "snappy"; "zlib"). kInvalidArgument
/// naming the name and the supported codecs otherwise.
Result<Codec> ParseCompression(std::string_view name);
/// "zstd", "gz", "bz2", "br", "snappy", "zlib".
std::string_view CodecName(Codec codec);
/// The codecs ParseCompression accepts, for messages: "br, bz2, gz, snappy, zlib, zstd".
std::string_view SupportedCompressions();

/// Decompresses one whole compressed object `in` into exactly `out_len`
/// bytes at `out`: kDataLoss when the data is corrupt, ends early, or
/// decodes to more or fewer bytes than `out_len` (the uncompressed size the
/// format's index gives).
Status Decompress(Codec codec, const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len);

/// Compresses `in` whole as one gzip member (kGzip) or zlib stream (kZlib),
/// as TensorFlow's TFRecordWriter writes a file with compression_type GZIP
/// or ZLIB (what `meshload run --generate-dataset` writes for such a job).
/// kInvalidArgument for the other codecs.
Result<std::string> Compress(Codec codec, std::string_view in);

/// Decodes a compressed object's first bytes as its compressed bytes arrive
/// in pieces: what reading an index from the head of a compressed shard
/// needs, without reading the whole shard.
class PrefixDecoder {
 public:
  static Result<std::unique_ptr<PrefixDecoder>> Make(Codec codec);
  virtual ~PrefixDecoder() = default;
  /// Takes the next compressed bytes `in` (`last`: no more follow) and
  /// appends to `out` what they decode to, until `out` holds `want` bytes.
  /// Sets `done` once `out` holds `want` bytes or the stream ended (then
  /// `out` may hold fewer: the object is shorter). kDataLoss when the data
  /// is corrupt, or when `last` came before the stream's end.
  virtual Status Feed(std::string_view in, bool last, size_t want, std::string& out, bool& done) = 0;
};

}  // namespace meshload::formats
