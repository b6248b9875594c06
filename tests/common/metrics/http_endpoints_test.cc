#include "common/metrics/http_endpoints.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace meshload::metrics {
namespace {

using meshload::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

HealthServerOptions Loopback(int port = 0) { return {.bind_address = "127.0.0.1", .port = port, .progress = nullptr}; }

httplib::Client ClientFor(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  return client;
}

// Whether `res` is an answer with HTTP `status` (and, when given, exactly
// `body`); a failure says what came instead.
::testing::AssertionResult Answered(const httplib::Result& res, int status,
                                    const std::optional<std::string>& body = std::nullopt) {
  if (!res) return ::testing::AssertionFailure() << "no answer: " << httplib::to_string(res.error());
  if (res->status != status || (body && res->body != *body)) {
    return ::testing::AssertionFailure() << "HTTP " << res->status << " with body \"" << res->body << "\"";
  }
  return ::testing::AssertionSuccess();
}

int ThreadCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Connections waiting in the accept queue of the IPv4 socket listening on
// `port` (for a socket in LISTEN, /proc/net/tcp's rx_queue is its accept
// backlog); nullopt when there is no such socket.
std::optional<int> AcceptQueue(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  std::optional<int> queued;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues;
    if (!(fields >> slot >> local >> remote >> state >> queues)) continue;
    const size_t colon = local.find(':');
    if (state != "0A" || colon == std::string::npos || std::stoi(local.substr(colon + 1), nullptr, 16) != port) {
      continue;
    }
    queued = queued.value_or(0) + std::stoi(queues.substr(queues.find(':') + 1), nullptr, 16);
  }
  return queued;
}

class HealthServerTest : public ::testing::Test {
 protected:
  HealthServerTest() {
    auto& bytes = BuildCounter().Name("meshload_bytes_read_total").Help("Bytes read from storage.").Register(registry_);
    bytes.Add({{"source", "file"}}).Increment(4096);
  }

  Registry registry_;
};

TEST_F(HealthServerTest, StartsOnAnEphemeralPortAndServesMetrics) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  EXPECT_GT(*port, 0);
  EXPECT_EQ(server.port(), *port);
  EXPECT_TRUE(server.running());

  auto client = ClientFor(*port);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(Answered(res, 200));
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, registry_.Serialize());
  EXPECT_THAT(res->body, HasSubstr("meshload_bytes_read_total{source=\"file\"} 4096\n"));
}

TEST_F(HealthServerTest, EachScrapeRunsTheCollectHooks) {
  Gauge& step = BuildGauge().Name("meshload_current_step").Help("h").Register(registry_).Add({});
  std::atomic<int> current{0};
  registry_.AddCollectHook([&] { step.Set(current.load()); });
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);
  current = 17;
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("meshload_current_step 17\n"));
}

TEST_F(HealthServerTest, HealthzIsOkUntilMarkedUnhealthyWithAReason) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);

  auto res = client.Get("/healthz");
  ASSERT_TRUE(Answered(res, 200, "ok"));
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; charset=utf-8");

  server.SetHealthy(false, "staging thread wedged for 120 s");
  EXPECT_TRUE(Answered(client.Get("/healthz"), 503, "staging thread wedged for 120 s"));

  server.SetHealthy(true);
  EXPECT_TRUE(Answered(client.Get("/healthz"), 200));
}

TEST_F(HealthServerTest, ReadyzFollowsTheReadinessCheck) {
  std::atomic<bool> ready{false};
  HealthServer server(
      registry_,
      [&]() -> std::pair<bool, std::string> {
        if (ready) return {true, ""};
        return {false, "waiting for the first plan"};
      },
      Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);

  EXPECT_TRUE(Answered(client.Get("/readyz"), 503, "waiting for the first plan"));

  ready = true;
  EXPECT_TRUE(Answered(client.Get("/readyz"), 200, "ready"));
}

TEST_F(HealthServerTest, NullReadinessCheckMeansReady) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  EXPECT_TRUE(Answered(ClientFor(*port).Get("/readyz"), 200));
}

TEST_F(HealthServerTest, ProgressServesTheCallersJsonAndIs404WithoutOne) {
  HealthServerOptions options = Loopback();
  std::atomic<int> calls{0};
  options.progress = [&] { return "{\"consumedStep\":" + std::to_string(calls++) + "}"; };
  HealthServer server(registry_, nullptr, options);
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);
  for (int i = 0; i < 2; ++i) {
    auto res = client.Get("/progress");
    ASSERT_TRUE(Answered(res, 200, "{\"consumedStep\":" + std::to_string(i) + "}"));
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  }
  EXPECT_TRUE(Answered(client.Post("/progress", "", "text/plain"), 405));

  HealthServer plain(registry_, nullptr, Loopback());
  Result<int> plain_port = plain.Start();
  ASSERT_OK(plain_port);
  EXPECT_TRUE(Answered(ClientFor(*plain_port).Get("/progress"), 404));
}

TEST_F(HealthServerTest, UnknownPathIs404WhateverTheMethod) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);
  for (const char* path : {"/", "/metricsx", "/metrics/", "/favicon.ico"}) {
    EXPECT_TRUE(Answered(client.Get(path), 404)) << path;
  }
  EXPECT_TRUE(Answered(client.Post("/nope", "x", "text/plain"), 404));
}

TEST_F(HealthServerTest, NonGetMethodOnAnEndpointIs405WithAllowHeader) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  auto client = ClientFor(*port);

  auto post = client.Post("/metrics", "x=1", "application/x-www-form-urlencoded");
  ASSERT_TRUE(Answered(post, 405));
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  EXPECT_TRUE(Answered(client.Put("/healthz", "x", "text/plain"), 405));
  EXPECT_TRUE(Answered(client.Delete("/readyz"), 405));
}

