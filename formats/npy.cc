#include "formats/npy.h"

#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshload::formats {
namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);
// Magic + major + minor; the header_len field starts here.
constexpr uint64_t kLenFieldOffset = 8;
// The longest preamble (version 2.0/3.0: 4-byte header_len).
constexpr size_t kMaxPreambleSize = 12;
constexpr size_t kArrayAlign = 64;  // numpy's ARRAY_ALIGN
// numpy's GROWTH_AXIS_MAX_DIGITS: spare spaces so that the first axis can be
// rewritten in place; replicated so that MakeNpyHeader is byte-identical.
constexpr size_t kGrowthAxisMaxDigits = 21;
// Enough for any uint64 (20 digits); longer runs are rejected before
// accumulating so that the overflow check only has to handle one step.
constexpr size_t kMaxDimDigits = 20;
// Long strings in a corrupt header must not turn into megabyte-long messages.
constexpr size_t kMaxQuotedBytes = 48;

constexpr std::string_view kSupportedDescrs =
    "meshload supports b1, i1, u1, i2, u2, i4, u4, i8, u8, f2, f4, f8 with byte order '<', '=' "
    "or '|' (e.g. '<u2', '|u1'; '>' only for one-byte types)";

std::string At(uint64_t offset) { return "@" + std::to_string(offset); }

char HexDigit(unsigned v) { return "0123456789abcdef"[v & 0xf]; }

std::string Hex(unsigned char c) {
  std::string s = "0x";
  s += HexDigit(c >> 4);
  s += HexDigit(c);
  return s;
}

// A header byte as a message shows it: 'x' when printable, else its hex value.
std::string ByteName(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  return "byte " + Hex(u);
}

// `s` in single quotes, with non-printable bytes escaped and long values cut,
// since it comes from an untrusted file and ends up in logs.
std::string Quote(std::string_view s) {
  std::string out = "'";
  size_t n = s.size() < kMaxQuotedBytes ? s.size() : kMaxQuotedBytes;
  for (size_t i = 0; i < n; ++i) {
    unsigned char u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7f && u != '\\' && u != '\'') {
      out += static_cast<char>(u);
    } else {
      out += "\\x";
      out += HexDigit(u >> 4);
      out += HexDigit(u);
    }
  }
  if (n < s.size()) out += "...";
  out += "'";
  return out;
}

Status UnsupportedDescr(std::string_view descr, std::string_view hint, uint64_t offset) {
  std::string msg = "unsupported dtype descr " + Quote(descr);
  if (!hint.empty()) {
    msg += " (";
    msg += hint;
    msg += ")";
  }
  msg += "; ";
  msg += kSupportedDescrs;
  return InvalidArgument(std::move(msg), At(offset));
}

// Maps a descr such as "<u2" to a DType; returns an error at `offset` for
// anything else (the caller passes the offset of the string's quote).
Result<DType> DescrToDType(std::string_view descr, uint64_t offset) {
  if (descr.size() != 3) return UnsupportedDescr(descr, "", offset);
  char order = descr[0];
  std::string_view type = descr.substr(1);
  DType dtype;
  if (type == "b1") {
    dtype = DType::kBool;
  } else if (type == "i1") {
    dtype = DType::kInt8;
  } else if (type == "u1") {
    dtype = DType::kUint8;
  } else if (type == "i2") {
    dtype = DType::kInt16;
  } else if (type == "u2") {
    dtype = DType::kUint16;
  } else if (type == "i4") {
    dtype = DType::kInt32;
  } else if (type == "u4") {
    dtype = DType::kUint32;
  } else if (type == "i8") {
    dtype = DType::kInt64;
  } else if (type == "u8") {
    dtype = DType::kUint64;
  } else if (type == "f2") {
    dtype = DType::kFloat16;
  } else if (type == "f4") {
    dtype = DType::kFloat32;
  } else if (type == "f8") {
    dtype = DType::kFloat64;
  } else {
    return UnsupportedDescr(descr, "", offset);
  }
  // meshload runs on little-endian hosts only, so native '=' is '<'.
  if (order == '<' || order == '|' || order == '=') return dtype;
  if (order == '>') {
    // Byte order is meaningless for one byte; numpy itself never writes it.
    if (DTypeSize(dtype) == 1) return dtype;
    return UnsupportedDescr(descr, "big-endian", offset);
  }
  return UnsupportedDescr(descr, "", offset);
}

