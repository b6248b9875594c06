#include "controller/kube/client.h"

#include <httplib.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "common/percent_encoding.h"

namespace meshload::controller::kube {
namespace {

bool Retryable5xx(int code) { return code == 500 || code == 502 || code == 503 || code == 504; }

X509_STORE* StoreFromPem(const std::string& pem) {
  X509_STORE* store = X509_STORE_new();
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    added += X509_STORE_add_cert(store, cert) == 1;
    X509_free(cert);
  }
  BIO_free(bio);
  if (added == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

std::string ErrorText(httplib::Error e) { return httplib::to_string(e); }

}  // namespace

std::string ApiResponse::reason() const {
  if (body.is_object() && body.value("kind", "") == "Status") return body.value("reason", "");
  return "";
}

std::string ApiResponse::message() const {
  if (code == 0) return error;
  if (body.is_object() && body.value("kind", "") == "Status") return body.value("message", "");
  return "";
}

Status ApiResponse::ToStatus(std::string_view what) const {
  if (ok()) return Status::Ok();
  std::string text = std::string(what) + ": ";
  if (code == 0) return Status(StatusCode::kUnavailable, text + "cannot reach the API server: " + error);
  text += std::to_string(code);
  if (!reason().empty()) text += " " + reason();
  if (!message().empty()) text += ": " + message();
  StatusCode sc = StatusCode::kFailedPrecondition;
  if (code == 404)
    sc = StatusCode::kNotFound;
  else if (code == 409 && reason() == "AlreadyExists")
    sc = StatusCode::kAlreadyExists;
  else if (code == 400 || code == 422)
    sc = StatusCode::kInvalidArgument;
  else if (code == 429 || code >= 500)
    sc = StatusCode::kUnavailable;
  return Status(sc, text);
}

RateLimiter::RateLimiter(double qps, int burst)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(burst_), last_(std::chrono::steady_clock::now()) {}

bool RateLimiter::Acquire(const std::atomic<bool>& stop) {
  if (qps_ <= 0) return !stop.load();
  while (!stop.load()) {
    std::chrono::duration<double> wait{0};
    {
      MutexLock lock(mu_);
      auto now = std::chrono::steady_clock::now();
      tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * qps_);
      last_ = now;
      if (tokens_ >= 1.0) {
        tokens_ -= 1.0;
        return true;
      }
      wait = std::chrono::duration<double>((1.0 - tokens_) / qps_);
    }
    // Short slices so that Shutdown() is not held up by a slow bucket.
    std::this_thread::sleep_for(std::min(wait, std::chrono::duration<double>(0.05)));
  }
  return false;
}

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string CutUtf8(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

std::string QueryEscape(std::string_view s) { return PercentEncode(s); }

std::string_view VerbLabel(std::string_view method, const std::string& full_path) {
  if (method != "GET") return method;
  std::string_view path(full_path);
  std::string_view query;
  if (size_t q = path.find('?'); q != std::string_view::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  if (query.find("watch=true") != std::string_view::npos || query.find("watch=1") != std::string_view::npos) {
    return "WATCH";
  }
  std::vector<std::string_view> parts;
  for (size_t i = 0; i < path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) parts.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  size_t prefix = !parts.empty() && parts[0] == "api" ? 2 : 3;
  if (parts.size() <= prefix) return "GET";  // discovery
  size_t rest = parts.size() - prefix;
  bool collection = parts[prefix] == "namespaces" ? (rest == 1 || rest == 3) : rest == 1;
  return collection ? "LIST" : "GET";
}

KubeClient::KubeClient(ClusterConfig config, ClientOptions options)
    : config_(std::move(config)), options_(std::move(options)), limiter_(options_.qps, options_.burst) {}

KubeClient::~KubeClient() { Shutdown(); }

Result<std::unique_ptr<KubeClient>> KubeClient::Create(ClusterConfig config, ClientOptions options) {
  std::unique_ptr<KubeClient> c(new KubeClient(std::move(config), std::move(options)));
  MESHLOAD_RETURN_IF_ERROR(c->Init());
  return c;
}

Status KubeClient::Init() {
  const std::string& s = config_.server;
  size_t colon = s.find("://");
  if (colon == std::string::npos) return InvalidArgument("the server is not a URL", s);
  scheme_ = s.substr(0, colon);
  std::string hostport = s.substr(colon + 3);
  if (size_t slash = hostport.find('/'); slash != std::string::npos) {
    return InvalidArgument("a server URL with a path is not supported", s);
  }
  size_t port_colon = hostport.rfind(':');
  if (port_colon != std::string::npos && hostport.find(']', port_colon) == std::string::npos) {
    host_ = hostport.substr(0, port_colon);
    try {
      port_ = std::stoi(hostport.substr(port_colon + 1));
    } catch (...) {
      return InvalidArgument("the server URL has a bad port", s);
    }
  } else {
    host_ = hostport;
    port_ = scheme_ == "https" ? 443 : 80;
  }
  if (!host_.empty() && host_.front() == '[') host_ = host_.substr(1, host_.size() - 2);
  if (scheme_ != "https" && scheme_ != "http") return InvalidArgument("the server must be http(s)", s);
  if (scheme_ == "https" && !config_.ca_pem.empty()) {
    X509_STORE* store = StoreFromPem(config_.ca_pem);
    if (store == nullptr) return InvalidArgument("the CA data holds no PEM certificate", config_.origin);
    X509_STORE_free(store);
  }
  // One connection up front: a bad client certificate or key fails here,
  // with a clear message, and not on the first request.
  MESHLOAD_ASSIGN_OR_RETURN(auto conn, NewConnection(options_.request_timeout));
  ReturnConnection(std::move(conn));
  return Status::Ok();
}

Result<std::unique_ptr<httplib::ClientImpl>> KubeClient::NewConnection(std::chrono::seconds read_timeout) {
  std::unique_ptr<httplib::ClientImpl> c;
  if (scheme_ == "https") {
    X509* cert = nullptr;
    EVP_PKEY* key = nullptr;
    if (!config_.client_cert_pem.empty()) {
      BIO* cb = BIO_new_mem_buf(config_.client_cert_pem.data(), static_cast<int>(config_.client_cert_pem.size()));
      BIO* kb = BIO_new_mem_buf(config_.client_key_pem.data(), static_cast<int>(config_.client_key_pem.size()));
      cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
      key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
      BIO_free(cb);
      BIO_free(kb);
      if (cert == nullptr || key == nullptr) {
        X509_free(cert);
        EVP_PKEY_free(key);
        return InvalidArgument("the client certificate or key is not valid PEM", config_.origin);
      }
    }
    auto ssl = std::make_unique<httplib::SSLClient>(host_, port_, cert, key);
    X509_free(cert);
    EVP_PKEY_free(key);
    if (!ssl->is_valid()) {
      return InvalidArgument("cannot set up TLS (does the client key match the certificate?)", config_.origin);
    }
    if (!config_.ca_pem.empty()) ssl->set_ca_cert_store(StoreFromPem(config_.ca_pem));
    ssl->enable_server_certificate_verification(!config_.insecure_skip_tls_verify);
    c = std::move(ssl);
  } else {
    c = std::make_unique<httplib::ClientImpl>(host_, port_);
  }
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);
  c->set_connection_timeout(options_.connect_timeout);
  c->set_read_timeout(read_timeout);
  c->set_write_timeout(options_.request_timeout);
  c->set_decompress(false);
  c->set_url_encode(false);
  return c;
}

std::unique_ptr<httplib::ClientImpl> KubeClient::TakeConnection(bool* pooled) {
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      *pooled = true;
      return c;
    }
  }
  *pooled = false;
  auto c = NewConnection(options_.request_timeout);
  return c.ok() ? std::move(*c) : nullptr;
}

