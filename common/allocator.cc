#include "common/allocator.h"

#include <malloc.h>

#include <climits>

namespace meshload {

bool KeepHeapForReuse(size_t max_block_bytes) {
  const int threshold = max_block_bytes > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(max_block_bytes);
  const bool mmap_ok = ::mallopt(M_MMAP_THRESHOLD, threshold) == 1;
  const bool trim_ok = ::mallopt(M_TRIM_THRESHOLD, threshold) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace meshload
