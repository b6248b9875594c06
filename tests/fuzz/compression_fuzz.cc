/// \file
/// libFuzzer target for the decompressors (formats/compression.h): the
/// first byte picks the codec, the next two the decompressed size the
/// "index" gives, the rest is the compressed data. They must never crash
/// or allocate what a damaged header claims, errors must be kDataLoss at a
/// compressed byte offset inside the input, and a head decoded from pieces
/// must be a prefix of what the whole object decodes to.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/compression.h"

namespace {
using meshload::StatusCode;
using meshload::formats::Codec;

void CheckError(const meshload::Status& st, size_t input) {
  if (st.code() != StatusCode::kDataLoss) __builtin_trap();
  const std::string& loc = st.location();
  if (loc.empty() || loc[0] != '@') __builtin_trap();
  if (std::stoull(loc.substr(1)) > input) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  constexpr Codec kCodecs[] = {Codec::kZstd, Codec::kGzip, Codec::kBzip2, Codec::kBrotli, Codec::kSnappy};
  const Codec codec = kCodecs[data[0] % 5];
  const size_t out_len = (static_cast<size_t>(data[1]) << 8 | data[2]) * 4;
  const uint8_t* in = data + 3;
  const size_t n = size - 3;

  std::vector<uint8_t> out(out_len);
  const meshload::Status whole = meshload::formats::Decompress(codec, in, n, out.data(), out.size());
  if (!whole.ok()) CheckError(whole, n);

  auto decoder = meshload::formats::PrefixDecoder::Make(codec);
  if (!decoder.ok()) __builtin_trap();
  const size_t want = out_len / 2 + 1;
  std::string head;
  bool done = false;
  meshload::Status st;
  const size_t piece = 1 + n / 3;
  for (size_t at = 0; at < n && !done && st.ok(); at += piece) {
    const std::string_view chunk(reinterpret_cast<const char*>(in) + at, std::min(piece, n - at));
    st = (*decoder)->Feed(chunk, at + chunk.size() == n, want, head, done);
  }
  if (head.size() > want) __builtin_trap();
  if (!st.ok()) CheckError(st, n);
  // What decoded whole decodes to the same first bytes from pieces.
  if (whole.ok() && st.ok() && done) {
    if (head.size() != std::min(want, out_len)) __builtin_trap();
    if (std::string_view(head) != std::string_view(reinterpret_cast<const char*>(out.data()), head.size())) {
      __builtin_trap();
    }
  }
  return 0;
}