void KubeClient::ReturnConnection(std::unique_ptr<httplib::ClientImpl> c) {
  MutexLock lock(mu_);
  if (idle_.size() < 16 && !stopping_.load()) idle_.push_back(std::move(c));
}

std::string KubeClient::AuthorizationHeader() {
  if (!config_.bearer_token.empty()) return "Bearer " + config_.bearer_token;
  if (config_.token_file.empty()) return "";
  struct stat st {};
  MutexLock lock(mu_);
  if (::stat(config_.token_file.c_str(), &st) == 0) {
    int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (mtime != token_mtime_ns_) {
      std::ifstream in(config_.token_file);
      std::stringstream ss;
      ss << in.rdbuf();
      std::string t = ss.str();
      while (!t.empty() && (t.back() == '\n' || t.back() == ' ' || t.back() == '\r')) t.pop_back();
      if (!t.empty()) {
        token_ = t;
        token_mtime_ns_ = mtime;
      }
    }
  }
  return token_.empty() ? "" : "Bearer " + token_;
}

bool KubeClient::Sleep(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (!stopping_.load()) {
    if (!cv_.WaitUntil(mu_, deadline)) break;  // timed out: stopping_ as it is now
  }
  return !stopping_.load();
}

std::chrono::milliseconds KubeClient::Backoff(int attempt) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  auto ceiling = options_.backoff_base * (int64_t(1) << std::min(attempt, 20));
  ceiling = std::min(ceiling, options_.backoff_cap);
  // Full jitter in [ceiling/2, ceiling]: spreads many clients retrying at once.
  std::uniform_int_distribution<int64_t> dist(ceiling.count() / 2, std::max<int64_t>(1, ceiling.count()));
  return std::chrono::milliseconds(dist(rng));
}

