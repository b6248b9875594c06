/// \file
/// Megatron-LM's indexed dataset index (`PREFIX.idx`), as
/// megatron/core/datasets/indexed_dataset.py (`_IndexWriter`) writes it,
/// little-endian throughout:
///
///   offset  size            field
///   0       9               magic "MMIDIDX\x00\x00"
///   9       8  u64          version, 1
///   17      1  u8           dtype code (1 uint8, 2 int8, 3 int16, 4 int32,
///                           5 int64, 6 float64, 7 float32, 8 uint16)
///   18      8  u64          sequence count S
///   26      8  u64          document count D
///   34      4*S  int32      sequence lengths, in elements
///   ...     8*S  int64      sequence pointers, byte offsets into PREFIX.bin
///   ...     8*D  int64      document indices: the sequence each document
///                           starts at, then S (so D is documents + 1)
///   ...     S  int8         sequence modes: multimodal datasets only
///
/// A sample is one sequence: `lengths[i]` elements of the dtype at byte
/// `pointers[i]` of PREFIX.bin. The file does not say whether the modes
/// array is there (Megatron's reader is told); it is there exactly when S
/// bytes follow the document indices, and it is refused: meshload reads
/// text datasets.
///
/// Pure: bytes in, facts out, no I/O. Every error names the file and the
/// byte offset at fault.
///
/// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/dtype.h"

namespace meshload::formats {

inline constexpr std::string_view kMegatronIndexMagic{"MMIDIDX\x00\x00", 9};
inline constexpr uint64_t kMegatronIndexHeaderBytes = 34;

/// Megatron's DType codes, with the element type's name as the DataLoadJob
/// spells it (the same as numpy's).
struct MegatronDType {
  uint8_t code = 0;
  std::string_view name;  // "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"
  uint32_t bytes = 0;     // per element
};
/// The dtype of `code`; false when Megatron has no such code.
bool MegatronDTypeOf(uint8_t code, MegatronDType& out);
/// Megatron's dtype for `t`; false when Megatron has no code for it (bool,
/// uint32, uint64, float16, bfloat16).
bool MegatronDTypeFor(DType t, MegatronDType& out);
/// True when Megatron has a code for `t` (uint8, int8, int16, int32, int64,
/// float64, float32, uint16).
bool IsMegatronDType(DType t);
/// The DType of a Megatron dtype (its name parsed).
DType ToDType(const MegatronDType& t);

struct MegatronIndex {
  MegatronDType dtype;
  std::vector<int32_t> lengths;           // per sequence, elements
  std::vector<int64_t> pointers;          // per sequence, bytes into PREFIX.bin
  std::vector<int64_t> document_indices;  // per document, its first sequence; then the sequence count

  uint64_t sequences() const { return lengths.size(); }
  uint64_t documents() const { return document_indices.empty() ? 0 : document_indices.size() - 1; }
  /// Sequence i's bytes in PREFIX.bin.
  uint64_t SequenceBytes(uint64_t i) const { return static_cast<uint64_t>(lengths[i]) * dtype.bytes; }
  /// The bytes PREFIX.bin must have: the end of the sequence that ends last.
  uint64_t data_bytes_needed = 0;
};

/// Parses a whole `.idx` file. `name` (the file, for messages) prefixes
/// every error with the byte offset: "data.idx@17: unknown dtype code 9".
/// Checks: the magic, the version, the dtype code, that the counts fit the
/// file, lengths not negative, pointers not negative and each sequence
/// within int64, document indices starting at 0, never decreasing and
/// ending at the sequence count, and nothing after them (a multimodal
/// modes array is refused by name).
Result<MegatronIndex> ParseMegatronIndex(std::string_view bytes, std::string_view name);

/// The `.idx` bytes of `index`, as Megatron's `_IndexWriter` writes them
/// (byte-identical; without the multimodal modes array).
std::string MegatronIndexBytes(const MegatronIndex& index);

/// Checks the index against PREFIX.bin's size: every sequence lies inside
/// it. The error names the first sequence that does not, and its bytes.
Status CheckMegatronData(const MegatronIndex& index, std::string_view bin_name, uint64_t bin_bytes);

}  // namespace meshload::formats
