/// \file
/// libFuzzer target for the plain-http client's response parsing
/// (sidecar/source/http_connection.h): the bytes as a response head and as
/// a chunk-size line. Neither may crash; a head it accepts has a status in
/// [100, 999] and a framing that is chunked, a length, or neither.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sidecar/source/http_connection.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  meshload::sidecar::source::internal::HttpResponseHead head;
  auto r = meshload::sidecar::source::internal::ParseResponseHead(bytes, &head);
  if (r.ok()) {
    if (head.status < 100 || head.status > 999) __builtin_trap();
    if (head.chunked && head.content_length && head.status != 204 && head.status != 304) __builtin_trap();
  } else if (r.message.empty()) {
    __builtin_trap();
  }
  auto chunk = meshload::sidecar::source::internal::ParseChunkSize(bytes);
  if (chunk && *chunk >= (uint64_t{1} << 60)) __builtin_trap();
  return 0;
}
