#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sidecar/source/source.h"
#include "test_support.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar::source {
namespace {

using meshload::testing::StatusIs;
using testing::FastOptions;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RandomBytes;
using testing::RecordingObserver;
using testing::ServeBytes;
using testing::TestHttpServer;
using namespace std::chrono_literals;

std::unique_ptr<Source> MakeHttp(const SourceOptions& options) {
  auto source = MakeHttpSource(options);
  EXPECT_OK(source);
  return std::move(source).value();
}

class HttpSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = RandomBytes(100000, 42);
    server_.Get("/obj", [this](const httplib::Request& req, httplib::Response& res) { ServeBytes(data_, req, res); });
    server_.Get("/missing", [](const httplib::Request&, httplib::Response& res) { res.status = 404; });
  }

  // Starts server_; a source with FastOptions that reports to observer_.
  std::unique_ptr<Source> Start() {
    server_.Start();
    return MakeHttp(FastOptions(&observer_));
  }

  // Serves data_ at `path`, but answers its first `failures` requests with
  // what `fail` makes of the response instead.
  void ServeAfterFailures(const std::string& path, int failures, std::function<void(httplib::Response&)> fail) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    server_.Get(path, [this, calls, failures, fail](const httplib::Request& req, httplib::Response& res) {
      if (calls->fetch_add(1) < failures) return fail(res);
      ServeBytes(data_, req, res);
    });
  }

  // Stat of `path` learns data_'s size from a ranged GET after the HEAD: two
  // requests.
  void ExpectStatFallsBackToARangedGet(const std::string& path) {
    auto info = Start()->Stat(server_.Url(path));
    ASSERT_OK(info);
    EXPECT_EQ(info->size, data_.size());
    EXPECT_EQ(server_.requests(), 2);
  }

  // Serves data_ at `path`; the first response promises the whole range,
  // sends half of it and drops the connection. The next request's Range
  // header goes to *second_range.
  void ServeCutOnce(const std::string& path, std::string* second_range) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    server_.Get(path, [this, calls, second_range](const httplib::Request& req, httplib::Response& res) {
      if (calls->fetch_add(1) == 0) {
        ServeBytes(data_, req, res);
        std::string body = res.body;
        res.body.clear();
        res.set_content_provider(body.size(), "application/octet-stream",
                                 [body](size_t, size_t, httplib::DataSink& sink) {
                                   sink.write(body.data(), body.size() / 2);
                                   return false;
                                 });
        return;
      }
      *second_range = req.get_header_value("Range");
      ServeBytes(data_, req, res);
    });
  }

  std::string data_;
  TestHttpServer server_;
  RecordingObserver observer_;
};

TEST_F(HttpSourceTest, RangeReadIntoIovecsIsByteExact) {
  auto source = Start();
  std::string a(7, '\0'), b(30000, '\0'), c(1, '\0');
  char unused = 'x';
  std::vector<iovec> iov = {{a.data(), a.size()}, {&unused, 0}, {b.data(), b.size()}, {c.data(), c.size()}};
  Status st = source->ReadV(server_.Url("/obj"), 12345, iov);
  ASSERT_OK(st);
  EXPECT_EQ(a + b + c, data_.substr(12345, 30008));
  EXPECT_EQ(unused, 'x');
  EXPECT_EQ(observer_.reads(), 1u);
  EXPECT_EQ(observer_.bytes(), 30008u);
  EXPECT_EQ(observer_.schemes(), std::set<std::string>{"http"});
}

TEST_F(HttpSourceTest, ReadOfTheLastBytesSucceeds) {
  auto source = Start();
  std::string out(100, '\0');
  ASSERT_OK(source->Read(server_.Url("/obj"), data_.size() - 100, out.data(), 100));
  EXPECT_EQ(out, data_.substr(data_.size() - 100));
}

TEST_F(HttpSourceTest, StatReturnsTheContentLength) {
  auto info = Start()->Stat(server_.Url("/obj"));
  ASSERT_OK(info);
  EXPECT_EQ(info->size, data_.size());
}

