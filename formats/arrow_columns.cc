#include "formats/arrow_columns.h"

#include "formats/parquet.h"

#include <arrow/util/byte_size.h>

#include <algorithm>
#include <map>

namespace meshload::formats {
namespace {

bool IsBytes(arrow::Type::type id) {
  return id == arrow::Type::BINARY || id == arrow::Type::STRING || id == arrow::Type::LARGE_BINARY ||
         id == arrow::Type::LARGE_STRING || id == arrow::Type::BINARY_VIEW || id == arrow::Type::STRING_VIEW;
}

bool IsList(arrow::Type::type id) { return id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST; }

/// A chain of fixed-size lists ending in numbers other than bool (`t`
/// itself a number counts, shape []): the shape and dtype; nullopt else.
std::optional<std::pair<std::vector<uint64_t>, DType>> FixedNumbers(const arrow::DataType& t) {
  std::vector<uint64_t> shape;
  const arrow::DataType* at = &t;
  while (at->id() == arrow::Type::FIXED_SIZE_LIST) {
    const auto& fl = static_cast<const arrow::FixedSizeListType&>(*at);
    shape.push_back(static_cast<uint64_t>(fl.list_size()));
    at = fl.value_type().get();
  }
  std::optional<DType> dt = ArrowNumberDType(*at);
  if (!dt || *dt == DType::kBool) return std::nullopt;
  return std::make_pair(std::move(shape), *dt);
}

/// Nulls inside a list's or fixed-size list's values (below the row): a
/// number meshload cannot deliver.
bool NullsBelow(const arrow::Array& a) {
  std::shared_ptr<arrow::Array> values;
  if (a.type_id() == arrow::Type::LIST) {
    values = static_cast<const arrow::ListArray&>(a).values();
  } else if (a.type_id() == arrow::Type::LARGE_LIST) {
    values = static_cast<const arrow::LargeListArray&>(a).values();
  } else if (a.type_id() == arrow::Type::FIXED_SIZE_LIST) {
    values = static_cast<const arrow::FixedSizeListArray&>(a).values();
  } else {
    return false;
  }
  return values->null_count() > 0 || NullsBelow(*values);
}

}  // namespace

std::optional<DType> ArrowNumberDType(const arrow::DataType& t) {
  switch (t.id()) {
    case arrow::Type::BOOL: return DType::kBool;
    case arrow::Type::INT8: return DType::kInt8;
    case arrow::Type::UINT8: return DType::kUint8;
    case arrow::Type::INT16: return DType::kInt16;
    case arrow::Type::UINT16: return DType::kUint16;
    case arrow::Type::INT32: return DType::kInt32;
    case arrow::Type::UINT32: return DType::kUint32;
    case arrow::Type::INT64: return DType::kInt64;
    case arrow::Type::UINT64: return DType::kUint64;
    case arrow::Type::HALF_FLOAT: return DType::kFloat16;
    case arrow::Type::FLOAT: return DType::kFloat32;
    case arrow::Type::DOUBLE: return DType::kFloat64;
    default: return std::nullopt;
  }
}

const arrow::Field* FindArrowField(const arrow::FieldVector& top, std::string_view name,
                                   std::vector<std::string>* path) {
  for (const std::shared_ptr<arrow::Field>& f : top) {
    if (f->name() == name) {
      if (path) *path = {std::string(name)};
      return f.get();
    }
  }
  // A struct's member by its dotted path: the longest top-level name first.
  for (size_t dot = name.rfind('.'); dot != std::string_view::npos && dot > 0; dot = name.rfind('.', dot - 1)) {
    std::vector<std::string> p;
    const arrow::Field* at = FindArrowField(top, name.substr(0, dot), &p);
    if (!at) continue;
    std::string_view rest = name.substr(dot + 1);
    while (at && !rest.empty()) {
      if (at->type()->id() != arrow::Type::STRUCT) {
        at = nullptr;
        break;
      }
      const arrow::Field* next = nullptr;
      // The longest member name that matches.
      for (const std::shared_ptr<arrow::Field>& c : at->type()->fields()) {
        const std::string& n = c->name();
        if (rest.substr(0, n.size()) == n && (rest.size() == n.size() || rest[n.size()] == '.') &&
            (!next || n.size() > next->name().size())) {
          next = c.get();
        }
      }
      if (!next) {
        at = nullptr;
        break;
      }
      p.push_back(next->name());
      rest = rest.size() == next->name().size() ? std::string_view() : rest.substr(next->name().size() + 1);
      at = next;
    }
    if (at) {
      if (path) *path = std::move(p);
      return at;
    }
    if (dot == 0) break;
  }
  return nullptr;
}

Result<ParquetField> ClassifyArrowField(std::string_view name, const arrow::Field& f, std::vector<int> leaves) {
  ParquetField out;
  out.name = std::string(name);
  const arrow::DataType& t = *f.type();
  out.type = t.ToString();
  out.leaves = std::move(leaves);
  const auto refuse = [&](std::string_view why) {
    return InvalidArgument("column " + out.name + " is " + out.type + ": " + std::string(why));
  };
  if (IsBytes(t.id())) {
    out.kind = ParquetValueKind::kBytes;
  } else if (t.id() == arrow::Type::FIXED_SIZE_BINARY) {
    out.kind = ParquetValueKind::kFixedList;
    out.shape = {static_cast<uint64_t>(static_cast<const arrow::FixedSizeBinaryType&>(t).byte_width())};
  } else if (std::optional<DType> dt = ArrowNumberDType(t)) {
    out.kind = ParquetValueKind::kScalar;
    out.dtype = *dt;
  } else if (t.id() == arrow::Type::FIXED_SIZE_LIST) {
    auto fixed = FixedNumbers(t);
    if (!fixed) return refuse("a fixed-size list is a field when it holds numbers (or fixed-size lists of numbers)");
    out.kind = ParquetValueKind::kFixedList;
    out.shape = std::move(fixed->first);
    out.dtype = fixed->second;
  } else if (IsList(t.id())) {
    auto fixed = FixedNumbers(*static_cast<const arrow::BaseListType&>(t).value_type());
    if (!fixed) return refuse("a list is a field when it holds numbers (bool excepted) or fixed-size lists of them");
    out.kind = ParquetValueKind::kList;
    out.dtype = fixed->second;
  } else if (t.id() == arrow::Type::STRUCT) {
    std::string members;
    for (const std::shared_ptr<arrow::Field>& c : t.fields())
      members += (members.empty() ? "" : ", ") + out.name + "." + c->name();
    return refuse("name one of its members as the field (" + members + ")");
  } else if (t.id() == arrow::Type::DICTIONARY) {
    return refuse("dictionary-typed columns are not delivered; write the column with its value type");
  } else {
    return refuse(
        "meshload delivers binary and string columns, numbers, lists and fixed-size lists of numbers, and struct "
        "members");
  }
  if (out.leaves.size() != 1) return refuse("a field is one leaf column");
  return out;
}

// ---------------------------------------------------------------------------
// A group's decoded values

/// One field's decoded arrays (a chunked array: one chunk unless a group's
/// values pass 2 GiB) and how to find a row's bytes in them.
struct ParquetRowGroupValues::Column {
  struct Piece {
    int64_t first_row = 0;
    std::shared_ptr<arrow::Array> array;
    std::vector<uint8_t> bools;  // a bool column's values, a byte each
  };
  ParquetField field;
  std::vector<Piece> pieces;

