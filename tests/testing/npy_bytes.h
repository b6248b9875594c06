// .npy bytes for tests that write their own headers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace meshload::testing {

/// A version `major` .npy header around `header` (the dict, which must end
/// in its final '\n'), with header_len set to its exact length: no
/// alignment padding.
inline std::string NpyWrap(int major, std::string_view header) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const size_t len_size = major == 1 ? 2 : 4;
  for (size_t i = 0; i < len_size; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  return out;
}

}  // namespace meshload::testing