TEST_F(HttpSourceTest, StatWithoutContentLengthFallsBackToARangedGet) {
  server_.Get("/chunked", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "HEAD") {
      // Chunked: the HEAD response carries no Content-Length.
      res.set_chunked_content_provider("application/octet-stream", [](size_t, httplib::DataSink& sink) {
        sink.done();
        return true;
      });
      return;
    }
    ServeBytes(data_, req, res);
  });
  ExpectStatFallsBackToARangedGet("/chunked");
}

TEST_F(HttpSourceTest, StatOfAUrlThatRefusesHeadFallsBackToARangedGet) {
  server_.Get("/get-only", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "HEAD") {
      res.status = 403;  // as S3 answers HEAD on a URL presigned for GET
      return;
    }
    ServeBytes(data_, req, res);
  });
  ExpectStatFallsBackToARangedGet("/get-only?sig=1");
}

TEST_F(HttpSourceTest, StatOfAMissingObjectIsNotFound) {
  auto info = Start()->Stat(server_.Url("/missing"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(info.status().location(), server_.Url("/missing"));
}

TEST_F(HttpSourceTest, TwoServerErrorsAreRetriedThenTheReadSucceeds) {
  ServeAfterFailures("/flaky", 2, [](httplib::Response& res) {
    res.status = 500;
    res.set_content("try again", "text/plain");
  });
  auto source = Start();
  std::string out(4096, '\0');
  Status st = source->Read(server_.Url("/flaky"), 777, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(777, 4096));
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"http_5xx", "http_5xx"}));
  EXPECT_EQ(server_.requests(), 3);
  EXPECT_TRUE(observer_.errors().empty());
  // The drained 500 responses left the connection usable.
  EXPECT_EQ(server_.connections(), 1);
}

TEST_F(HttpSourceTest, NotFoundFailsFastWithoutRetries) {
  auto source = Start();
  char buf[16];
  Status st = source->Read(server_.Url("/missing"), 64, buf, sizeof buf);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.location(), server_.Url("/missing") + "@64");
  EXPECT_THAT(st.message(), HasSubstr("404"));
  EXPECT_THAT(st.message(), HasSubstr("not retried"));
  EXPECT_EQ(server_.requests(), 1);
  EXPECT_TRUE(observer_.retries().empty());
  EXPECT_EQ(observer_.errors(), std::vector<std::string>{"not_found"});
}

TEST_F(HttpSourceTest, ForbiddenIsNotRetried) {
  server_.Get("/forbidden", [](const httplib::Request&, httplib::Response& res) { res.status = 403; });
  char buf[16];
  Status st = Start()->Read(server_.Url("/forbidden"), 0, buf, sizeof buf);
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("HTTP 403 Forbidden")));
  EXPECT_EQ(server_.requests(), 1);
  EXPECT_EQ(observer_.errors(), std::vector<std::string>{"http_4xx"});
}

TEST_F(HttpSourceTest, TooManyRequestsWithRetryAfterZeroIsRetried) {
  ServeAfterFailures("/throttled", 1, [](httplib::Response& res) {
    res.status = 429;
    res.set_header("Retry-After", "0");
  });
  std::string out(1000, '\0');
  Status st = Start()->Read(server_.Url("/throttled"), 0, out.data(), 1000);
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(0, 1000));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"http_429"});
  EXPECT_EQ(server_.requests(), 2);
}

TEST_F(HttpSourceTest, RetryAfterIsCappedAtBackoffMax) {
  ServeAfterFailures("/slowdown", 1, [](httplib::Response& res) {
    res.status = 503;
    res.set_header("Retry-After", "3600");
  });
  auto source = Start();
  std::string out(10, '\0');
  const auto start = std::chrono::steady_clock::now();
  Status st = source->Read(server_.Url("/slowdown"), 0, out.data(), 10);
  ASSERT_OK(st);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"http_5xx"});
}

