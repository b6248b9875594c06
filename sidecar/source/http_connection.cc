// One HTTP/1.1 connection over plain TCP (http_connection.h): a request
// written with send(), a response head parsed from a buffer, and a body of
// known length read with readv() into the caller's iovecs.

#include "sidecar/source/http_connection.h"

#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>

#include "sidecar/source/http_internal.h"

namespace meshload::sidecar::source::internal {
namespace {

// A response head is at most this long.
constexpr size_t kHeadLimit = 64 << 10;
// Reads into the buffer (heads, chunked or error bodies) take this much.
constexpr size_t kBufferBytes = 64 << 10;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool ContainsTokenIgnoreCase(std::string_view list, std::string_view token) {
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view item = Trim(list.substr(pos, comma - pos));
    if (item.size() == token.size() && std::equal(item.begin(), item.end(), token.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        })) {
      return true;
    }
    pos = comma + 1;
  }
  return false;
}

void SetTimeout(int fd, int option, std::chrono::milliseconds t) {
  timeval tv{};
  const auto ms = std::max<int64_t>(t.count(), 1);
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

// One address within the timeout: a non-blocking connect and a poll.
// Returns the connected (blocking) socket, or -1 with errno_out set
// (ETIMEDOUT when the time ran out).
int ConnectOne(const addrinfo* ai, std::chrono::milliseconds timeout, int* errno_out) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    *errno_out = errno;
    return -1;
  }
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *errno_out = errno;
      close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int n;
    do {
      n = poll(&p, 1, static_cast<int>(std::min<int64_t>(timeout.count(), std::numeric_limits<int>::max())));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      *errno_out = n == 0 ? ETIMEDOUT : errno;
      close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      *errno_out = err != 0 ? err : errno;
      close(fd);
      return -1;
    }
  }
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

void IovCursor::Advance(uint64_t n) {
  if (iov_ == nullptr) {
    at_ += n;
    return;
  }
  while (n > 0) {
    const iovec& v = (*iov_)[index_];
    const uint64_t take = std::min<uint64_t>(n, v.iov_len - within_);
    n -= take;
    within_ += take;
    if (within_ == v.iov_len) {
      ++index_;
      within_ = 0;
    }
  }
}

bool IovCursor::Write(const char* data, size_t n) {
  if (iov_ == nullptr) {
    if (n == 0) return sink_status_.ok();
    if (sink_status_.ok()) sink_status_ = (*sink_)(at_, reinterpret_cast<const uint8_t*>(data), n);
    at_ += n;
    return sink_status_.ok();
  }
  while (n > 0) {
    const iovec& v = (*iov_)[index_];
    const size_t take = std::min(n, v.iov_len - within_);
    std::memcpy(static_cast<char*>(v.iov_base) + within_, data, take);
    data += take;
    n -= take;
    within_ += take;
    if (within_ == v.iov_len) {
      ++index_;
      within_ = 0;
    }
  }
  return true;
}

int IovCursor::Room(uint64_t max_bytes, iovec* out, int max_iov) const {
  if (iov_ == nullptr) {
    if (max_bytes == 0 || max_iov < 1) return 0;
    out[0].iov_base = buffer_;
    out[0].iov_len = static_cast<size_t>(std::min<uint64_t>(max_bytes, buffer_len_));
    return 1;
  }
  int count = 0;
  size_t index = index_;
  size_t within = within_;
  while (max_bytes > 0 && count < max_iov && index < iov_->size()) {
    const iovec& v = (*iov_)[index];
    const size_t take = static_cast<size_t>(std::min<uint64_t>(max_bytes, v.iov_len - within));
    if (take > 0) {
      out[count].iov_base = static_cast<char*>(v.iov_base) + within;
      out[count].iov_len = take;
      ++count;
      max_bytes -= take;
    }
    ++index;
    within = 0;
  }
  return count;
}

bool IovCursor::Landed(uint64_t n) {
  if (iov_ == nullptr) return Write(reinterpret_cast<const char*>(buffer_), static_cast<size_t>(n));
  Advance(n);
  return true;
}

