#include "formats/fields.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "formats/tar.h"
#include "formats/tfrecord.h"
#include "formats/webdataset.h"

namespace meshload::formats {
namespace {

Status ErrorAt(const std::string& file, uint64_t offset, const std::string& what) {
  return InvalidArgument(what, file + "@" + std::to_string(offset));
}

// IEEE half from a double (round to nearest even; overflow to infinity).
uint16_t ToHalf(double d) {
  const float f = static_cast<float>(d);
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFFu;
  if (((x >> 23) & 0xFF) == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

bool IsFloat(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}

bool IsSigned(DType t) { return t == DType::kInt8 || t == DType::kInt16 || t == DType::kInt32 || t == DType::kInt64; }

template <typename T>
void Store(uint8_t* dest, T v) {
  std::memcpy(dest, &v, sizeof v);
}

// The number `text` as an element of `t` at `dest`; false when it is not
// one (not a number, or out of the type's range).
bool ParseNumber(std::string_view text, DType t, uint8_t* dest) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  if (IsFloat(t)) {
    double d = 0;
    const std::string_view digits = text.front() == '+' ? text.substr(1) : text;
    auto [p, ec] = std::from_chars(digits.data(), end, d);
    if (ec != std::errc() || p != end) return false;
    switch (t) {
      case DType::kFloat16: Store(dest, ToHalf(d)); break;
      case DType::kFloat32: Store(dest, static_cast<float>(d)); break;
      case DType::kFloat64: Store(dest, d); break;
      default: return false;  // bfloat16: refused by the spec's checks
    }
    return true;
  }
  const std::string_view digits = text.front() == '+' ? text.substr(1) : text;
  if (IsSigned(t)) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), end, v);
    if (ec != std::errc() || p != end) return false;
    switch (t) {
      case DType::kInt8:
        if (v < INT8_MIN || v > INT8_MAX) return false;
        Store(dest, static_cast<int8_t>(v));
        break;
      case DType::kInt16:
        if (v < INT16_MIN || v > INT16_MAX) return false;
        Store(dest, static_cast<int16_t>(v));
        break;
      case DType::kInt32:
        if (v < INT32_MIN || v > INT32_MAX) return false;
        Store(dest, static_cast<int32_t>(v));
        break;
      default: Store(dest, v); break;
    }
    return true;
  }
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), end, v);
  if (ec != std::errc() || p != end) return false;
  switch (t) {
    case DType::kBool:
      if (v > 1) return false;
      Store(dest, static_cast<uint8_t>(v));
      break;
    case DType::kUint8:
      if (v > UINT8_MAX) return false;
      Store(dest, static_cast<uint8_t>(v));
      break;
    case DType::kUint16:
      if (v > UINT16_MAX) return false;
      Store(dest, static_cast<uint16_t>(v));
      break;
    case DType::kUint32:
      if (v > UINT32_MAX) return false;
      Store(dest, static_cast<uint32_t>(v));
      break;
    default: Store(dest, v); break;
  }
  return true;
}

// Streaming's NDArray value dtype codes (encodings.py, _int2value_dtype).
std::optional<DType> NdarrayDTypeOfCode(uint8_t code) {
  switch (code) {
    case 8: return DType::kUint8;
    case 9: return DType::kInt8;
    case 16: return DType::kUint16;
    case 17: return DType::kInt16;
    case 18: return DType::kFloat16;
    case 32: return DType::kUint32;
    case 33: return DType::kInt32;
    case 34: return DType::kFloat32;
    case 64: return DType::kUint64;
    case 65: return DType::kInt64;
    case 66: return DType::kFloat64;
    default: return std::nullopt;
  }
}

std::string Truncated(std::string_view s) {
  std::string out(s.substr(0, 32));
  for (char& c : out) {
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return s.size() > 32 ? out + "..." : out;
}

}  // namespace

uint64_t FieldDecoding::sample_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (uint64_t d : shape) n *= d;
  return n;
}

FieldDecoding WebDatasetFieldDecoding(const std::string& name, std::optional<DType> dtype) {
  FieldDecoding f;
  f.name = name;
  if (dtype) {
    f.kind = FieldDecoding::Kind::kText;
    f.dtype = *dtype;
  }
  return f;
}

namespace {
std::string Article(TfFeature::Kind kind) { return kind == TfFeature::Kind::kInt64 ? "an " : "a "; }
}  // namespace

