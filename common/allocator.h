/// \file
/// Process-wide allocator settings for long-running data-path processes.
///
/// glibc returns freed blocks of >= 128 KiB to the kernel (mmap threshold)
/// and trims the heap top eagerly, so a loop that allocates a few MiB per
/// step (a GlobalLoad plan: 65,536 sample ids, their ranges, the radix-sort
/// scratch) page-faults the same memory in again on every step, which costs
/// more than the work itself. KeepHeapForReuse() raises both thresholds so
/// that memory freed by one step is reused by the next.
///
/// Thread safety: call once at start-up, before other threads exist.
#pragma once

#include <cstddef>

namespace meshload {

/// Keeps blocks of up to `max_block_bytes` in the heap and stops trimming
/// it. Returns false if the C library rejected the setting.
bool KeepHeapForReuse(size_t max_block_bytes = size_t{256} << 20);

}  // namespace meshload