// Element and byte counts of `shape`. On overflow returns false and sets
// `*bad_dim` to the dimension whose product overflowed, or to shape.size()
// when only the byte count did (`*count` is then still set).
bool ComputeSizes(const std::vector<uint64_t>& shape, uint64_t elem_size, uint64_t* count, uint64_t* bytes,
                  size_t* bad_dim) {
  uint64_t n = 1;
  bool has_zero = false;
  for (uint64_t d : shape) has_zero = has_zero || d == 0;
  // A zero anywhere makes the true product 0, even if a prefix would overflow.
  if (has_zero) {
    n = 0;
  } else {
    for (size_t i = 0; i < shape.size(); ++i) {
      if (__builtin_mul_overflow(n, shape[i], &n)) {
        *bad_dim = i;
        return false;
      }
    }
  }
  *count = n;
  if (__builtin_mul_overflow(n, elem_size, bytes)) {
    *bad_dim = shape.size();
    return false;
  }
  return true;
}

struct Preamble {
  int major = 0;
  int minor = 0;
  uint64_t header_start = 0;  // offset of the dict
  uint64_t header_len = 0;
  uint64_t data_offset = 0;
};

// Validates magic, version and header_len; needs only the first 10 or 12
// bytes, which is what lets a reader (NpyDataOffset) size its second read.
Result<Preamble> ParsePreamble(std::string_view bytes) {
  size_t n = bytes.size() < kMagic.size() ? bytes.size() : kMagic.size();
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] != kMagic[i]) {
      return InvalidArgument(
          "not an .npy file: bad magic " + ByteName(bytes[i]) + " (an .npy file starts with \"\\x93NUMPY\")", At(i));
    }
  }
  if (bytes.size() < kLenFieldOffset) {
    return DataLoss("truncated: header needs at least " + std::to_string(kLenFieldOffset + 2) + " bytes, have " +
                        std::to_string(bytes.size()),
                    At(bytes.size()));
  }
  Preamble p;
  p.major = static_cast<unsigned char>(bytes[6]);
  p.minor = static_cast<unsigned char>(bytes[7]);
  if (p.major < 1 || p.major > 3 || p.minor != 0) {
    return InvalidArgument("unsupported .npy format version " + std::to_string(p.major) + "." +
                               std::to_string(p.minor) + "; meshload reads versions 1.0, 2.0 and 3.0",
                           At(p.major < 1 || p.major > 3 ? 6 : 7));
  }
  const size_t len_size = p.major == 1 ? 2 : 4;
  p.header_start = kLenFieldOffset + len_size;
  if (bytes.size() < p.header_start) {
    return DataLoss("truncated: header needs at least " + std::to_string(p.header_start) + " bytes, have " +
                        std::to_string(bytes.size()),
                    At(bytes.size()));
  }
  for (size_t i = 0; i < len_size; ++i) {
    p.header_len |= uint64_t{static_cast<unsigned char>(bytes[kLenFieldOffset + i])} << (8 * i);
  }
  if (p.major >= 2 && p.header_len > kNpyMaxHeaderLen) {
    return InvalidArgument("header_len " + std::to_string(p.header_len) + " exceeds the " +
                               std::to_string(kNpyMaxHeaderLen) + "-byte limit for version " + std::to_string(p.major) +
                               ".0 headers",
                           At(kLenFieldOffset));
  }
  if (p.header_len == 0) {
    return InvalidArgument("header_len is 0; the header must hold a dict and a final '\\n'", At(kLenFieldOffset));
  }
  p.data_offset = p.header_start + p.header_len;
  return p;
}

// A cursor over the dict text (the header without its final '\n'). Iterative
// by construction: the grammar has one fixed nesting level (dict > tuple), so
// no recursion is needed and a hostile header cannot exhaust the stack.
class DictParser {
 public:
  DictParser(std::string_view text, uint64_t base) : text_(text), base_(base) {}

