#include "formats/tar.h"

#include <algorithm>
#include <cstring>

namespace meshload::formats {
namespace {

// Extended headers (long names, PAX records) larger than this are refused:
// a name is at most a few KiB; a larger one is a damaged or hostile file.
constexpr uint64_t kMaxExtensionBytes = 1 << 20;

bool AllZero(std::string_view b) {
  return std::all_of(b.begin(), b.end(), [](char c) { return c == 0; });
}

// A NUL-terminated field of at most `n` bytes.
std::string Field(std::string_view block, size_t at, size_t n) {
  std::string_view f = block.substr(at, n);
  return std::string(f.substr(0, f.find('\0')));
}

// An octal number field (spaces or NULs around the digits), or base-256
// (GNU: first byte 0x80, big-endian after it). False when it is neither.
bool Number(std::string_view block, size_t at, size_t n, uint64_t& out) {
  std::string_view f = block.substr(at, n);
  if (static_cast<unsigned char>(f[0]) == 0x80) {
    out = 0;
    for (size_t i = 1; i < f.size(); ++i) {
      if (out >> 56) return false;
      out = out << 8 | static_cast<unsigned char>(f[i]);
    }
    return true;
  }
  size_t i = 0;
  while (i < f.size() && (f[i] == ' ' || f[i] == '\0')) ++i;
  if (i == f.size()) {
    out = 0;  // an empty field reads as 0, as tarfile does
    return true;
  }
  out = 0;
  size_t digits = 0;
  for (; i < f.size() && f[i] >= '0' && f[i] <= '7'; ++i, ++digits) {
    if (out >> 60) return false;
    out = out * 8 + static_cast<uint64_t>(f[i] - '0');
  }
  for (; i < f.size(); ++i) {
    if (f[i] != ' ' && f[i] != '\0') return false;
  }
  return digits > 0;
}

uint64_t Padded(uint64_t n) { return (n + kTarBlock - 1) / kTarBlock * kTarBlock; }

}  // namespace

TarWalker::TarWalker(std::string file, uint64_t file_bytes) : file_(std::move(file)), file_bytes_(file_bytes) {
  if (file_bytes_ == 0) done_ = true;
  // Shorter than a header: what there is, which Feed refuses.
  need_.bytes = std::min(kTarBlock, file_bytes_);
}

TarWalker::TarWalker(std::string file, uint64_t file_bytes, uint64_t start)
    : file_(std::move(file)), file_bytes_(file_bytes) {
  need_.offset = start;
  if (start >= file_bytes_) {
    done_ = true;
    end_offset_ = file_bytes_;
  }
  need_.bytes = std::min(kTarBlock, file_bytes_ - std::min(start, file_bytes_));
}

Status TarWalker::Error(uint64_t offset, const std::string& what) const {
  return InvalidArgument(what, file_ + "@" + std::to_string(offset));
}

Result<std::optional<TarMember>> TarWalker::Feed(std::string_view bytes) {
  if (done_) return Error(need_.offset, "the archive has ended; nothing more to read");
  if (bytes.size() != need_.bytes) {
    return Error(need_.offset, "fed " + std::to_string(bytes.size()) + " bytes where " + std::to_string(need_.bytes) +
                                   " were asked for");
  }
  const uint64_t at = need_.offset;
  // Where the header after `data_at` + `size` bytes is, or the end.
  auto header_at = [&](uint64_t offset) -> Status {
    // The end of the file there (or inside the padding of the member
    // before: its data is whole) ends the archive, as for Python's tarfile.
    if (offset >= file_bytes_) {
      done_ = true;
      end_offset_ = file_bytes_;
      if (first_header_) return Error(*first_header_, "an extended header with no member after it");
      return Status::Ok();
    }
    if (offset + kTarBlock > file_bytes_) {
      return Error(offset, "the file ends " + std::to_string(file_bytes_ - offset) +
                               " bytes into a header (a truncated archive?)");
    }
    need_ = {offset, kTarBlock};
    reading_ = Reading::kHeader;
    return Status::Ok();
  };

  if (reading_ == Reading::kLongName || reading_ == Reading::kPax) {
    if (reading_ == Reading::kLongName) {
      long_name_ = std::string(bytes.substr(0, bytes.find('\0')));
    } else {
      MESHLOAD_ASSIGN_OR_RETURN(PaxValues pax, ParsePaxRecords(bytes, file_, at));
      if (pax.path) pax_path_ = std::move(pax.path);
      if (pax.size) pax_size_ = pax.size;
    }
    MESHLOAD_RETURN_IF_ERROR(header_at(at + Padded(bytes.size())));
    return std::optional<TarMember>();
  }

  // A header block.
  if (bytes.size() < kTarBlock) {
    return Error(at, "the file ends " + std::to_string(bytes.size()) + " bytes into a header (a truncated archive?)");
  }
  if (AllZero(bytes)) {
    if (first_header_) return Error(*first_header_, "an extended header with no member after it");
    done_ = true;
    end_offset_ = at;
    return std::optional<TarMember>();
  }
  uint64_t stored = 0;
  if (!Number(bytes, 148, 8, stored)) return Error(at + 148, "the header's checksum field is not a number");
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    const char c = (i >= 148 && i < 156) ? ' ' : bytes[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  if (stored != unsigned_sum && static_cast<int64_t>(stored) != signed_sum) {
    return Error(at, "bad header checksum (stored " + std::to_string(stored) + ", computed " +
                         std::to_string(unsigned_sum) + "): not a tar header, or a damaged one");
  }
  uint64_t size = 0;
  if (!Number(bytes, 124, 12, size)) return Error(at + 124, "the header's size field is not a number");
  const char type = bytes[156];
  const uint64_t data_at = at + kTarBlock;
  if (size > file_bytes_ - std::min(file_bytes_, data_at)) {
    return Error(at, "a member of " + std::to_string(size) + " bytes runs past the end of the file (" +
                         std::to_string(file_bytes_) + " bytes)");
  }
  if (type == 'L' || type == 'x') {
    if (size > kMaxExtensionBytes) {
      return Error(at, "an extended header of " + std::to_string(size) + " bytes (at most " +
                           std::to_string(kMaxExtensionBytes) + " are read)");
    }
    if (!first_header_) first_header_ = at;
    if (size == 0) {
      MESHLOAD_RETURN_IF_ERROR(header_at(data_at));
      return std::optional<TarMember>();
    }
    need_ = {data_at, size};
    reading_ = type == 'L' ? Reading::kLongName : Reading::kPax;
    return std::optional<TarMember>();
  }
  if (type == 'K' || type == 'g') {
    // A long link name, or global PAX records: nothing webdataset uses.
    if (type == 'K' && !first_header_) first_header_ = at;
    MESHLOAD_RETURN_IF_ERROR(header_at(data_at + Padded(size)));
    return std::optional<TarMember>();
  }
  if (type == 'S') return Error(at + 156, "a GNU sparse member; meshload reads plain members only");

  TarMember m;
  const std::string magic = std::string(bytes.substr(257, 6));
  std::string name = Field(bytes, 0, 100);
  if (magic == std::string("ustar\0", 6)) {
    const std::string prefix = Field(bytes, 345, 155);
    if (!prefix.empty()) name = prefix + "/" + name;
  }
  m.name = pax_path_ ? *pax_path_ : long_name_ ? *long_name_ : name;
  // As Python's tarfile: an old-style regular type with a name ending in
  // '/' is a directory.
  m.regular = type == '0' || type == '7' || (type == '\0' && !m.name.ends_with('/'));
  m.offset = first_header_.value_or(at);
  m.data_offset = data_at;
  m.size = pax_size_.value_or(size);
  if (m.size > file_bytes_ - std::min(file_bytes_, data_at)) {
    return Error(at, "a member of " + std::to_string(m.size) + " bytes runs past the end of the file (" +
                         std::to_string(file_bytes_) + " bytes)");
  }
  first_header_.reset();
  long_name_.reset();
  pax_path_.reset();
  pax_size_.reset();
  // As Python's tarfile: regular files and types it does not know have
  // data after their header; links, devices, directories and FIFOs none.
  const bool known_without_data = type == '\0' || (type >= '1' && type <= '6');
  MESHLOAD_RETURN_IF_ERROR(header_at(m.regular            ? m.next_offset()
                                     : known_without_data ? data_at
                                                          : data_at + Padded(size)));
  return std::optional<TarMember>(std::move(m));
}

Result<PaxValues> ParsePaxRecords(std::string_view records, std::string_view file, uint64_t at) {
  PaxValues out;
  uint64_t pos = 0;
  auto error = [&](const std::string& what) {
    return InvalidArgument("PAX record: " + what, std::string(file) + "@" + std::to_string(at + pos));
  };
  while (pos < records.size()) {
    if (records[pos] == '\0') break;  // padding some writers leave
    const size_t space = records.find(' ', pos);
    if (space == std::string_view::npos || space == pos || space - pos > 20) return error("no length");
    uint64_t len = 0;
    for (size_t i = pos; i < space; ++i) {
      if (records[i] < '0' || records[i] > '9') return error("the length is not a number");
      len = len * 10 + static_cast<uint64_t>(records[i] - '0');
    }
    if (len <= space - pos + 1 || len > records.size() - pos || records[pos + len - 1] != '\n') {
      return error("a record of " + std::to_string(len) + " bytes does not end in a newline inside the header");
    }
    const std::string_view kv = records.substr(space + 1, pos + len - 1 - (space + 1));
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return error("no '=' in the record");
    const std::string_view key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "path") out.path = std::string(value);
    if (key == "size") {
      uint64_t n = 0;
      if (value.empty() || value.size() > 19) return error("size '" + std::string(value) + "'");
      for (char c : value) {
        if (c < '0' || c > '9') return error("size '" + std::string(value) + "'");
        n = n * 10 + static_cast<uint64_t>(c - '0');
      }
      out.size = n;
    }
    pos += len;
  }
  return out;
}

}  // namespace meshload::formats
