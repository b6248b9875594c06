#include "formats/megatron_index.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace meshload::formats {
namespace {

constexpr MegatronDType kDTypes[] = {
    {1, "uint8", 1}, {2, "int8", 1},    {3, "int16", 2},   {4, "int32", 4},
    {5, "int64", 8}, {6, "float64", 8}, {7, "float32", 4}, {8, "uint16", 2},
};

// Little-endian reads at a checked position.
template <class T>
T Load(std::string_view bytes, uint64_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

Status At(std::string_view name, uint64_t offset, const std::string& what) {
  return InvalidArgument(what, std::string(name) + "@" + std::to_string(offset));
}

}  // namespace

bool MegatronDTypeOf(uint8_t code, MegatronDType& out) {
  for (const MegatronDType& d : kDTypes) {
    if (d.code == code) {
      out = d;
      return true;
    }
  }
  return false;
}

bool MegatronDTypeFor(DType t, MegatronDType& out) {
  for (const MegatronDType& d : kDTypes) {
    if (d.name == DTypeName(t)) {
      out = d;
      return true;
    }
  }
  return false;
}

bool IsMegatronDType(DType t) {
  MegatronDType unused;
  return MegatronDTypeFor(t, unused);
}

std::string MegatronIndexBytes(const MegatronIndex& index) {
  std::string out(kMegatronIndexMagic);
  auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t{1});
  put(index.dtype.code);
  put(static_cast<uint64_t>(index.lengths.size()));
  put(static_cast<uint64_t>(index.document_indices.size()));
  out.append(reinterpret_cast<const char*>(index.lengths.data()), index.lengths.size() * sizeof(int32_t));
  out.append(reinterpret_cast<const char*>(index.pointers.data()), index.pointers.size() * sizeof(int64_t));
  out.append(reinterpret_cast<const char*>(index.document_indices.data()),
             index.document_indices.size() * sizeof(int64_t));
  return out;
}

DType ToDType(const MegatronDType& t) {
  // Every Megatron dtype name is a DataLoadJob dtype name.
  Result<DType> d = ParseDType(t.name);
  return d.ok() ? *d : DType::kUint8;
}

