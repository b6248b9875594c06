/// \file
/// libFuzzer target for the decoding of WebDataset, MDS and Parquet records into
/// fields (formats/fields.h): the same bytes as a WebDataset sample's tar
/// members, as an MDS row of the fixtures' columns, and as a field value of
/// every kind and dtype (the first byte picks them). They must never crash,
/// errors must name the file and byte, and what they accept must lie inside
/// the input and fit its room.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/fields.h"
#include "formats/parquet_record.h"

using namespace meshload::formats;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t pick = data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto inside = [&](const std::optional<std::string_view>& v) {
    return !v || (v->data() >= bytes.data() && v->data() + v->size() <= bytes.data() + bytes.size());
  };
  auto located = [](const meshload::Status& st, const char* file) {
    return st.location().rfind(std::string(file) + "@", 0) == 0;
  };

  // As one WebDataset sample at byte 1024 of a shard.
  FieldValues values;
  std::string key;
  meshload::Status st = WebDatasetSampleValues(bytes, "s.tar", 1024, {"jpg", "cls", "json"}, values, key);
  if (!st.ok()) {
    if (!located(st, "s.tar")) __builtin_trap();
  } else {
    if (values.size() != 3 || key.empty()) __builtin_trap();
    for (const auto& v : values) {
      if (!inside(v)) __builtin_trap();
    }
  }

  // As an MDS row of the fixtures' columns (tests/formats/data/mds/raw).
  MdsShard shard;
  shard.basename = "f.mds";
  shard.columns = {
      {"box", "ndarray:uint16:4", 8}, {"image", "bytes", std::nullopt}, {"label", "int", 8},
      {"score", "float32", 4},        {"text", "str", std::nullopt},    {"tokens", "ndarray:int32", std::nullopt}};
  st = MdsSampleValues(bytes, shard, "f.mds", 64, {5, -1, 1, 0}, values);
  if (!st.ok()) {
    if (!located(st, "f.mds")) __builtin_trap();
  } else {
    if (values.size() != 4 || values[1]) __builtin_trap();
    for (const auto& v : values) {
      if (!inside(v)) __builtin_trap();
    }
  }

  // As a Parquet row's record (formats/parquet_record.h) of three fields,
  // their rooms from the first byte.
  const ParquetRecordLayout layout = ParquetRecordLayout::Make({pick % 7u, 0, pick % 13u + 1});
  if (bytes.size() >= layout.bytes) {
    const std::string_view record = bytes.substr(0, layout.bytes);
    st = ParquetRecordValues(layout, record, values);
    if (st.ok()) {
      if (values.size() != 3) __builtin_trap();
      for (size_t f = 0; f < values.size(); ++f) {
        if (values[f] && (values[f]->size() > layout.room[f] || values[f]->data() < record.data() ||
                          values[f]->data() + values[f]->size() > record.data() + record.size())) {
          __builtin_trap();
        }
      }
    } else if (st.location().rfind('@', 0) != 0) {
      __builtin_trap();
    }
  }

  // As a field value: every kind, a dtype from the first byte.
  static const DType kTypes[] = {DType::kBool,   DType::kInt8,    DType::kUint8,   DType::kInt16,
                                 DType::kUint16, DType::kInt32,   DType::kUint32,  DType::kInt64,
                                 DType::kUint64, DType::kFloat16, DType::kFloat32, DType::kFloat64};
  const DType t = kTypes[pick % (sizeof kTypes / sizeof kTypes[0])];
  std::vector<FieldDecoding> fields(5);
  fields[0] = WebDatasetFieldDecoding("raw", std::nullopt);
  fields[1] = WebDatasetFieldDecoding("text", t);
  fields[2].kind = FieldDecoding::Kind::kScalar;
  fields[2].dtype = t;
  fields[3].kind = FieldDecoding::Kind::kNdarrayFixed;
  fields[3].dtype = t;
  fields[3].shape = {1 + pick % 5u, 2};
  fields[4].kind = FieldDecoding::Kind::kNdarrayVariable;
  fields[4].dtype = t;
  fields[4].dtype_in_value = pick & 0x80;
  const uint64_t room = pick & 1 ? bytes.size() : bytes.size() / 2;
  std::vector<uint8_t> out(bytes.size() + 16);
  for (const FieldDecoding& f : fields) {
    uint64_t written = 0;
    st = DecodeFieldValue(f, bytes, out.data(), f.ragged() ? room : f.sample_bytes(), written, "v", 7);
    if (!st.ok()) {
      if (!located(st, "v")) __builtin_trap();
      continue;
    }
    if (written > (f.ragged() ? room : f.sample_bytes())) __builtin_trap();
    if (!f.ragged() && written != f.sample_bytes()) __builtin_trap();
  }
  return 0;
}
