#include "formats/npy.h"
#include "tests/testing/status_matchers.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/npy_bytes.h"

namespace meshload::formats {
namespace {

using meshload::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// A string literal with embedded NULs, without its terminating NUL.
template <size_t N>
std::string Bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// Header bytes as numpy 1.24 writes them (np.save to io.BytesIO), copied
// verbatim so that the parser is checked against the real writer. The magic
// is split off so that the hex escape cannot swallow the 'N'.
const std::string kNumpyU2_1000x2049 = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<u2', 'fortran_order': False, 'shape': (1000, 2049), }"
    "                                                    \n");
const std::string kNumpyF4Scalar = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"
    "                                                              \n");
const std::string kNumpyB1_3 = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }"
    "                                                            \n");
const std::string kNumpyI8_2x3x4 = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3, 4), }"
    "                                                       \n");
// np.lib.format.write_array(f, a, version=(2, 0)) / (3, 0).
const std::string kNumpyU4_7_V2 = Bytes(
    "\x93"
    "NUMPY\x02\x00"
    "t\x00\x00\x00"
    "{'descr': '<u4', 'fortran_order': False, 'shape': (7,), }"
    "                                                          \n");
const std::string kNumpyF2_5x0_V3 = Bytes(
    "\x93"
    "NUMPY\x03\x00"
    "t\x00\x00\x00"
    "{'descr': '<f2', 'fortran_order': False, 'shape': (5, 0), }"
    "                                                        \n");
// Arrays numpy writes that meshload must reject.
const std::string kNumpyBigEndianU2 = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '>u2', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                          \n");
const std::string kNumpyFortranF8 = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }"
    "                                                           \n");
const std::string kNumpyStructured = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': [('a', '<i4'), ('b', '<f4')], 'fortran_order': False, 'shape': (2,), }"
    "                                     \n");
const std::string kNumpyUnicode = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }"
    "                                                            \n");
const std::string kNumpyComplex = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }"
    "                                                            \n");
const std::string kNumpyObject = Bytes(
    "\x93"
    "NUMPY\x01\x00"
    "v\x00"
    "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
    "                                                             \n");

// The offset of a dict built by V1(): magic (6) + version (2) + length (2).
constexpr uint64_t kV1Dict = 10;
// The same for V2()/V3(): a 4-byte length.
constexpr uint64_t kV2Dict = 12;

using meshload::testing::NpyWrap;
std::string V1(std::string_view header) { return NpyWrap(1, header); }
std::string V3(std::string_view header) { return NpyWrap(3, header); }

// A v1 header around `dict`, padded with spaces as numpy pads it.
std::string Padded(std::string dict) {
  while ((kV1Dict + dict.size() + 1) % 64 != 0) dict += ' ';
  return V1(dict + "\n");
}

// A v1 header for `descr` and the Python tuple text `shape`.
std::string WithDescrAndShape(std::string_view descr, std::string_view shape) {
  return Padded("{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + std::string(shape) +
                ", }");
}

// Offset of the first occurrence of `needle` in `haystack`, for locations.
uint64_t OffsetOf(std::string_view haystack, std::string_view needle) {
  size_t pos = haystack.find(needle);
  EXPECT_NE(pos, std::string_view::npos) << needle;
  return pos;
}

std::string At(uint64_t offset) { return "@" + std::to_string(offset); }

void ExpectError(const Result<NpyHeader>& r, StatusCode code, std::string_view message_part,
                 std::string_view location) {
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << message_part;
  EXPECT_THAT(r, StatusIs(code, HasSubstr(std::string(message_part))));
  EXPECT_EQ(r.status().location(), location) << r.status().ToString();
}

void ExpectInvalid(std::string_view bytes, std::string_view message_part, std::string_view location) {
  SCOPED_TRACE(std::string(bytes));
  ExpectError(ParseNpyHeader(bytes), StatusCode::kInvalidArgument, message_part, location);
}

const std::vector<DType> kSupported = {
    DType::kBool,   DType::kInt8,  DType::kUint8,  DType::kInt16,   DType::kUint16,  DType::kInt32,
    DType::kUint32, DType::kInt64, DType::kUint64, DType::kFloat16, DType::kFloat32, DType::kFloat64,
};