Result<FieldDecoding> TfRecordFieldDecoding(const std::string& name, std::optional<DType> dtype,
                                            const std::optional<std::vector<uint64_t>>& shape) {
  FieldDecoding f;
  f.name = name;
  if (!dtype) {
    if (shape) return InvalidArgument("a shape needs a dtype: int64 for an int64_list, float32 for a float_list");
    return f;  // a bytes_list's value
  }
  if (*dtype == DType::kInt64) {
    f.kind = FieldDecoding::Kind::kTfInt64List;
  } else if (*dtype == DType::kFloat32) {
    f.kind = FieldDecoding::Kind::kTfFloatList;
  } else {
    return InvalidArgument("a TFRecord feature holds bytes (no dtype), int64 or float32 values, not " +
                           std::string(DTypeName(*dtype)));
  }
  f.dtype = *dtype;
  if (shape) {
    f.fixed_list = true;
    f.shape = *shape;
  }
  return f;
}

Status TfRecordSampleValues(std::string_view record, const std::string& file, uint64_t offset,
                            const std::vector<FieldDecoding>& fields, FieldValues& out) {
  MESHLOAD_ASSIGN_OR_RETURN(std::string_view example, TfRecordPayload(record, file, offset));
  thread_local std::vector<std::string> names;
  thread_local std::vector<std::optional<TfFeature>> features;
  thread_local std::vector<std::string_view> bytes;
  names.clear();
  for (const FieldDecoding& f : fields) names.push_back(f.name);
  MESHLOAD_RETURN_IF_ERROR(TfExampleFeatures(example, names, features, file, offset));
  out.assign(fields.size(), std::nullopt);
  for (size_t i = 0; i < fields.size(); ++i) {
    if (!features[i]) continue;
    const FieldDecoding& fd = fields[i];
    const TfFeature::Kind want = fd.kind == FieldDecoding::Kind::kTfInt64List   ? TfFeature::Kind::kInt64
                                 : fd.kind == FieldDecoding::Kind::kTfFloatList ? TfFeature::Kind::kFloat
                                                                                : TfFeature::Kind::kBytes;
    if (features[i]->kind != want) {
      return ErrorAt(
          file, offset,
          "feature '" + fd.name + "' is " + Article(features[i]->kind) +
              std::string(TfFeatureKindName(features[i]->kind)) + ", and the job asks for " + Article(want) +
              std::string(TfFeatureKindName(want)) +
              (want == TfFeature::Kind::kBytes ? " (no dtype)" : " (dtype " + std::string(DTypeName(fd.dtype)) + ")"));
    }
    if (want != TfFeature::Kind::kBytes) {
      out[i] = features[i]->list;
      continue;
    }
    bytes.clear();
    if (Status st = TfBytesValues(features[i]->list, bytes); !st.ok())
      return st.WithLocationPrefix(file + "@" + std::to_string(offset));
    if (bytes.size() != 1) {
      return ErrorAt(file, offset,
                     "feature '" + fd.name + "' is a bytes_list of " + std::to_string(bytes.size()) +
                         " values; meshload delivers a bytes_list of one value per sample");
    }
    out[i] = bytes.front();
  }
  return Status::Ok();
}

Result<FieldDecoding> MdsFieldDecoding(const std::string& name, std::optional<DType> dtype, const MdsColumn& column) {
  FieldDecoding f;
  f.name = name;
  if (!dtype) return f;
  const std::string& enc = column.encoding;
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("field '" + name + "' asks for " + std::string(DTypeName(*dtype)) + " but column '" +
                           column.name + "' is encoded '" + enc + "': " + why);
  };
  f.dtype = *dtype;
  if (enc.rfind("ndarray", 0) == 0) {
    std::vector<std::string> parts;
    size_t from = 0;
    while (true) {
      const size_t colon = enc.find(':', from);
      parts.push_back(enc.substr(from, colon == std::string::npos ? std::string::npos : colon - from));
      if (colon == std::string::npos) break;
      from = colon + 1;
    }
    if (parts.size() >= 2) {
      auto t = ParseDType(parts[1]);
      if (!t.ok() || *t != *dtype) return refuse("its elements are " + parts[1]);
    }
    if (parts.size() >= 3) {
      f.kind = FieldDecoding::Kind::kNdarrayFixed;
      size_t at = 0;
      const std::string& dims = parts[2];
      while (at <= dims.size()) {
        const size_t comma = std::min(dims.find(',', at), dims.size());
        uint64_t d = 0;
        auto [p, ec] = std::from_chars(dims.data() + at, dims.data() + comma, d);
        if (ec != std::errc() || p != dims.data() + comma || d == 0) return refuse("its shape does not parse");
        f.shape.push_back(d);
        at = comma + 1;
      }
    } else {
      f.kind = FieldDecoding::Kind::kNdarrayVariable;
      f.dtype_in_value = parts.size() == 1;
    }
    return f;
  }
  const std::optional<uint32_t> scalar = MdsScalarSize(enc);
  if (!scalar) {
    return refuse(
        "a dtype decodes numeric columns only (int, int8 ... float64, ndarray); leave dtype out for the "
        "bytes as stored");
  }
  const std::string_view want = enc == "int" ? "int64" : std::string_view(enc);
  if (DTypeName(*dtype) != want) return refuse("its values are " + std::string(want));
  f.kind = FieldDecoding::Kind::kScalar;
  return f;
}

