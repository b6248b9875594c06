/// \file
/// Status and Result<T>: errors as values on the data path (no exceptions).
///
/// A Status carries a code, a message, and a *location*: the thing the error is
/// about, written so that a user can find it — a field path
/// (`spec.mesh.axes[1].size`), a file (`/data/shard-0003.bin`), or a file and a
/// byte offset (`/data/shard-0003.bin@4096`). ToString() renders
/// `location: message`, the form every user-facing error takes.
///
/// Likely errors are Statuses; broken invariants crash: MESHLOAD_CHECK, a
/// Result made from an OK status, and value() of a Result holding an error
/// print what broke and where, and abort.
///
/// Thread safety: Status and Result are values; distinct objects may be used
/// from distinct threads, a shared object only for reading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace meshload {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the input is wrong (spec, flag, file content)
  kNotFound,         // a file, object or key does not exist
  kAlreadyExists,
  kFailedPrecondition,  // the world is not in the state the call needs
  kOutOfRange,
  kDataLoss,     // data is truncated or corrupt
  kIoError,      // the OS refused an I/O call
  kUnavailable,  // a peer or service cannot be reached (retryable)
  kDeadlineExceeded,
  kCancelled,  // interrupted (a signal) before it could finish
  kInternal,   // a broken invariant
};

/// The lower-case name of a code, e.g. "invalid_argument". Used as a metric
/// label value, so the set is bounded.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  /// An OK status.
  Status() = default;
  Status(StatusCode code, std::string message, std::string location = {})
      : code_(code), message_(std::move(message)), location_(std::move(location)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }

  /// Returns a copy whose location is `outer` joined with this location, for
  /// errors that pass through layers (a parser reports `@12`, its caller
  /// prefixes the file name).
  Status WithLocationPrefix(std::string_view outer) const;

  /// `location: message`, or just the message when there is no location.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string location_;
};

inline Status InvalidArgument(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kInvalidArgument, std::move(msg), std::move(loc));
}
inline Status NotFound(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kNotFound, std::move(msg), std::move(loc));
}
inline Status DataLoss(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kDataLoss, std::move(msg), std::move(loc));
}
inline Status IoError(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kIoError, std::move(msg), std::move(loc));
}
inline Status FailedPrecondition(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg), std::move(loc));
}
inline Status OutOfRange(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kOutOfRange, std::move(msg), std::move(loc));
}
inline Status Internal(std::string msg, std::string loc = {}) {
  return Status(StatusCode::kInternal, std::move(msg), std::move(loc));
}
/// An I/O error from errno, e.g. `IoErrorFromErrno("open", path)`.
Status IoErrorFromErrno(std::string_view what, std::string location, int err);

namespace internal {
/// Prints "meshload: invariant broken at FILE:LINE: WHAT" to stderr and
/// aborts.
[[noreturn]] void InvariantBroken(const char* file, int line, std::string_view what);
}  // namespace internal

/// Result<T>: either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(runtime/explicit)
  /// Precondition (checked: aborts): `status` is not OK.
  Result(Status status) : v_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (std::get<Status>(v_).ok()) {
      internal::InvariantBroken(__FILE__, __LINE__, "a Result made from an OK status: give it a value or an error");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  /// The error; an OK status when the result holds a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  /// Precondition (checked: aborts, printing the error): ok().
  T& value() & {
    CheckOk();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<T>(v_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) {
      internal::InvariantBroken(__FILE__, __LINE__,
                                "value() of a Result holding an error: " + std::get<Status>(v_).ToString());
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace meshload

/// Aborts with `what` (a string) when `cond` is false: for invariants, never
/// for errors a caller can meet (those are Statuses).
#define MESHLOAD_CHECK(cond, what)                                                  \
  do {                                                                              \
    if (!(cond)) ::meshload::internal::InvariantBroken(__FILE__, __LINE__, (what)); \
  } while (0)

#define MESHLOAD_CONCAT_INNER_(a, b) a##b
#define MESHLOAD_CONCAT_(a, b) MESHLOAD_CONCAT_INNER_(a, b)

/// Returns the status from the enclosing function when `expr` is not OK.
#define MESHLOAD_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::meshload::Status _st = (expr);   \
    if (!_st.ok()) return _st;         \
  } while (0)

/// `MESHLOAD_ASSIGN_OR_RETURN(auto x, Compute());` binds the value or returns the error.
#define MESHLOAD_ASSIGN_OR_RETURN(lhs, expr) \
  MESHLOAD_ASSIGN_OR_RETURN_IMPL_(MESHLOAD_CONCAT_(_result_, __LINE__), lhs, expr)
#define MESHLOAD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