// ---------------------------------------------------------------------------
// Round trips and numpy's own bytes.

TEST(NpyHeader, RoundTripsEveryDtypeAndShape) {
  std::vector<std::vector<uint64_t>> shapes = {
      {},
      {0},
      {1},
      {5},
      {1000, 2049},
      {2, 3, 4},
      {0, 7},
      {7, 0, 3},
      {1, 1, 1, 1, 1, 1, 1, 1},
      std::vector<uint64_t>(kNpyMaxRank, 1),
      {kU64Max / 8},
      {uint64_t{1} << 31, uint64_t{1} << 29},
  };
  for (DType dtype : kSupported) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " rank " + std::to_string(shape.size()));
      Result<std::string> bytes = MakeNpyHeader(dtype, shape);
      ASSERT_OK(bytes);
      EXPECT_EQ(bytes->size() % 64, 0u);
      Result<NpyHeader> h = ParseNpyHeader(*bytes);
      ASSERT_OK(h);
      EXPECT_EQ(h->major_version, 1);
      EXPECT_EQ(h->minor_version, 0);
      EXPECT_EQ(h->descr, *NpyDescr(dtype));
      EXPECT_EQ(h->dtype, dtype);
      EXPECT_FALSE(h->fortran_order);
      EXPECT_EQ(h->shape, shape);
      EXPECT_EQ(h->data_offset, bytes->size());
      uint64_t count = 1;
      for (uint64_t d : shape) count *= d;
      EXPECT_EQ(h->element_count, count);
      EXPECT_EQ(h->data_bytes, count * DTypeSize(dtype));
    }
  }
}

TEST(NpyHeader, MakeNpyHeaderIsByteIdenticalToNumpy) {
  EXPECT_EQ(*MakeNpyHeader(DType::kUint16, {1000, 2049}), kNumpyU2_1000x2049);
  EXPECT_EQ(*MakeNpyHeader(DType::kFloat32, {}), kNumpyF4Scalar);
  EXPECT_EQ(*MakeNpyHeader(DType::kBool, {3}), kNumpyB1_3);
  EXPECT_EQ(*MakeNpyHeader(DType::kInt64, {2, 3, 4}), kNumpyI8_2x3x4);
}

TEST(NpyHeader, ParsesHeadersWrittenByNumpy) {
  struct Case {
    const std::string* bytes;
    int major;
    const char* descr;
    DType dtype;
    std::vector<uint64_t> shape;
    uint64_t count;
  };
  const std::vector<Case> cases = {
      {&kNumpyU2_1000x2049, 1, "<u2", DType::kUint16, {1000, 2049}, 2049000},
      {&kNumpyF4Scalar, 1, "<f4", DType::kFloat32, {}, 1},
      {&kNumpyB1_3, 1, "|b1", DType::kBool, {3}, 3},
      {&kNumpyI8_2x3x4, 1, "<i8", DType::kInt64, {2, 3, 4}, 24},
      {&kNumpyU4_7_V2, 2, "<u4", DType::kUint32, {7}, 7},
      {&kNumpyF2_5x0_V3, 3, "<f2", DType::kFloat16, {5, 0}, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(*c.bytes);
    Result<NpyHeader> h = ParseNpyHeader(*c.bytes);
    ASSERT_OK(h);
    EXPECT_EQ(h->major_version, c.major);
    EXPECT_EQ(h->minor_version, 0);
    EXPECT_EQ(h->descr, c.descr);
    EXPECT_EQ(h->dtype, c.dtype);
    EXPECT_EQ(h->shape, c.shape);
    EXPECT_EQ(h->data_offset, 128u);
    EXPECT_EQ(h->element_count, c.count);
    EXPECT_EQ(h->data_bytes, c.count * DTypeSize(c.dtype));
  }
}

TEST(NpyHeader, RejectsUnsupportedArraysWrittenByNumpy) {
  ExpectInvalid(kNumpyBigEndianU2, "unsupported dtype descr '>u2' (big-endian)", "@20");
  ExpectInvalid(kNumpyFortranF8, "fortran_order must be False (C order)", "@44");
  ExpectInvalid(kNumpyStructured, "structured dtypes are not supported", "@20");
  ExpectInvalid(kNumpyUnicode, "unsupported dtype descr '<U3'; meshload supports", "@20");
  ExpectInvalid(kNumpyComplex, "unsupported dtype descr '<c8'", "@20");
  ExpectInvalid(kNumpyObject, "unsupported dtype descr '|O'", "@20");
}

TEST(NpyHeader, ParsesHandBuiltVersion1And2And3Headers) {
  const std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (4, 5), }\n";
  for (int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    std::string bytes = NpyWrap(major, dict);
    Result<NpyHeader> h = ParseNpyHeader(bytes);
    ASSERT_OK(h);
    EXPECT_EQ(h->major_version, major);
    EXPECT_EQ(h->data_offset, (major == 1 ? kV1Dict : kV2Dict) + dict.size());
    EXPECT_EQ(h->shape, (std::vector<uint64_t>{4, 5}));
    EXPECT_EQ(h->data_bytes, 40u);
  }
}

