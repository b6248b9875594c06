/// \file
/// The DLPack 1.0 ABI pieces that Debian's dlpack.h (0.6) lacks: the version
/// record and DLManagedTensorVersioned, which the Python array API hands out
/// in a "dltensor_versioned" capsule when the consumer asks for
/// max_version >= (1, 0).
///
/// The declarations follow dlpack.h 1.0 field for field; a consumer in
/// another library reads this struct by offset, so the layout is the
/// contract, and the static_asserts below pin it as the 1.0 spec lays it
/// out on LP64 (x86-64, aarch64). A dlpack.h that is already 1.0 or newer
/// declares these itself; then its declarations are used and only checked.
///
/// Thread safety: declarations only.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1

extern "C" {

/// The DLPack ABI version a managed tensor was produced for.
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

/// DLManagedTensor with a version, read-only/copied flags, and the DLTensor
/// moved to the end so later ABI versions can grow the header compatibly.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  /// Owned by the producer; the consumer passes it back only via deleter.
  void* manager_ctx;
  /// Frees the whole DLManagedTensorVersioned (including itself); may be
  /// NULL. Called by the consumer, from any thread, possibly without the GIL.
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

}  // extern "C"

#endif  // DLPACK_MAJOR_VERSION < 1

#ifndef DLPACK_FLAG_BITMASK_READ_ONLY
/// The consumer must not write through dl_tensor.data.
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#endif
#ifndef DLPACK_FLAG_BITMASK_IS_COPIED
/// The producer copied the data for this export (meshload never does).
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#endif

namespace meshload::client::python {

/// What this module produces in a versioned capsule.
inline constexpr uint32_t kDLPackMajor = 1;
inline constexpr uint32_t kDLPackMinor = 0;

/// kDLBool arrived in DLPack 0.8; Debian's 0.6 enum does not have it.
inline constexpr uint8_t kDLBoolCode = 6;

// The 1.0 layout on LP64: an 8-byte version, two pointers, the flags, then
// the 48-byte DLTensor.
static_assert(sizeof(DLPackVersion) == 8);
static_assert(offsetof(DLPackVersion, major) == 0 && offsetof(DLPackVersion, minor) == 4);
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(offsetof(DLTensor, data) == 0 && offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 && offsetof(DLTensor, strides) == 32 &&
              offsetof(DLTensor, byte_offset) == 40 && sizeof(DLTensor) == 48);
static_assert(offsetof(DLManagedTensorVersioned, version) == 0);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8);
static_assert(offsetof(DLManagedTensorVersioned, deleter) == 16);
static_assert(offsetof(DLManagedTensorVersioned, flags) == 24);
static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) == 32);
static_assert(sizeof(DLManagedTensorVersioned) == 80);
// The legacy (0.x) struct that the "dltensor" capsule carries.
static_assert(offsetof(DLManagedTensor, dl_tensor) == 0 && offsetof(DLManagedTensor, manager_ctx) == 48 &&
              offsetof(DLManagedTensor, deleter) == 56 && sizeof(DLManagedTensor) == 64);

}  // namespace meshload::client::python