  std::optional<std::string_view> Value(uint64_t row) const {
    size_t k = pieces.size() - 1;
    while (k > 0 && pieces[k].first_row > static_cast<int64_t>(row)) --k;
    const Piece& p = pieces[k];
    const int64_t i = static_cast<int64_t>(row) - p.first_row;
    const arrow::Array& a = *p.array;
    if (a.IsNull(i)) return std::nullopt;
    switch (field.kind) {
      case ParquetValueKind::kBytes:
        switch (a.type_id()) {
          case arrow::Type::BINARY:
          case arrow::Type::STRING: return static_cast<const arrow::BinaryArray&>(a).GetView(i);
          case arrow::Type::LARGE_BINARY:
          case arrow::Type::LARGE_STRING: return static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
          default: return static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
        }
      case ParquetValueKind::kScalar: {
        if (field.dtype == DType::kBool) return std::string_view(reinterpret_cast<const char*>(&p.bools[i]), 1);
        const size_t w = DTypeSize(field.dtype);
        const uint8_t* base = a.data()->buffers[1]->data();
        return std::string_view(reinterpret_cast<const char*>(base + (a.offset() + i) * w), w);
      }
      case ParquetValueKind::kFixedList:
        if (a.type_id() == arrow::Type::FIXED_SIZE_BINARY)
          return static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i);
        return ElementsOf(a, i, i + 1);
      case ParquetValueKind::kList: {
        // The list's values by reference: a shared_ptr copied for every
        // row would bounce its count between the threads reading the group.
        int64_t from = 0, to = 0;
        const arrow::Array* values = nullptr;
        if (a.type_id() == arrow::Type::LIST) {
          const auto& l = static_cast<const arrow::ListArray&>(a);
          from = l.value_offset(i);
          to = l.value_offset(i + 1);
          values = l.values().get();
        } else {
          const auto& l = static_cast<const arrow::LargeListArray&>(a);
          from = l.value_offset(i);
          to = l.value_offset(i + 1);
          values = l.values().get();
        }
        return ElementsOf(*values, from, to);
      }
    }
    return std::nullopt;
  }