TEST(NpyHeader, AcceptsVersion3Utf8PaddingAfterTheDict) {
  // Version 3.0 is UTF-8; non-ASCII can only be in strings, so a valid
  // header is plain ASCII, and a non-ASCII key is merely unknown.
  Result<NpyHeader> h =
      ParseNpyHeader(V3("{'descr': '<u1', 'fortran_order': False, "
                        "'shape': (2,)}   \n"));
  ASSERT_OK(h);
  std::string bytes = V3("{'d\xc3\xa9scr': '<u1', 'fortran_order': False, 'shape': (2,)}\n");
  ExpectInvalid(bytes, "unknown key 'd\\xc3\\xa9scr'", At(kV2Dict + 1));
}

TEST(NpyHeader, AcceptsPythonSyntaxVariants) {
  struct Case {
    std::string dict;
    std::vector<uint64_t> shape;
  };
  const std::vector<Case> cases = {
      // Keys in another order, double quotes, no trailing commas.
      {"{\"shape\": (3, 4), \"fortran_order\": False, \"descr\": \"<u2\"}", {3, 4}},
      // A trailing comma in a multi-element tuple.
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4,), }", {3, 4}},
      // Whitespace everywhere between tokens, including tabs and newlines.
      {" \t{ 'descr' :\t'<u2' ,\n'fortran_order'\r\n: False , 'shape' : ( 3 ,\t4 ) , } ", {3, 4}},
      // No whitespace at all.
      {"{'descr':'<u2','fortran_order':False,'shape':(3,4)}", {3, 4}},
      {"{'descr':'<u2','fortran_order':False,'shape':(3,)}", {3}},
      {"{'descr':'<u2','fortran_order':False,'shape':( 3 , )}", {3}},
      {"{'descr':'<u2','fortran_order':False,'shape':( )}", {}},
      {"{'descr':'<u2','fortran_order':False,'shape':(0,)}", {0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dict);
    // Unaligned (exact length) and padded to 64 as numpy does.
    for (const std::string& bytes : {V1(c.dict + "\n"), Padded(c.dict)}) {
      Result<NpyHeader> h = ParseNpyHeader(bytes);
      ASSERT_OK(h);
      EXPECT_EQ(h->dtype, DType::kUint16);
      EXPECT_EQ(h->shape, c.shape);
      EXPECT_EQ(h->data_offset, bytes.size());
    }
  }
}

TEST(NpyHeader, AcceptsNativeAndNotApplicableByteOrders) {
  struct Case {
    const char* descr;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"=u2", DType::kUint16},  {"|u2", DType::kUint16}, {"=f8", DType::kFloat64}, {"<u1", DType::kUint8},
      {">u1", DType::kUint8},   {">i1", DType::kInt8},   {">b1", DType::kBool},    {"=b1", DType::kBool},
      {"<f2", DType::kFloat16}, {"<i4", DType::kInt32},  {"<u4", DType::kUint32},  {"<u8", DType::kUint64},
      {"<i2", DType::kInt16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.descr);
    Result<NpyHeader> h = ParseNpyHeader(WithDescrAndShape(c.descr, "(2,)"));
    ASSERT_OK(h);
    EXPECT_EQ(h->dtype, c.dtype);
    EXPECT_EQ(h->descr, c.descr);  // kept as written
  }
}

