// The plain-http ranged GETs (internal::HttpConnection under the "http"
// source) against a server that writes exactly the bytes a test gives it:
// response framings and timings that httplib's server does not produce.

#include "sidecar/source/http_connection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sidecar/source/source.h"
#include "test_support.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar::source {
namespace {

using ::testing::HasSubstr;
using testing::RandomBytes;
using testing::RecordingObserver;
using namespace std::chrono_literals;

// What the server does with one request.
struct Reply {
  std::vector<std::string> pieces;  // written in turn, 20 ms apart
  bool close_after = false;
};

// Accepts connections on 127.0.0.1 and answers each request (the bytes up
// to an empty line) with what `answer` returns for it. Thread safety: the
// counters from any thread.
class CannedServer {
 public:
  using Answer = std::function<Reply(int request, const std::string& head)>;

  explicit CannedServer(Answer answer) : answer_(std::move(answer)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~CannedServer() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    close(listen_fd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
    for (auto& t : threads_) t.join();
    for (int fd : open_) close(fd);
  }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  int connections() const { return connections_.load(); }
  int requests() const { return requests_.load(); }
  // Closes every connection that is waiting for a request.
  void CloseIdle() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      connections_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(fd);
      threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Serve(int fd) {
    std::string buffered;
    for (;;) {
      size_t end;
      while ((end = buffered.find("\r\n\r\n")) == std::string::npos) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return;  // the descriptor stays in open_ and is closed by the destructor's shutdown
        buffered.append(buf, static_cast<size_t>(n));
      }
      std::string head = buffered.substr(0, end + 4);
      buffered.erase(0, end + 4);
      Reply reply = answer_(requests_.fetch_add(1), head);
      for (size_t i = 0; i < reply.pieces.size(); ++i) {
        if (i > 0) std::this_thread::sleep_for(20ms);
        if (send(fd, reply.pieces[i].data(), reply.pieces[i].size(), MSG_NOSIGNAL) < 0) return;
      }
      if (reply.close_after) {
        shutdown(fd, SHUT_RDWR);
        return;
      }
    }
  }

  Answer answer_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> open_;
  std::vector<std::thread> threads_;
};

// The asked range's first and last byte from a request head.
std::pair<uint64_t, uint64_t> RangeOf(const std::string& head) {
  size_t at = head.find("Range: bytes=");
  EXPECT_NE(at, std::string::npos) << head;
  uint64_t first = std::stoull(head.substr(at + 13));
  uint64_t last = std::stoull(head.substr(head.find('-', at + 13) + 1));
  return {first, last};
}

std::string Partial(const std::string& data, uint64_t first, uint64_t last, const std::string& extra_headers = "") {
  return "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(first) + "-" + std::to_string(last) +
         "/" + std::to_string(data.size()) + "\r\nContent-Length: " + std::to_string(last - first + 1) + "\r\n" +
         extra_headers + "\r\n" + data.substr(first, last - first + 1);
}

class PlainHttpTest : public ::testing::Test {
 protected:
  std::unique_ptr<Source> MakeSource() {
    auto source = MakeHttpSource(testing::FastOptions(&observer_));
    EXPECT_OK(source);
    return std::move(source).value();
  }
  const std::string data_ = RandomBytes(1 << 20, 7);
  RecordingObserver observer_;
};

TEST_F(PlainHttpTest, ALargeBodyLandsInMisalignedIovecsByteExact) {
  CannedServer server([&](int, const std::string& head) {
    auto [first, last] = RangeOf(head);
    return Reply{{Partial(data_, first, last)}};
  });
  std::string a(3, '\0'), b(700001, '\0'), c(5, '\0');
  ASSERT_OK(
      MakeSource()->ReadV(server.Url("/o"), 11, {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}}));
  EXPECT_EQ(a + b + c, data_.substr(11, a.size() + b.size() + c.size()));
  EXPECT_TRUE(observer_.retries().empty());
}

TEST_F(PlainHttpTest, AChunkedPartialBodyAHeadInPiecesAndAnInterimResponseAreRead) {
  CannedServer server([&](int, const std::string& head) {
    auto [first, last] = RangeOf(head);
    const std::string body = data_.substr(first, last - first + 1);
    std::string chunked;
    for (size_t at = 0; at < body.size(); at += 1000) {
      std::string piece = body.substr(at, 1000);
      char size[16];
      std::snprintf(size, sizeof size, "%zx", piece.size());
      chunked += std::string(size) + ";ext=1\r\n" + piece + "\r\n";
    }
    chunked += "0\r\nX-Trailer: yes\r\n\r\n";
    const std::string range_header = "Content-Range: bytes " + std::to_string(first) + "-" + std::to_string(last) +
                                     "/" + std::to_string(data_.size()) + "\r\n";
    return Reply{{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 206 Par", "tial Content\r\n" + range_header,
                  "Transfer-Encoding: chunked\r\n\r\n" + chunked.substr(0, 1500), chunked.substr(1500)}};
  });
  auto source = MakeSource();
  for (uint64_t offset : {0u, 4321u}) {
    std::string out(2500, '\0');
    ASSERT_OK(source->Read(server.Url("/o"), offset, out.data(), out.size()));
    EXPECT_EQ(out, data_.substr(offset, out.size()));
  }
  EXPECT_EQ(server.connections(), 1);  // a chunked body read to its end leaves the connection usable
}