Status WebDatasetSampleValues(std::string_view record, const std::string& shard, uint64_t offset,
                              const std::vector<std::string>& extensions, FieldValues& out, std::string& key) {
  out.assign(extensions.size(), std::nullopt);
  key.clear();
  TarWalker walker(shard, offset + record.size(), offset);
  std::string k, ext;
  while (!walker.done()) {
    const TarWalker::Need need = walker.next();
    MESHLOAD_ASSIGN_OR_RETURN(std::optional<TarMember> m, walker.Feed(record.substr(need.offset - offset, need.bytes)));
    if (!m || !m->regular || IsWebDatasetMetadata(m->name)) continue;
    if (!SplitWebDatasetName(m->name, k, ext)) continue;
    if (key.empty()) {
      key = k;
    } else if (k != key) {
      return ErrorAt(shard, m->offset,
                     "member '" + m->name + "' belongs to sample '" + k + "', but its index entry starts sample '" +
                         key + "': the .tar.idx does not match the shard (rebuild it with `meshload index`)");
    }
    for (size_t i = 0; i < extensions.size(); ++i) {
      if (ext != extensions[i]) continue;
      if (out[i]) {
        return ErrorAt(shard, m->offset, "sample '" + key + "' has the field '" + ext + "' twice");
      }
      out[i] = record.substr(m->data_offset - offset, m->size);
    }
  }
  if (key.empty()) {
    return ErrorAt(shard, offset,
                   "the index points at a sample with no members (the .tar.idx does not match the shard)");
  }
  return Status::Ok();
}

Status MdsSampleValues(std::string_view record, const MdsShard& shard_info, const std::string& shard, uint64_t offset,
                       const std::vector<int>& columns, FieldValues& out) {
  auto parsed = ParseMdsSample(record, shard_info, offset);
  if (!parsed.ok()) {
    // Located at the shard's basename; the caller names the file.
    const Status& st = parsed.status();
    const size_t at = st.location().rfind('@');
    return Status(st.code(), st.message(), shard + (at == std::string::npos ? "" : st.location().substr(at)));
  }
  out.assign(columns.size(), std::nullopt);
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] < 0) continue;
    const MdsField& f = (*parsed)[static_cast<size_t>(columns[i])];
    out[i] = record.substr(f.offset, f.size);
  }
  return Status::Ok();
}

Result<std::pair<DType, std::string_view>> MdsNdarrayElements(const FieldDecoding& field, std::string_view value,
                                                              const std::string& file, uint64_t offset) {
  // Streaming's NDArray: [dtype code: 1, when the column names none]
  // [ndim << 2 | shape dtype: 1] [shape: ndim × 2^shape dtype bytes] [values].
  size_t at = 0;
  DType dtype = field.dtype;
  auto need = [&](size_t n) { return value.size() - at >= n; };
  if (field.kind != FieldDecoding::Kind::kNdarrayVariable) {
    return ErrorAt(file, offset, "field '" + field.name + "' is not an ndarray of variable shape");
  }
  if (field.dtype_in_value) {
    if (!need(1)) return ErrorAt(file, offset, "an ndarray value without its dtype byte");
    const auto t = NdarrayDTypeOfCode(static_cast<uint8_t>(value[at]));
    if (!t) {
      return ErrorAt(file, offset + at,
                     "unknown ndarray dtype code " + std::to_string(static_cast<uint8_t>(value[at])));
    }
    if (*t != field.dtype) {
      return ErrorAt(file, offset + at,
                     "an ndarray of " + std::string(DTypeName(*t)) + " where field '" + field.name + "' asks for " +
                         std::string(DTypeName(field.dtype)));
    }
    dtype = *t;
    ++at;
  }
  if (!need(1)) return ErrorAt(file, offset + at, "an ndarray value without its shape byte");
  const uint8_t b = static_cast<uint8_t>(value[at++]);
  const size_t ndim = b >> 2;
  const size_t dim_bytes = size_t{1} << (b & 3);
  if (!need(ndim * dim_bytes)) {
    return ErrorAt(file, offset + at,
                   "an ndarray shape of " + std::to_string(ndim) + " dimensions runs past the value");
  }
  uint64_t elements = 1;
  for (size_t d = 0; d < ndim; ++d) {
    uint64_t v = 0;
    std::memcpy(&v, value.data() + at, dim_bytes);  // little-endian
    at += dim_bytes;
    if (v != 0 && elements > std::numeric_limits<uint64_t>::max() / v)
      elements = std::numeric_limits<uint64_t>::max();
    else
      elements *= v;
  }
  const std::string_view rest = value.substr(at);
  if (elements > rest.size() / DTypeSize(dtype) || elements * DTypeSize(dtype) != rest.size()) {
    return ErrorAt(file, offset + at,
                   "the ndarray's shape says " + std::to_string(elements) + " elements of " +
                       std::string(DTypeName(dtype)) + " but " + std::to_string(rest.size()) + " bytes follow");
  }
  return std::make_pair(dtype, rest);
}