TEST(NpyHeader, IgnoresBytesAfterTheHeader) {
  std::string bytes = kNumpyB1_3 + Bytes("\x01\x00\x01 trailing data and more");
  Result<NpyHeader> h = ParseNpyHeader(bytes);
  ASSERT_OK(h);
  EXPECT_EQ(h->data_offset, 128u);
  EXPECT_EQ(h->data_bytes, 3u);
}

TEST(NpyHeader, AcceptsTheLargestDimensions) {
  Result<NpyHeader> h = ParseNpyHeader(WithDescrAndShape("|u1", "(18446744073709551615,)"));
  ASSERT_OK(h);
  EXPECT_EQ(h->element_count, kU64Max);
  EXPECT_EQ(h->data_bytes, kU64Max);
  // A zero anywhere makes the product 0, even when other factors would overflow.
  h = ParseNpyHeader(WithDescrAndShape("<u8", "(18446744073709551615, 18446744073709551615, 0)"));
  ASSERT_OK(h);
  EXPECT_EQ(h->element_count, 0u);
  EXPECT_EQ(h->data_bytes, 0u);
}

// ---------------------------------------------------------------------------
// Preamble rejections.

TEST(NpyHeader, RejectsBadMagic) {
  std::string bytes = kNumpyB1_3;
  bytes[0] = '\x92';
  ExpectInvalid(bytes, "not an .npy file: bad magic byte 0x92", "@0");
  bytes = kNumpyB1_3;
  bytes[3] = 'p';
  ExpectInvalid(bytes, "bad magic 'p'", "@3");
  ExpectInvalid("PK\x03\x04", "not an .npy file", "@0");
}

TEST(NpyHeader, RejectsUnsupportedVersions) {
  std::string bytes = kNumpyB1_3;
  bytes[6] = '\x00';
  ExpectInvalid(bytes, "unsupported .npy format version 0.0", "@6");
  bytes[6] = '\x04';
  ExpectInvalid(bytes, "unsupported .npy format version 4.0", "@6");
  bytes[6] = '\x01';
  bytes[7] = '\x01';
  ExpectInvalid(bytes, "unsupported .npy format version 1.1", "@7");
}

TEST(NpyHeader, RejectsHeaderLenOverTheCapForVersion2And3) {
  for (int major : {2, 3}) {
    SCOPED_TRACE(major);
    std::string bytes = Bytes(
        "\x93"
        "NUMPY");
    bytes += static_cast<char>(major);
    bytes += Bytes("\x00\x01\x00\x10\x00");  // 0x100001 = 1 MiB + 1
    bytes += std::string(64, ' ');
    ExpectInvalid(bytes, "header_len 1048577 exceeds the 1048576-byte limit", "@8");
  }
  // Exactly at the cap is fine as far as the cap goes (it is then truncated).
  std::string at_cap = Bytes(
      "\x93"
      "NUMPY\x02\x00\x00\x00\x10\x00");
  ExpectError(ParseNpyHeader(at_cap), StatusCode::kDataLoss, "truncated: header needs 1048588 bytes, have 12", "@12");
}

TEST(NpyHeader, RejectsZeroHeaderLen) {
  ExpectInvalid(Bytes("\x93"
                      "NUMPY\x01\x00\x00\x00"),
                "header_len is 0", "@8");
}

TEST(NpyHeader, ReportsTruncatedInputAsDataLoss) {
  std::string bytes = kNumpyU2_1000x2049.substr(0, 100);
  ExpectError(ParseNpyHeader(bytes), StatusCode::kDataLoss, "truncated: header needs 128 bytes, have 100", "@100");
}

