// SourceRegistry, scheme parsing, URI redaction and the null observer.

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>

#include "sidecar/source/source.h"

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

std::unique_ptr<SourceRegistry> SourceRegistry::WithBuiltins(SourceOptions options) {
  auto registry = std::make_unique<SourceRegistry>(std::move(options));
  registry->Register("file", MakeFileSource);
  registry->Register("http", MakeHttpSource, Latency::kNetwork);
  registry->Register("https", MakeHttpSource, Latency::kNetwork);
  registry->Register("s3", MakeS3Source, Latency::kNetwork);
  return registry;
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

}  // namespace meshload::sidecar::source
