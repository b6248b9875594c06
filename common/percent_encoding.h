/// \file
/// Percent-encoding (RFC 3986 §2.1): every byte but the unreserved
/// characters (ALPHA, DIGIT, '-', '.', '_', '~') becomes %XX with upper-case
/// hex. The form AWS Signature V4 requires for a canonical URI and query, and
/// a safe one for Kubernetes paths and query values.
///
/// Thread safety: pure functions.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace meshload {

/// `s` percent-encoded; with `keep_slash`, '/' stays as it is (a path).
inline std::string PercentEncode(std::string_view s, bool keep_slash = false) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace meshload
