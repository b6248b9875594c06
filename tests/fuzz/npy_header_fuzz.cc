/// \file
/// libFuzzer target for ParseNpyHeader: the parser reads untrusted files, so
/// it must never crash, and whatever it accepts must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/dtype.h"
#include "formats/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  meshload::Result<meshload::formats::NpyHeader> r = meshload::formats::ParseNpyHeader(bytes);
  if (!r.ok()) {
    // Every error must say where it is.
    if (r.status().location().empty() || r.status().location()[0] != '@') __builtin_trap();
    return 0;
  }
  const meshload::formats::NpyHeader& h = *r;
  if (h.data_offset > size) __builtin_trap();
  if (h.fortran_order) __builtin_trap();
  if (h.shape.size() > meshload::formats::kNpyMaxRank) __builtin_trap();
  if (h.dtype == meshload::formats::DType::kBFloat16) __builtin_trap();

  // The true product: zero if any dimension is, else it must not overflow.
  bool has_zero = false;
  for (uint64_t d : h.shape) has_zero = has_zero || d == 0;
  uint64_t product = has_zero ? 0 : 1;
  if (!has_zero) {
    for (uint64_t d : h.shape) {
      if (__builtin_mul_overflow(product, d, &product)) __builtin_trap();
    }
  }
  if (h.element_count != product) __builtin_trap();
  uint64_t bytes_needed = 0;
  if (__builtin_mul_overflow(product, meshload::formats::DTypeSize(h.dtype), &bytes_needed)) {
    __builtin_trap();
  }
  if (h.data_bytes != bytes_needed) __builtin_trap();

  // Whatever was accepted must survive a write/parse round trip unchanged.
  meshload::Result<std::string> made = meshload::formats::MakeNpyHeader(h.dtype, h.shape);
  if (!made.ok()) __builtin_trap();
  meshload::Result<meshload::formats::NpyHeader> again = meshload::formats::ParseNpyHeader(*made);
  if (!again.ok() || again->dtype != h.dtype || again->shape != h.shape || again->data_bytes != h.data_bytes ||
      again->data_offset != made->size()) {
    __builtin_trap();
  }
  return 0;
}