std::string HttpResponseHead::Header(const char* name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

HttpIoResult ParseResponseHead(std::string_view text, HttpResponseHead* head) {
  *head = HttpResponseHead{};
  size_t line_end = text.find('\n');
  std::string_view status_line = Trim(text.substr(0, line_end));
  // HTTP/1.x SSS reason
  if (status_line.size() < 12 || status_line.substr(0, 7) != "HTTP/1." || status_line[8] != ' ' ||
      status_line[9] < '1' || status_line[9] > '9' || !std::isdigit(static_cast<unsigned char>(status_line[10])) ||
      !std::isdigit(static_cast<unsigned char>(status_line[11]))) {
    return {HttpIoError::kMalformed, "not an HTTP/1.x status line: \"" +
                                         std::string(status_line.substr(0, std::min<size_t>(64, status_line.size()))) +
                                         "\""};
  }
  const bool http11 = status_line[7] == '1';
  head->status = (status_line[9] - '0') * 100 + (status_line[10] - '0') * 10 + (status_line[11] - '0');
  std::string_view rest = line_end == std::string_view::npos ? std::string_view() : text.substr(line_end + 1);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      return {HttpIoError::kMalformed, "a folded header line in the response"};
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return {HttpIoError::kMalformed, "a header line without a name: \"" +
                                           std::string(line.substr(0, std::min<size_t>(64, line.size()))) + "\""};
    }
    head->headers.emplace(std::string(Trim(line.substr(0, colon))), std::string(Trim(line.substr(colon + 1))));
  }

  const std::string connection = head->Header("Connection");
  head->keep_alive =
      http11 ? !ContainsTokenIgnoreCase(connection, "close") : ContainsTokenIgnoreCase(connection, "keep-alive");
  const std::string encoding = head->Header("Transfer-Encoding");
  if (!encoding.empty()) {
    // Only chunked alone: another transfer coding (gzip, ...) would hand
    // over bytes that are not the object's.
    if (!ContainsTokenIgnoreCase(encoding, "chunked") || encoding.find(',') != std::string::npos) {
      return {HttpIoError::kMalformed, "an unsupported Transfer-Encoding: " + encoding};
    }
    head->chunked = true;
  } else if (head->headers.count("Content-Length") > 0) {
    auto range = head->headers.equal_range("Content-Length");
    for (auto it = range.first; it != range.second; ++it) {
      std::optional<uint64_t> n = ParseDecimal(it->second);
      if (!n || (head->content_length && *head->content_length != *n)) {
        return {HttpIoError::kMalformed, "an invalid Content-Length: \"" + it->second + "\""};
      }
      head->content_length = n;
    }
  }
  if (head->status == 204 || head->status == 304) head->content_length = 0;
  return {};
}

std::optional<uint64_t> ParseChunkSize(std::string_view line) {
  std::string_view size_text = Trim(line.substr(0, line.find(';')));
  if (size_text.empty() || size_text.size() > 15) return std::nullopt;
  uint64_t size = 0;
  for (char c : size_text) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    size = size * 16 + static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(c))
                                                 ? c - '0'
                                                 : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
  }
  return size;
}

Result<std::unique_ptr<HttpConnection>> HttpConnection::Connect(const std::string& origin, const Timeouts& timeouts) {
  // origin: http://HOST:PORT, HOST maybe [v6].
  const size_t scheme_end = origin.find("://");
  std::string hostport = scheme_end == std::string::npos ? origin : origin.substr(scheme_end + 3);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("no port in " + origin);
  std::string host = hostport.substr(0, colon);
  const std::string port = hostport.substr(colon + 1);
  // The Host header: the port only when it is not the default.
  std::string host_header = port == "80" ? host : hostport;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Status(StatusCode::kUnavailable, "cannot resolve the host: " + std::string(gai_strerror(rc)));
  }
  int last_errno = 0;
  int fd = -1;
  for (const addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ConnectOne(ai, timeouts.connect, &last_errno);
  }
  freeaddrinfo(found);
  if (fd < 0) {
    if (last_errno == ETIMEDOUT) return Status(StatusCode::kDeadlineExceeded, "connect timed out");
    return Status(StatusCode::kUnavailable,
                  "cannot connect (refused, unreachable or unknown host): " + std::string(std::strerror(last_errno)));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SetTimeout(fd, SO_RCVTIMEO, timeouts.read);
  SetTimeout(fd, SO_SNDTIMEO, timeouts.write);
  return std::unique_ptr<HttpConnection>(new HttpConnection(fd, std::move(host_header), timeouts));
}

