#include "formats/tfrecord.h"

#include <array>
#include <charconv>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace meshload::formats {
namespace {

constexpr uint32_t kCastagnoli = 0x82f63b78u;  // reflected

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t Crc32cTable(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint64_t Crc32cRun(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  return c;
}

// The CRC register after `bytes` zero bytes, as a table per byte of the
// register: appending zeros is linear in the register, so the 4 tables of
// 256 registers (each byte value at each position, advanced over the zeros
// by the instruction itself) give any register's advance in 4 lookups.
struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  explicit ZeroShift(size_t bytes) {
    const std::vector<uint8_t> zeros(bytes, 0);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        t[k][b] = static_cast<uint32_t>(Crc32cRun(static_cast<uint64_t>(b) << (8 * k), zeros.data(), bytes));
      }
    }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) void Crc32cLanes(uint64_t& c, const uint8_t*& p, size_t& n, size_t lane,
                                                   const ZeroShift& shift) {
  while (n >= 3 * lane) {
    uint64_t a = c, b = 0, d = 0;
    const uint8_t* end = p + lane;
    for (; p < end; p += 8) {
      uint64_t va, vb, vd;
      std::memcpy(&va, p, 8);
      std::memcpy(&vb, p + lane, 8);
      std::memcpy(&vd, p + 2 * lane, 8);
      a = _mm_crc32_u64(a, va);
      b = _mm_crc32_u64(b, vb);
      d = _mm_crc32_u64(d, vd);
    }
    c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
    p += 2 * lane;
    n -= 3 * lane;
  }
}

// The instruction has a latency of 3 cycles and a throughput of 1: one
// chain of it runs at a third of what the core can do. Runs of 3 lanes
// (of kLong, then kShort bytes) go through three independent chains at
// once, which are then joined: the register after A·B is B's from zero
// xor A's advanced over |B| zero bytes.
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const uint8_t* p, size_t n, uint32_t crc) {
  constexpr size_t kLong = 8192, kShort = 256;
  static const ZeroShift long_shift(kLong), short_shift(kShort);
  uint64_t c = crc;
  Crc32cLanes(c, p, n, kLong, long_shift);
  Crc32cLanes(c, p, n, kShort, short_shift);
  c = Crc32cRun(c, p, n & ~size_t{7});
  p += n & ~size_t{7};
  n &= 7;
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string At(std::string_view file, uint64_t offset) { return std::string(file) + "@" + std::to_string(offset); }

// Protobuf's wire format: a field's key, then its value by wire type.
struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t varint = 0;     // wire 0; wire 1 and 5: the fixed value
  std::string_view bytes;  // wire 2
};

