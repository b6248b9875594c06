#include "common/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace meshload {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kAlreadyExists: return "already_exists";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kOutOfRange: return "out_of_range";
    case StatusCode::kDataLoss: return "data_loss";
    case StatusCode::kIoError: return "io_error";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

Status Status::WithLocationPrefix(std::string_view outer) const {
  if (ok() || outer.empty()) return *this;
  std::string loc(outer);
  if (!location_.empty()) {
    // "file" + "@12" -> "file@12"; "spec" + "mesh" -> "spec.mesh"; "a" + "[0]" -> "a[0]".
    char first = location_.front();
    if (first != '@' && first != '[' && first != '.' && first != ':') loc += '.';
    loc += location_;
  }
  return Status(code_, message_, std::move(loc));
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  if (location_.empty()) return message_;
  return location_ + ": " + message_;
}

Status IoErrorFromErrno(std::string_view what, std::string location, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  StatusCode code = err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError;
  return Status(code, std::move(msg), std::move(location));
}

namespace internal {

void InvariantBroken(const char* file, int line, std::string_view what) {
  std::fprintf(stderr, "meshload: invariant broken at %s:%d: %.*s\n", file, line, static_cast<int>(what.size()),
               what.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal

}  // namespace meshload