TEST(NpyHeader, ReturnsDataLossForEveryPrefixOfAValidHeader) {
  for (const std::string* full : {&kNumpyU2_1000x2049, &kNumpyU4_7_V2, &kNumpyF2_5x0_V3}) {
    for (size_t n = 0; n < full->size(); ++n) {
      SCOPED_TRACE(n);
      // A copy of exactly n bytes, so that ASan catches any read past the end.
      std::string prefix = full->substr(0, n);
      Result<NpyHeader> h = ParseNpyHeader(prefix);
      ASSERT_FALSE(h.ok());
      EXPECT_EQ(h.status().code(), StatusCode::kDataLoss) << h.status().ToString();
      EXPECT_EQ(h.status().location(), At(n));
      EXPECT_THAT(h.status().message(), HasSubstr("truncated"));
    }
  }
}

TEST(NpyHeader, NeverCrashesOnSingleByteCorruption) {
  // Every byte of a valid header replaced by a handful of interesting values:
  // each parse must return (OK or an error) without tripping the sanitizers.
  const std::string& base = kNumpyI8_2x3x4;
  for (size_t i = 0; i < base.size(); ++i) {
    for (char c : {'\0', '\n', ' ', '\'', '"', '(', ')', '{', '}', ',', ':', '-', '9', '\x80', '\xff', '\\'}) {
      std::string bytes = base;
      bytes[i] = c;
      Result<NpyHeader> h = ParseNpyHeader(bytes);
      if (h.ok()) {
        EXPECT_LE(h->data_offset, bytes.size());
      } else {
        EXPECT_FALSE(h.status().location().empty()) << h.status().ToString();
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Dict rejections.

TEST(NpyHeader, RejectsHeaderNotEndingInNewline) {
  std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }  ";
  std::string bytes = V1(dict);
  ExpectInvalid(bytes, "header must end with '\\n', found ' '", At(bytes.size() - 1));
}

TEST(NpyHeader, RejectsAnythingButSpacesAfterTheDict) {
  const std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }";
  const uint64_t after = kV1Dict + dict.size();
  ExpectInvalid(V1(dict + "  x\n"), "only spaces and a final '\\n' may follow", At(after + 2));
  ExpectInvalid(V1(dict + "\n  \n"), "found byte 0x0a", At(after));
  ExpectInvalid(V1(dict + " \t\n"), "found byte 0x09", At(after + 1));
  ExpectInvalid(V1(dict + "}\n"), "found '}'", At(after));
  ExpectInvalid(V1(dict + std::string(1, '\0') + "\n"), "found byte 0x00", At(after));
}

TEST(NpyHeader, RejectsNonAsciiInVersion1And2Headers) {
  for (int major : {1, 2}) {
    std::string bytes = NpyWrap(major, "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), } \xe9\n");
    uint64_t base = major == 1 ? kV1Dict : kV2Dict;
    ExpectInvalid(bytes, "non-ASCII byte 0xe9 in a version " + std::to_string(major) + ".0",
                  At(base + OffsetOf(bytes.substr(base), "\xe9")));
  }
}

TEST(NpyHeader, RejectsUnknownKey) {
  std::string bytes = Padded("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'extra': 1, }");
  ExpectInvalid(bytes, "unknown key 'extra'", At(OffsetOf(bytes, "'extra'")));
  // Close but not equal spellings are unknown too.
  bytes = Padded("{'Descr': '<u2', 'fortran_order': False, 'shape': (2,), }");
  ExpectInvalid(bytes, "unknown key 'Descr'", At(kV1Dict + 1));
}

TEST(NpyHeader, RejectsDuplicateKey) {
  std::string bytes = Padded("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'descr': '<u2', }");
  ExpectInvalid(bytes, "duplicate key 'descr'", At(OffsetOf(bytes, "'descr': '<u2', }")));
  bytes = Padded("{'shape': (2,), 'descr': '<u2', 'fortran_order': False, 'shape': (3,)}");
  ExpectInvalid(bytes, "duplicate key 'shape'", At(OffsetOf(bytes, "'shape': (3,)")));
}

TEST(NpyHeader, RejectsMissingKey) {
  std::string bytes = Padded("{'descr': '<u2', 'fortran_order': False, }");
  ExpectInvalid(bytes, "header dict is missing key 'shape'", At(OffsetOf(bytes, "}")));
  bytes = Padded("{'descr': '<u2', 'shape': (2,)}");
  ExpectInvalid(bytes, "missing key 'fortran_order'", At(OffsetOf(bytes, "}")));
  bytes = Padded("{}");
  ExpectInvalid(bytes, "missing key 'descr'", At(kV1Dict + 1));
}

TEST(NpyHeader, RejectsFortranOrder) {
  std::string bytes = Padded("{'descr': '<u2', 'fortran_order': True, 'shape': (2, 3), }");
  ExpectInvalid(bytes, "fortran_order must be False (C order)", At(OffsetOf(bytes, "True")));
}

TEST(NpyHeader, RejectsFortranOrderThatIsNotABoolLiteral) {
  for (std::string value : {"0", "false", "FALSE", "Falsey", "'False'", "None"}) {
    SCOPED_TRACE(value);
    std::string bytes = Padded("{'descr': '<u2', 'fortran_order': " + value + ", 'shape': (2, 3), }");
    Result<NpyHeader> h = ParseNpyHeader(bytes);
    ExpectError(h, StatusCode::kInvalidArgument, "False", At(OffsetOf(bytes, "'fortran_order': ") + 17));
  }
}

TEST(NpyHeader, RejectsUnsupportedDescr) {
  const std::vector<std::string> bad = {">u2",  ">i4", ">f8", "<c8",     "<c16", "<U3", "|S5",
                                        "|O",   "|V8", "<m8", "<M8[ns]", "u2",   "<u",  "<u16",
                                        "<f16", "<b2", "<i3", "",        "<u2 ", "&u2", "<e2"};
  for (const std::string& descr : bad) {
    SCOPED_TRACE(descr);
    std::string bytes = WithDescrAndShape(descr, "(2,)");
    ExpectInvalid(bytes, "unsupported dtype descr '" + descr + "'", At(kV1Dict + 10));
    ExpectInvalid(bytes, "; meshload supports b1, i1, u1", At(kV1Dict + 10));
  }
  ExpectInvalid(WithDescrAndShape(">u2", "(2,)"), "(big-endian)", At(kV1Dict + 10));
}

TEST(NpyHeader, RejectsStructuredDescr) {
  std::string bytes = Padded("{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (2,), }");
  ExpectInvalid(bytes, "structured dtypes are not supported", At(kV1Dict + 10));
}

TEST(NpyHeader, RejectsStringsWithEscapesOrWithoutEnd) {
  std::string bytes = Padded("{'descr': '<u\\x32', 'fortran_order': False, 'shape': (2,), }");
  ExpectInvalid(bytes, "escape sequences are not supported", At(OffsetOf(bytes, "\\")));
  bytes = V1("{'descr': '<u2, 'fortran_order': False, 'shape': (2,), }\n");
  // A missing quote makes the string run to the next one, as in Python.
  ExpectInvalid(bytes, "unsupported dtype descr '<u2, '", At(kV1Dict + 10));
  bytes = V1("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'x\n");
  ExpectInvalid(bytes, "unterminated string", At(OffsetOf(bytes, "'x")));
  bytes = V1("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'x\n \n");
  ExpectInvalid(bytes, "unterminated string", At(OffsetOf(bytes, "'x")));
  bytes = V1("{\"descr': '<u2'}\n");
  ExpectInvalid(bytes, "unterminated string", At(kV1Dict + 1));
  bytes = V1("{'descr\": '<u2'}\n");
  ExpectInvalid(bytes, "unknown key 'descr\": '", At(kV1Dict + 1));
}

TEST(NpyHeader, RejectsMalformedDictSyntax) {
  struct Case {
    std::string dict;
    std::string message;
    std::string at;  // the text at the offending byte; empty: the final '\n'
  };
  const std::vector<Case> cases = {
      {"['descr', '<u2']", "expected '{' opening the header dict, found '['", "['descr"},
      {"descr: '<u2'", "expected '{'", "descr:"},
      {"{'descr' '<u2', 'fortran_order': False, 'shape': (2,)}", "expected ':' after key", "'<u2'"},
      {"{'descr': '<u2' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}' after the value of 'descr'",
       "'fortran"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,)", "found the end of the header", ""},
      {"{'descr': '<u2',, 'fortran_order': False, 'shape': (2,)}", "expected a quoted key or '}', found ','",
       ", 'fortran"},
      {"{, 'descr': '<u2', 'fortran_order': False, 'shape': (2,)}", "expected a quoted key or '}'", ", 'descr"},
      {"{descr: '<u2', 'fortran_order': False, 'shape': (2,)}", "expected a quoted key", "descr:"},
      {"{u'descr': '<u2', 'fortran_order': False, 'shape': (2,)}", "expected a quoted key", "u'descr"},
      {"{'descr': <u2, 'fortran_order': False, 'shape': (2,)}", "expected a quoted dtype descr", "<u2,"},
      {"{'descr': '<u2', 'fortran_order': , 'shape': (2,)}", "expected False for", ", 'shape"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': 2}", "expected '(' opening the shape", "2}"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': [2, 3]}",
       "shape must be a tuple such as (2, 3), found a list", "[2, 3]"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')' in shape", "3)"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (,)}", "expected a dimension", ",)"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,,)}", "expected a dimension", ",)"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': ((2,),)}", "expected a dimension", "(2,),"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,)}}", "may follow", "}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dict);
    std::string bytes = V1(c.dict + "\n");
    uint64_t at = c.at.empty() ? bytes.size() - 1 : bytes.rfind(c.at);
    if (c.at == "}") at = bytes.size() - 2;
    ExpectInvalid(bytes, c.message, At(at));
  }
}

