#include "controller/fakeapi/fake_apiserver.h"

#include <httplib.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/test_pki.h"
#include "controller/fakeapi/discovery.h"
#include "controller/fakeapi/store.h"

namespace meshload::fakeapi {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A real server's default watch timeout is 30-60 minutes; tests pass their own.
constexpr int64_t kDefaultWatchSeconds = 1800;

void Reply(httplib::Response& res, const ApiResponse& r) {
  res.status = r.code;
  res.set_content(r.body.dump(), "application/json");
}

bool IsTrue(const std::string& v) { return v == "1" || v == "true"; }

int64_t ParamInt(const httplib::Request& req, const char* key, int64_t fallback, bool* ok) {
  *ok = true;
  if (!req.has_param(key)) return fallback;
  int64_t v = 0;
  const std::string s = req.get_param_value(key);
  if (s.empty()) return fallback;
  for (char c : s) {
    if (c < '0' || c > '9' || v > (int64_t{1} << 40)) {
      *ok = false;
      return fallback;
    }
    v = v * 10 + (c - '0');
  }
  return v;
}

// Splits "/apis/meshload.io/v1alpha1" into {"apis", "meshload.io", "v1alpha1"}.
std::vector<std::string> PathSegments(const std::string& path) {
  std::vector<std::string> seg;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) seg.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return seg;
}

// True when the client asked for a meta.k8s.io Table (kubectl get does,
// listing plain JSON last as its fallback).
bool WantsTable(const httplib::Request& req) {
  const std::string accept = req.get_header_value("Accept");
  return accept.find("as=Table") != std::string::npos &&
         accept.find("g=meta.k8s.io") != std::string::npos;
}

struct InjectedError {
  std::string prefix;
  int code;
  int remaining;
  int retry_after;
};

}  // namespace

struct FakeApiServer::Impl {
  explicit Impl(FakeApiServerOptions o) : options(std::move(o)), store(options.history_limit) {}

  void Route();
  void Handle(const httplib::Request& req, httplib::Response& res);
  /// Answers discovery and OpenAPI paths; false when `req` is not one.
  bool Discovery(const httplib::Request& req, httplib::Response& res);
  void Watch(const RequestTarget& target, const httplib::Request& req, httplib::Response& res);
  bool TakeInjected(const httplib::Request& req, httplib::Response& res);
  /// Sets up `server` (plain or TLS with a fresh PKI).
  Status MakeServer();
  /// The user a request authenticates as (bearer token or verified client
  /// certificate), or nullopt; always "anonymous" when no tokens are set
  /// and TLS client certificates are not in use.
  std::optional<std::string> Authenticate(const httplib::Request& req) const;

  FakeApiServerOptions options;
  ObjectStore store;
  std::unique_ptr<httplib::Server> server_ptr;
  httplib::Server* server = nullptr;
  pki::TestPki pki;  // when options.tls
  std::thread thread;
  int port = -1;
  bool started = false;
  bool stopped = false;
  std::mutex lifecycle_mu;

  mutable std::mutex hooks_mu;
  std::vector<InjectedError> injected;
  std::chrono::milliseconds latency{0};
  std::map<std::string, int64_t> writes;  // by qualified resource
  std::map<std::string, int64_t> writes_by_agent;  // by User-Agent header
  std::map<std::pair<std::string, std::string>, int64_t> requests;  // by (method, qualified resource)
};

bool FakeApiServer::Impl::TakeInjected(const httplib::Request& req, httplib::Response& res) {
  std::lock_guard<std::mutex> lock(hooks_mu);
  for (auto it = injected.begin(); it != injected.end(); ++it) {
    if (req.path.rfind(it->prefix, 0) != 0) continue;
    int code = it->code;
    std::string reason = ReasonForCode(code);
    std::string message = code == 429 ? "Too many requests, please try again later."
                                      : "injected failure (" + std::to_string(code) + ")";
    json details = nullptr;
    if (it->retry_after > 0) {
      res.set_header("Retry-After", std::to_string(it->retry_after));
      details = {{"retryAfterSeconds", it->retry_after}};
    }
    Reply(res, ErrorResponse(code, reason, message, details));
    if (--it->remaining <= 0) injected.erase(it);
    return true;
  }
  return false;
}

