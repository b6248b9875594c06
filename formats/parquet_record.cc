#include "formats/parquet_record.h"

#include <cstring>
#include <string>

namespace meshload::formats {

uint64_t ParquetField::row_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (uint64_t d : shape) n *= d;
  return n;
}

ParquetRecordLayout ParquetRecordLayout::Make(const std::vector<uint64_t>& rooms) {
  ParquetRecordLayout l;
  l.room = rooms;
  for (uint64_t r : rooms) {
    l.at.push_back(l.bytes);
    l.bytes += sizeof(uint32_t) + r;
  }
  return l;
}

Status EncodeParquetRecord(const ParquetRecordLayout& layout, const FieldValues& values, uint8_t* record,
                           size_t& field) {
  for (size_t f = 0; f < layout.room.size(); ++f) {
    uint8_t* at = record + layout.at[f];
    uint32_t len = kParquetNullValue;
    if (values[f]) {
      if (values[f]->size() > layout.room[f]) {
        field = f;
        return OutOfRange("a value of " + std::to_string(values[f]->size()) + " bytes, more than the " +
                          std::to_string(layout.room[f]) + " its field allows");
      }
      len = static_cast<uint32_t>(values[f]->size());
      if (len > 0) std::memcpy(at + sizeof len, values[f]->data(), len);
    }
    std::memcpy(at, &len, sizeof len);
  }
  return Status::Ok();
}

Status ParquetRecordValues(const ParquetRecordLayout& layout, std::string_view record, FieldValues& out) {
  out.resize(layout.room.size());
  if (record.size() != layout.bytes) {
    return DataLoss("a record of " + std::to_string(record.size()) + " bytes where a row's takes " +
                    std::to_string(layout.bytes));
  }
  for (size_t f = 0; f < layout.room.size(); ++f) {
    uint32_t len = 0;
    std::memcpy(&len, record.data() + layout.at[f], sizeof len);
    if (len == kParquetNullValue) {
      out[f] = std::nullopt;
      continue;
    }
    if (len > layout.room[f]) {
      return DataLoss("field " + std::to_string(f) + "'s length " + std::to_string(len) + " is more than its room of " +
                          std::to_string(layout.room[f]),
                      "@" + std::to_string(layout.at[f]));
    }
    out[f] = record.substr(layout.at[f] + sizeof len, len);
  }
  return Status::Ok();
}

}  // namespace meshload::formats
