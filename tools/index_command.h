/// \file
/// `meshload index`: writes the index a WebDataset shard needs
/// (Energon's SHARD.tar.idx) by reading the shard's tar headers through
/// the storage sources.
#pragma once

#include <string>
#include <vector>

namespace meshload::tools {

int RunIndex(const std::vector<std::string>& args);

}  // namespace meshload::tools
