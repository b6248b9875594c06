/// \file
/// Element types of dataset samples (TokenStream tokens, Npy arrays).
///
/// Thread safety: pure functions over immutable tables.
#pragma once

#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace meshload::formats {

enum class DType {
  kBool,
  kInt8,
  kUint8,
  kInt16,
  kUint16,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

/// Parses the spec spelling: bool, int8, uint8, int16, uint16, int32, uint32,
/// int64, uint64, float16, bfloat16, float32, float64. The error lists them.
Result<DType> ParseDType(std::string_view name);
/// The spec spelling of `t`.
std::string_view DTypeName(DType t);
/// Bytes per element.
size_t DTypeSize(DType t);
/// The comma-separated list of valid spellings, for error messages.
std::string_view DTypeNames();
/// True for the signed and unsigned integer types (not bool).
bool IsIntegerDType(DType t);

/// DLPack type code (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLBool=6)
/// and bit width, so that the client can describe tensors without a table.
struct DLPackType {
  unsigned char code;
  unsigned char bits;
};
DLPackType ToDLPackType(DType t);

}  // namespace meshload::formats
