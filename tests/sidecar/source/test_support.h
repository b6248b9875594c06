// Helpers for source tests: temp dirs, a recording observer, and an
// httplib::Server on 127.0.0.1 that counts requests and connections.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sidecar/source/source.h"
#include "tests/testing/temp_dir.h"

namespace meshload::sidecar::source::testing {

using ::meshload::testing::TempDir;

/// `n` pseudo-random bytes, different for each seed.
std::string RandomBytes(size_t n, uint64_t seed);

/// Source options with fast retries (3 attempts, 1 to 5 ms apart) and short
/// timeouts (1 s to connect, 2 s of silence), reporting to `observer`, so
/// that tests of failures stay quick.
SourceOptions FastOptions(SourceObserver* observer);

/// Records every callback. Thread-safe.
class RecordingObserver : public SourceObserver {
 public:
  void OnRead(std::string_view scheme, uint64_t bytes, double seconds) override;
  void OnRetry(std::string_view scheme, std::string_view reason) override;
  void OnError(std::string_view scheme, std::string_view kind) override;

  uint64_t reads() const;
  uint64_t bytes() const;
  std::vector<std::string> retries() const;  // reasons, in order
  std::vector<std::string> errors() const;   // kinds, in order
  std::set<std::string> schemes() const;     // every scheme label seen

 private:
  mutable std::mutex mu_;
  uint64_t reads_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::string> retries_;
  std::vector<std::string> errors_;
  std::set<std::string> schemes_;
};

/// Writes a fresh CA and a server certificate for 127.0.0.1 signed by it
/// (common/test_pki.h) and the server's key as PEM files into `dir`;
/// returns false on failure.
bool WriteTestCerts(const std::string& dir, std::string* ca_path, std::string* cert_path, std::string* key_path);

/// An httplib::Server (or SSLServer) listening on 127.0.0.1 at a free port. Routes added
/// with Get() count requests and distinct client connections before the
/// handler runs, so the counts are final once the client has its response.
/// Thread safety: Get() before Start(); the counters from any thread.
class TestHttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  TestHttpServer();
  /// An HTTPS server with this certificate and key.
  TestHttpServer(const std::string& cert_path, const std::string& key_path);
  ~TestHttpServer();

  /// Routes GET and HEAD of `path` (exact match) to `handler`.
  void Get(const std::string& path, Handler handler);
  void Start();
  /// http(s)://127.0.0.1:PORT + path_and_query.
  std::string Url(const std::string& path_and_query) const;

  int requests() const { return requests_.load(); }
  int connections() const;

 private:
  void Configure();

  std::unique_ptr<httplib::Server> server_;
  std::string scheme_ = "http";
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
  mutable std::mutex mu_;
  std::set<int> client_ports_;
};

/// Serves `data` the way an object store does: HEAD and GET without Range
/// give 200 with the whole object; "Range: bytes=A-B" (or "A-") gives 206 with
/// Content-Range, or 416 with "bytes */SIZE" when A is past the end.
void ServeBytes(const std::string& data, const httplib::Request& req, httplib::Response& res);

}  // namespace meshload::sidecar::source::testing