HttpConnection::HttpConnection(int fd, std::string host_header, const Timeouts& timeouts)
    : fd_(fd), host_header_(std::move(host_header)), timeouts_(timeouts), buf_(kBufferBytes) {}

HttpConnection::~HttpConnection() { close(fd_); }

bool HttpConnection::Reusable() const {
  if (!reusable_ || begin_ != end_) return false;
  // Readable while idle: the server closed it (EOF), reset it, or sent
  // something nobody asked for. Either way it cannot carry a request.
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

HttpIoResult HttpConnection::ErrnoResult(const char* what, int err) const {
  if (err == EAGAIN || err == EWOULDBLOCK) return {HttpIoError::kTimeout, std::string(what) + " timed out"};
  return {HttpIoError::kClosed, std::string(what) + " failed: " + std::strerror(err)};
}

HttpIoResult HttpConnection::SendGet(const std::string& target, const httplib::Headers& headers) {
  reusable_ = false;
  begin_ = end_ = 0;
  std::string request;
  request.reserve(512);
  request += "GET ";
  request += target;
  request += " HTTP/1.1\r\n";
  if (headers.find("Host") == headers.end()) request += "Host: " + host_header_ + "\r\n";
  for (const auto& [name, value] : headers) {
    request += name;
    request += ": ";
    request += value;
    request += "\r\n";
  }
  request += "User-Agent: meshload\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoResult("sending the request", errno);
    }
    sent += static_cast<size_t>(n);
  }
  return {};
}

HttpIoResult HttpConnection::Fill() {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == buf_.size()) {
    if (begin_ == 0) return {HttpIoError::kMalformed, "a response line longer than the buffer"};
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  for (;;) {
    ssize_t n = recv(fd_, buf_.data() + end_, buf_.size() - end_, 0);
    if (n > 0) {
      end_ += static_cast<size_t>(n);
      return {};
    }
    if (n == 0) return {HttpIoError::kClosed, "the server closed the connection"};
    if (errno == EINTR) continue;
    return ErrnoResult("reading the response", errno);
  }
}

HttpIoResult HttpConnection::ReadLine(std::string* line) {
  for (;;) {
    const char* start = buf_.data() + begin_;
    const void* nl = std::memchr(start, '\n', end_ - begin_);
    if (nl != nullptr) {
      const size_t len = static_cast<const char*>(nl) - start;
      line->assign(start, len > 0 && start[len - 1] == '\r' ? len - 1 : len);
      begin_ += len + 1;
      return {};
    }
    if (end_ - begin_ > 4096) return {HttpIoError::kMalformed, "a chunk-size line longer than 4 KiB"};
    HttpIoResult r = Fill();
    if (!r.ok()) return r;
  }
}

HttpIoResult HttpConnection::ReadHead(HttpResponseHead* head, bool* got_bytes) {
  *got_bytes = false;
  for (;;) {
    // The head ends at the first empty line.
    size_t head_end = std::string_view::npos;
    for (;;) {
      std::string_view view(buf_.data() + begin_, end_ - begin_);
      if (!view.empty()) *got_bytes = true;
      size_t crlf = view.find("\r\n\r\n");
      size_t lf = view.find("\n\n");
      if (crlf != std::string_view::npos || lf != std::string_view::npos) {
        head_end = std::min(crlf == std::string_view::npos ? view.size() : crlf + 4,
                            lf == std::string_view::npos ? view.size() : lf + 2);
        break;
      }
      if (view.size() >= kHeadLimit) {
        return {HttpIoError::kMalformed, "a response head longer than " + std::to_string(kHeadLimit) + " bytes"};
      }
      HttpIoResult r = Fill();
      if (!r.ok()) return r;
    }
    std::string_view text(buf_.data() + begin_, head_end);
    begin_ += head_end;

    HttpIoResult parsed = ParseResponseHead(text, head);
    if (!parsed.ok()) return parsed;
    if (head->status / 100 == 1) continue;  // 100 Continue, 103 Early Hints: the final answer follows
    return {};
  }
}