TEST(NpyHeader, RejectsOneElementShapeWithoutTrailingComma) {
  std::string bytes = Padded("{'descr': '<u2', 'fortran_order': False, 'shape': (5), }");
  ExpectInvalid(bytes,
                "shape (5) is not a tuple; a one-dimensional shape needs a trailing "
                "comma: (5,)",
                At(OffsetOf(bytes, "(5)")));
}

TEST(NpyHeader, RejectsNegativeDimension) {
  std::string bytes = WithDescrAndShape("<u2", "(3, -1)");
  ExpectInvalid(bytes, "negative dimension in shape", At(OffsetOf(bytes, "-1")));
}

TEST(NpyHeader, RejectsDimensionsThatAreNotPlainDecimalIntegers) {
  struct Case {
    std::string shape;
    std::string message;
    std::string at;
  };
  const std::vector<Case> cases = {
      {"(+5,)", "expected a dimension", "+5"},
      {"(007,)", "dimension '007' in shape has a leading zero", "007"},
      {"(00,)", "leading zero", "00"},
      {"(5L,)", "must be a plain decimal integer, found 'L'", "L,"},
      {"(5.0,)", "found '.'", ".0"},
      {"(1_000,)", "found '_'", "_000"},
      {"(0x10,)", "found 'x'", "x10"},
      {"(2e3,)", "found 'e'", "e3"},
      {"(True,)", "expected a dimension", "True"},
      {"('5',)", "expected a dimension", "'5'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.shape);
    std::string bytes = WithDescrAndShape("<u2", c.shape);
    ExpectInvalid(bytes, c.message, At(OffsetOf(bytes, c.at)));
  }
}

TEST(NpyHeader, RejectsDimensionsThatDoNotFitInUint64) {
  for (std::string dim :
       {"18446744073709551616", "99999999999999999999", "100000000000000000000", "123456789012345678901234567890"}) {
    SCOPED_TRACE(dim);
    std::string bytes = WithDescrAndShape("|u1", "(2, " + dim + ")");
    ExpectInvalid(bytes, "in shape does not fit in 64 bits", At(OffsetOf(bytes, dim)));
  }
}

TEST(NpyHeader, RejectsElementCountOverflow) {
  std::string bytes = WithDescrAndShape("|u1", "(4294967296, 4294967296)");
  ExpectInvalid(bytes, "element count overflows uint64 at dimension 1", At(OffsetOf(bytes, " 4294967296)") + 1));
}

TEST(NpyHeader, RejectsByteSizeOverflow) {
  // 2^62 elements fit; 2^62 * 8 bytes do not.
  std::string bytes = WithDescrAndShape("<u8", "(4611686018427387904,)");
  ExpectInvalid(bytes, "byte size overflows uint64 (4611686018427387904 elements of 8 bytes)",
                At(OffsetOf(bytes, "(4611")));
  Result<NpyHeader> h = ParseNpyHeader(WithDescrAndShape("<u4", "(4611686018427387903,)"));
  ASSERT_OK(h);
  EXPECT_EQ(h->data_bytes, uint64_t{4611686018427387903} * 4);
}

TEST(NpyHeader, RejectsMoreThan32Dimensions) {
  std::string dims;
  for (size_t i = 0; i < kNpyMaxRank; ++i) dims += "1, ";
  Result<NpyHeader> h = ParseNpyHeader(WithDescrAndShape("<u2", "(" + dims + ")"));
  ASSERT_OK(h);
  EXPECT_EQ(h->shape.size(), kNpyMaxRank);
  std::string bytes = WithDescrAndShape("<u2", "(" + dims + "7)");
  ExpectInvalid(bytes, "shape has more than 32 dimensions", At(OffsetOf(bytes, "7)")));
}

// ---------------------------------------------------------------------------
// NpyDescr and MakeNpyHeader.

TEST(NpyDescr, MapsEverySupportedDtype) {
  EXPECT_EQ(*NpyDescr(DType::kBool), "|b1");
  EXPECT_EQ(*NpyDescr(DType::kInt8), "|i1");
  EXPECT_EQ(*NpyDescr(DType::kUint8), "|u1");
  EXPECT_EQ(*NpyDescr(DType::kInt16), "<i2");
  EXPECT_EQ(*NpyDescr(DType::kUint16), "<u2");
  EXPECT_EQ(*NpyDescr(DType::kInt32), "<i4");
  EXPECT_EQ(*NpyDescr(DType::kUint32), "<u4");
  EXPECT_EQ(*NpyDescr(DType::kInt64), "<i8");
  EXPECT_EQ(*NpyDescr(DType::kUint64), "<u8");
  EXPECT_EQ(*NpyDescr(DType::kFloat16), "<f2");
  EXPECT_EQ(*NpyDescr(DType::kFloat32), "<f4");
  EXPECT_EQ(*NpyDescr(DType::kFloat64), "<f8");
}

TEST(NpyDescr, RejectsBFloat16) {
  Result<std::string> d = NpyDescr(DType::kBFloat16);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d, StatusIs(StatusCode::kInvalidArgument, HasSubstr("bfloat16 has no numpy descr")));
}