TEST_F(HealthServerTest, HeadIsAnsweredLikeGetWithoutABody) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);
  EXPECT_TRUE(Answered(ClientFor(*port).Head("/healthz"), 200, ""));
}

TEST_F(HealthServerTest, StartOnAPortHeldByAnotherServerFailsNamingTheAddress) {
  // httplib's own default sets SO_REUSEPORT; the occupant must still win.
  httplib::Server occupant;
  occupant.Get("/", [](const httplib::Request&, httplib::Response& res) { res.body = "x"; });
  int busy = occupant.bind_to_any_port("127.0.0.1");
  ASSERT_GT(busy, 0);
  std::thread occupant_thread([&] { occupant.listen_after_bind(); });
  EXPECT_TRUE(WaitFor([&] { return occupant.is_running(); }, 10s)) << "the occupant did not start";

  HealthServer server(registry_, nullptr, Loopback(busy));
  Result<int> port = server.Start();
  occupant.stop();
  occupant_thread.join();

  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), StatusCode::kIoError);
  EXPECT_EQ(port.status().location(), "127.0.0.1:" + std::to_string(busy));
  EXPECT_THAT(port.status().message(), HasSubstr("Address already in use")) << port.status().ToString();
  EXPECT_FALSE(server.running());
  EXPECT_EQ(server.port(), 0);
}

TEST_F(HealthServerTest, StartOnAPortHeldByAnotherHealthServerFails) {
  HealthServer first(registry_, nullptr, Loopback());
  Result<int> port = first.Start();
  ASSERT_OK(port);
  HealthServer second(registry_, nullptr, Loopback(*port));
  Result<int> again = second.Start();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().location(), "127.0.0.1:" + std::to_string(*port));
  // The first server is unaffected.
  EXPECT_TRUE(Answered(ClientFor(*port).Get("/healthz"), 200));
}

TEST_F(HealthServerTest, StartOnAnAddressThatIsNotLocalFails) {
  // 192.0.2.0/24 is TEST-NET-1: never assigned to a host.
  HealthServer server(registry_, nullptr, {.bind_address = "192.0.2.1", .port = 0, .progress = nullptr});
  Result<int> port = server.Start();
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().location(), "192.0.2.1:0");
}

TEST_F(HealthServerTest, StartWhileRunningFails) {
  HealthServer server(registry_, nullptr, Loopback());
  ASSERT_OK(server.Start());
  Result<int> again = server.Start();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(HealthServerTest, StopTwiceIsHarmlessAndStartAfterStopServesAgain) {
  HealthServer server(registry_, nullptr, Loopback());
  server.Stop();  // before any Start
  Result<int> port = server.Start();
  ASSERT_OK(port);
  server.Stop();
  server.Stop();
  EXPECT_FALSE(server.running());
  EXPECT_EQ(server.port(), 0);
  EXPECT_FALSE(ClientFor(*port).Get("/healthz"));

  Result<int> restarted = server.Start();
  ASSERT_OK(restarted);
  EXPECT_TRUE(Answered(ClientFor(*restarted).Get("/healthz"), 200));
}

TEST_F(HealthServerTest, StopJoinsEveryThreadTheServerStarted) {
  int before = ThreadCount();
  ASSERT_GT(before, 0);
  {
    HealthServer server(registry_, nullptr, Loopback());
    Result<int> port = server.Start();
    ASSERT_OK(port);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(ClientFor(*port).Get("/metrics"));
    EXPECT_GT(ThreadCount(), before);
    server.Stop();
    EXPECT_EQ(ThreadCount(), before);
  }
  EXPECT_EQ(ThreadCount(), before);
}

TEST_F(HealthServerTest, DestructorStopsTheServer) {
  int port = 0;
  {
    HealthServer server(registry_, nullptr, Loopback());
    Result<int> started = server.Start();
    ASSERT_OK(started);
    port = *started;
  }
  EXPECT_FALSE(ClientFor(port).Get("/healthz"));
}

TEST_F(HealthServerTest, StopIsPromptWhileAClientHoldsAnIdleConnection) {
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);

  int sock = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  // The server has accepted it (a worker takes it from there).
  EXPECT_TRUE(WaitFor([&] { return AcceptQueue(*port) == 0; }, 10s))
      << "the connection was not accepted (accept queue: " << AcceptQueue(*port).value_or(-1) << ")";

  auto start = std::chrono::steady_clock::now();
  server.Stop();
  auto took = std::chrono::steady_clock::now() - start;
  close(sock);
  EXPECT_LT(took, std::chrono::seconds(4));
}

TEST_F(HealthServerTest, ServesConcurrentScrapesWhileMetricsChange) {
  Counter& reads = BuildCounter().Name("reads_total").Help("h").Register(registry_).Add({});
  HealthServer server(registry_, nullptr, Loopback());
  Result<int> port = server.Start();
  ASSERT_OK(port);

  std::atomic<bool> done{false};
  std::thread writer([&] {
    while (!done) reads.Increment();
  });
  std::vector<std::thread> scrapers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    scrapers.emplace_back([&] {
      auto client = ClientFor(*port);
      for (int i = 0; i < 20; ++i) {
        auto res = client.Get("/metrics");
        if (res && res->status == 200 && res->body.find("reads_total ") != std::string::npos) {
          ++ok;
        }
      }
    });
  }
  for (auto& t : scrapers) t.join();
  done = true;
  writer.join();
  EXPECT_EQ(ok.load(), 80);
}

}  // namespace
}  // namespace meshload::metrics