TEST_F(PlainHttpTest, AKeepAliveConnectionTheServerClosedWhileIdleIsReplacedWithoutARetry) {
  CannedServer server([&](int, const std::string& head) {
    auto [first, last] = RangeOf(head);
    return Reply{{Partial(data_, first, last)}};
  });
  auto source = MakeSource();
  std::string out(100, '\0');
  ASSERT_OK(source->Read(server.Url("/o"), 0, out.data(), out.size()));
  server.CloseIdle();
  std::this_thread::sleep_for(50ms);
  ASSERT_OK(source->Read(server.Url("/o"), 200, out.data(), out.size()));
  EXPECT_EQ(out, data_.substr(200, 100));
  EXPECT_EQ(server.connections(), 2);
  EXPECT_TRUE(observer_.retries().empty());
}

TEST_F(PlainHttpTest, ConnectionCloseHttp10AndALongerBodyThanAskedAreNotReused) {
  CannedServer server([&](int request, const std::string& head) {
    auto [first, last] = RangeOf(head);
    switch (request) {
      case 0: return Reply{{Partial(data_, first, last, "Connection: close\r\n")}, true};
      case 1: {
        std::string r = Partial(data_, first, last);
        r.replace(0, 8, "HTTP/1.0");
        return Reply{{r}, true};
      }
      default: return Reply{{Partial(data_, first, last + 1000)}};  // 1000 bytes more than asked
    }
  });
  auto source = MakeSource();
  for (int i = 0; i < 4; ++i) {
    std::string out(100, '\0');
    ASSERT_OK(source->Read(server.Url("/o"), 100 * i, out.data(), out.size()));
    EXPECT_EQ(out, data_.substr(100 * i, 100));
  }
  EXPECT_EQ(server.connections(), 4);
  EXPECT_TRUE(observer_.retries().empty());
}

TEST_F(PlainHttpTest, AMalformedResponseIsRetriedAndThenNamedInTheError) {
  CannedServer server([&](int, const std::string&) { return Reply{{"HTTP/2 200\r\n\r\n"}, true}; });
  std::string out(10, '\0');
  Status st = MakeSource()->Read(server.Url("/o"), 0, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("not an HTTP/1.x status line"));
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"connection", "connection"}));
}

TEST_F(PlainHttpTest, ABodyCutShortAfterItsHeadIsResumedFromTheFirstMissingByte) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::mutex mu;
  CannedServer server([&](int request, const std::string& head) {
    auto [first, last] = RangeOf(head);
    {
      std::lock_guard<std::mutex> lock(mu);
      ranges.emplace_back(first, last);
    }
    std::string r = Partial(data_, first, last);
    if (request == 0) return Reply{{r.substr(0, r.size() - 300000)}, true};
    return Reply{{r}};
  });
  std::string out(500000, '\0');
  ASSERT_OK(MakeSource()->Read(server.Url("/o"), 1000, out.data(), out.size()));
  EXPECT_EQ(out, data_.substr(1000, out.size()));
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[1], (std::pair<uint64_t, uint64_t>{1000 + 200000, 1000 + 500000 - 1}));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"short_body"});
}

TEST_F(PlainHttpTest, AnErrorWithAChunkedBodyKeepsTheConnection) {
  CannedServer server([&](int request, const std::string& head) {
    if (request == 0) {
      return Reply{
          {"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\nRetry-After: 0\r\n\r\n"
           "5\r\nbusy!\r\n0\r\n\r\n"}};
    }
    auto [first, last] = RangeOf(head);
    return Reply{{Partial(data_, first, last)}};
  });
  std::string out(64, '\0');
  ASSERT_OK(MakeSource()->Read(server.Url("/o"), 5, out.data(), out.size()));
  EXPECT_EQ(out, data_.substr(5, 64));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"http_5xx"});
}

TEST(IovCursorTest, RoomSpansIovecsFromTheCursorUpToTheBound) {
  std::string a(4, '\0'), b(0, '\0'), c(10, '\0');
  std::vector<iovec> iov{{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  internal::IovCursor cursor(iov);
  cursor.Advance(3);
  iovec room[4];
  ASSERT_EQ(cursor.Room(6, room, 4), 2);
  EXPECT_EQ(room[0].iov_base, a.data() + 3);
  EXPECT_EQ(room[0].iov_len, 1u);
  EXPECT_EQ(room[1].iov_base, c.data());
  EXPECT_EQ(room[1].iov_len, 5u);
  EXPECT_EQ(cursor.Room(100, room, 1), 1);
  cursor.Write("xyz", 3);
  EXPECT_EQ(a[3], 'x');
  EXPECT_EQ(c.substr(0, 2), "yz");
}

}  // namespace
}  // namespace meshload::sidecar::source