ApiResponse KubeClient::Call(std::string_view method, const std::string& path, const std::string& body,
                             std::string_view content_type) {
  ApiResponse out;
  const std::string_view verb = VerbLabel(method, path);
  for (int attempt = 0; attempt < std::max(1, options_.max_attempts); ++attempt) {
    out = ApiResponse{};
    out.attempts = attempt + 1;
    if (!limiter_.Acquire(stopping_)) {
      out.error = "the client is shutting down";
      return out;
    }
    bool pooled = false;
    auto conn = TakeConnection(&pooled);
    if (conn == nullptr) {
      out.error = "cannot create a connection to " + config_.server;
      return out;
    }
    httplib::Request req;
    req.method = std::string(method);
    req.path = path;
    req.headers = {{"Accept", "application/json"}, {"User-Agent", options_.user_agent}};
    if (std::string auth = AuthorizationHeader(); !auth.empty()) req.headers.emplace("Authorization", auth);
    if (!body.empty()) {
      req.body = body;
      req.headers.emplace("Content-Type", std::string(content_type));
    }
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    bool sent = conn->send(req, res, err);
    if (!sent && pooled && !stopping_.load()) {
      // The server may have closed an idle keep-alive connection: that is
      // not a failed attempt. Once more on a fresh connection.
      auto fresh = NewConnection(options_.request_timeout);
      if (fresh.ok()) {
        conn = std::move(*fresh);
        res = httplib::Response();
        err = httplib::Error::Success;
        sent = conn->send(req, res, err);
      }
    }
    if (options_.observer) options_.observer(verb, sent ? res.status : 0);
    std::chrono::milliseconds delay{0};
    if (!sent) {
      out.error = ErrorText(err);
      delay = Backoff(attempt);
      // A broken connection is not returned to the pool.
    } else {
      ReturnConnection(std::move(conn));
      out.code = res.status;
      out.body = nlohmann::json::parse(res.body, nullptr, /*allow_exceptions=*/false);
      if (out.body.is_discarded()) out.body = nullptr;
      if (res.status == 429) {
        int retry_after = 0;
        if (res.has_header("Retry-After")) {
          try {
            retry_after = std::stoi(res.get_header_value("Retry-After"));
          } catch (...) {
            retry_after = 0;
          }
        }
        delay = retry_after > 0
                    ? std::chrono::milliseconds(std::min<int64_t>(retry_after, options_.max_retry_after.count()) * 1000)
                    : Backoff(attempt);
      } else if (Retryable5xx(res.status)) {
        delay = Backoff(attempt);
      } else {
        return out;
      }
    }
    if (attempt + 1 >= options_.max_attempts) break;
    LogDebug("retrying an API request", {{"verb", std::string(verb)},
                                         {"code", out.code},
                                         {"attempt", attempt + 1},
                                         {"delay_ms", static_cast<int64_t>(delay.count())}});
    if (!Sleep(delay)) break;
  }
  return out;
}