bool Varint(std::string_view s, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < s.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The next field of message `s` at `pos`; false with `why` set when the
// message is malformed.
bool NextField(std::string_view s, size_t& pos, Field& f, std::string& why) {
  const size_t start = pos;
  uint64_t key = 0;
  if (!Varint(s, pos, key) || key >> 3 == 0 || key >> 3 > 0x1fffffff) {
    why = "a bad field key at byte " + std::to_string(start);
    return false;
  }
  f.number = static_cast<uint32_t>(key >> 3);
  f.wire = static_cast<uint32_t>(key & 7);
  switch (f.wire) {
    case 0:
      if (!Varint(s, pos, f.varint)) {
        why = "a truncated varint at byte " + std::to_string(start);
        return false;
      }
      return true;
    case 1:
      if (s.size() - pos < 8) break;
      f.varint = LoadU64(s.data() + pos);
      pos += 8;
      return true;
    case 5:
      if (s.size() - pos < 4) break;
      f.varint = LoadU32(s.data() + pos);
      pos += 4;
      return true;
    case 2: {
      uint64_t n = 0;
      if (!Varint(s, pos, n) || n > s.size() - pos) break;
      f.bytes = s.substr(pos, static_cast<size_t>(n));
      pos += static_cast<size_t>(n);
      return true;
    }
    default:
      why = "field " + std::to_string(f.number) + " of wire type " + std::to_string(f.wire) +
            " (groups are not in tf.train.Example) at byte " + std::to_string(start);
      return false;
  }
  why = "field " + std::to_string(f.number) + " runs past the end of its message (byte " + std::to_string(start) + ")";
  return false;
}

Status Malformed(std::string_view what, const std::string& why) {
  return DataLoss("not a well-formed " + std::string(what) + ": " + why);
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return ~Crc32cHardware(p, n, ~0u);
#endif
  return ~Crc32cTable(p, n, ~0u);
}

Result<std::vector<uint64_t>> ParseTfRecordIndex(std::string_view text, std::string_view name,
                                                 std::optional<uint64_t> file_bytes) {
  // A compressed file's decompressed bytes end where its records do.
  const uint64_t bound = file_bytes.value_or(UINT64_MAX);
  std::vector<uint64_t> offsets;
  uint64_t expect = 0;
  size_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) continue;
    uint64_t offset = 0, length = 0;
    const char* b = l.data();
    const char* e = l.data() + l.size();
    auto r1 = std::from_chars(b, e, offset);
    const char* mid = r1.ptr;
    while (mid < e && *mid == ' ') ++mid;
    auto r2 = std::from_chars(mid, e, length);
    if (r1.ec != std::errc() || mid == r1.ptr || r2.ec != std::errc() || r2.ptr != e) {
      return InvalidArgument(
          "line " + std::to_string(line) + " is not \"OFFSET LENGTH\": \"" + std::string(l.substr(0, 60)) + "\"",
          std::string(name));
    }
    if (offset != expect) {
      return InvalidArgument("line " + std::to_string(line) + " puts a record at byte " + std::to_string(offset) +
                                 " where the one before ended at " + std::to_string(expect) +
                                 ": the index is not this file's (write it again with `meshload index`)",
                             std::string(name));
    }
    if (length < kTfRecordFramingBytes || length > bound - std::min(offset, bound)) {
      return InvalidArgument("line " + std::to_string(line) + " gives a record of " + std::to_string(length) +
                                 " bytes at byte " + std::to_string(offset) +
                                 (file_bytes ? " of a " + std::to_string(*file_bytes) + "-byte file" : ""),
                             std::string(name));
    }
    offsets.push_back(offset);
    expect = offset + length;
  }
  if (file_bytes && expect != *file_bytes) {
    return InvalidArgument("its records end at byte " + std::to_string(expect) + " of a " +
                               std::to_string(*file_bytes) +
                               "-byte file: the index is not this file's (write it again with `meshload index`)",
                           std::string(name));
  }
  offsets.push_back(expect);
  return offsets;
}

std::string_view TfRecordCompressionHint(std::string_view head) {
  if (head.size() < 2) return "";
  const auto b0 = static_cast<uint8_t>(head[0]);
  const auto b1 = static_cast<uint8_t>(head[1]);
  if (b0 == 0x1f && b1 == 0x8b) return "GZIP";
  // CMF: deflate (method 8) with a window of at most 32 KiB; FCHECK makes
  // CMF·256 + FLG a multiple of 31.
  if ((b0 & 0x0f) == 8 && (b0 >> 4) <= 7 && ((b0 << 8) | b1) % 31 == 0) return "ZLIB";
  return "";
}

Result<uint64_t> TfRecordLength(std::string_view header, std::string_view name, uint64_t offset) {
  if (header.size() < 12) return DataLoss("a record's framing is cut off by the end of the file", At(name, offset));
  if (MaskCrc32c(Crc32c(header.data(), 8)) != LoadU32(header.data() + 8)) {
    return DataLoss("bad length CRC: not the start of a TFRecord record", At(name, offset));
  }
  return LoadU64(header.data());
}

Result<std::vector<uint64_t>> ScanTfRecords(std::string_view file, std::string_view name) {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < kTfRecordFramingBytes) {
      return DataLoss("a record's framing is cut off by the end of the file", At(name, at));
    }
    MESHLOAD_ASSIGN_OR_RETURN(const uint64_t n, TfRecordLength(file.substr(at, 12), name, at));
    if (n > file.size() - at - kTfRecordFramingBytes) {
      return DataLoss("a record of " + std::to_string(n) + " bytes runs past the end of the file", At(name, at));
    }
    offsets.push_back(at);
    at += n + kTfRecordFramingBytes;
  }
  offsets.push_back(at);
  return offsets;
}