Status FakeApiServer::Impl::MakeServer() {
  if (!options.tls) {
    server_ptr = std::make_unique<httplib::Server>();
    server = server_ptr.get();
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(pki, pki::MakeTestPki());
  auto setup = [this](SSL_CTX& ctx) {
    BIO* cbio = BIO_new_mem_buf(pki.server.cert_pem.data(), static_cast<int>(pki.server.cert_pem.size()));
    BIO* kbio = BIO_new_mem_buf(pki.server.key_pem.data(), static_cast<int>(pki.server.key_pem.size()));
    BIO* abio = BIO_new_mem_buf(pki.ca.cert_pem.data(), static_cast<int>(pki.ca.cert_pem.size()));
    X509* cert = cbio ? PEM_read_bio_X509(cbio, nullptr, nullptr, nullptr) : nullptr;
    EVP_PKEY* key = kbio ? PEM_read_bio_PrivateKey(kbio, nullptr, nullptr, nullptr) : nullptr;
    X509* ca = abio ? PEM_read_bio_X509(abio, nullptr, nullptr, nullptr) : nullptr;
    bool ok = cert && key && ca && SSL_CTX_use_certificate(&ctx, cert) == 1 &&
              SSL_CTX_use_PrivateKey(&ctx, key) == 1 &&
              X509_STORE_add_cert(SSL_CTX_get_cert_store(&ctx), ca) == 1;
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    // Client certificates are optional, as on a real API server: a request
    // without one may still authenticate with a bearer token.
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_free(ca);
    BIO_free(cbio);
    BIO_free(kbio);
    BIO_free(abio);
    return ok;
  };
  auto tls = std::make_unique<httplib::SSLServer>(setup);
  if (!tls->is_valid()) return Internal("cannot set up TLS for the fake API server");
  server = tls.get();
  server_ptr = std::move(tls);
  return Status::Ok();
}

std::optional<std::string> FakeApiServer::Impl::Authenticate(const httplib::Request& req) const {
  if (options.tls && req.ssl != nullptr) {
    X509* peer = SSL_get1_peer_certificate(req.ssl);
    if (peer != nullptr) {
      // The handshake verified the chain (SSL_VERIFY_PEER fails it otherwise).
      char cn[256] = {0};
      X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, cn, sizeof cn);
      X509_free(peer);
      if (SSL_get_verify_result(req.ssl) == X509_V_OK) return std::string(cn);
      return std::nullopt;
    }
  }
  if (options.bearer_tokens.empty()) return std::string("anonymous");
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (auth.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string token = auth.substr(prefix.size());
  for (const auto& t : options.bearer_tokens) {
    if (t == token) return "token:" + std::to_string(&t - options.bearer_tokens.data());
  }
  return std::nullopt;
}

void FakeApiServer::Impl::Route() {
  server->new_task_queue = [n = options.worker_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  // Short keep-alive so that Stop() does not wait on idle client connections.
  server->set_keep_alive_timeout(1);
  // Headers and body go out in separate writes: without TCP_NODELAY each
  // response waits for the client's delayed ACK (40 ms).
  server->set_tcp_nodelay(true);
  server->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> lock(hooks_mu);
      delay = latency;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    // httplib answers from here before reading a request body; closing the
    // connection keeps an unread body from being parsed as the next request.
    if (!Authenticate(req)) {
      Reply(res, ErrorResponse(401, "Unauthorized", "Unauthorized"));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (TakeInjected(req, res)) {
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  server->Get(".*", handler);
  server->Post(".*", handler);
  server->Put(".*", handler);
  server->Patch(".*", handler);
  server->Delete(".*", handler);
}

bool FakeApiServer::Impl::Discovery(const httplib::Request& req, httplib::Response& res) {
  std::vector<std::string> seg = PathSegments(req.path);
  bool core = !seg.empty() && seg[0] == "api";
  bool groups = !seg.empty() && seg[0] == "apis";
  bool version = seg.size() == 1 && seg[0] == "version";
  bool openapi = !seg.empty() && seg[0] == "openapi";
  // /api/v1/... and /apis/g/v/... deeper than these are resources.
  if (!version && !openapi && !(core && seg.size() <= 2) && !(groups && seg.size() <= 3)) {
    return false;
  }
  if (req.method != "GET") {
    Reply(res, ErrorResponse(405, "MethodNotAllowed",
                             "the server does not allow this method on the requested resource"));
    return true;
  }
  // Always the legacy format with a plain application/json type, whatever
  // the Accept header asks: a client that asked for aggregated discovery
  // (apidiscovery.k8s.io) sees the content type and falls back to it.
  if (version) {
    Reply(res, {200, VersionInfo()});
    return true;
  }
  if (core && seg.size() == 1) {
    Reply(res, {200, CoreApiVersions(options.host + ":" + std::to_string(port))});
    return true;
  }
  ResourceTypes types = store.ResourceTypes();
  std::optional<json> body;
  if (openapi) {
    if (seg.size() == 2 && seg[1] == "v2") {
      body = OpenApiV2(types);
    } else if (seg.size() == 2 && seg[1] == "v3") {
      body = OpenApiV3Index(types);
    } else if (seg.size() == 4 && seg[1] == "v3" && seg[2] == "api") {
      body = OpenApiV3GroupVersion(types, "", seg[3]);
    } else if (seg.size() == 5 && seg[1] == "v3" && seg[2] == "apis") {
      body = OpenApiV3GroupVersion(types, seg[3], seg[4]);
    }
  } else if (groups && seg.size() == 1) {
    body = ApiGroupList(types);
  } else if (groups && seg.size() == 2) {
    body = ApiGroup(types, seg[1]);
  } else if (core) {
    body = ApiResourceList(types, "", seg[1]);
  } else {
    body = ApiResourceList(types, seg[1], seg[2]);
  }
  Reply(res, body ? ApiResponse{200, *body}
                  : ErrorResponse(404, "NotFound",
                                  "the server could not find the requested resource",
                                  json::object()));
  return true;
}

void FakeApiServer::Impl::Handle(const httplib::Request& req, httplib::Response& res) {
  if (Discovery(req, res)) return;
  ApiResponse error;
  std::optional<RequestTarget> target = store.Resolve(req.path, &error);
  if (!target) return Reply(res, error);
  {
    std::lock_guard<std::mutex> lock(hooks_mu);
    ++requests[{req.method, target->type.QualifiedName()}];
  }
  ApiResponse r;
  bool write = true;
  if (req.method == "GET") {
    write = false;
    if (target->name.empty() && req.has_param("watch") && IsTrue(req.get_param_value("watch"))) {
      return Watch(*target, req, res);
    }
    if (target->name.empty()) {
      bool ok;
      ListOptions options;
      options.label_selector = req.get_param_value("labelSelector");
      options.field_selector = req.get_param_value("fieldSelector");
      options.limit = ParamInt(req, "limit", 0, &ok);
      options.continue_token = req.get_param_value("continue");
      r = ok ? store.List(*target, options)
             : ErrorResponse(400, "BadRequest", "limit must be a non-negative integer");
    } else {
      r = store.Get(*target);
    }
  } else if (req.method == "POST") {
    r = store.Create(*target, req.body);
  } else if (req.method == "PUT") {
    r = store.Update(*target, req.body);
  } else if (req.method == "PATCH") {
    r = store.Patch(*target, req.get_header_value("Content-Type"), req.body);
  } else if (req.method == "DELETE" && target->name.empty() && !target->status) {
    ListOptions options;
    options.label_selector = req.get_param_value("labelSelector");
    options.field_selector = req.get_param_value("fieldSelector");
    r = store.DeleteCollection(*target, options, req.body);
  } else if (req.method == "DELETE") {
    r = store.Delete(*target, req.body);
  } else {
    write = false;
    r = ErrorResponse(405, "MethodNotAllowed",
                      "the server does not allow this method on the requested resource");
  }
  if (write && r.ok()) {
    std::lock_guard<std::mutex> lock(hooks_mu);
    ++writes[target->type.QualifiedName()];
    ++writes_by_agent[req.get_header_value("User-Agent")];
  }
  if (!write && r.ok() && WantsTable(req)) {
    std::string include = req.get_param_value("includeObject");
    IncludeObject what = include == "None"     ? IncludeObject::kNone
                         : include == "Object" ? IncludeObject::kObject
                                               : IncludeObject::kMetadata;
    r.body = ToTable(target->type, r.body, what, std::time(nullptr));
  }
  Reply(res, r);
}

void FakeApiServer::Impl::Watch(const RequestTarget& target, const httplib::Request& req,
                                httplib::Response& res) {
  bool ok;
  int64_t timeout_s = ParamInt(req, "timeoutSeconds", kDefaultWatchSeconds, &ok);
  if (!ok) return Reply(res, ErrorResponse(400, "BadRequest", "invalid timeoutSeconds"));
  WatchOptions watch;
  watch.resource_version = req.get_param_value("resourceVersion");
  watch.label_selector = req.get_param_value("labelSelector");
  watch.field_selector = req.get_param_value("fieldSelector");
  bool bookmarks =
      req.has_param("allowWatchBookmarks") && IsTrue(req.get_param_value("allowWatchBookmarks"));

  struct State {
    std::optional<WatchCursor> cursor;
    std::vector<json> pending;  // written on the first call of the provider
    Clock::time_point deadline;
    Clock::time_point next_bookmark;
  };
  auto state = std::make_shared<State>();
  ApiResponse error;
  state->cursor = store.BeginWatch(target, watch, &state->pending, &error);
  if (!state->cursor && state->pending.empty()) return Reply(res, error);
  state->deadline = Clock::now() + std::chrono::seconds(timeout_s);
  state->next_bookmark = Clock::now() + options.bookmark_interval;

  res.status = 200;
  // Not plain "application/json": httplib would gzip it for clients that
  // accept gzip, and a buffering compressor would hold events back.
  res.set_chunked_content_provider(
      "application/json;stream=watch", [this, state, bookmarks](size_t, httplib::DataSink& sink) {
        auto write_events = [&](const std::vector<json>& events) {
          std::string out;
          for (const json& e : events) out += e.dump() + "\n";
          return out.empty() || sink.write(out.data(), out.size());
        };
        if (!state->pending.empty()) {
          std::vector<json> events = std::move(state->pending);
          state->pending.clear();
          if (!write_events(events)) return false;
          if (!state->cursor) sink.done();  // the 410 ERROR event ends the stream
          return true;
        }
        Clock::time_point now = Clock::now();
        if (now >= state->deadline) {
          sink.done();
          return true;
        }
        Clock::time_point wake = state->deadline;
        if (bookmarks) wake = std::min(wake, state->next_bookmark);
        std::vector<json> events;
        switch (store.WaitForEvents(&*state->cursor, wake, &events)) {
          case ObjectStore::WaitResult::kEvents:
            return write_events(events);
          case ObjectStore::WaitResult::kExpired:
            if (!write_events(events)) return false;
            sink.done();
            return true;
          case ObjectStore::WaitResult::kClosed:
            sink.done();
            return true;
          case ObjectStore::WaitResult::kShutdown:
            return false;  // cancel: the server is going away
          case ObjectStore::WaitResult::kTimeout:
            if (bookmarks && Clock::now() >= state->next_bookmark) {
              state->next_bookmark = Clock::now() + options.bookmark_interval;
              return write_events({store.Bookmark(*state->cursor)});
            }
            return true;
        }
        return false;
      });
}

FakeApiServer::FakeApiServer(FakeApiServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

FakeApiServer::~FakeApiServer() { Stop(); }

Status FakeApiServer::Start() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mu);
  if (impl_->started) return FailedPrecondition("the fake API server was already started");
  RETURN_IF_ERROR(impl_->MakeServer());
  impl_->Route();
  int port = impl_->options.port == 0
                 ? impl_->server->bind_to_any_port(impl_->options.host)
                 : (impl_->server->bind_to_port(impl_->options.host, impl_->options.port)
                        ? impl_->options.port
                        : -1);
  if (port < 0) {
    return Status(StatusCode::kUnavailable, "cannot bind the fake API server",
                  impl_->options.host + ":" + std::to_string(impl_->options.port));
  }
  impl_->port = port;
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->server->listen_after_bind(); });
  while (!impl_->server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  LogDebug("fake API server listening", {{"port", port}});
  return Status::Ok();
}

void FakeApiServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->lifecycle_mu);
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  impl_->store.Shutdown();  // first: watch providers return and free their workers
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int FakeApiServer::port() const { return impl_->port; }

std::string FakeApiServer::ca_pem() const { return impl_->pki.ca.cert_pem; }

Result<pki::CertAndKey> FakeApiServer::MakeClientCert(const std::string& user) const {
  if (!impl_->options.tls) return FailedPrecondition("the fake API server does not serve TLS");
  return pki::MakeClientCert(impl_->pki.ca, user, "system:masters");
}

std::string FakeApiServer::url() const {
  return std::string(impl_->options.tls ? "https://" : "http://") + impl_->options.host + ":" + std::to_string(impl_->port);
}

void FakeApiServer::CloseAllWatches() { impl_->store.CloseAllWatches(); }
uint64_t FakeApiServer::WatchesBegun() const { return impl_->store.watches_begun(); }

void FakeApiServer::InjectErrors(std::string path_prefix, int status_code, int count,
                                 int retry_after_seconds) {
  if (count <= 0) return;
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  impl_->injected.push_back({std::move(path_prefix), status_code, count, retry_after_seconds});
}

int FakeApiServer::InjectedErrorsPending() const {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  int n = 0;
  for (const auto& e : impl_->injected) n += e.remaining;
  return n;
}

void FakeApiServer::ClearInjectedErrors() {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  impl_->injected.clear();
}

void FakeApiServer::SetLatency(std::chrono::milliseconds latency) {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  impl_->latency = latency;
}

int64_t FakeApiServer::WriteCountByUserAgent(std::string_view part) const {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  int64_t n = 0;
  for (const auto& [agent, count] : impl_->writes_by_agent) {
    if (agent.find(part) != std::string::npos) n += count;
  }
  return n;
}

int64_t FakeApiServer::WriteCount(std::string_view resource) const {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  int64_t total = 0;
  for (const auto& [name, n] : impl_->writes) {
    if (resource.empty() || name == resource) total += n;
  }
  return total;
}

int64_t FakeApiServer::RequestCount(std::string_view method, std::string_view resource) const {
  std::lock_guard<std::mutex> lock(impl_->hooks_mu);
  int64_t total = 0;
  for (const auto& [key, n] : impl_->requests) {
    if ((method.empty() || key.first == method) && key.second == resource) total += n;
  }
  return total;
}

void FakeApiServer::CompactHistory() { impl_->store.CompactHistory(); }

std::string FakeApiServer::CurrentResourceVersion() const {
  return impl_->store.CurrentResourceVersion();
}

}  // namespace meshload::fakeapi
