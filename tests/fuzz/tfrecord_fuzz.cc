/// \file
/// libFuzzer target for the TFRecord parsers (formats/tfrecord.h): the same
/// bytes as a DALI index, as a file of framed records, as one record, and
/// as an Example whose features are decoded. They must never crash, errors
/// must say where, and what they accept must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tfrecord.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshload::formats;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // As an index of a file of 4096 bytes: offsets start at 0, rise, end there.
  auto index = ParseTfRecordIndex(bytes, "f.idx", 4096);
  if (index.ok()) {
    if (index->front() != 0 || index->back() != 4096) __builtin_trap();
    for (size_t i = 1; i < index->size(); ++i) {
      if ((*index)[i] < (*index)[i - 1] + kTfRecordFramingBytes) __builtin_trap();
    }
  } else if (index.status().location() != "f.idx") {
    __builtin_trap();
  }
  // As a file of records.
  auto scanned = ScanTfRecords(bytes, "f");
  if (scanned.ok() && scanned->back() != size) __builtin_trap();
  if (!scanned.ok() && scanned.status().location().rfind("f@", 0) != 0) __builtin_trap();
  // As one record, then as an Example.
  auto payload = TfRecordPayload(bytes, "f", 0);
  if (payload.ok() && payload->size() + kTfRecordFramingBytes != size) __builtin_trap();
  std::vector<std::optional<TfFeature>> features;
  const std::vector<std::string> names = {"image", "label", "", "box"};
  const meshload::Status st = TfExampleFeatures(bytes, names, features, "f", 7);
  if (!st.ok()) {
    if (st.location() != "f@7") __builtin_trap();
    return 0;
  }
  for (const auto& f : features) {
    if (!f) continue;
    if (f->list.data() < bytes.data() || f->list.data() + f->list.size() > bytes.data() + bytes.size()) {
      __builtin_trap();
    }
    std::vector<std::string_view> b;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    if (TfBytesValues(f->list, b).ok()) {
      for (std::string_view v : b) {
        if (v.data() < f->list.data() || v.data() + v.size() > f->list.data() + f->list.size()) __builtin_trap();
      }
    }
    if (TfInt64Values(f->list, ints).ok() && ints.size() > f->list.size()) __builtin_trap();
    if (TfFloatValues(f->list, floats).ok() && floats.size() * 4 > f->list.size()) __builtin_trap();
  }
  return 0;
}