std::string TfRecordIndexText(const std::vector<uint64_t>& offsets) {
  std::string out;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    out += std::to_string(offsets[i]) + " " + std::to_string(offsets[i + 1] - offsets[i]) + "\n";
  }
  return out;
}

Result<std::string_view> TfRecordPayload(std::string_view record, const std::string& file, uint64_t offset) {
  if (record.size() < kTfRecordFramingBytes) {
    return DataLoss("a record of " + std::to_string(record.size()) + " bytes is shorter than its framing",
                    At(file, offset));
  }
  const uint64_t n = LoadU64(record.data());
  const uint32_t length_crc = MaskCrc32c(Crc32c(record.data(), 8));
  if (length_crc != LoadU32(record.data() + 8)) {
    return DataLoss("bad length CRC (stored " + std::to_string(LoadU32(record.data() + 8)) + ", computed " +
                        std::to_string(length_crc) + ")",
                    At(file, offset));
  }
  if (n != record.size() - kTfRecordFramingBytes) {
    return DataLoss("the record's length says " + std::to_string(n) + " bytes, the index " +
                        std::to_string(record.size() - kTfRecordFramingBytes) + ": the index is not this file's",
                    At(file, offset));
  }
  const std::string_view payload = record.substr(12, static_cast<size_t>(n));
  const uint32_t stored = LoadU32(record.data() + 12 + n);
  const uint32_t computed = MaskCrc32c(Crc32c(payload.data(), payload.size()));
  if (stored != computed) {
    return DataLoss("bad data CRC (stored " + std::to_string(stored) + ", computed " + std::to_string(computed) + ")",
                    At(file, offset));
  }
  return payload;
}

std::string_view TfFeatureKindName(TfFeature::Kind kind) {
  switch (kind) {
    case TfFeature::Kind::kBytes: return "bytes_list";
    case TfFeature::Kind::kFloat: return "float_list";
    case TfFeature::Kind::kInt64: return "int64_list";
  }
  return "?";
}

Status TfExampleFeatures(std::string_view example, const std::vector<std::string>& names,
                         std::vector<std::optional<TfFeature>>& out, const std::string& file, uint64_t offset) {
  out.assign(names.size(), std::nullopt);
  auto bad = [&](const std::string& why) {
    return Malformed("tf.train.Example", why).WithLocationPrefix(At(file, offset));
  };
  std::string why;
  Field f;
  for (size_t pos = 0; pos < example.size();) {
    if (!NextField(example, pos, f, why)) return bad(why);
    if (f.number != 1 || f.wire != 2) continue;  // Example.features
    const std::string_view features = f.bytes;
    for (size_t fp = 0; fp < features.size();) {
      if (!NextField(features, fp, f, why)) return bad("in its features: " + why);
      if (f.number != 1 || f.wire != 2) continue;  // Features.feature (a map entry)
      const std::string_view entry = f.bytes;
      std::string_view key, value;
      bool has_value = false;
      for (size_t ep = 0; ep < entry.size();) {
        if (!NextField(entry, ep, f, why)) return bad("in a feature's entry: " + why);
        if (f.number == 1 && f.wire == 2) key = f.bytes;
        if (f.number == 2 && f.wire == 2) {
          value = f.bytes;
          has_value = true;
        }
      }
      size_t want = names.size();
      for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == key) want = i;
      }
      if (want == names.size()) continue;
      out[want] = std::nullopt;  // a later entry of one key replaces an earlier one
      if (!has_value) continue;
      for (size_t vp = 0; vp < value.size();) {
        if (!NextField(value, vp, f, why)) return bad("in feature '" + std::string(key) + "': " + why);
        if (f.wire != 2 || f.number < 1 || f.number > 3) continue;
        const TfFeature::Kind kind = f.number == 1   ? TfFeature::Kind::kBytes
                                     : f.number == 2 ? TfFeature::Kind::kFloat
                                                     : TfFeature::Kind::kInt64;
        out[want] = TfFeature{kind, f.bytes};
      }
    }
  }
  return Status::Ok();
}

