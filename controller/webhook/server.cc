#include "controller/webhook/server.h"

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <chrono>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "controller/webhook/admission.h"

namespace meshload::controller::webhook {

namespace {

// Pods, and the Jobs and JobSets whose templates get the sidecar (one
// handler: the review names the kind).
constexpr char kPath[] = "/mutate-pods";
constexpr char kJobsPath[] = "/mutate-jobs";

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

struct FileStamp {
  bool ok = false;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp Stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, st.st_ino, st.st_size, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

}  // namespace

/// The serving certificate: loaded from cert_dir, swapped in at a handshake
/// when the files changed.
class CertificateStore {
 public:
  struct Pair {
    X509* leaf = nullptr;
    STACK_OF(X509) * chain = nullptr;
    EVP_PKEY* key = nullptr;
    int64_t not_after = 0;  // seconds since the epoch
    ~Pair() {
      X509_free(leaf);
      sk_X509_pop_free(chain, X509_free);
      EVP_PKEY_free(key);
    }
  };

  CertificateStore(std::string dir, metrics::Registry* registry) : crt_(dir + "/tls.crt"), key_(dir + "/tls.key") {
    if (registry != nullptr) {
      auto& reloads = metrics::BuildCounter()
                          .Name("meshload_controller_webhook_certificate_reloads_total")
                          .Help("Loads of the webhook's serving certificate after its files changed, by result.")
                          .Register(*registry);
      reload_ok_ = &reloads.Add({{"result", "ok"}});
      reload_error_ = &reloads.Add({{"result", "error"}});
      expiry_ = &metrics::BuildGauge()
                     .Name("meshload_controller_webhook_certificate_expiry_timestamp_seconds")
                     .Help("When the webhook's serving certificate in use expires (Unix time).")
                     .Register(*registry)
                     .Add({});
    }
  }

  /// Loads the pair now; an error names the file.
  Status Load() MESHLOAD_EXCLUDES(mu_) {
    auto loaded = Read();
    if (!loaded.ok()) return loaded.status();
    MutexLock lock(mu_);
    current_ = std::move(*loaded);
    if (expiry_ != nullptr) expiry_->Set(static_cast<double>(current_->not_after));
    return Status::Ok();
  }

  /// The pair to serve with, reloaded first if the files changed (checked at
  /// most once a second).
  std::shared_ptr<const Pair> Current() MESHLOAD_EXCLUDES(mu_) {
    const auto now = std::chrono::steady_clock::now();
    bool check = false;
    {
      MutexLock lock(mu_);
      if (now - last_check_ >= std::chrono::seconds(1)) {
        last_check_ = now;
        check = true;
      }
    }
    if (check) MaybeReload();
    MutexLock lock(mu_);
    return current_;
  }

 private:
  void MaybeReload() MESHLOAD_EXCLUDES(mu_) {
    FileStamp c = Stamp(crt_), k = Stamp(key_);
    {
      MutexLock lock(mu_);
      if (c == crt_stamp_ && k == key_stamp_) return;
    }
    auto loaded = Read();
    MutexLock lock(mu_);
    if (!loaded.ok()) {
      // Keep serving the last good pair; try again when the files change.
      crt_stamp_ = c;
      key_stamp_ = k;
      if (reload_error_ != nullptr) reload_error_->Increment();
      LogWarn("cannot reload the webhook's serving certificate; the previous one stays in use",
              {{"error", loaded.status().ToString()}});
      return;
    }
    current_ = std::move(*loaded);
    if (reload_ok_ != nullptr) reload_ok_->Increment();
    if (expiry_ != nullptr) expiry_->Set(static_cast<double>(current_->not_after));
    LogInfo("reloaded the webhook's serving certificate", {{"file", crt_}, {"not_after", current_->not_after}});
  }

  Result<std::shared_ptr<const Pair>> Read() MESHLOAD_EXCLUDES(mu_) {
    // Stamps first: a change while reading is seen at the next check.
    FileStamp c = Stamp(crt_), k = Stamp(key_);
    auto pair = std::make_shared<Pair>();
    std::unique_ptr<BIO, decltype(&BIO_free)> crt_bio(BIO_new_file(crt_.c_str(), "r"), BIO_free);
    if (!crt_bio)
      return Status(StatusCode::kNotFound, "cannot open the webhook certificate " + crt_ + ": " + OpenSslError());
    pair->leaf = PEM_read_bio_X509(crt_bio.get(), nullptr, nullptr, nullptr);
    if (pair->leaf == nullptr) {
      return Status(StatusCode::kInvalidArgument, "no PEM certificate in " + crt_ + ": " + OpenSslError());
    }
    pair->chain = sk_X509_new_null();
    while (X509* extra = PEM_read_bio_X509(crt_bio.get(), nullptr, nullptr, nullptr)) sk_X509_push(pair->chain, extra);
    ERR_clear_error();  // the end of the file
    std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(BIO_new_file(key_.c_str(), "r"), BIO_free);
    if (!key_bio) return Status(StatusCode::kNotFound, "cannot open the webhook key " + key_ + ": " + OpenSslError());
    pair->key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    if (pair->key == nullptr) {
      return Status(StatusCode::kInvalidArgument, "no PEM private key in " + key_ + ": " + OpenSslError());
    }
    if (X509_check_private_key(pair->leaf, pair->key) != 1) {
      ERR_clear_error();
      return Status(StatusCode::kInvalidArgument, "the key in " + key_ + " is not the certificate's in " + crt_);
    }
    const ASN1_TIME* na = X509_get0_notAfter(pair->leaf);
    struct tm t {};
    if (ASN1_TIME_to_tm(na, &t) == 1) pair->not_after = static_cast<int64_t>(timegm(&t));
    MutexLock lock(mu_);
    crt_stamp_ = c;
    key_stamp_ = k;
    return std::shared_ptr<const Pair>(std::move(pair));
  }

