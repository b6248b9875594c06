#include "formats/compression.h"

#include <brotli/decode.h>
#include <bzlib.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace meshload::formats {
namespace {

struct Named {
  std::string_view name;
  Codec codec;
};
constexpr Named kCodecs[] = {
    {"br", Codec::kBrotli},     {"bz2", Codec::kBzip2}, {"gz", Codec::kGzip},
    {"snappy", Codec::kSnappy}, {"zlib", Codec::kZlib}, {"zstd", Codec::kZstd},
};

Status Corrupt(Codec codec, uint64_t at, std::string_view why) {
  return DataLoss("corrupt " + std::string(CodecName(codec)) + " data: " + std::string(why), "@" + std::to_string(at));
}

// One codec's decoder over a stream of compressed bytes. Step decodes from
// `in` into `out` and says how much of each it used; `ended`: the stream
// (every frame or member so far) is complete with no output pending.
class Stream {
 public:
  explicit Stream(Codec codec) : codec_(codec) {}
  virtual ~Stream() = default;
  // `last`: `in` holds every compressed byte left.
  virtual Status Step(const uint8_t* in, size_t in_len, bool last, uint8_t* out, size_t out_cap, size_t& used,
                      size_t& made, bool& ended) = 0;
  Codec codec() const { return codec_; }
  uint64_t consumed() const { return consumed_; }  // compressed bytes used so far

 protected:
  Status Fail(std::string_view why, size_t at_in) const { return Corrupt(codec_, consumed_ + at_in, why); }
  const Codec codec_;
  uint64_t consumed_ = 0;
};

class ZstdStream final : public Stream {
 public:
  ZstdStream() : Stream(Codec::kZstd), ctx_(ZSTD_createDCtx()) {}
  ~ZstdStream() override { ZSTD_freeDCtx(ctx_); }
  Status Step(const uint8_t* in, size_t in_len, bool, uint8_t* out, size_t out_cap, size_t& used, size_t& made,
              bool& ended) override {
    if (ctx_ == nullptr) return Internal("zstd: cannot allocate a decompression context");
    ZSTD_inBuffer ib{in, in_len, 0};
    ZSTD_outBuffer ob{out, out_cap, 0};
    const size_t r = ZSTD_decompressStream(ctx_, &ob, &ib);
    if (ZSTD_isError(r)) return Fail(ZSTD_getErrorName(r), ib.pos);
    used = ib.pos;
    made = ob.pos;
    consumed_ += used;
    // 0: a frame is complete and flushed; the next byte, if any, starts
    // another frame.
    ended = r == 0;
    return Status::Ok();
  }

 private:
  ZSTD_DCtx* ctx_;
};

// gzip members (RFC 1952), or zlib streams (RFC 1950: TensorFlow's ZLIB
// TFRecord files), one after another.
class GzipStream final : public Stream {
 public:
  explicit GzipStream(Codec codec) : Stream(codec) {
    std::memset(&z_, 0, sizeof z_);
    // 16 +: a gzip header and trailer; else a zlib header and trailer.
    ok_ = inflateInit2(&z_, codec == Codec::kGzip ? 16 + MAX_WBITS : MAX_WBITS) == Z_OK;
  }
  ~GzipStream() override {
    if (ok_) inflateEnd(&z_);
  }
  Status Step(const uint8_t* in, size_t in_len, bool, uint8_t* out, size_t out_cap, size_t& used, size_t& made,
              bool& ended) override {
    if (!ok_) return Internal("zlib: cannot initialize inflate");
    if (ended_ && in_len > 0) {  // another gzip member (zlib stream) follows
      inflateReset(&z_);
      ended_ = false;
    }
    z_.next_in = const_cast<Bytef*>(in);
    z_.avail_in = static_cast<uInt>(std::min<size_t>(in_len, 1u << 30));
    z_.next_out = out;
    z_.avail_out = static_cast<uInt>(std::min<size_t>(out_cap, 1u << 30));
    const uInt in0 = z_.avail_in;
    const uInt out0 = z_.avail_out;
    const int r = inflate(&z_, Z_NO_FLUSH);
    used = in0 - z_.avail_in;
    made = out0 - z_.avail_out;
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR) {
      return Fail(z_.msg != nullptr ? z_.msg : ("inflate returned " + std::to_string(r)).c_str(), used);
    }
    consumed_ += used;
    if (r == Z_STREAM_END) ended_ = true;
    ended = ended_;
    return Status::Ok();
  }