Status TfBytesValues(std::string_view list, std::vector<std::string_view>& out) {
  std::string why;
  Field f;
  for (size_t pos = 0; pos < list.size();) {
    if (!NextField(list, pos, f, why)) return Malformed("BytesList", why);
    if (f.number == 1 && f.wire == 2) out.push_back(f.bytes);
  }
  return Status::Ok();
}

Status TfInt64Values(std::string_view list, std::vector<int64_t>& out) {
  std::string why;
  Field f;
  for (size_t pos = 0; pos < list.size();) {
    if (!NextField(list, pos, f, why)) return Malformed("Int64List", why);
    if (f.number != 1) continue;
    if (f.wire == 0) {
      out.push_back(static_cast<int64_t>(f.varint));
    } else if (f.wire == 2) {  // packed
      for (size_t p = 0; p < f.bytes.size();) {
        uint64_t v = 0;
        if (!Varint(f.bytes, p, v)) return Malformed("Int64List", "a truncated packed varint");
        out.push_back(static_cast<int64_t>(v));
      }
    } else {
      return Malformed("Int64List", "its values are of wire type " + std::to_string(f.wire));
    }
  }
  return Status::Ok();
}

Status TfFloatValues(std::string_view list, std::vector<float>& out) {
  std::string why;
  Field f;
  for (size_t pos = 0; pos < list.size();) {
    if (!NextField(list, pos, f, why)) return Malformed("FloatList", why);
    if (f.number != 1) continue;
    if (f.wire == 5) {
      float v;
      const auto bits = static_cast<uint32_t>(f.varint);
      std::memcpy(&v, &bits, 4);
      out.push_back(v);
    } else if (f.wire == 2) {  // packed
      if (f.bytes.size() % 4 != 0)
        return Malformed("FloatList", "packed floats of " + std::to_string(f.bytes.size()) + " bytes");
      for (size_t p = 0; p < f.bytes.size(); p += 4) {
        float v;
        std::memcpy(&v, f.bytes.data() + p, 4);
        out.push_back(v);
      }
    } else {
      return Malformed("FloatList", "its values are of wire type " + std::to_string(f.wire));
    }
  }
  return Status::Ok();
}

namespace {
void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void PutBytesField(std::string& out, uint32_t number, std::string_view bytes) {
  PutVarint(out, (static_cast<uint64_t>(number) << 3) | 2);
  PutVarint(out, bytes.size());
  out.append(bytes);
}
}  // namespace

std::string TfRecordFrame(std::string_view payload) {
  std::string out(12, '\0');
  const uint64_t n = payload.size();
  std::memcpy(out.data(), &n, 8);
  const uint32_t length_crc = MaskCrc32c(Crc32c(out.data(), 8));
  std::memcpy(out.data() + 8, &length_crc, 4);
  out.append(payload);
  const uint32_t data_crc = MaskCrc32c(Crc32c(payload.data(), payload.size()));
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

void TfExampleWriter::AddFeature(std::string_view name, int kind, const std::string& list) {
  std::string feature, entry;
  PutBytesField(feature, static_cast<uint32_t>(kind), list);
  PutBytesField(entry, 1, name);
  PutBytesField(entry, 2, feature);
  PutBytesField(features_, 1, entry);
}

void TfExampleWriter::AddBytes(std::string_view name, std::string_view value) {
  std::string list;
  PutBytesField(list, 1, value);
  AddFeature(name, 1, list);
}

void TfExampleWriter::AddInt64s(std::string_view name, const std::vector<int64_t>& values) {
  std::string packed, list;
  for (int64_t v : values) PutVarint(packed, static_cast<uint64_t>(v));
  if (!values.empty()) PutBytesField(list, 1, packed);
  AddFeature(name, 3, list);
}

void TfExampleWriter::AddFloats(std::string_view name, const std::vector<float>& values) {
  std::string list;
  if (!values.empty()) {
    PutBytesField(list, 1, std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  }
  AddFeature(name, 2, list);
}

std::string TfExampleWriter::Serialize() const {
  std::string out;
  PutBytesField(out, 1, features_);
  return out;
}

}  // namespace meshload::formats
