#include "common/metrics/http_endpoints.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/logging.h"

namespace meshload::metrics {
namespace {

constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";

// Enough for the kubelet's two probes and a scrape at once; the endpoints are
// cheap, so more threads would only cost memory in every trainer pod.
constexpr size_t kWorkerThreads = 4;
// Bounds on how long a silent or slow client holds a worker, and so on how
// long Stop() waits for it.
constexpr time_t kIdleTimeoutSeconds = 2;
constexpr time_t kIoTimeoutSeconds = 5;

std::string HostPort(const std::string& host, int port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// httplib's default sets SO_REUSEPORT, which lets a second process bind the
// same port and silently steal half the scrapes; SO_REUSEADDR alone still
// allows a quick restart while old connections sit in TIME_WAIT.
void SetListenerOptions(int sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  // Keep the listener out of any child the process execs.
  fcntl(sock, F_SETFD, fcntl(sock, F_GETFD) | FD_CLOEXEC);
}

}  // namespace

HealthServer::HealthServer(const Registry& registry, ReadinessCheck readiness, HealthServerOptions options)
    : registry_(registry), readiness_(std::move(readiness)), options_(std::move(options)) {}

HealthServer::~HealthServer() { Stop(); }

Result<int> HealthServer::Start() {
  MutexLock lock(lifecycle_mu_);
  const std::string where = HostPort(options_.bind_address, options_.port);
  if (server_) {
    return FailedPrecondition("health server already running on port " + std::to_string(port_), where);
  }

  auto server = std::make_unique<httplib::Server>();
  server->set_socket_options(SetListenerOptions);
  server->new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
  server->set_keep_alive_timeout(kIdleTimeoutSeconds);
  server->set_read_timeout(kIoTimeoutSeconds, 0);
  server->set_write_timeout(kIoTimeoutSeconds, 0);
  // One handler for every method httplib routes, so that 404 and 405 are
  // decided in one place (httplib would answer 404 to a POST on /metrics).
  auto handler = [this](const httplib::Request& request, httplib::Response& response) { Handle(request, response); };
  server->Get(".*", handler);
  server->Post(".*", handler);
  server->Put(".*", handler);
  server->Patch(".*", handler);
  server->Delete(".*", handler);
  server->Options(".*", handler);

  errno = 0;
  int port = options_.port == 0 ? server->bind_to_any_port(options_.bind_address)
             : server->bind_to_port(options_.bind_address, options_.port) ? options_.port
                                                                          : -1;
  if (port < 0) {
    // httplib reports only failure; errno still holds bind(2)'s reason when
    // bind was reached. Trust only the errors bind gives, since name
    // resolution may leave an unrelated errno (ENOENT from /etc/hosts).
    int err = errno;
    if (err == EADDRINUSE || err == EADDRNOTAVAIL || err == EACCES || err == EPERM || err == EAFNOSUPPORT) {
      return IoError("cannot bind health server: " + std::string(std::strerror(err)), where);
    }
    return IoError("cannot bind health server: the address does not resolve to a local one", where);
  }

  listen_returned_ = false;
  stopping_ = false;
  httplib::Server* raw = server.get();
  thread_ = std::thread([this, raw, port] {
    if (!raw->listen_after_bind() && !stopping_) {
      LogError("health server stopped accepting connections", {{"address", options_.bind_address}, {"port", port}});
    }
    listen_returned_ = true;
  });
  // httplib's stop() only works once the accept loop has started, so wait for
  // it: otherwise a Stop() right after Start() could leave the thread serving.
  while (!raw->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (listen_returned_) {
    thread_.join();
    return IoError("health server listener exited at start", HostPort(options_.bind_address, port));
  }

  server_ = std::move(server);
  port_ = port;
  LogInfo("health server listening", {{"address", options_.bind_address}, {"port", port}});
  return port;
}

void HealthServer::Stop() {
  MutexLock lock(lifecycle_mu_);
  if (!server_) return;
  stopping_ = true;
  server_->stop();  // closes the listener; the accept loop ends and joins its workers
  thread_.join();
  server_.reset();
  LogInfo("health server stopped", {{"address", options_.bind_address}, {"port", port_.load()}});
  port_ = 0;
}

void HealthServer::SetHealthy(bool healthy, std::string reason) {
  MutexLock lock(health_mu_);
  healthy_ = healthy;
  unhealthy_reason_ = std::move(reason);
}

bool HealthServer::running() const {
  MutexLock lock(lifecycle_mu_);
  return server_ != nullptr;
}

int HealthServer::port() const { return port_; }

void HealthServer::Handle(const httplib::Request& request, httplib::Response& response) const {
  const std::string& path = request.path;
  if (path != "/metrics" && path != "/healthz" && path != "/readyz" && !(path == "/progress" && options_.progress)) {
    response.status = 404;
    response.set_content("not found: " + path, kTextContentType);
    return;
  }
  if (request.method != "GET" && request.method != "HEAD") {
    response.status = 405;
    response.set_header("Allow", "GET, HEAD");
    response.set_content("method not allowed: " + request.method, kTextContentType);
    return;
  }

  if (path == "/metrics") {
    response.status = 200;
    response.set_content(registry_.Serialize(), kExpositionContentType);
  } else if (path == "/progress") {
    response.status = 200;
    response.set_content(options_.progress(), "application/json");
  } else if (path == "/healthz") {
    MutexLock lock(health_mu_);
    response.status = healthy_ ? 200 : 503;
    response.set_content(healthy_                    ? std::string("ok")
                         : unhealthy_reason_.empty() ? std::string("unhealthy")
                                                     : unhealthy_reason_,
                         kTextContentType);
  } else {
    auto [ready, reason] = readiness_ ? readiness_() : std::pair<bool, std::string>(true, "");
    response.status = ready ? 200 : 503;
    response.set_content(ready ? std::string("ready") : reason.empty() ? "not ready" : reason, kTextContentType);
  }
}

}  // namespace meshload::metrics
