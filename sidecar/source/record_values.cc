#include "sidecar/source/record_values.h"

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

std::unique_ptr<const planner::RecordDecoder> RecordDecoderOf(const planner::DatasetIndex& ds) {
  return planner::DriverOf(ds.format()).MakeDecoder(ds);
}

Status MissingFieldError(const planner::DatasetIndex& ds, uint64_t id, const RecordPlace& place, const std::string& key,
                         size_t field, int64_t step) {
  return InvalidArgument("sample " + std::to_string(id) + " ('" + key + "') has no field '" + ds.fields()[field].name +
                             "' (step " + std::to_string(step) +
                             "); set spec.dataset.missingField: Skip to leave such samples out",
                         *place.file_name + "@" + std::to_string(place.offset));
}

}  // namespace meshload::sidecar::source
