/// \file
/// What the formats' tests share: reading a fixture file whole (a test
/// failure when it cannot be read) and bytes as lower-case hex, the way
/// the fixture scripts write them into the *.expected.json files.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace meshload::formats::fixtures {

inline std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline std::string Hex(std::string_view b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (unsigned char c : b) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

}  // namespace meshload::formats::fixtures