TEST_F(HttpSourceTest, AlwaysFailingServerIsGivenUpOnAfterMaxAttempts) {
  server_.Get("/down", [](const httplib::Request&, httplib::Response& res) { res.status = 502; });
  auto source = Start();
  char buf[8];
  Status st = source->Read(server_.Url("/down"), 5, buf, sizeof buf);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.ToString(), server_.Url("/down") + "@5: giving up after 3 attempts: HTTP 502 Bad Gateway");
  EXPECT_EQ(server_.requests(), 3);
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"http_5xx", "http_5xx"}));
  EXPECT_EQ(observer_.errors(), std::vector<std::string>{"retries_exhausted"});
}

TEST_F(HttpSourceTest, SlowResponseIsRetriedAsTimeoutAndTheFastRetrySucceeds) {
  std::atomic<int> calls{0};
  server_.Get("/slow", [&](const httplib::Request& req, httplib::Response& res) {
    if (calls.fetch_add(1) == 0) std::this_thread::sleep_for(500ms);  // slower than the read timeout
    ServeBytes(data_, req, res);
  });
  server_.Start();
  SourceOptions options = FastOptions(&observer_);
  options.read_timeout = 150ms;
  std::string out(2048, '\0');
  Status st = MakeHttp(options)->Read(server_.Url("/slow"), 100, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(100, 2048));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"timeout"});
  EXPECT_EQ(server_.requests(), 2);
}

TEST_F(HttpSourceTest, BodyCutShortIsRetriedForTheRestOnly) {
  std::string second_range;
  ServeCutOnce("/cut", &second_range);
  std::string out(50000, '\0');
  Status st = Start()->Read(server_.Url("/cut"), 10, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(10, 50000));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"short_body"});
  EXPECT_EQ(server_.requests(), 2);
  // The first 25,000 bytes arrived: the retry asks for the rest.
  EXPECT_EQ(second_range, "bytes=25010-50009");
}

// What a streamed read (Source::ReadTo) handed its sink: the bytes by
// position, and whether each piece began where the one before it ended.
struct Pieces {
  std::string bytes;
  int count = 0;
  bool in_order = true;
  Source::Sink Sink() {
    return [this](uint64_t at, const uint8_t* data, size_t n) {
      in_order = in_order && at == bytes.size();
      if (bytes.size() < at + n) bytes.resize(at + n);
      bytes.replace(at, n, reinterpret_cast<const char*>(data), n);
      count += 1;
      return Status::Ok();
    };
  }
};

TEST_F(HttpSourceTest, AStreamedReadHandsItsBytesInOrderFromOneRequest) {
  const std::string big = RandomBytes(3 << 20, 5);
  server_.Get("/big", [&](const httplib::Request& req, httplib::Response& res) { ServeBytes(big, req, res); });
  auto source = Start();
  Pieces got;
  ASSERT_OK(source->ReadTo(server_.Url("/big"), 12345, 3000000, got.Sink()));
  EXPECT_EQ(got.bytes, big.substr(12345, 3000000));
  EXPECT_TRUE(got.in_order);
  EXPECT_GT(got.count, 1) << "handed in pieces, never as one buffer of the whole read";
  EXPECT_EQ(server_.requests(), 1);
  EXPECT_EQ(observer_.reads(), 1u);
  EXPECT_EQ(observer_.bytes(), 3000000u);
}

TEST_F(HttpSourceTest, AStreamedReadCutShortGoesOnFromTheByteItReached) {
  std::string second_range;
  ServeCutOnce("/cut", &second_range);
  Pieces got;
  ASSERT_OK(Start()->ReadTo(server_.Url("/cut"), 10, 50000, got.Sink()));
  EXPECT_EQ(got.bytes, data_.substr(10, 50000));
  EXPECT_TRUE(got.in_order) << "no byte handed twice";
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"short_body"});
  EXPECT_EQ(second_range, "bytes=25010-50009");
}

TEST_F(HttpSourceTest, ASinkThatRefusesBytesEndsTheReadWithItsOwnErrorUnretried) {
  auto source = Start();
  int calls = 0;
  Status st = source->ReadTo(server_.Url("/obj"), 0, data_.size(), [&](uint64_t, const uint8_t*, size_t) {
    calls += 1;
    return Status(StatusCode::kIoError, "writing a block to the cache: No space left on device", "/cache/x.tmp");
  });
  EXPECT_THAT(st, StatusIs(StatusCode::kIoError, HasSubstr("No space left on device")));
  EXPECT_EQ(st.location(), "/cache/x.tmp") << "the sink's error as it is, not a storage error of the URL";
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(server_.requests(), 1);
  EXPECT_TRUE(observer_.retries().empty());
  EXPECT_TRUE(observer_.errors().empty()) << "the storage did nothing wrong";
}

