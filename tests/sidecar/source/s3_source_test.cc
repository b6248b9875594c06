// The "s3" source against a real S3 server: versitygw with its POSIX
// backend (built from the pinned module tests/s3/tools by
// scripts/build-s3-test-tools.sh), with faultproxy in front of it for
// throttling and slow answers (tests/tools/faultproxy in its plain-HTTP,
// S3 mode; built with the control plane's tools by
// scripts/build-test-tools.sh). Listing across many pages, globs and
// prefixes, ranged reads into iovecs, and the errors a user meets: wrong
// credentials, a missing bucket or key, the wrong region.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sidecar/source/source.h"
#include "tests/sidecar/source/test_support.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace meshload::sidecar::source {
namespace {

using meshload::testing::StatusIs;
using ::testing::HasSubstr;
using testing::RandomBytes;
using testing::TempDir;

constexpr const char* kAccess = "MESHLOADTESTKEY";
constexpr const char* kSecret = "meshload-test-secret-0123456789";

std::string Shell(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  EXPECT_EQ(::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0) << args[0];
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// versitygw serving root_/<bucket> directories, and the fault proxy.
class S3SourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // versitygw from the S3 tools, faultproxy from the control plane's.
    bin_ = Shell("bash " MESHLOAD_SOURCE_DIR "/scripts/build-s3-test-tools.sh --dir 2>&1");
    const std::string proxy_bin = Shell("bash " MESHLOAD_SOURCE_DIR "/scripts/build-test-tools.sh --dir 2>&1");
    if (!std::filesystem::exists(bin_ + "/versitygw")) {
      not_built_ = "versitygw is not built: run scripts/install-deps.sh (it runs scripts/build-s3-test-tools.sh)";
    } else if (!std::filesystem::exists(proxy_bin + "/faultproxy")) {
      not_built_ = "faultproxy is not built: run scripts/install-deps.sh (it runs scripts/build-test-tools.sh)";
    }
    if (!not_built_.empty()) {
      bin_.clear();
      return;
    }
    root_ = new TempDir();
    std::filesystem::create_directories(root_->path() + "/gw/bkt");
    port_ = FreePort();
    server_ = Spawn({bin_ + "/versitygw", "--access", kAccess, "--secret", kSecret, "--region", "us-east-1", "--port",
                     "127.0.0.1:" + std::to_string(port_), "--keep-alive", "--quiet", "posix", root_->path() + "/gw"},
                    root_->path() + "/versitygw.log");
    const std::string ready = root_->path() + "/proxy.ready";
    proxy_ = Spawn({proxy_bin + "/faultproxy", "--upstream", "http://127.0.0.1:" + std::to_string(port_), "--errors",
                    "s3", "--ready-file", ready},
                   root_->path() + "/proxy.log");
    const bool up = ::meshload::testing::WaitFor(
        [&] {
          httplib::Client c("127.0.0.1", port_);
          return c.Get("/") && std::filesystem::exists(ready);
        },
        std::chrono::seconds(30), std::chrono::milliseconds(50));
    if (!up) ADD_FAILURE() << "versitygw or faultproxy did not start within 30 s (see " << root_->path() << ")";
    std::ifstream in(ready);
    std::string proxy_addr, admin_addr;
    in >> proxy_addr >> admin_addr;
    proxy_endpoint_ = "http://" + proxy_addr;
    admin_ = admin_addr;
  }
  static void TearDownTestSuite() {
    for (pid_t p : {server_, proxy_}) {
      if (p > 0) {
        ::kill(p, SIGTERM);
        ::waitpid(p, nullptr, 0);
      }
    }
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    ASSERT_FALSE(bin_.empty()) << not_built_;
    Admin("/reset");  // no injections, no latency
  }

