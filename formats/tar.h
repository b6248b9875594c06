/// \file
/// Tar archives (POSIX ustar, with the GNU and PAX extensions webdataset
/// shards use), walked header by header: a pure state machine that says
/// which bytes it needs next and is fed them, so that the caller reads a
/// shard through any source, by ranged reads or as one buffer.
///
/// A member is one file of the archive. Its header is a 512-byte block:
///
///   offset  size  field
///   0       100   name (NUL-padded)
///   124     12    size, octal (or base-256, first byte 0x80, for large sizes)
///   148     8     checksum: the sum of the header's bytes, with this field
///                 as spaces, in octal
///   156     1     type: '0' or NUL a regular file, '5' a directory, 'x' a
///                 PAX header for the next member, 'g' a global PAX header,
///                 'L' a GNU long name for the next member, 'K' a long link
///   257     6     magic "ustar\0" (POSIX) or "ustar " (GNU)
///   345     155   prefix (POSIX): the name is prefix/name
///
/// and its data follows, padded to a multiple of 512. Two zero blocks (or
/// the end of the file at a block boundary) end the archive. A member's
/// offset is that of its first header: the PAX or GNU header before it,
/// as Python's tarfile (and so Energon's index) counts it.
///
/// Thread safety: a TarWalker is one caller's; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace meshload::formats {

inline constexpr uint64_t kTarBlock = 512;

struct TarMember {
  std::string name;
  bool regular = false;  // a regular file (not a directory, link or device)
  uint64_t offset = 0;   // its first header (a PAX or GNU one before it included)
  uint64_t data_offset = 0;
  uint64_t size = 0;  // data bytes
  /// Where the next member's header starts.
  uint64_t next_offset() const { return data_offset + (size + kTarBlock - 1) / kTarBlock * kTarBlock; }
};

class TarWalker {
 public:
  /// Walks `file` (its name, for messages), of `file_bytes` bytes.
  TarWalker(std::string file, uint64_t file_bytes);
  /// Walks the members from the header at `start` (a sample's first, from
  /// an index) up to `file_bytes` (where the caller stops: the end of the
  /// sample counts as the end of the archive).
  TarWalker(std::string file, uint64_t file_bytes, uint64_t start);

  struct Need {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  /// The bytes to read next and Feed(); meaningless once done().
  Need next() const { return need_; }
  /// Takes exactly the bytes next() asked for. A member, when its header
  /// (and the extended headers before it) are through; nullopt while more
  /// is needed or at the end. Errors name the file and the byte offset: a
  /// bad checksum or size field, a member that runs past the end of the
  /// file, a PAX record that does not parse.
  Result<std::optional<TarMember>> Feed(std::string_view bytes);
  /// The archive ended (end blocks, or the end of the file at a block
  /// boundary).
  bool done() const { return done_; }
  /// Where the archive's members end (the end blocks' offset): Energon's
  /// last index entry. Meaningful once done().
  uint64_t end_offset() const { return end_offset_; }

 private:
  enum class Reading { kHeader, kLongName, kPax };
  Status Error(uint64_t offset, const std::string& what) const;

  const std::string file_;
  const uint64_t file_bytes_;
  Need need_{0, kTarBlock};
  Reading reading_ = Reading::kHeader;
  bool done_ = false;
  uint64_t end_offset_ = 0;
  // What extended headers said about the next member.
  std::optional<uint64_t> first_header_;
  std::optional<std::string> long_name_;
  std::optional<std::string> pax_path_;
  std::optional<uint64_t> pax_size_;
};

/// The PAX records of an extended header's data ("LEN key=value\n" each):
/// the `path` and `size` values when given. `at` is the data's offset, for
/// messages.
struct PaxValues {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
};
Result<PaxValues> ParsePaxRecords(std::string_view records, std::string_view file, uint64_t at);

}  // namespace meshload::formats