  /// Elements [from, to) of a chain of fixed-size lists ending in numbers
  /// (`a` itself numbers when the chain is empty): one run of bytes.
  std::string_view ElementsOf(const arrow::Array& a, int64_t from, int64_t to) const {
    if (a.type_id() == arrow::Type::FIXED_SIZE_LIST) {
      const auto& fl = static_cast<const arrow::FixedSizeListArray&>(a);
      const int64_t n = fl.value_length();
      return ElementsOf(*fl.values(), fl.value_offset(from), fl.value_offset(from) + (to - from) * n);
    }
    const size_t w = DTypeSize(field.dtype);
    const uint8_t* base = a.data()->buffers[1] ? a.data()->buffers[1]->data() : nullptr;
    if (to <= from || base == nullptr) return std::string_view();
    return std::string_view(reinterpret_cast<const char*>(base + (a.offset() + from) * w),
                            static_cast<size_t>(to - from) * w);
  }
};

Result<std::shared_ptr<const ParquetRowGroupValues::Column>> ArrowColumn(const ParquetField& field,
                                                                         const std::vector<std::string>& path,
                                                                         const arrow::ArrayVector& chunks,
                                                                         uint64_t rows, uint64_t& bytes,
                                                                         const std::string& where) {
  auto col = std::make_shared<ParquetRowGroupValues::Column>();
  col->field = field;
  int64_t first = 0;
  for (const std::shared_ptr<arrow::Array>& chunk : chunks) {
    std::shared_ptr<arrow::Array> a = chunk;
    for (size_t k = 1; k < path.size(); ++k) {
      if (a->type_id() != arrow::Type::STRUCT) return Internal("column " + path[k - 1] + " is not a struct", where);
      const auto& s = static_cast<const arrow::StructArray&>(*a);
      const int idx = s.struct_type()->GetFieldIndex(path[k]);
      if (idx < 0) return Internal("the decoded struct has no member " + path[k], where);
      // The member's values with the struct's nulls applied.
      auto flat = s.GetFlattenedField(idx);
      if (!flat.ok()) return DataLoss(flat.status().ToString(), where);
      a = std::move(*flat);
    }
    if (NullsBelow(*a)) {
      return DataLoss("column " + field.name + " holds a null number inside a list; meshload delivers lists of numbers",
                      where);
    }
    ParquetRowGroupValues::Column::Piece piece;
    piece.first_row = first;
    if (field.kind == ParquetValueKind::kScalar && field.dtype == DType::kBool) {
      const auto& b = static_cast<const arrow::BooleanArray&>(*a);
      piece.bools.resize(static_cast<size_t>(b.length()));
      for (int64_t i = 0; i < b.length(); ++i) piece.bools[static_cast<size_t>(i)] = b.IsValid(i) && b.Value(i) ? 1 : 0;
      bytes += piece.bools.size();
    }
    first += a->length();
    bytes += static_cast<uint64_t>(arrow::util::TotalBufferSize(*a));
    piece.array = std::move(a);
    col->pieces.push_back(std::move(piece));
  }
  if (static_cast<uint64_t>(first) != rows) {
    return DataLoss("column " + field.name + " decodes to " + std::to_string(first) + " rows, the file says " +
                        std::to_string(rows),
                    where);
  }
  return std::shared_ptr<const ParquetRowGroupValues::Column>(std::move(col));
}

std::optional<std::string_view> ParquetRowGroupValues::Value(size_t f, uint64_t row) const {
  return columns_[f]->Value(row);
}