  static std::string Endpoint() { return "http://127.0.0.1:" + std::to_string(port_); }
  // Writes an object through the POSIX backend (the bucket's directory).
  static void Put(const std::string& key, const std::string& bytes) {
    const std::string path = root_->path() + "/gw/bkt/" + key;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
  }
  static std::string Admin(const std::string& what) {
    const size_t colon = admin_.rfind(':');
    httplib::Client c(admin_.substr(0, colon), std::stoi(admin_.substr(colon + 1)));
    auto r = what.rfind("/answered", 0) == 0 || what.rfind("/requests", 0) == 0 ? c.Get(what) : c.Post(what);
    return r ? r->body : std::string();
  }
  std::unique_ptr<Source> Make(SourceOptions o, const std::string& endpoint = Endpoint()) {
    o.s3.endpoint = endpoint;
    if (o.s3.access_key_id.empty() && !anonymous_) {
      o.s3.access_key_id = kAccess;
      o.s3.secret_access_key = kSecret;
    }
    o.observer = &observer_;
    o.backoff_initial = std::chrono::milliseconds(5);
    auto s = MakeS3Source(o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  static inline std::string bin_, not_built_, proxy_endpoint_, admin_;
  static inline TempDir* root_ = nullptr;
  static inline int port_ = 0;
  static inline pid_t server_ = -1, proxy_ = -1;
  testing::RecordingObserver observer_;
  bool anonymous_ = false;
};

TEST_F(S3SourceTest, ListsAPrefixAcrossManyPagesAGlobAndOneObject) {
  for (int i = 0; i < 250; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "many/obj-%04d.bin", i);
    Put(name, std::string(static_cast<size_t>(i + 1), 'x'));
  }
  Put("many/.hidden", "h");
  Put("many/sub/deeper.bin", "d");
  SourceOptions o;
  o.s3.list_page_size = 7;  // 36 pages
  auto s = Make(o);
  auto all = s->List("s3://bkt/many/");
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 250u) << "hidden objects and deeper prefixes are not part of the dataset";
  for (int i = 0; i < 250; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "s3://bkt/many/obj-%04d.bin", i);
    EXPECT_EQ((*all)[i].name, name);
    EXPECT_EQ((*all)[i].size, static_cast<uint64_t>(i + 1));
  }
  EXPECT_GE(std::stoll(Admin("/requests")), 0);
  // "many" without the slash names the same prefix; a glob picks some.
  auto same = s->List("s3://bkt/many");
  ASSERT_OK(same);
  EXPECT_EQ(same->size(), 250u);
  auto some = s->List("s3://bkt/many/obj-01[0-4]?.bin");
  ASSERT_OK(some);
  ASSERT_EQ(some->size(), 50u);
  EXPECT_EQ(some->front().name, "s3://bkt/many/obj-0100.bin");
  auto one = s->List("s3://bkt/many/obj-0042.bin");
  ASSERT_OK(one);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].size, 43u);
  auto none = s->List("s3://bkt/many/*.npy");
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().location(), "s3://bkt/many/*.npy");
  EXPECT_EQ(s->List("s3://bkt/nothing-here").status().code(), StatusCode::kNotFound);
}