TEST_F(HttpSourceTest, ShorterRangeThanAskedIsRetriedAsShortBody) {
  server_.Get("/stingy", [&](const httplib::Request& req, httplib::Response& res) {
    // A consistent 206 for fewer bytes than asked, object size unknown.
    ServeBytes(data_, req, res);
    res.body.resize(res.body.size() / 2);
    const std::string cr = res.get_header_value("Content-Range");
    uint64_t first = std::stoull(cr.substr(6, cr.find('-') - 6));
    res.set_header("Content-Range",
                   "bytes " + std::to_string(first) + "-" + std::to_string(first + res.body.size() - 1) + "/*");
  });
  std::string out(1000, '\0');
  Status st = Start()->Read(server_.Url("/stingy"), 0, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  // Each attempt asks for the rest and gets half of it: 500, 250, 125.
  EXPECT_THAT(st.message(), HasSubstr("short body: got 875 of 1000 bytes"));
  EXPECT_EQ(out.substr(0, 875), data_.substr(0, 875));
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"short_body", "short_body"}));
  EXPECT_EQ(server_.requests(), 3);
}

TEST_F(HttpSourceTest, ReadPastTheEndOfTheObjectIsDataLossWithoutRetries) {
  auto source = Start();
  std::string out(200, '\0');
  Status st = source->Read(server_.Url("/obj"), data_.size() - 100, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.ToString(), server_.Url("/obj") +
                               "@99900: short read: wanted 200 bytes at "
                               "offset 99900, the object ends after 100000 "
                               "bytes");
  // Starting past the end: the server answers 416.
  st = source->Read(server_.Url("/obj"), data_.size() + 5, out.data(), out.size());
  EXPECT_THAT(st, StatusIs(StatusCode::kDataLoss, HasSubstr("the object ends after 100000 bytes")));
  EXPECT_EQ(server_.requests(), 2);
  EXPECT_EQ(observer_.errors(), (std::vector<std::string>{"data_loss", "data_loss"}));
}

TEST_F(HttpSourceTest, PartialContentForAnotherRangeIsRejected) {
  server_.Get("/shifted", [&](const httplib::Request&, httplib::Response& res) {
    // Whatever was asked, answer with bytes 0-99.
    res.status = 206;
    res.set_header("Content-Range", "bytes 0-99/" + std::to_string(data_.size()));
    res.set_content(data_.substr(0, 100), "application/octet-stream");
  });
  std::string out(100, '\0');
  Status st = Start()->Read(server_.Url("/shifted"), 50, out.data(), 100);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.ToString(), server_.Url("/shifted") + "@50: HTTP 206 for bytes 0-99, asked for bytes 50-149");
  EXPECT_EQ(server_.requests(), 1);
}

TEST_F(HttpSourceTest, ServerIgnoringRangeIsAcceptedOnlyFromOffsetZero) {
  server_.Get("/norange", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(data_, "application/octet-stream");
  });
  auto source = Start();
  std::string out(300, '\0');
  Status st = source->Read(server_.Url("/norange"), 0, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(0, 300));
  st = source->Read(server_.Url("/norange"), 1, out.data(), out.size());
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("ignored the Range header")));
  EXPECT_EQ(server_.requests(), 2);
}

TEST_F(HttpSourceTest, WholeObjectShorterThanTheReadIsDataLoss) {
  server_.Get("/chunked-small", [](const httplib::Request&, httplib::Response& res) {
    // Range ignored and no Content-Length: the size shows only at the end.
    res.set_chunked_content_provider("application/octet-stream", [](size_t, httplib::DataSink& sink) {
      sink.write("0123456789", 10);
      sink.done();
      return true;
    });
  });
  std::string out(64, '\0');
  Status st = Start()->Read(server_.Url("/chunked-small"), 0, out.data(), out.size());
  EXPECT_THAT(st, StatusIs(StatusCode::kDataLoss, HasSubstr("the object ends after 10 bytes")));
  EXPECT_EQ(server_.requests(), 1);
}