Status DecodeFieldValue(const FieldDecoding& field, std::string_view value, uint8_t* dest, uint64_t room,
                        uint64_t& written, const std::string& file, uint64_t offset) {
  written = 0;
  switch (field.kind) {
    case FieldDecoding::Kind::kBytes:
    case FieldDecoding::Kind::kNdarrayVariable: {
      std::string_view bytes = value;
      if (field.kind == FieldDecoding::Kind::kNdarrayVariable) {
        MESHLOAD_ASSIGN_OR_RETURN(auto elems, MdsNdarrayElements(field, value, file, offset));
        bytes = elems.second;
      }
      if (bytes.size() > room) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' of " + std::to_string(bytes.size()) + " bytes does not fit the " +
                           std::to_string(room) + " left for it");
      }
      if (!bytes.empty()) std::memcpy(dest, bytes.data(), bytes.size());
      written = bytes.size();
      return Status::Ok();
    }
    case FieldDecoding::Kind::kValues:
      if (value.size() % DTypeSize(field.dtype) != 0) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' has " + std::to_string(value.size()) + " bytes, not whole " +
                           std::string(DTypeName(field.dtype)) + " values");
      }
      if (value.size() > room) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' of " + std::to_string(value.size()) + " bytes does not fit the " +
                           std::to_string(room) + " left for it");
      }
      if (!value.empty()) std::memcpy(dest, value.data(), value.size());
      written = value.size();
      return Status::Ok();
    case FieldDecoding::Kind::kText:
      if (!ParseNumber(value, field.dtype, dest)) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' is '" + Truncated(value) + "', not a number of type " +
                           std::string(DTypeName(field.dtype)));
      }
      written = DTypeSize(field.dtype);
      return Status::Ok();
    case FieldDecoding::Kind::kTfInt64List:
    case FieldDecoding::Kind::kTfFloatList: {
      thread_local std::vector<int64_t> ints;
      thread_local std::vector<float> floats;
      ints.clear();
      floats.clear();
      Status st =
          field.kind == FieldDecoding::Kind::kTfInt64List ? TfInt64Values(value, ints) : TfFloatValues(value, floats);
      if (!st.ok())
        return Status(st.code(), "feature '" + field.name + "': " + st.message(), file + "@" + std::to_string(offset));
      const uint64_t n = field.kind == FieldDecoding::Kind::kTfInt64List ? ints.size() * 8 : floats.size() * 4;
      if (field.fixed_list && n != field.sample_bytes()) {
        const uint64_t got = n / DTypeSize(field.dtype), want = field.sample_bytes() / DTypeSize(field.dtype);
        return ErrorAt(file, offset,
                       "feature '" + field.name + "' has " + std::to_string(got) + " value" + (got == 1 ? "" : "s") +
                           " where its shape takes " + std::to_string(want));
      }
      if (n > room) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' of " + std::to_string(n) + " bytes does not fit the " +
                           std::to_string(room) + " left for it");
      }
      if (n > 0) std::memcpy(dest, ints.empty() ? static_cast<const void*>(floats.data()) : ints.data(), n);
      written = n;
      return Status::Ok();
    }
    case FieldDecoding::Kind::kScalar:
    case FieldDecoding::Kind::kNdarrayFixed:
      if (value.size() != field.sample_bytes()) {
        return ErrorAt(file, offset,
                       "field '" + field.name + "' has " + std::to_string(value.size()) +
                           " bytes where its encoding gives " + std::to_string(field.sample_bytes()));
      }
      std::memcpy(dest, value.data(), value.size());
      written = value.size();
      return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace meshload::formats