HttpIoResult HttpConnection::ReadBodyInto(const HttpResponseHead& head, uint64_t max, IovCursor& dest,
                                          uint64_t* received) {
  *received = 0;
  const uint64_t body = *head.content_length;
  const uint64_t want = std::min(body, max);
  // What came with the head first.
  const uint64_t buffered = std::min<uint64_t>(end_ - begin_, want);
  const bool taken = dest.Write(buf_.data() + begin_, static_cast<size_t>(buffered));
  begin_ += buffered;
  *received = buffered;
  if (!taken) return {HttpIoError::kRefused, dest.sink_status().message()};
  iovec room[IOV_MAX];
  while (*received < want) {
    const int count = dest.Room(want - *received, room, IOV_MAX);
    ssize_t n = readv(fd_, room, count);
    if (n > 0) {
      *received += static_cast<uint64_t>(n);
      if (!dest.Landed(static_cast<uint64_t>(n))) return {HttpIoError::kRefused, dest.sink_status().message()};
      continue;
    }
    if (n == 0) return {HttpIoError::kClosed, "the server closed the connection"};
    if (errno == EINTR) continue;
    return ErrnoResult("reading the response body", errno);
  }
  reusable_ = head.keep_alive && want == body && begin_ == end_;
  return {};
}

// Passes up to n buffered-or-read bytes of a body to the sink, counting
// them off *left (the caller's limit).
HttpIoResult HttpConnection::SinkBuffered(uint64_t n, uint64_t* left,
                                          const std::function<bool(const char*, size_t)>& sink, bool* stopped) {
  while (n > 0) {
    if (begin_ == end_) {
      HttpIoResult r = Fill();
      if (!r.ok()) return r;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>({n, end_ - begin_, *left}));
    if (take == 0 || !sink(buf_.data() + begin_, take)) {
      *stopped = true;
      return {};
    }
    begin_ += take;
    n -= take;
    *left -= take;
  }
  return {};
}

HttpIoResult HttpConnection::ReadBody(const HttpResponseHead& head, uint64_t limit,
                                      const std::function<bool(const char*, size_t)>& sink) {
  bool stopped = false;
  uint64_t left = limit;
  if (head.chunked) {
    for (;;) {
      std::string line;
      HttpIoResult r = ReadLine(&line);
      if (!r.ok()) return r;
      std::optional<uint64_t> parsed = ParseChunkSize(line);
      if (!parsed) return {HttpIoError::kMalformed, "an invalid chunk size: \"" + line.substr(0, 32) + "\""};
      const uint64_t size = *parsed;
      if (size == 0) {
        // Trailers up to an empty line.
        do {
          r = ReadLine(&line);
          if (!r.ok()) return r;
        } while (!line.empty());
        reusable_ = head.keep_alive && begin_ == end_;
        return {};
      }
      r = SinkBuffered(size, &left, sink, &stopped);
      if (!r.ok() || stopped) return r;
      r = ReadLine(&line);
      if (!r.ok()) return r;
      if (!line.empty()) return {HttpIoError::kMalformed, "a chunk longer than its size"};
    }
  }
  if (head.content_length) {
    HttpIoResult r = SinkBuffered(*head.content_length, &left, sink, &stopped);
    if (r.ok() && !stopped) reusable_ = head.keep_alive && begin_ == end_;
    return r;
  }
  // Neither: the body ends when the server closes the connection.
  for (;;) {
    HttpIoResult r = SinkBuffered(std::numeric_limits<uint64_t>::max(), &left, sink, &stopped);
    if (stopped) return {};
    if (r.error == HttpIoError::kClosed) return {};
    if (!r.ok()) return r;
  }
}

}  // namespace meshload::sidecar::source::internal