TEST_F(S3SourceTest, RangedReadsLandInTheIovecsAndAShortObjectIsDataLoss) {
  const std::string bytes = RandomBytes(1 << 20, 7);
  Put("ranged/blob.bin", bytes);
  auto s = Make({});
  auto info = s->Stat("s3://bkt/ranged/blob.bin");
  ASSERT_OK(info);
  EXPECT_EQ(info->size, bytes.size());
  std::string a(1000, '\0'), b(70000, '\0'), c(3, '\0');
  std::vector<iovec> iov = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  ASSERT_OK(s->ReadV("s3://bkt/ranged/blob.bin", 12345, iov));
  EXPECT_EQ(a + b + c, bytes.substr(12345, a.size() + b.size() + c.size()));
  EXPECT_EQ(observer_.reads(), 1u);
  std::string past(100, '\0');
  Status st = s->Read("s3://bkt/ranged/blob.bin", bytes.size() - 10, past.data(), past.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_EQ(st.location(), "s3://bkt/ranged/blob.bin@" + std::to_string(bytes.size() - 10));
}

TEST_F(S3SourceTest, WrongCredentialsAMissingBucketOrKeyAndTheWrongRegionFailAtOnceSayingWhy) {
  Put("e/obj.bin", "0123456789");
  SourceOptions wrong;
  wrong.s3.access_key_id = kAccess;
  wrong.s3.secret_access_key = "not-the-secret-at-all";
  auto s = Make(wrong, proxy_endpoint_);
  std::string buf(4, '\0');
  const int64_t before = std::stoll(Admin("/requests"));
  Status st = s->Read("s3://bkt/e/obj.bin", 0, buf.data(), buf.size());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(st.location(), "s3://bkt/e/obj.bin@0");
  EXPECT_THAT(st.message(), HasSubstr("HTTP 403 Forbidden: S3 SignatureDoesNotMatch")) << st.ToString();
  EXPECT_EQ(std::stoll(Admin("/requests")) - before, 1) << "a refusal is not retried";
  EXPECT_THAT(st.ToString(), ::testing::Not(HasSubstr("not-the-secret")));

  auto ok = Make({});
  Status bucket = ok->Read("s3://nosuchbucket/e/obj.bin", 0, buf.data(), buf.size());
  EXPECT_THAT(bucket, StatusIs(StatusCode::kNotFound, HasSubstr("S3 NoSuchBucket")));
  EXPECT_EQ(bucket.location(), "s3://nosuchbucket/e/obj.bin@0");
  Status key = ok->Read("s3://bkt/e/missing.bin", 0, buf.data(), buf.size());
  EXPECT_THAT(key, StatusIs(StatusCode::kNotFound, HasSubstr("S3 NoSuchKey")));
  auto listed = ok->List("s3://nosuchbucket/");
  EXPECT_THAT(listed.status().message(), HasSubstr("NoSuchBucket")) << listed.status().ToString();

  SourceOptions region;
  region.s3.region = "eu-west-1";
  Status r = Make(region)->Read("s3://bkt/e/obj.bin", 0, buf.data(), buf.size());
  EXPECT_THAT(r.message(), HasSubstr("AuthorizationHeaderMalformed")) << r.ToString();
  EXPECT_THAT(r.message(), HasSubstr("region")) << r.ToString();
  EXPECT_EQ(observer_.retries().size(), 0u);

  anonymous_ = true;
  Status anon = Make({})->Read("s3://bkt/e/obj.bin", 0, buf.data(), buf.size());
  EXPECT_EQ(anon.code(), StatusCode::kFailedPrecondition)
      << "unsigned requests to a private bucket: " << anon.ToString();
}

TEST_F(S3SourceTest, ThrottlingIsRetriedWithBackoffAndCountedAsThrottled) {
  const std::string bytes = RandomBytes(5000, 3);
  Put("t/obj.bin", bytes);
  auto s = Make({}, proxy_endpoint_);
  Admin("/inject?status=503&code=SlowDown&count=3");
  std::string got(bytes.size(), '\0');
  Status st = s->Read("s3://bkt/t/obj.bin", 0, got.data(), got.size());
  ASSERT_OK(st);
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(observer_.retries(), (std::vector<std::string>{"throttled", "throttled", "throttled"}));
  EXPECT_EQ(Admin("/answered"), "3\n");
  // More throttling than attempts: the error says so, with the code.
  SourceOptions few;
  few.max_attempts = 2;
  Admin("/inject?status=503&code=SlowDown&count=5");
  Status gave_up = Make(few, proxy_endpoint_)->Read("s3://bkt/t/obj.bin", 0, got.data(), got.size());
  EXPECT_EQ(gave_up.code(), StatusCode::kUnavailable);
  EXPECT_THAT(gave_up.message(), HasSubstr("giving up after 2 attempts: HTTP 503 Service Unavailable: S3 SlowDown"))
      << gave_up.ToString();
}

TEST_F(S3SourceTest, ASlowServerTimesOutAndIsRetried) {
  Put("slow/obj.bin", "abcdef");
  SourceOptions o;
  o.read_timeout = std::chrono::milliseconds(200);
  o.max_attempts = 2;
  auto s = Make(o, proxy_endpoint_);
  Admin("/latency?ms=600");
  std::string got(6, '\0');
  Status st = s->Read("s3://bkt/slow/obj.bin", 0, got.data(), got.size());
  EXPECT_THAT(st, StatusIs(StatusCode::kUnavailable, HasSubstr("timed out")));
  EXPECT_EQ(observer_.retries(), std::vector<std::string>{"timeout"});
  Admin("/latency?ms=0");
  ASSERT_OK(s->Read("s3://bkt/slow/obj.bin", 0, got.data(), got.size()));
  EXPECT_EQ(got, "abcdef");
}

}  // namespace
}  // namespace meshload::sidecar::source