  const std::string crt_, key_;
  Mutex mu_;
  std::shared_ptr<const Pair> current_ MESHLOAD_GUARDED_BY(mu_);
  FileStamp crt_stamp_ MESHLOAD_GUARDED_BY(mu_), key_stamp_ MESHLOAD_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_check_ MESHLOAD_GUARDED_BY(mu_){};
  // Set by the constructor, read-only after (the metrics are thread-safe).
  metrics::Counter* reload_ok_ = nullptr;
  metrics::Counter* reload_error_ = nullptr;
  metrics::Gauge* expiry_ = nullptr;
};

WebhookServer::WebhookServer(metrics::Registry* registry, JobLookup jobs, InjectorOptions injector,
                             WebhookServerOptions options)
    : jobs_(std::move(jobs)),
      injector_(std::move(injector)),
      options_(std::move(options)),
      certs_(std::make_unique<CertificateStore>(options_.cert_dir, registry)) {
  if (registry != nullptr) {
    auto& requests = metrics::BuildCounter()
                         .Name("meshload_controller_webhook_requests_total")
                         .Help(
                             "Admission requests to the sidecar injector, by outcome: injected, unchanged (not "
                             "labelled, or injected already), refused (the pod is not admitted), bad_request.")
                         .Register(*registry);
    for (const char* o : {"injected", "unchanged", "refused", "bad_request"})
      requests_[o] = &requests.Add({{"outcome", o}});
    duration_ = &metrics::BuildHistogram()
                     .Name("meshload_controller_webhook_request_duration_seconds")
                     .Help("Time to answer one admission request.")
                     .Register(*registry)
                     .Add({}, metrics::ExponentialBuckets(0.0001, 4, 9));
  }
}

WebhookServer::~WebhookServer() { Stop(); }

Result<int> WebhookServer::Start() {
  MESHLOAD_RETURN_IF_ERROR(certs_->Load());
  CertificateStore* store = certs_.get();
  auto server = std::make_unique<httplib::SSLServer>([store](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_cert_cb(
        &ctx,
        [](SSL* ssl, void* arg) -> int {
          auto pair = static_cast<CertificateStore*>(arg)->Current();
          if (!pair) return 0;
          if (SSL_use_certificate(ssl, pair->leaf) != 1 || SSL_use_PrivateKey(ssl, pair->key) != 1) return 0;
          if (sk_X509_num(pair->chain) > 0 && SSL_set1_chain(ssl, pair->chain) != 1) return 0;
          return 1;
        },
        store);
    return true;
  });
  if (!server->is_valid()) return Status(StatusCode::kInternal, "cannot set up TLS for the webhook: " + OpenSslError());
  server->set_payload_max_length(kMaxAdmissionReviewBytes);
  server->set_read_timeout(10, 0);
  server->set_write_timeout(10, 0);
  server->set_keep_alive_timeout(30);
  const auto review = [this](const httplib::Request& req, httplib::Response& res) {
    const auto start = std::chrono::steady_clock::now();
    AdmissionAnswer a = ReviewAdmission(req.body, jobs_, injector_);
    res.status = a.http_status;
    res.set_content(a.body, "application/json");
    if (auto it = requests_.find(a.outcome); it != requests_.end()) it->second->Increment();
    if (duration_ != nullptr) {
      duration_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (a.outcome == "refused" || a.outcome == "bad_request") {
      LogInfo("webhook refused a request", {{"outcome", a.outcome}, {"answer", a.body.substr(0, 1024)}});
    }
  };
  server->Post(kPath, review);
  server->Post(kJobsPath, review);
  server->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 413) {
      res.set_content("request body larger than " + std::to_string(kMaxAdmissionReviewBytes) + " bytes\n",
                      "text/plain");
    } else if (res.status == 404 && (req.path == kPath || req.path == kJobsPath)) {
      res.status = 405;
      res.set_header("Allow", "POST");
      res.set_content("method not allowed\n", "text/plain");
    } else if (res.status == 404) {
      res.set_content("not found: " + req.path + "\n", "text/plain");
    }
  });
  int port = options_.port == 0 ? server->bind_to_any_port(options_.bind_address)
             : server->bind_to_port(options_.bind_address, options_.port) ? options_.port
                                                                          : -1;
  if (port < 0) {
    return Status(StatusCode::kUnavailable, "cannot listen on " + options_.bind_address + ":" +
                                                std::to_string(options_.port) + " for the webhook");
  }
  httplib::SSLServer* raw = server.get();
  server_ = std::move(server);
  auto returned = std::make_shared<std::atomic<bool>>(false);
  thread_ = std::thread([raw, returned] {
    raw->listen_after_bind();
    *returned = true;
  });
  while (!raw->is_running() && !*returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (*returned) {
    Stop();
    return Status(StatusCode::kUnavailable,
                  "the webhook's listener on port " + std::to_string(port) + " exited at start");
  }
  LogInfo("webhook listening", {{"address", options_.bind_address}, {"port", port}, {"path", kPath}});
  return port;
}

void WebhookServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace meshload::controller::webhook