TEST_F(HttpSourceTest, SequentialReadsReuseOneKeepAliveConnection) {
  auto source = Start();
  constexpr int kReads = 20;
  for (int i = 0; i < kReads; ++i) {
    std::string out(512, '\0');
    ASSERT_OK(source->Read(server_.Url("/obj"), 1000 * i, out.data(), out.size()));
    ASSERT_EQ(out, data_.substr(1000 * i, 512));
  }
  EXPECT_EQ(server_.requests(), kReads);
  EXPECT_EQ(server_.connections(), 1);
}

TEST_F(HttpSourceTest, ConcurrentReadersGetExactBytesOnPooledConnections) {
  server_.Start();
  SourceOptions options = FastOptions(&observer_);
  options.max_idle_connections = 4;
  auto source = MakeHttp(options);
  constexpr int kThreads = 4;
  constexpr int kReadsPerThread = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kReadsPerThread; ++r) {
        uint64_t offset = (t * 7919 + r * 613) % (data_.size() - 3000);
        std::string a(1000, '\0'), b(2000, '\0');
        Status st = source->ReadV(server_.Url("/obj"), offset, {{a.data(), a.size()}, {b.data(), b.size()}});
        if (!st.ok() || a + b != data_.substr(offset, 3000)) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(server_.requests(), kThreads * kReadsPerThread);
  EXPECT_LE(server_.connections(), kThreads);
  EXPECT_EQ(observer_.reads(), uint64_t{kThreads} * kReadsPerThread);
}

TEST_F(HttpSourceTest, QueryStringIsSentButNeverAppearsInErrors) {
  std::atomic<int> saw_secret{0};
  server_.Get("/signed", [&](const httplib::Request& req, httplib::Response& res) {
    if (req.get_param_value("secret") == "hunter2") saw_secret.fetch_add(1);
    res.status = req.get_param_value("fail") == "404" ? 404 : 500;
  });
  auto source = Start();
  char buf[8];
  for (const char* query : {"?secret=hunter2&fail=404", "?secret=hunter2&fail=500"}) {
    Status st = source->Read(server_.Url(std::string("/signed") + query), 3, buf, sizeof buf);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.location(), server_.Url("/signed") + "@3");
    EXPECT_THAT(st.ToString(), Not(HasSubstr("secret")));
    EXPECT_THAT(st.ToString(), Not(HasSubstr("hunter2")));
    EXPECT_THAT(st.ToString(), Not(HasSubstr("?")));
  }
  auto info = source->Stat(server_.Url("/signed?secret=hunter2&fail=404"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().ToString(), Not(HasSubstr("hunter2")));
  EXPECT_EQ(saw_secret.load(), 1 + 3 + 1);
}

TEST_F(HttpSourceTest, ConnectionRefusedIsRetriedAsConnectionThenUnavailable) {
  // A port that was free a moment ago: nothing listens there.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/x";
  char buf[8];
  Status st = MakeHttp(FastOptions(&observer_))->Read(url, 0, buf, sizeof buf);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.location(), url + "@0");
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"connection", "connection"}));
  EXPECT_EQ(observer_.errors(), std::vector<std::string>{"retries_exhausted"});
}

TEST(HttpSourceOptionsTest, InvalidOptionsAreRejectedNamingTheField) {
  SourceOptions options;
  options.max_attempts = 0;
  auto source = MakeHttpSource(options);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(source.status().location(), "max_attempts");
  options = {};
  options.read_timeout = 0ms;
  EXPECT_EQ(MakeHttpSource(options).status().location(), "read_timeout");
}

TEST(HttpSourceUrlTest, CredentialsInTheUrlAreRejectedWithoutEchoingThem) {
  auto source = MakeHttp({});
  char buf[1];
  Status st = source->Read("http://user:pa55word@127.0.0.1:1/x", 0, buf, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.ToString(), Not(HasSubstr("pa55word")));
}