ApiResponse KubeClient::Get(const std::string& path) { return Call("GET", path, "", ""); }
ApiResponse KubeClient::Post(const std::string& path, const nlohmann::json& body) {
  return Call("POST", path, body.dump(), "application/json");
}
ApiResponse KubeClient::Put(const std::string& path, const nlohmann::json& body) {
  return Call("PUT", path, body.dump(), "application/json");
}
ApiResponse KubeClient::Patch(const std::string& path, const nlohmann::json& body, std::string_view content_type) {
  return Call("PATCH", path, body.dump(), content_type);
}
ApiResponse KubeClient::Delete(const std::string& path, const nlohmann::json& body) {
  return Call("DELETE", path, body.is_null() ? "" : body.dump(), "application/json");
}

uint64_t KubeClient::NewWatchId() {
  MutexLock lock(mu_);
  return next_watch_id_++;
}

void KubeClient::CancelWatch(uint64_t id) {
  MutexLock lock(mu_);
  cancelled_watches_.push_back(id);
  if (auto it = watches_.find(id); it != watches_.end()) it->second->stop();
}

Status KubeClient::Watch(const std::string& path, const std::function<bool(nlohmann::json&)>& on_event, uint64_t id,
                         int* code_out) {
  if (code_out) *code_out = 0;
  if (!limiter_.Acquire(stopping_)) return Status(StatusCode::kCancelled, "the client is shutting down");
  // A watch may legitimately be silent for its whole timeoutSeconds; the read
  // timeout only guards against a dead peer.
  MESHLOAD_ASSIGN_OR_RETURN(auto conn, NewConnection(options_.request_timeout + std::chrono::seconds(600)));
  {
    MutexLock lock(mu_);
    if (stopping_.load() ||
        std::find(cancelled_watches_.begin(), cancelled_watches_.end(), id) != cancelled_watches_.end()) {
      return Status(StatusCode::kCancelled, "the watch was cancelled");
    }
    watches_[id] = conn.get();
  }
  httplib::Headers headers = {{"Accept", "application/json"}, {"User-Agent", options_.user_agent}};
  if (std::string auth = AuthorizationHeader(); !auth.empty()) headers.emplace("Authorization", auth);
  std::string buffer, error_body;
  bool callback_stopped = false;
  int status = 0;
  auto res = conn->Get(
      path, headers,
      [&](const httplib::Response& r) {
        status = r.status;
        return true;
      },
      [&](const char* data, size_t n) {
        if (status != 200) {
          error_body.append(data, n);
          return error_body.size() < (1 << 20);
        }
        buffer.append(data, n);
        size_t start = 0;
        for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
          if (nl == start) continue;
          auto event = nlohmann::json::parse(buffer.begin() + static_cast<std::ptrdiff_t>(start),
                                             buffer.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
          if (event.is_discarded() || !event.is_object()) continue;
          if (!on_event(event)) {
            callback_stopped = true;
            return false;
          }
        }
        buffer.erase(0, start);
        return true;
      });
  bool cancelled;
  {
    MutexLock lock(mu_);
    watches_.erase(id);
    auto it = std::find(cancelled_watches_.begin(), cancelled_watches_.end(), id);
    cancelled = it != cancelled_watches_.end() || stopping_.load();
    if (it != cancelled_watches_.end()) cancelled_watches_.erase(it);
  }
  if (options_.observer) options_.observer("WATCH", res ? res->status : status);
  if (code_out) *code_out = res ? res->status : status;
  if (callback_stopped) return Status::Ok();
  if (cancelled) return Status(StatusCode::kCancelled, "the watch was cancelled");
  if (!res) return Status(StatusCode::kUnavailable, "the watch stream broke: " + ErrorText(res.error()));
  if (res->status != 200) {
    ApiResponse r;
    r.code = res->status;
    r.body = nlohmann::json::parse(error_body, nullptr, false);
    return r.ToStatus("watch");
  }
  return Status::Ok();
}

void KubeClient::Shutdown() {
  MutexLock lock(mu_);
  stopping_.store(true);
  for (auto& [id, c] : watches_) c->stop();
  idle_.clear();
  cv_.NotifyAll();
}

}  // namespace meshload::controller::kube
