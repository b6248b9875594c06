/// \file
/// A strict parser (and writer) for NumPy `.npy` headers.
///
/// An `.npy` file is the magic "\x93NUMPY", a major and a minor version byte, a
/// little-endian header length (2 bytes in version 1.0, 4 in 2.0 and 3.0), that
/// many bytes of a Python dict literal ending in '\n', and then the raw array
/// data. meshload reads only the subset numpy writes for plain C-order arrays of
/// little-endian numbers, and rejects everything else with an error naming the
/// byte at fault, so that a bad shard is reported where it is read rather than
/// surfacing later as garbage tokens.
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

struct NpyHeader {
  int major_version = 0;
  int minor_version = 0;
  /// The descr as written in the file, e.g. "<u2", "|u1" or "=f4".
  std::string descr;
  /// Mapped from descr.
  DType dtype = DType::kUint8;
  /// Always false in a successful parse: Fortran order is rejected.
  bool fortran_order = false;
  /// May be empty (a scalar).
  std::vector<uint64_t> shape;
  /// Bytes before the array data: magic + version + length field + header_len.
  uint64_t data_offset = 0;
  /// Product of shape (1 for a scalar, 0 if any dimension is 0).
  uint64_t element_count = 0;
  /// element_count * DTypeSize(dtype).
  uint64_t data_bytes = 0;
};

/// The most dimensions a shape may have (numpy 1.x's NPY_MAXDIMS); bounds the
/// memory one header can make the parser allocate.
inline constexpr size_t kNpyMaxRank = 32;
/// The cap on header_len for version 2.0 and 3.0 headers (version 1.0 is
/// limited to 65535 by its 2-byte field). numpy's own headers are < 1 KiB for
/// the arrays meshload reads; a larger value means a corrupt or hostile file.
inline constexpr uint64_t kNpyMaxHeaderLen = uint64_t{1} << 20;

/// Parses an `.npy` header from the first bytes of a file. `bytes` may be
/// longer than the header (e.g. the whole file); only the header is examined,
/// and whether the data fits in the file is the caller's check.
///
/// Accepts versions 1.0, 2.0 and 3.0, a dict with exactly the keys 'descr',
/// 'fortran_order' and 'shape' in any order (single or double quotes, optional
/// trailing commas, any whitespace between tokens), descr one of b1, i1, u1,
/// i2, u2, i4, u4, i8, u8, f2, f4, f8 with byte order '<', '|' or '=' ('>' only
/// for one-byte types), fortran_order False, and a shape of at most
/// kNpyMaxRank dimensions whose element and byte counts fit in uint64. After
/// the '}' only spaces may follow, and the header's last byte must be '\n'.
///
/// Errors: kDataLoss when `bytes` is shorter than the header says
/// ("truncated: header needs N bytes, have M"), otherwise kInvalidArgument.
/// The location is "@<offset>" of the offending byte, counted from the start
/// of the file, e.g. "@6" for a bad major version.
Result<NpyHeader> ParseNpyHeader(std::string_view bytes);

/// The first bytes a reader must fetch to learn the header's length.
inline constexpr size_t kNpyPreambleBytes = 12;

/// The header's length, data_offset (the whole header, preamble included),
/// from the file's first kNpyPreambleBytes bytes (or all of a shorter
/// file), so that a reader fetches exactly the header and never the data
/// (sidecar/source/dataset_facts.h reads .npy headers through the storage
/// sources). Errors as ParseNpyHeader's for the preamble.
Result<uint64_t> NpyDataOffset(std::string_view first_bytes);

/// Builds a version-1.0 header for a C-order array of `dtype` and `shape`,
/// byte for byte as numpy (>= 1.23) writes it: the dict, spare spaces for
/// growing the first axis, padding to a multiple of 64 bytes, and '\n'.
///
/// Errors: kInvalidArgument for bfloat16 (numpy has no descr for it), for more
/// than kNpyMaxRank dimensions, and for shapes whose byte count overflows
/// uint64 — i.e. exactly the headers ParseNpyHeader would reject.
Result<std::string> MakeNpyHeader(DType dtype, const std::vector<uint64_t>& shape);

/// The numpy descr of `dtype`: bool "|b1", int8 "|i1", uint8 "|u1", and
/// little-endian "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"
/// for the others.
///
/// Errors: kInvalidArgument for bfloat16.
Result<std::string> NpyDescr(DType dtype);

}  // namespace meshload::formats
