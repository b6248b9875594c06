/// \file
/// A dataset written by Hugging Face `datasets`' `save_to_disk`: a
/// `Dataset` is a folder of Arrow IPC streams (`data-00000-of-00003.arrow`,
/// formats/arrow_ipc.h) with `state.json` (whose `_data_files` lists them,
/// in order) and `dataset_info.json`; a `DatasetDict` is a folder with
/// `dataset_dict.json` (`{"splits": ["train", "test"]}`) and one such
/// folder per split.
///
/// Pure: the JSON files' bytes in, names out. Errors name the key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshload::formats {

/// The most bytes state.json or dataset_dict.json may take.
inline constexpr uint64_t kSavedDatasetJsonMaxBytes = 16ull << 20;

/// The splits `dataset_dict.json` lists, in its order. kDataLoss naming the
/// key when it is not JSON, or `splits` is not a list of split names.
Result<std::vector<std::string>> SavedDatasetSplits(std::string_view dataset_dict_json);

/// The Arrow files `state.json`'s `_data_files` list, in order: plain file
/// names in the Dataset's folder. kDataLoss naming the key when it is not
/// JSON, `_data_files` is missing or not a list of `{"filename": ...}`, or a
/// name is not a file of that folder (a path, "..", empty).
Result<std::vector<std::string>> SavedDatasetFiles(std::string_view state_json);

}  // namespace meshload::formats