// HTTPS end to end against a certificate made for this test run.
class HttpsSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::WriteTestCerts(dir_.path(), &ca_, &cert_, &key_));
    server_ = std::make_unique<TestHttpServer>(cert_, key_);
    data_ = RandomBytes(5000, 9);
    server_->Get("/obj", [this](const httplib::Request& req, httplib::Response& res) { ServeBytes(data_, req, res); });
    server_->Start();
  }

  testing::TempDir dir_;
  std::string ca_, cert_, key_, data_;
  std::unique_ptr<TestHttpServer> server_;
  RecordingObserver observer_;
};

// The sources link libparquet (Parquet datasets), whose pyarrow build
// carries and exports its own copy of OpenSSL's libcrypto: the process's
// OpenSSL calls (TLS to HTTPS and S3 endpoints) must still reach the
// system's libcrypto, the one libssl was built with; mixing the two crashed
// the first HTTPS handshake.
TEST(HttpsSourceLinking, OpenSslCallsReachTheSystemsLibcryptoNotLibparquetsCopy) {
  for (void* fn : {reinterpret_cast<void*>(&EVP_sha256), reinterpret_cast<void*>(&EVP_MD_CTX_new)}) {
    Dl_info info{};
    ASSERT_NE(dladdr(fn, &info), 0);
    ASSERT_NE(info.dli_fname, nullptr);
    EXPECT_THAT(std::string(info.dli_fname), ::testing::HasSubstr("libcrypto.so"));
  }
}

TEST_F(HttpsSourceTest, ReadVerifiedAgainstTheCaFileIsByteExact) {
  SourceOptions options = FastOptions(&observer_);
  options.ca_file = ca_;
  auto source = MakeHttp(options);
  std::string out(1000, '\0');
  Status st = source->Read(server_->Url("/obj?sig=1"), 1234, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(1234, 1000));
  auto info = source->Stat(server_->Url("/obj"));
  ASSERT_OK(info);
  EXPECT_EQ(info->size, data_.size());
  EXPECT_EQ(observer_.schemes(), std::set<std::string>{"https"});
}

TEST_F(HttpsSourceTest, AStreamedReadIsByteExact) {
  SourceOptions options = FastOptions(&observer_);
  options.ca_file = ca_;
  auto source = MakeHttp(options);
  Pieces got;
  ASSERT_OK(source->ReadTo(server_->Url("/obj"), 100, 4000, got.Sink()));
  EXPECT_EQ(got.bytes, data_.substr(100, 4000));
  EXPECT_TRUE(got.in_order);
  EXPECT_EQ(observer_.reads(), 1u);
}

TEST_F(HttpsSourceTest, UntrustedCertificateFailsWithoutRetries) {
  auto source = MakeHttp(FastOptions(&observer_));  // system CAs only
  char buf[8];
  Status st = source->Read(server_->Url("/obj?sig=1"), 0, buf, sizeof buf);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.location(), server_->Url("/obj") + "@0");
  EXPECT_THAT(st.message(), HasSubstr("certificate"));
  EXPECT_TRUE(observer_.retries().empty());
  EXPECT_EQ(server_->requests(), 0);
}

TEST_F(HttpsSourceTest, UnreadableCaFileFailsWithoutRetries) {
  SourceOptions options = FastOptions(&observer_);
  options.ca_file = dir_.path() + "/missing-ca.pem";
  char buf[8];
  Status st = MakeHttp(options)->Read(server_->Url("/obj"), 0, buf, sizeof buf);
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("CA certificates")));
  EXPECT_TRUE(observer_.retries().empty());
}

TEST_F(HttpsSourceTest, VerificationOffAcceptsAnUntrustedCertificate) {
  SourceOptions options = FastOptions(&observer_);
  options.verify_tls = false;
  std::string out(100, '\0');
  Status st = MakeHttp(options)->Read(server_->Url("/obj"), 0, out.data(), out.size());
  ASSERT_OK(st);
  EXPECT_EQ(out, data_.substr(0, 100));
}

}  // namespace
}  // namespace meshload::sidecar::source
