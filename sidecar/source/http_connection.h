/// \file
/// One HTTP/1.1 client connection over plain TCP, for the ranged GETs that
/// carry a dataset's bytes over `http://` (the "http" source and the "s3"
/// source on an http endpoint). A body of known length is read with readv()
/// straight into the caller's iovecs (or into a buffer handed to a sink
/// after each call), as many bytes per system call as the socket holds;
/// cpp-httplib reads a body 4 KiB at a time into a buffer of its own and
/// copies it out, which on a fast link costs a core per few GB/s. TLS stays
/// with cpp-httplib. Internal to the HTTP transport; exposed for its tests.
///
/// Thread safety: a connection is used by one thread at a time.
#pragma once

#include <httplib.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source::internal {

/// Where a body's bytes go: consecutive iovecs, or a sink (Source::Sink)
/// that gets them in pieces, read into a buffer of the caller's first.
/// Positions count from the start of the destination. Copyable: a copy
/// goes on from the same position.
class IovCursor {
 public:
  using Sink = Source::Sink;
  explicit IovCursor(const std::vector<iovec>& iov) : iov_(&iov) {}
  /// Bytes go to `sink`; readv() lands them in `buffer` first.
  IovCursor(const Sink& sink, uint8_t* buffer, size_t buffer_len)
      : iov_(nullptr), sink_(&sink), buffer_(buffer), buffer_len_(buffer_len) {}
  /// Moves past n bytes (written by an earlier attempt).
  /// Precondition: at most the remaining capacity.
  void Advance(uint64_t n);
  /// Copies n bytes in (hands them to the sink) and advances; false when
  /// the sink refused them (its status: sink_status()).
  /// Precondition: at most the remaining capacity.
  bool Write(const char* data, size_t n);
  /// The next at most `max_bytes` bytes of room as at most `max_iov` iovecs
  /// into `out` (the iovecs', or the sink's buffer); returns how many iovecs.
  int Room(uint64_t max_bytes, iovec* out, int max_iov) const;
  /// n bytes landed in the room Room() gave: advances (a sink gets them);
  /// false when the sink refused them.
  bool Landed(uint64_t n);
  /// OK, or why the sink refused bytes.
  const Status& sink_status() const { return sink_status_; }

 private:
  const std::vector<iovec>* iov_;
  size_t index_ = 0;
  size_t within_ = 0;
  const Sink* sink_ = nullptr;
  uint8_t* buffer_ = nullptr;
  size_t buffer_len_ = 0;
  uint64_t at_ = 0;  // sink mode: the position of the next byte
  Status sink_status_;
};

/// A response's status line and headers.
struct HttpResponseHead {
  int status = 0;
  httplib::Headers headers;  // case-insensitive names, as httplib's
  /// The body's framing: chunked, a length, or (neither) until the server closes.
  bool chunked = false;
  std::optional<uint64_t> content_length;
  /// HTTP/1.1 without "Connection: close".
  bool keep_alive = false;

  /// The first value of header `name`, or "".
  std::string Header(const char* name) const;
};

/// How a connection's I/O failed: the retry loop tells a timeout from a
/// connection that ended, and both from a response it cannot parse.
/// kRefused: the destination (a sink) refused the bytes; the cursor's
/// sink_status() says why.
enum class HttpIoError { kNone, kTimeout, kClosed, kMalformed, kRefused };

struct HttpIoResult {
  HttpIoError error = HttpIoError::kNone;
  std::string message;  // what happened, without a location
  bool ok() const { return error == HttpIoError::kNone; }
};

/// Parses a response head (the status line, the header lines, up to and
/// with the empty line) and its body's framing. kMalformed for a status line
/// that is not HTTP/1.x, a folded or nameless header line, a
/// Transfer-Encoding other than chunked, or Content-Lengths that are not
/// one decimal number.
HttpIoResult ParseResponseHead(std::string_view text, HttpResponseHead* head);

/// The size of a chunk from its size line (hex digits, then optional
/// ";extensions"); nullopt when malformed or above 2^60.
std::optional<uint64_t> ParseChunkSize(std::string_view line);

class HttpConnection {
 public:
  struct Timeouts {
    std::chrono::milliseconds connect{2000};
    std::chrono::milliseconds read{10000};
    std::chrono::milliseconds write{10000};
  };

  /// Connects to `origin` ("http://host:port", host possibly a bracketed
  /// IPv6 literal) with TCP_NODELAY; kUnavailable when no address answers
  /// within the connect timeout, kDeadlineExceeded when it timed out.
  static Result<std::unique_ptr<HttpConnection>> Connect(const std::string& origin, const Timeouts& timeouts);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  /// Whether an idle pooled connection may carry another request: its last
  /// response was read to the end, nothing more arrived since, and the
  /// server has not closed it.
  bool Reusable() const;

  /// Sends "GET target HTTP/1.1" with `headers` (a Host header is added
  /// when they have none: host, and :port when it is not 80).
  HttpIoResult SendGet(const std::string& target, const httplib::Headers& headers);
  /// Reads the next final response's head (1xx responses are skipped).
  /// `*got_bytes` tells whether any byte of a response arrived.
  HttpIoResult ReadHead(HttpResponseHead* head, bool* got_bytes);

  /// Reads up to `max` bytes of a Content-Length body into `dest`, with
  /// readv() straight into its iovecs once the bytes buffered with the head
  /// are used; `*received` counts what arrived, also on failure. A body
  /// longer than `max` is left unread, and the connection is then not
  /// reusable. Precondition: the head had a Content-Length and no chunking.
  HttpIoResult ReadBodyInto(const HttpResponseHead& head, uint64_t max, IovCursor& dest, uint64_t* received);
  /// Reads a body of any framing and passes it to `sink` in pieces; a sink
  /// that returns false stops the reading (the connection is then not
  /// reusable). Reading stops too after `limit` bytes.
  HttpIoResult ReadBody(const HttpResponseHead& head, uint64_t limit,
                        const std::function<bool(const char*, size_t)>& sink);

 private:
  HttpConnection(int fd, std::string host_header, const Timeouts& timeouts);
  // At least one more byte into the buffer; kClosed at the end of the stream.
  HttpIoResult Fill();
  HttpIoResult SinkBuffered(uint64_t n, uint64_t* left, const std::function<bool(const char*, size_t)>& sink,
                            bool* stopped);
  HttpIoResult ReadLine(std::string* line);
  HttpIoResult ErrnoResult(const char* what, int err) const;

  const int fd_;
  const std::string host_header_;
  const Timeouts timeouts_;
  std::vector<char> buf_;
  size_t begin_ = 0;  // buffered, unread bytes are buf_[begin_, end_)
  size_t end_ = 0;
  bool reusable_ = false;  // the last response was read to its end on a keep-alive connection
};

}  // namespace meshload::sidecar::source::internal
