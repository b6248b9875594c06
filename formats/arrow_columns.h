/// \file
/// What the columnar files (formats/columnar.h) share once Arrow C++ has
/// decoded a group: how an Arrow column's type becomes a field, how a
/// dotted name finds a struct's member, and how a row's value is found in
/// the decoded arrays. Internal to formats/ (it includes Arrow's headers,
/// which the public headers do not).
#pragma once

#include <arrow/api.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/columnar.h"
#include "formats/dtype.h"

namespace meshload::formats {

/// A number column's dtype (bool included); nullopt for other types.
std::optional<DType> ArrowNumberDType(const arrow::DataType& t);

/// The field `name` asks for among `top` (a schema's top-level fields): a
/// top-level field of that name, else a struct's member by its dotted path
/// (the longest names first: a column may have a dot in its name). The
/// names from the top to it go to `path`; nullptr when there is none.
const arrow::Field* FindArrowField(const arrow::FieldVector& top, std::string_view name,
                                   std::vector<std::string>* path);

/// How field `f`, asked for as `name`, is delivered (kind, dtype, shape;
/// `leaves` as given). kInvalidArgument naming the column and its type when
/// meshload cannot deliver it.
Result<ParquetField> ClassifyArrowField(std::string_view name, const arrow::Field& f, std::vector<int> leaves);

/// Field `field`'s column (the top-level column path[0], then the struct
/// members down `path`) from its decoded `chunks`, which must hold `rows`
/// rows in all; adds the memory its values take to `bytes`. kDataLoss
/// (at `where`) for a null number inside a list or a row count that is not
/// `rows`.
Result<std::shared_ptr<const ParquetRowGroupValues::Column>> ArrowColumn(const ParquetField& field,
                                                                         const std::vector<std::string>& path,
                                                                         const arrow::ArrayVector& chunks,
                                                                         uint64_t rows, uint64_t& bytes,
                                                                         const std::string& where);

struct ParquetColumnToWrite;
/// A table of these columns (formats/parquet.h), for the writers.
Result<std::shared_ptr<arrow::Table>> ArrowTableOf(const std::vector<ParquetColumnToWrite>& columns);

/// Runs `f`, turning an exception (libparquet throws) into kDataLoss
/// prefixed by `what`.
template <typename F>
Status GuardArrow(F&& f, std::string_view what) {
  try {
    return f();
  } catch (const std::exception& e) {
    return DataLoss(std::string(what) + ": " + e.what());
  }
}

}  // namespace meshload::formats