std::string ColumnarFile::SchemaDifference(const ColumnarFile& other) const {
  const auto mine = TypedColumns();
  const auto theirs = other.TypedColumns();
  const std::map<std::string, std::string> their_types(theirs.begin(), theirs.end());
  const std::map<std::string, std::string> my_types(mine.begin(), mine.end());
  for (const auto& [name, type] : mine) {
    auto o = their_types.find(name);
    if (o == their_types.end()) return "column " + name + ": missing there";
    if (o->second != type) return "column " + name + ": " + type + " here, " + o->second + " there";
  }
  for (const auto& [name, type] : theirs) {
    if (!my_types.count(name)) return "column " + name + ": only there";
  }
  return "";
}

// ---------------------------------------------------------------------------
// Writing

namespace {

std::shared_ptr<arrow::DataType> ArrowTypeOf(DType t) {
  switch (t) {
    case DType::kBool: return arrow::boolean();
    case DType::kInt8: return arrow::int8();
    case DType::kUint8: return arrow::uint8();
    case DType::kInt16: return arrow::int16();
    case DType::kUint16: return arrow::uint16();
    case DType::kInt32: return arrow::int32();
    case DType::kUint32: return arrow::uint32();
    case DType::kInt64: return arrow::int64();
    case DType::kUint64: return arrow::uint64();
    case DType::kFloat16: return arrow::float16();
    case DType::kFloat32: return arrow::float32();
    case DType::kFloat64: return arrow::float64();
    case DType::kBFloat16: return nullptr;
  }
  return nullptr;
}

/// `n` numbers of `dtype` from their bytes back to back.
Result<std::shared_ptr<arrow::Array>> Numbers(DType dtype, const std::string& bytes, int64_t n) {
  std::shared_ptr<arrow::DataType> type = ArrowTypeOf(dtype);
  if (!type) return InvalidArgument(std::string(DTypeName(dtype)) + " has no Arrow type");
  if (dtype == DType::kBool) {
    arrow::BooleanBuilder b;
    for (int64_t i = 0; i < n; ++i) {
      if (!b.Append(bytes[static_cast<size_t>(i)] != 0).ok()) return Internal("arrow: append");
    }
    std::shared_ptr<arrow::Array> out;
    if (!b.Finish(&out).ok()) return Internal("arrow: finish");
    return out;
  }
  return arrow::MakeArray(arrow::ArrayData::Make(type, n, {nullptr, arrow::Buffer::FromString(bytes)}));
}

}  // namespace

Result<std::shared_ptr<arrow::Table>> ArrowTableOf(const std::vector<ParquetColumnToWrite>& columns) {
  std::vector<std::shared_ptr<arrow::Field>> fields;
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  for (const ParquetColumnToWrite& c : columns) {
    const auto n = static_cast<int64_t>(c.values.size());
    const size_t es = DTypeSize(c.dtype);
    std::shared_ptr<arrow::Array> a;
    if (c.kind == ParquetValueKind::kBytes) {
      arrow::BinaryBuilder b;
      for (const std::string& v : c.values) {
        if (!b.Append(v).ok()) return Internal("arrow: append", c.name);
      }
      if (!b.Finish(&a).ok()) return Internal("arrow: finish", c.name);
    } else if (c.kind == ParquetValueKind::kScalar) {
      std::string all;
      for (const std::string& v : c.values) {
        if (v.size() != es) return InvalidArgument("a value of " + std::to_string(v.size()) + " bytes", c.name);
        all += v;
      }
      MESHLOAD_ASSIGN_OR_RETURN(a, Numbers(c.dtype, all, n));
    } else if (c.kind == ParquetValueKind::kList) {
      std::string all;
      std::vector<int32_t> offsets = {0};
      for (const std::string& v : c.values) {
        if (v.size() % es != 0) return InvalidArgument("a list of " + std::to_string(v.size()) + " bytes", c.name);
        all += v;
        offsets.push_back(static_cast<int32_t>(all.size() / es));
      }
      MESHLOAD_ASSIGN_OR_RETURN(auto values, Numbers(c.dtype, all, static_cast<int64_t>(all.size() / es)));
      auto off = arrow::MakeArray(arrow::ArrayData::Make(
          arrow::int32(), n + 1,
          {nullptr, arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(offsets.data()),
                                                          offsets.size() * sizeof(int32_t)))}));
      auto list = arrow::ListArray::FromArrays(*off, *values);
      if (!list.ok()) return Internal("arrow: " + list.status().ToString(), c.name);
      a = *list;
    } else {
      return InvalidArgument("fixed-size lists are not written", c.name);
    }
    fields.push_back(arrow::field(c.name, a->type()));
    arrays.push_back(std::move(a));
  }
  return arrow::Table::Make(arrow::schema(fields), arrays);
}

}  // namespace meshload::formats