 private:
  z_stream z_;
  bool ok_ = false;
  bool ended_ = false;
};

class Bzip2Stream final : public Stream {
 public:
  Bzip2Stream() : Stream(Codec::kBzip2) { Init(); }
  ~Bzip2Stream() override {
    if (ok_) BZ2_bzDecompressEnd(&s_);
  }
  Status Step(const uint8_t* in, size_t in_len, bool, uint8_t* out, size_t out_cap, size_t& used, size_t& made,
              bool& ended) override {
    if (ended_ && in_len > 0) {  // another bzip2 stream follows
      BZ2_bzDecompressEnd(&s_);
      Init();
      ended_ = false;
    }
    if (!ok_) return Internal("bzip2: cannot initialize the decompressor");
    s_.next_in = const_cast<char*>(reinterpret_cast<const char*>(in));
    s_.avail_in = static_cast<unsigned>(std::min<size_t>(in_len, 1u << 30));
    s_.next_out = reinterpret_cast<char*>(out);
    s_.avail_out = static_cast<unsigned>(std::min<size_t>(out_cap, 1u << 30));
    const unsigned in0 = s_.avail_in;
    const unsigned out0 = s_.avail_out;
    const int r = BZ2_bzDecompress(&s_);
    used = in0 - s_.avail_in;
    made = out0 - s_.avail_out;
    if (r != BZ_OK && r != BZ_STREAM_END) {
      const char* why = r == BZ_DATA_ERROR_MAGIC ? "not a bzip2 stream (bad magic)"
                        : r == BZ_DATA_ERROR     ? "a block fails its CRC or does not decode"
                        : r == BZ_MEM_ERROR      ? "out of memory"
                                                 : "the decompressor failed";
      return Fail(why, used);
    }
    consumed_ += used;
    if (r == BZ_STREAM_END) ended_ = true;
    ended = ended_;
    return Status::Ok();
  }

 private:
  void Init() {
    std::memset(&s_, 0, sizeof s_);
    ok_ = BZ2_bzDecompressInit(&s_, 0, 0) == BZ_OK;
  }
  bz_stream s_;
  bool ok_ = false;
  bool ended_ = false;
};

class BrotliStream final : public Stream {
 public:
  BrotliStream() : Stream(Codec::kBrotli), s_(BrotliDecoderCreateInstance(nullptr, nullptr, nullptr)) {}
  ~BrotliStream() override { BrotliDecoderDestroyInstance(s_); }
  Status Step(const uint8_t* in, size_t in_len, bool, uint8_t* out, size_t out_cap, size_t& used, size_t& made,
              bool& ended) override {
    if (s_ == nullptr) return Internal("brotli: cannot allocate a decoder");
    size_t avail_in = in_len;
    const uint8_t* next_in = in;
    size_t avail_out = out_cap;
    uint8_t* next_out = out;
    const BrotliDecoderResult r =
        BrotliDecoderDecompressStream(s_, &avail_in, &next_in, &avail_out, &next_out, nullptr);
    used = in_len - avail_in;
    made = out_cap - avail_out;
    if (r == BROTLI_DECODER_RESULT_ERROR) {
      return Fail(BrotliDecoderErrorString(BrotliDecoderGetErrorCode(s_)), used);
    }
    consumed_ += used;
    ended = r == BROTLI_DECODER_RESULT_SUCCESS;
    return Status::Ok();
  }

 private:
  BrotliDecoderState* s_;
};