Result<MegatronIndex> ParseMegatronIndex(std::string_view bytes, std::string_view name) {
  const uint64_t size = bytes.size();
  if (size < kMegatronIndexHeaderBytes) {
    return At(name, size,
              "a Megatron index is at least " + std::to_string(kMegatronIndexHeaderBytes) +
                  " bytes; this one ends after " + std::to_string(size));
  }
  if (bytes.substr(0, kMegatronIndexMagic.size()) != kMegatronIndexMagic) {
    return At(name, 0, "not a Megatron indexed dataset index (the magic is not MMIDIDX\\x00\\x00)");
  }
  if (const uint64_t version = Load<uint64_t>(bytes, 9); version != 1) {
    return At(name, 9, "Megatron index version " + std::to_string(version) + "; only version 1 is read");
  }
  MegatronIndex index;
  if (const uint8_t code = Load<uint8_t>(bytes, 17); !MegatronDTypeOf(code, index.dtype)) {
    return At(name, 17, "unknown dtype code " + std::to_string(code) + " (Megatron's are 1 to 8)");
  }
  const uint64_t sequences = Load<uint64_t>(bytes, 18);
  const uint64_t documents = Load<uint64_t>(bytes, 26);
  // What the counts need, without overflow: each array is checked against
  // what is left of the file before it is sized.
  uint64_t at = kMegatronIndexHeaderBytes;
  auto need = [&](uint64_t count, uint64_t width, const char* what) -> Status {
    const uint64_t left = size - at;
    if (count > left / width) {
      return At(name, at,
                std::string(what) + ": " + std::to_string(count) + " entries of " + std::to_string(width) +
                    " bytes do not fit in the " + std::to_string(left) + " bytes left (a truncated index?)");
    }
    return Status::Ok();
  };
  MESHLOAD_RETURN_IF_ERROR(need(sequences, 4, "sequence lengths"));
  index.lengths.resize(sequences);
  if (sequences > 0) std::memcpy(index.lengths.data(), bytes.data() + at, sequences * 4);
  const uint64_t lengths_at = at;
  at += sequences * 4;
  MESHLOAD_RETURN_IF_ERROR(need(sequences, 8, "sequence pointers"));
  index.pointers.resize(sequences);
  if (sequences > 0) std::memcpy(index.pointers.data(), bytes.data() + at, sequences * 8);
  const uint64_t pointers_at = at;
  at += sequences * 8;
  MESHLOAD_RETURN_IF_ERROR(need(documents, 8, "document indices"));
  index.document_indices.resize(documents);
  if (documents > 0) std::memcpy(index.document_indices.data(), bytes.data() + at, documents * 8);
  const uint64_t documents_at = at;
  at += documents * 8;
  if (at != size) {
    if (size - at == sequences) {
      return At(name, at,
                "a multimodal index (a mode for each of the " + std::to_string(sequences) +
                    " sequences follows the document indices); meshload reads text datasets only");
    }
    return At(name, at, std::to_string(size - at) + " bytes after the document indices, which end the index");
  }

  const uint64_t width = index.dtype.bytes;
  for (uint64_t i = 0; i < sequences; ++i) {
    if (index.lengths[i] < 0) {
      return At(name, lengths_at + 4 * i,
                "sequence " + std::to_string(i) + " has a negative length (" + std::to_string(index.lengths[i]) + ")");
    }
    const int64_t p = index.pointers[i];
    const uint64_t bytes_i = static_cast<uint64_t>(index.lengths[i]) * width;
    if (p < 0 || bytes_i > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - p)) {
      return At(name, pointers_at + 8 * i,
                "sequence " + std::to_string(i) + " starts at byte " + std::to_string(p) +
                    ", which is not a place in a data file");
    }
    index.data_bytes_needed = std::max(index.data_bytes_needed, static_cast<uint64_t>(p) + bytes_i);
  }
  if (documents == 0) {
    return At(name, 26, "no document indices (Megatron writes at least the leading 0)");
  }
  for (uint64_t d = 0; d < documents; ++d) {
    const int64_t v = index.document_indices[d];
    const int64_t prev = d == 0 ? 0 : index.document_indices[d - 1];
    if ((d == 0 && v != 0) || v < prev || static_cast<uint64_t>(v) > sequences) {
      return At(name, documents_at + 8 * d,
                "document index " + std::to_string(d) + " is " + std::to_string(v) +
                    "; they start at 0, never go down and end at the sequence count (" + std::to_string(sequences) +
                    ")");
    }
  }
  if (static_cast<uint64_t>(index.document_indices.back()) != sequences) {
    return At(name, documents_at + 8 * (documents - 1),
              "the last document index is " + std::to_string(index.document_indices.back()) +
                  ", not the sequence count (" + std::to_string(sequences) + ")");
  }
  return index;
}

Status CheckMegatronData(const MegatronIndex& index, std::string_view bin_name, uint64_t bin_bytes) {
  if (index.data_bytes_needed <= bin_bytes) return Status::Ok();
  for (uint64_t i = 0; i < index.sequences(); ++i) {
    const uint64_t end = static_cast<uint64_t>(index.pointers[i]) + index.SequenceBytes(i);
    if (end > bin_bytes) {
      return InvalidArgument("sequence " + std::to_string(i) + " is bytes " + std::to_string(index.pointers[i]) +
                                 " to " + std::to_string(end) + " but the file has " + std::to_string(bin_bytes) +
                                 " (the index points past the data)",
                             std::string(bin_name));
    }
  }
  return Status::Ok();  // unreachable: data_bytes_needed is the largest end
}

}  // namespace meshload::formats
