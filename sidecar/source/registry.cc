// SourceRegistry, scheme parsing, URI redaction and the null observer.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sidecar/source/source.h"

#include "common/status.h"
#include "planner/spec.h"

namespace meshload::sidecar::source {
namespace {

class NullObserverImpl final : public SourceObserver {
 public:
  void OnRead(std::string_view, uint64_t, double) override {}
  void OnRetry(std::string_view, std::string_view) override {}
  void OnError(std::string_view, std::string_view) override {}
};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ). Anything else before
// "://" means the text is a path that happens to contain "://".
bool IsScheme(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
}

constexpr std::string_view kSchemeSep = "://";

// Where "://" starts in `uri` when it has a scheme; npos for plain paths.
size_t SchemeEnd(std::string_view uri) {
  size_t sep = uri.find(kSchemeSep);
  return sep != std::string_view::npos && IsScheme(uri.substr(0, sep)) ? sep : std::string_view::npos;
}

}  // namespace

SourceObserver& NullObserver() {
  static NullObserverImpl observer;
  return observer;
}

std::string RedactUri(std::string_view uri) {
  // An s3:// URI has no query: a '?' there is a glob character of the key.
  if (uri.size() >= 5 && Lower(uri.substr(0, 5)) == "s3://") return std::string(uri);
  std::string_view kept = uri.substr(0, uri.find_first_of("?#"));
  size_t sep = SchemeEnd(kept);
  if (sep == std::string_view::npos) return std::string(kept);
  size_t authority = sep + kSchemeSep.size();
  size_t authority_end = kept.find('/', authority);
  if (authority_end == std::string_view::npos) authority_end = kept.size();
  size_t at = kept.substr(0, authority_end).rfind('@');
  if (at == std::string_view::npos || at < authority) return std::string(kept);
  std::string out(kept.substr(0, authority));
  out += kept.substr(at + 1);
  return out;
}

SourceRegistry::SourceRegistry(SourceOptions options) : options_(std::move(options)) {
  if (options_.observer == nullptr) options_.observer = &NullObserver();
}

namespace {

// s3: the dataset's spec.dataset.s3, then the environment.
Status S3SettingsOf(const planner::DatasetSpec& dataset, SourceOptions& options) {
  S3Options& s3 = options.s3;
  if (dataset.s3) {
    if (!dataset.s3->endpoint.empty()) s3.endpoint = dataset.s3->endpoint;
    if (!dataset.s3->region.empty()) s3.region = dataset.s3->region;
    if (dataset.s3->addressing == "Path") s3.addressing = S3Options::Addressing::kPath;
    if (dataset.s3->addressing == "VirtualHosted") s3.addressing = S3Options::Addressing::kVirtualHosted;
  }
  return S3OptionsFromEnvironment(s3);
}

// A built-in scheme, in one place: its sources, how their reads cost, and
// the settings they take from a dataset declared on it (none: null).
struct BuiltinScheme {
  const char* scheme;
  Result<std::unique_ptr<Source>> (*make)(const SourceOptions&);
  SourceRegistry::Latency latency;
  Status (*settings)(const planner::DatasetSpec&, SourceOptions&);
};

constexpr BuiltinScheme kBuiltins[] = {
    {"file", MakeFileSource, SourceRegistry::Latency::kLocal, nullptr},
    {"http", MakeHttpSource, SourceRegistry::Latency::kNetwork, nullptr},
    {"https", MakeHttpSource, SourceRegistry::Latency::kNetwork, nullptr},
    {"s3", MakeS3Source, SourceRegistry::Latency::kNetwork, S3SettingsOf},
};

// Each dataset's scheme fills its settings into `options`, once per scheme
// (a mixture's datasets share spec.dataset's settings).
Result<SourceOptions> WithSettings(const std::vector<planner::DatasetSpec>& datasets, SourceOptions options) {
  std::vector<std::string> done;
  for (const planner::DatasetSpec& ds : datasets) {
    const std::string scheme = SourceRegistry::SchemeOf(ds.uri);
    if (std::find(done.begin(), done.end(), scheme) != done.end()) continue;
    done.push_back(scheme);
    for (const BuiltinScheme& b : kBuiltins) {
      if (scheme == b.scheme && b.settings != nullptr) MESHLOAD_RETURN_IF_ERROR(b.settings(ds, options));
    }
  }
  return options;
}

}  // namespace