TEST(MakeNpyHeader, RejectsWhatTheParserWouldReject) {
  Result<std::string> r = MakeNpyHeader(DType::kBFloat16, {2});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("bfloat16"));

  r = MakeNpyHeader(DType::kUint8, std::vector<uint64_t>(kNpyMaxRank + 1, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, HasSubstr("at most 32")));

  r = MakeNpyHeader(DType::kUint16, {kU64Max});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("overflows"));
}

TEST(MakeNpyHeader, KeepsNumpyGrowthPaddingForHugeFirstAxis) {
  // The first axis reserves room for 21 digits, so a 20-digit first axis
  // still yields a 64-aligned header that parses back.
  Result<std::string> r = MakeNpyHeader(DType::kUint8, {kU64Max});
  ASSERT_OK(r);
  EXPECT_EQ(r->size() % 64, 0u);
  Result<NpyHeader> h = ParseNpyHeader(*r);
  ASSERT_OK(h);
  EXPECT_EQ(h->shape, std::vector<uint64_t>{kU64Max});
}

TEST(NpyDataOffset, TheHeaderLengthFromThePreambleAlone) {
  EXPECT_EQ(*NpyDataOffset(kNumpyU2_1000x2049.substr(0, 12)), 128u);
  EXPECT_EQ(*NpyDataOffset(kNumpyU4_7_V2.substr(0, 12)), kNumpyU4_7_V2.size());
  EXPECT_EQ(NpyDataOffset(kNumpyU2_1000x2049.substr(0, 9)).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(NpyDataOffset("hello, world").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshload::formats
