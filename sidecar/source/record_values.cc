#include "sidecar/source/record_values.h"

#include <cctype>

#include "sidecar/source/source.h"

namespace meshload::sidecar::source {

std::vector<std::string> RecordFileNames(const planner::DatasetIndex& ds) {
  std::vector<std::string> out;
  out.reserve(ds.files().size());
  for (const planner::DatasetFile& f : ds.files()) out.push_back(RedactUri(f.path));
  return out;
}

RecordPlace PlaceOfRecord(const planner::DatasetIndex& ds, uint64_t id, std::vector<planner::Extent>& scratch,
                          const std::vector<std::string>& names) {
  std::vector<planner::Extent>& extents = scratch;
  extents.clear();
  ds.AppendExtents(id, extents);
  RecordPlace p;
  if (extents.empty()) return p;
  p.file = extents.front().file;
  p.offset = extents.front().offset;
  p.bytes = extents.front().length;
  p.file_name = &names[p.file];
  return p;
}

std::vector<std::string> WebDatasetExtensions(const planner::DatasetIndex& ds) {
  std::vector<std::string> out;
  for (const formats::FieldDecoding& f : ds.fields()) {
    std::string ext = f.name;
    for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out.push_back(std::move(ext));
  }
  return out;
}

Status RecordValues(const planner::DatasetIndex& ds, uint64_t id, std::string_view record, const RecordPlace& place,
                    const std::vector<std::string>& extensions, formats::FieldValues& values, std::string& key) {
  if (ds.format() == planner::DatasetFormat::kWebDataset) {
    return formats::WebDatasetSampleValues(record, *place.file_name, place.offset, extensions, values, key);
  }
  const planner::DatasetFile& file = ds.files()[place.file];
  if (ds.format() == planner::DatasetFormat::kTFRecord) {
    key = "record " + std::to_string(id - file.first);
    return formats::TfRecordSampleValues(record, *place.file_name, place.offset, ds.fields(), values);
  }
  key = "row " + std::to_string(id - file.first);
  return formats::MdsSampleValues(record, *file.mds, *place.file_name, place.offset, file.mds_columns, values);
}

Status MissingFieldError(const planner::DatasetIndex& ds, uint64_t id, const RecordPlace& place, const std::string& key,
                         size_t field, int64_t step) {
  return InvalidArgument("sample " + std::to_string(id) + " ('" + key + "') has no field '" + ds.fields()[field].name +
                             "' (step " + std::to_string(step) +
                             "); set spec.dataset.missingField: Skip to leave such samples out",
                         *place.file_name + "@" + std::to_string(place.offset));
}

}  // namespace meshload::sidecar::source
