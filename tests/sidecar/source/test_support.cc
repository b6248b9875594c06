#include "test_support.h"

#include "tests/testing/test_pki.h"
#include "tests/testing/wait.h"

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <utility>

namespace meshload::sidecar::source::testing {

SourceOptions FastOptions(SourceObserver* observer) {
  SourceOptions o;
  o.connect_timeout = std::chrono::milliseconds(1000);
  o.read_timeout = std::chrono::milliseconds(2000);
  o.max_attempts = 3;
  o.backoff_initial = std::chrono::milliseconds(1);
  o.backoff_max = std::chrono::milliseconds(5);
  o.observer = observer;
  return o;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

void RecordingObserver::OnRead(std::string_view scheme, uint64_t bytes, double) {
  std::lock_guard<std::mutex> lock(mu_);
  ++reads_;
  bytes_ += bytes;
  schemes_.emplace(scheme);
}

void RecordingObserver::OnRetry(std::string_view scheme, std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  retries_.emplace_back(reason);
  schemes_.emplace(scheme);
}

void RecordingObserver::OnError(std::string_view scheme, std::string_view kind) {
  std::lock_guard<std::mutex> lock(mu_);
  errors_.emplace_back(kind);
  schemes_.emplace(scheme);
}

uint64_t RecordingObserver::reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reads_;
}
uint64_t RecordingObserver::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}
std::vector<std::string> RecordingObserver::retries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retries_;
}
std::vector<std::string> RecordingObserver::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}
std::set<std::string> RecordingObserver::schemes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return schemes_;
}

bool WriteTestCerts(const std::string& dir, std::string* ca_path, std::string* cert_path, std::string* key_path) {
  *ca_path = dir + "/ca.pem";
  *cert_path = dir + "/cert.pem";
  *key_path = dir + "/key.pem";
  auto pki = pki::MakeTestPki();
  return pki.ok() && pki::WritePem(*ca_path, pki->ca.cert_pem).ok() &&
         pki::WritePem(*cert_path, pki->server.cert_pem).ok() && pki::WritePem(*key_path, pki->server.key_pem).ok();
}

TestHttpServer::TestHttpServer() : server_(std::make_unique<httplib::Server>()) { Configure(); }

TestHttpServer::TestHttpServer(const std::string& cert_path, const std::string& key_path)
    : server_(std::make_unique<httplib::SSLServer>(cert_path.c_str(), key_path.c_str())), scheme_("https") {
  Configure();
}

void TestHttpServer::Configure() {
  // Enough for every keep-alive connection a test opens to stay open.
  server_->set_keep_alive_max_count(1000);
  // Headers and body go out in separate writes; without TCP_NODELAY Nagle and
  // delayed ACKs add ~40 ms to every response.
  server_->set_tcp_nodelay(true);
}

TestHttpServer::~TestHttpServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void TestHttpServer::Get(const std::string& path, Handler handler) {
  server_->Get(path, [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    requests_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_ports_.insert(req.remote_port);
    }
    // cpp-httplib 0.11 re-applies the request's Range to whatever body the
    // handler returns (and turns other statuses into 416); the handlers here
    // implement Range themselves, so the parsed ranges are dropped. The
    // Request object is the server's own non-const one.
    const_cast<httplib::Request&>(req).ranges.clear();
    handler(req, res);
  });
}

void TestHttpServer::Start() {
  port_ = server_->bind_to_any_port("127.0.0.1");
  if (port_ <= 0) throw std::runtime_error("cannot bind a test HTTP server");
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  if (!::meshload::testing::WaitFor([&] { return server_->is_running(); }, std::chrono::seconds(10))) {
    throw std::runtime_error("the test HTTP server did not start within 10 s");
  }
}

std::string TestHttpServer::Url(const std::string& path_and_query) const {
  return scheme_ + "://127.0.0.1:" + std::to_string(port_) + path_and_query;
}

int TestHttpServer::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(client_ports_.size());
}

void ServeBytes(const std::string& data, const httplib::Request& req, httplib::Response& res) {
  const std::string range = req.get_header_value("Range");
  constexpr std::string_view kPrefix = "bytes=";
  if (range.empty() || range.compare(0, kPrefix.size(), kPrefix) != 0) {
    res.status = 200;
    res.set_content(data, "application/octet-stream");
    return;
  }
  std::string spec = range.substr(kPrefix.size());
  size_t dash = spec.find('-');
  uint64_t first = std::stoull(spec.substr(0, dash));
  uint64_t last = dash + 1 < spec.size() ? std::stoull(spec.substr(dash + 1)) : data.size() - 1;
  if (first >= data.size()) {
    res.status = 416;
    res.set_header("Content-Range", "bytes */" + std::to_string(data.size()));
    return;
  }
  last = std::min<uint64_t>(last, data.size() - 1);
  res.status = 206;
  res.set_header("Content-Range",
                 "bytes " + std::to_string(first) + "-" + std::to_string(last) + "/" + std::to_string(data.size()));
  res.set_content(data.substr(first, last - first + 1), "application/octet-stream");
}

}  // namespace meshload::sidecar::source::testing