std::unique_ptr<SourceRegistry> SourceRegistry::WithBuiltins(SourceOptions options) {
  auto registry = std::make_unique<SourceRegistry>(std::move(options));
  for (const BuiltinScheme& b : kBuiltins) registry->Register(b.scheme, b.make, b.latency);
  return registry;
}

Result<SourceOptions> SourceOptionsForJob(const planner::JobSpec& spec, SourceOptions base) {
  return WithSettings(planner::JobDatasets(spec), std::move(base));
}

Result<SourceOptions> SourceOptionsForUris(const std::vector<std::string>& uris, SourceOptions base) {
  std::vector<planner::DatasetSpec> datasets(uris.size());
  for (size_t i = 0; i < uris.size(); ++i) datasets[i].uri = uris[i];
  return WithSettings(datasets, std::move(base));
}

void SourceRegistry::Register(std::string scheme, SourceFactory factory, Latency latency) {
  MutexLock lock(mu_);
  scheme = Lower(scheme);
  factories_[scheme] = std::move(factory);
  latency_[scheme] = latency;
}

bool SourceRegistry::Network(const std::string& uri) const {
  MutexLock lock(mu_);
  auto it = latency_.find(SchemeOf(uri));
  return it != latency_.end() && it->second == Latency::kNetwork;
}

std::string SourceRegistry::SchemeOf(const std::string& uri) {
  size_t sep = SchemeEnd(uri);
  return sep == std::string::npos ? "file" : Lower(std::string_view(uri).substr(0, sep));
}

Result<std::pair<Source*, std::string>> SourceRegistry::For(const std::string& uri) {
  std::string scheme = SchemeOf(uri);
  std::string object = uri;
  size_t sep = SchemeEnd(uri);
  if (scheme == "file" && sep != std::string::npos) {
    // file:///a/b and file://localhost/a/b name /a/b; the path is used verbatim
    // (no percent-decoding), so dataset paths containing '%' keep working.
    std::string_view rest = std::string_view(uri).substr(sep + kSchemeSep.size());
    constexpr std::string_view kLocalhost = "localhost/";
    if (rest.substr(0, kLocalhost.size()) == kLocalhost) rest.remove_prefix(kLocalhost.size() - 1);
    if (rest.empty() || rest.front() != '/') {
      return InvalidArgument(
          "file URIs name an absolute local path (file:///path); a host other than "
          "localhost is not supported",
          RedactUri(uri));
    }
    object = std::string(rest);
  }

  MutexLock lock(mu_);
  auto source = sources_.find(scheme);
  if (source == sources_.end()) {
    auto factory = factories_.find(scheme);
    if (factory == factories_.end()) {
      std::string known;
      for (const auto& [name, unused] : factories_) {
        if (!known.empty()) known += ", ";
        known += name;
      }
      if (known.empty()) known = "none";
      return InvalidArgument("unknown URI scheme \"" + scheme + "\" (known schemes: " + known + ")", RedactUri(uri));
    }
    auto made = factory->second(options_);
    if (!made.ok()) return made.status();
    source = sources_.emplace(scheme, std::move(made).value()).first;
  }
  Source* found = source->second.get();
  // An interposed source may itself have another over it (the decoding of
  // compressed files over the block cache over the remote source).
  for (auto in = interposed_.find(found); in != interposed_.end(); in = interposed_.find(found)) found = in->second;
  return std::make_pair(found, std::move(object));
}

void SourceRegistry::Interpose(Source* inner, Source* outer) {
  MutexLock lock(mu_);
  interposed_[inner] = outer;
}

Status Source::ReadTo(const std::string& uri, uint64_t offset, uint64_t len, const Sink& sink) {
  std::vector<uint8_t> piece(static_cast<size_t>(std::min<uint64_t>(len, kStreamPiece)));
  for (uint64_t at = 0; at < len;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(len - at, piece.size()));
    MESHLOAD_RETURN_IF_ERROR(Read(uri, offset + at, piece.data(), n));
    MESHLOAD_RETURN_IF_ERROR(sink(at, piece.data(), n));
    at += n;
  }
  return Status::Ok();
}

void ForEach(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  threads = std::min(n, threads);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

void ForEachObject(const Source& source, size_t n, const std::function<void(size_t)>& fn) {
  ForEach(n, source.LatencyBound() ? 16 : 1, fn);
}

namespace {
thread_local int64_t t_reading_step = -1;
}  // namespace

void SetReadingStep(int64_t step) { t_reading_step = step; }
int64_t ReadingStep() { return t_reading_step; }

}  // namespace meshload::sidecar::source