  Status Parse(NpyHeader* out) {
    SkipWs();
    if (!Consume('{')) return Unexpected("'{' opening the header dict");
    bool seen[3] = {false, false, false};
    static constexpr std::string_view kKeys[3] = {"descr", "fortran_order", "shape"};
    uint64_t close_offset = 0;
    while (true) {
      SkipWs();
      if (Peek() == '}') {
        close_offset = Offset();
        ++pos_;
        break;
      }
      const uint64_t key_offset = Offset();
      std::string_view key;
      if (Peek() == '\'' || Peek() == '"') {
        MESHLOAD_ASSIGN_OR_RETURN(key, ParseString());
      } else {
        return Unexpected("a quoted key or '}'");
      }
      int index = -1;
      for (int i = 0; i < 3; ++i) {
        if (key == kKeys[i]) index = i;
      }
      if (index < 0) {
        return InvalidArgument("unknown key " + Quote(key) +
                                   " in header dict; expected exactly 'descr', 'fortran_order' "
                                   "and 'shape'",
                               At(key_offset));
      }
      if (seen[index]) {
        return InvalidArgument("duplicate key " + Quote(key) + " in header dict", At(key_offset));
      }
      seen[index] = true;
      SkipWs();
      if (!Consume(':')) return Unexpected("':' after key " + Quote(key));
      SkipWs();
      switch (index) {
        case 0: MESHLOAD_RETURN_IF_ERROR(ParseDescr(out)); break;
        case 1: MESHLOAD_RETURN_IF_ERROR(ParseFortranOrder(out)); break;
        default: MESHLOAD_RETURN_IF_ERROR(ParseShape(out)); break;
      }
      SkipWs();
      if (Consume(',')) continue;
      if (Peek() == '}') {
        close_offset = Offset();
        ++pos_;
        break;
      }
      return Unexpected("',' or '}' after the value of " + Quote(key));
    }
    for (int i = 0; i < 3; ++i) {
      if (!seen[i]) {
        return InvalidArgument(
            "header dict is missing key " + Quote(kKeys[i]) + "; expected exactly 'descr', 'fortran_order' and 'shape'",
            At(close_offset));
      }
    }
    // numpy pads with spaces only; anything else means a damaged or foreign header.
    for (; pos_ < text_.size(); ++pos_) {
      if (text_[pos_] != ' ') {
        std::string msg = "only spaces and a final '\\n' may follow the header dict's '}', found ";
        return InvalidArgument(msg + ByteName(text_[pos_]), At(Offset()));
      }
    }
    return Status::Ok();
  }

  uint64_t shape_offset() const { return shape_offset_; }
  const std::vector<uint64_t>& dim_offsets() const { return dim_offsets_; }

 private:
  static bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsIdentChar(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || IsDigit(c) || c == '_'; }