// Raw snappy has no streaming form: the whole input, then its output. A
// snappy element expands at most about 21 times (a 3-byte copy of 64
// bytes).
constexpr size_t kMaxSnappyRatio = 32;

Status DecompressSnappy(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len) {
  const char* src = reinterpret_cast<const char*>(in);
  size_t n = 0;
  if (snappy_uncompressed_length(src, in_len, &n) != SNAPPY_OK) {
    return Corrupt(Codec::kSnappy, 0, "the uncompressed length at its start does not parse");
  }
  if (n > out_len) {
    return Corrupt(
        Codec::kSnappy, 0,
        "decodes to more than the " + std::to_string(out_len) + " bytes the index gives (" + std::to_string(n) + ")");
  }
  if (n < out_len) {
    return Corrupt(
        Codec::kSnappy, 0,
        "decodes to " + std::to_string(n) + " bytes, not the " + std::to_string(out_len) + " the index gives");
  }
  size_t got = n;
  if (snappy_uncompress(src, in_len, reinterpret_cast<char*>(out), &got) != SNAPPY_OK || got != n) {
    return Corrupt(Codec::kSnappy, 0, "the data does not decode to its " + std::to_string(n) + " bytes");
  }
  return Status::Ok();
}

class SnappyStream final : public Stream {
 public:
  SnappyStream() : Stream(Codec::kSnappy) {}
  Status Step(const uint8_t* in, size_t in_len, bool last, uint8_t* out, size_t out_cap, size_t& used, size_t& made,
              bool& ended) override {
    used = 0;
    made = 0;
    ended = false;
    if (!decoded_) {
      input_.insert(input_.end(), in, in + in_len);
      used = in_len;
      consumed_ += in_len;
      if (!last) return Status::Ok();
      size_t n = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(input_.data()), input_.size(), &n) != SNAPPY_OK) {
        return Fail("the uncompressed length at its start does not parse", 0);
      }
      if (n > kMaxSnappyRatio * input_.size() + 64) {  // before allocating what a damaged length claims
        return Fail("it claims " + std::to_string(n) + " bytes, more than " + std::to_string(input_.size()) +
                        " bytes of snappy data can hold",
                    0);
      }
      output_.resize(n);
      MESHLOAD_RETURN_IF_ERROR(DecompressSnappy(input_.data(), input_.size(), output_.data(), n));
      decoded_ = true;
      std::vector<uint8_t>().swap(input_);
    }
    made = std::min(out_cap, output_.size() - served_);
    std::memcpy(out, output_.data() + served_, made);
    served_ += made;
    ended = served_ == output_.size();
    return Status::Ok();
  }

 private:
  std::vector<uint8_t> input_;
  std::vector<uint8_t> output_;
  size_t served_ = 0;
  bool decoded_ = false;
};

std::unique_ptr<Stream> MakeStream(Codec codec) {
  switch (codec) {
    case Codec::kZstd: return std::make_unique<ZstdStream>();
    case Codec::kGzip:
    case Codec::kZlib: return std::make_unique<GzipStream>(codec);
    case Codec::kBzip2: return std::make_unique<Bzip2Stream>();
    case Codec::kBrotli: return std::make_unique<BrotliStream>();
    case Codec::kSnappy: return std::make_unique<SnappyStream>();
  }
  return nullptr;
}

Status Truncated(const Stream& s) {
  return Corrupt(s.codec(), s.consumed(),
                 "the data ends before its " + std::string(CodecName(s.codec())) + " stream does (truncated)");
}

