#include "planner/format_driver.h"

#include <cstdlib>
#include "planner/drivers/drivers.h"

namespace meshload::planner {

const std::vector<const FormatDriver*>& FormatDrivers() {
  // One line per format, in the declaration's order.
  static const std::vector<const FormatDriver*> all = {
      &drivers::FixedRecord(),     &drivers::TokenStream(), &drivers::Npy(),
      &drivers::MegatronIndexed(), &drivers::WebDataset(),  &drivers::MDS(),
      &drivers::TFRecord(),        &drivers::Parquet(),     &drivers::Arrow(),
  };
  return all;
}

const FormatDriver& DriverOf(DatasetFormat format) {
  for (const FormatDriver* d : FormatDrivers()) {
    if (d->format() == format) return *d;
  }
  MESHLOAD_CHECK(false, "format " + std::string(ToString(format)) + " has no driver");
  std::abort();
}

std::string FormatsWith(bool FormatTraits::*trait, std::string_view last) {
  std::vector<std::string> names;
  for (const FormatDriver* d : FormatDrivers()) {
    if (d->traits().*trait) names.push_back(d->name());
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " " + std::string(last) + " " : ", ";
    out += names[i];
  }
  return out;
}

FormatDriver::IndexParts FormatDriver::Parts(DatasetIndex& idx) {
  return {idx.dtype_,           idx.num_samples_,  idx.sample_bytes_, idx.token_bytes_,
          idx.sequence_length_, idx.sample_shape_, idx.fields_,       idx.missing_field_,
          idx.files_,           idx.offsets_,      idx.sizes_,        idx.offsets_ascending_};
}

}  // namespace meshload::planner