  uint64_t Offset() const { return base_ + pos_; }
  bool AtEnd() const { return pos_ >= text_.size(); }
  // '\0' at the end; callers never match '\0' as a token, so it only needs to
  // differ from every expected character.
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool Consume(char c) {
    if (AtEnd() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void SkipWs() {
    while (!AtEnd() && IsWs(text_[pos_])) ++pos_;
  }

  Status Unexpected(const std::string& expected) const {
    std::string found = AtEnd() ? std::string("the end of the header") : ByteName(text_[pos_]);
    return InvalidArgument("malformed header dict: expected " + expected + ", found " + found, At(Offset()));
  }

  // A Python string literal without prefix or escapes, which is all numpy
  // writes; returns the contents. Precondition: Peek() is a quote.
  Result<std::string_view> ParseString() {
    const uint64_t start_offset = Offset();
    const char quote = text_[pos_++];
    const size_t begin = pos_;
    while (!AtEnd()) {
      char c = text_[pos_];
      if (c == quote) {
        std::string_view s = text_.substr(begin, pos_ - begin);
        ++pos_;
        return s;
      }
      if (c == '\\') {
        return InvalidArgument("escape sequences are not supported in header strings", At(Offset()));
      }
      if (c == '\n' || c == '\r') break;
      ++pos_;
    }
    return InvalidArgument("unterminated string in header dict", At(start_offset));
  }

  Status ParseDescr(NpyHeader* out) {
    descr_offset_ = Offset();
    if (Peek() == '[') {
      return UnsupportedDescr("[...]", "a list: structured dtypes are not supported", Offset());
    }
    if (Peek() != '\'' && Peek() != '"') return Unexpected("a quoted dtype descr");
    MESHLOAD_ASSIGN_OR_RETURN(std::string_view descr, ParseString());
    MESHLOAD_ASSIGN_OR_RETURN(out->dtype, DescrToDType(descr, descr_offset_));
    out->descr = std::string(descr);
    return Status::Ok();
  }

  Status ParseFortranOrder(NpyHeader* out) {
    const uint64_t offset = Offset();
    const size_t begin = pos_;
    while (!AtEnd() && IsIdentChar(text_[pos_])) ++pos_;
    std::string_view word = text_.substr(begin, pos_ - begin);
    if (word == "False") {
      out->fortran_order = false;
      return Status::Ok();
    }
    if (word == "True") {
      return InvalidArgument(
          "fortran_order must be False (C order); Fortran-order arrays are "
          "not supported",
          At(offset));
    }
    pos_ = begin;
    if (word.empty()) return Unexpected("False for 'fortran_order'");
    return InvalidArgument("fortran_order must be False, found " + Quote(word), At(offset));
  }

  Result<uint64_t> ParseDim() {
    const uint64_t offset = Offset();
    if (Peek() == '-') {
      return InvalidArgument("negative dimension in shape", At(offset));
    }
    const size_t begin = pos_;
    while (!AtEnd() && IsDigit(text_[pos_])) ++pos_;
    const size_t ndigits = pos_ - begin;
    if (ndigits == 0) return Unexpected("a dimension (a non-negative decimal integer) in shape");
    std::string_view digits = text_.substr(begin, ndigits);
    // Python 3 rejects leading zeros (`007`); numpy never writes them.
    if (ndigits > 1 && digits[0] == '0') {
      return InvalidArgument("dimension " + Quote(digits) + " in shape has a leading zero", At(offset));
    }
    // Suffixes such as 5L (Python 2), 5.0, 1_000 or 0x10 are not plain decimal integers.
    if (!AtEnd() && (IsIdentChar(text_[pos_]) || text_[pos_] == '.')) {
      return InvalidArgument(
          "dimension in shape must be a plain decimal integer, found " + ByteName(text_[pos_]) + " after the digits",
          At(Offset()));
    }
    if (ndigits > kMaxDimDigits) {
      return InvalidArgument("dimension " + Quote(digits) + " in shape does not fit in 64 bits", At(offset));
    }
    uint64_t v = 0;
    for (char c : digits) {
      if (__builtin_mul_overflow(v, uint64_t{10}, &v) ||
          __builtin_add_overflow(v, static_cast<uint64_t>(c - '0'), &v)) {
        return InvalidArgument("dimension " + Quote(digits) + " in shape does not fit in 64 bits", At(offset));
      }
    }
    return v;
  }

  Status ParseShape(NpyHeader* out) {
    shape_offset_ = Offset();
    if (Peek() == '[') {
      return InvalidArgument("shape must be a tuple such as (2, 3), found a list", At(Offset()));
    }
    if (!Consume('(')) return Unexpected("'(' opening the shape tuple");
    out->shape.clear();
    dim_offsets_.clear();
    SkipWs();
    if (Consume(')')) return Status::Ok();
    while (true) {
      const uint64_t dim_offset = Offset();
      MESHLOAD_ASSIGN_OR_RETURN(uint64_t dim, ParseDim());
      if (out->shape.size() == kNpyMaxRank) {
        return InvalidArgument("shape has more than " + std::to_string(kNpyMaxRank) + " dimensions", At(dim_offset));
      }
      out->shape.push_back(dim);
      dim_offsets_.push_back(dim_offset);
      SkipWs();
      if (Consume(',')) {
        SkipWs();
        if (Consume(')')) return Status::Ok();
        continue;
      }
      if (Peek() == ')') {
        if (out->shape.size() == 1) {
          // In Python `(5)` is the integer 5, which numpy rejects as a shape.
          return InvalidArgument("shape (" + std::to_string(dim) +
                                     ") is not a tuple; a one-dimensional shape needs a trailing "
                                     "comma: (" +
                                     std::to_string(dim) + ",)",
                                 At(shape_offset_));
        }
        ++pos_;
        return Status::Ok();
      }
      return Unexpected("',' or ')' in shape");
    }
  }

  std::string_view text_;
  uint64_t base_;
  size_t pos_ = 0;
  uint64_t descr_offset_ = 0;
  uint64_t shape_offset_ = 0;
  std::vector<uint64_t> dim_offsets_;
};

}  // namespace

Result<std::string> NpyDescr(DType dtype) {
  switch (dtype) {
    case DType::kBool: return std::string("|b1");
    case DType::kInt8: return std::string("|i1");
    case DType::kUint8: return std::string("|u1");
    case DType::kInt16: return std::string("<i2");
    case DType::kUint16: return std::string("<u2");
    case DType::kInt32: return std::string("<i4");
    case DType::kUint32: return std::string("<u4");
    case DType::kInt64: return std::string("<i8");
    case DType::kUint64: return std::string("<u8");
    case DType::kFloat16: return std::string("<f2");
    case DType::kFloat32: return std::string("<f4");
    case DType::kFloat64: return std::string("<f8");
    case DType::kBFloat16: break;
  }
  return InvalidArgument("dtype " + std::string(DTypeName(dtype)) + " has no numpy descr; .npy files cannot hold it");
}

Result<NpyHeader> ParseNpyHeader(std::string_view bytes) {
  MESHLOAD_ASSIGN_OR_RETURN(Preamble pre, ParsePreamble(bytes));
  if (bytes.size() < pre.data_offset) {
    return DataLoss(
        "truncated: header needs " + std::to_string(pre.data_offset) + " bytes, have " + std::to_string(bytes.size()),
        At(bytes.size()));
  }
  std::string_view header = bytes.substr(pre.header_start, pre.header_len);
  if (header.back() != '\n') {
    return InvalidArgument("header must end with '\\n', found " + ByteName(header.back()), At(pre.data_offset - 1));
  }
  // Versions 1.0 and 2.0 are latin-1 by spec but numpy only writes ASCII
  // there; a high byte means the length field points at the wrong place.
  if (pre.major < 3) {
    for (size_t i = 0; i < header.size(); ++i) {
      if (static_cast<unsigned char>(header[i]) >= 0x80) {
        return InvalidArgument("non-ASCII " + ByteName(header[i]) + " in a version " + std::to_string(pre.major) +
                                   ".0 header (only version 3.0 headers may be UTF-8)",
                               At(pre.header_start + i));
      }
    }
  }

  NpyHeader out;
  out.major_version = pre.major;
  out.minor_version = pre.minor;
  out.data_offset = pre.data_offset;
  DictParser parser(header.substr(0, header.size() - 1), pre.header_start);
  MESHLOAD_RETURN_IF_ERROR(parser.Parse(&out));

  size_t bad_dim = 0;
  if (!ComputeSizes(out.shape, DTypeSize(out.dtype), &out.element_count, &out.data_bytes, &bad_dim)) {
    if (bad_dim < out.shape.size()) {
      return InvalidArgument("shape's element count overflows uint64 at dimension " + std::to_string(bad_dim),
                             At(parser.dim_offsets()[bad_dim]));
    }
    return InvalidArgument("shape's byte size overflows uint64 (" + std::to_string(out.element_count) +
                               " elements of " + std::to_string(DTypeSize(out.dtype)) + " bytes)",
                           At(parser.shape_offset()));
  }
  return out;
}

Result<uint64_t> NpyDataOffset(std::string_view first_bytes) {
  MESHLOAD_ASSIGN_OR_RETURN(Preamble pre, ParsePreamble(first_bytes.substr(0, kMaxPreambleSize)));
  return pre.data_offset;
}

Result<std::string> MakeNpyHeader(DType dtype, const std::vector<uint64_t>& shape) {
  MESHLOAD_ASSIGN_OR_RETURN(std::string descr, NpyDescr(dtype));
  if (shape.size() > kNpyMaxRank) {
    return InvalidArgument("shape has " + std::to_string(shape.size()) + " dimensions; at most " +
                           std::to_string(kNpyMaxRank) + " are supported");
  }
  uint64_t count = 0;
  uint64_t bytes = 0;
  size_t bad_dim = 0;
  if (!ComputeSizes(shape, DTypeSize(dtype), &count, &bytes, &bad_dim)) {
    return InvalidArgument("shape's byte size overflows uint64");
  }

  // The same spelling as numpy's repr of the dict: sorted keys, ", " after
  // every item, and Python's tuple repr for the shape.
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dict += ",";
  dict += "), }";
  if (!shape.empty()) {
    size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  const size_t hlen = dict.size() + 1;  // + the final '\n'
  const size_t padlen = kArrayAlign - ((kLenFieldOffset + 2 + hlen) % kArrayAlign);
  const size_t header_len = hlen + padlen;  // < 1 KiB given the rank cap

  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header_len & 0xff);
  out += static_cast<char>((header_len >> 8) & 0xff);
  out += dict;
  out.append(padlen, ' ');
  out += '\n';
  return out;
}

}  // namespace meshload::formats
