/// \file
/// The values of a WebDataset, MDS or TFRecord sample: its record (the bytes the
/// index gives it, read whole) split into the job's fields, and each field
/// decoded as the index says (formats/fields.h). What the step loader does
/// after reading a step's records, and what `meshload run --local`'s
/// trainer checks a staged field against.
///
/// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/fields.h"
#include "planner/dataset_index.h"
#include "planner/format_driver.h"

namespace meshload::sidecar::source {

/// The dataset's files as messages name them (redacted), once per reader:
/// what PlaceOfRecord points into.
std::vector<std::string> RecordFileNames(const planner::DatasetIndex& ds);

/// Where sample `id`'s record is and what it is called in messages
/// (`scratch`: the caller's, reused; `names`: RecordFileNames(ds)).
struct RecordPlace {
  uint32_t file = 0;
  uint64_t offset = 0;  // of the record in its file
  uint64_t bytes = 0;
  const std::string* file_name = nullptr;  // the file, redacted for messages (in `names`)
};
RecordPlace PlaceOfRecord(const planner::DatasetIndex& ds, uint64_t id, std::vector<planner::Extent>& scratch,
                          const std::vector<std::string>& names);

/// The decoder of `ds`'s records (its format driver's; null when `ds` is
/// not of a record format). `ds` must outlive it.
std::unique_ptr<const planner::RecordDecoder> RecordDecoderOf(const planner::DatasetIndex& ds);

/// Sample `id`'s wanted values from its `record` (views into it; nullopt: a
/// field the sample lacks) and its name for messages (`key`: the
/// WebDataset key, the MDS row, the TFRecord record), by `decoder`
/// (RecordDecoderOf). Errors name the file and byte.
inline Status RecordValues(const planner::RecordDecoder& decoder, uint64_t id, std::string_view record,
                           const RecordPlace& place, formats::FieldValues& values, std::string& key) {
  return decoder.Decode(id, record, place.file, *place.file_name, place.offset, values, key);
}

/// The error for sample `id` lacking field `field` (missingField: Error).
Status MissingFieldError(const planner::DatasetIndex& ds, uint64_t id, const RecordPlace& place, const std::string& key,
                         size_t field, int64_t step);

}  // namespace meshload::sidecar::source