class PrefixDecoderImpl final : public PrefixDecoder {
 public:
  explicit PrefixDecoderImpl(std::unique_ptr<Stream> s) : s_(std::move(s)) {}
  Status Feed(std::string_view in, bool last, size_t want, std::string& out, bool& done) override {
    pending_.append(in);
    done = false;
    while (out.size() < want) {
      const size_t at = out.size();
      out.resize(want);
      size_t used = 0, made = 0;
      bool ended = false;
      Status st = s_->Step(reinterpret_cast<const uint8_t*>(pending_.data()), pending_.size(), last,
                           reinterpret_cast<uint8_t*>(out.data()) + at, want - at, used, made, ended);
      out.resize(at + made);
      if (!st.ok()) return st;
      pending_.erase(0, used);
      if (ended && pending_.empty()) {
        // The stream is complete: the object is shorter than `want` when
        // nothing follows; otherwise the next Feed may start a new frame.
        done = last;
        return Status::Ok();
      }
      if (used == 0 && made == 0) {
        if (last) return Truncated(*s_);
        return Status::Ok();  // needs more input
      }
    }
    done = true;
    return Status::Ok();
  }

 private:
  std::unique_ptr<Stream> s_;
  std::string pending_;
};

}  // namespace

Result<Codec> ParseCompression(std::string_view name) {
  const std::string_view base = name.substr(0, name.find(':'));
  for (const Named& n : kCodecs) {
    if (n.name == base) return n.codec;
  }
  return InvalidArgument("unknown compression '" + std::string(name) + "'; meshload decompresses " +
                         std::string(SupportedCompressions()) + " (with or without a level, as 'zstd:7')");
}

std::string_view CodecName(Codec codec) {
  for (const Named& n : kCodecs) {
    if (n.codec == codec) return n.name;
  }
  return "?";
}

std::string_view SupportedCompressions() { return "br, bz2, gz, snappy, zlib, zstd"; }

Status Decompress(Codec codec, const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len) {
  if (codec == Codec::kSnappy) return DecompressSnappy(in, in_len, out, out_len);  // straight into `out`
  constexpr size_t kPiece = 64 << 10;
  std::unique_ptr<Stream> s = MakeStream(codec);
  size_t in_pos = 0, out_pos = 0;
  bool ended = false;
  uint8_t probe = 0;  // once `out` is full: does the data decode to more?
  while (true) {
    size_t used = 0, made = 0;
    const bool full = out_pos == out_len;
    // The input in pieces: an error's offset is then within a piece of
    // where the codec found it (a codec reports where its call began).
    const size_t piece = std::min<size_t>(in_len - in_pos, kPiece);
    MESHLOAD_RETURN_IF_ERROR(s->Step(in + in_pos, piece, in_pos + piece == in_len, full ? &probe : out + out_pos,
                                     full ? 1 : out_len - out_pos, used, made, ended));
    in_pos += used;
    if (full && made > 0) {
      return Corrupt(codec, s->consumed(),
                     "decodes to more than the " + std::to_string(out_len) + " bytes the index gives");
    }
    out_pos += made;
    if (ended && in_pos == in_len) break;
    if (used == 0 && made == 0) {
      if (ended) return Corrupt(codec, s->consumed(), "trailing bytes after the end of the stream");
      return Truncated(*s);
    }
  }
  if (out_pos != out_len) {
    return Corrupt(
        codec, s->consumed(),
        "decodes to " + std::to_string(out_pos) + " bytes, not the " + std::to_string(out_len) + " the index gives");
  }
  return Status::Ok();
}

Result<std::string> Compress(Codec codec, std::string_view in) {
  if (codec != Codec::kGzip && codec != Codec::kZlib) {
    return InvalidArgument("meshload writes only gz and zlib, not " + std::string(CodecName(codec)));
  }
  if (in.size() > (1u << 30)) return InvalidArgument("meshload compresses at most 1 GiB at once");
  z_stream z;
  std::memset(&z, 0, sizeof z);
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, codec == Codec::kGzip ? 16 + MAX_WBITS : MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return Internal("zlib: cannot initialize deflate");
  }
  std::string out(deflateBound(&z, static_cast<uLong>(in.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int r = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (r != Z_STREAM_END) return Internal("zlib: deflate did not finish");
  return out;
}

Result<std::unique_ptr<PrefixDecoder>> PrefixDecoder::Make(Codec codec) {
  return std::unique_ptr<PrefixDecoder>(new PrefixDecoderImpl(MakeStream(codec)));
}

}  // namespace meshload::formats
