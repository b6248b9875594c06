#include "formats/dtype.h"

#include <array>
#include <string>

namespace meshload::formats {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
  DLPackType dl;
};

constexpr std::array<DTypeInfo, 13> kTypes = {{
    {DType::kBool, "bool", 1, {6, 8}},
    {DType::kInt8, "int8", 1, {0, 8}},
    {DType::kUint8, "uint8", 1, {1, 8}},
    {DType::kInt16, "int16", 2, {0, 16}},
    {DType::kUint16, "uint16", 2, {1, 16}},
    {DType::kInt32, "int32", 4, {0, 32}},
    {DType::kUint32, "uint32", 4, {1, 32}},
    {DType::kInt64, "int64", 8, {0, 64}},
    {DType::kUint64, "uint64", 8, {1, 64}},
    {DType::kFloat16, "float16", 2, {2, 16}},
    {DType::kBFloat16, "bfloat16", 2, {4, 16}},
    {DType::kFloat32, "float32", 4, {2, 32}},
    {DType::kFloat64, "float64", 8, {2, 64}},
}};

const DTypeInfo& Info(DType t) { return kTypes[static_cast<size_t>(t)]; }

}  // namespace

Result<DType> ParseDType(std::string_view name) {
  for (const auto& info : kTypes) {
    if (info.name == name) return info.type;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "'; expected one of " + std::string(DTypeNames()));
}

std::string_view DTypeName(DType t) { return Info(t).name; }
size_t DTypeSize(DType t) { return Info(t).size; }
bool IsIntegerDType(DType t) { return Info(t).dl.code == 0 || Info(t).dl.code == 1; }
DLPackType ToDLPackType(DType t) { return Info(t).dl; }

std::string_view DTypeNames() {
  return "bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, "
         "float32, float64";
}

}  // namespace meshload::formats
