// The "s3" source: objects of S3-compatible storage read with ranged GETs
// signed with AWS Signature Version 4, listed with ListObjectsV2, over the
// HTTP transport of http_source.cc (keep-alive pooling, retries with
// jittered backoff, S3 error codes in the messages).

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/percent_encoding.h"
#include "sidecar/source/http_internal.h"
#include "sidecar/source/s3_internal.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source {
namespace internal {
namespace {

constexpr std::string_view kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Hex(const unsigned char* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  // Sequential spaces inside become one (SigV4's Trimall).
  std::string out;
  for (char c : s) {
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  return out;
}

// The text of the first <tag>...</tag> in `xml` from `from`; nullopt if none.
std::optional<std::string_view> Element(std::string_view xml, std::string_view tag, size_t* from = nullptr) {
  const std::string open = "<" + std::string(tag) + ">";
  const std::string close = "</" + std::string(tag) + ">";
  size_t start = xml.find(open, from ? *from : 0);
  if (start == std::string_view::npos) return std::nullopt;
  start += open.size();
  size_t end = xml.find(close, start);
  if (end == std::string_view::npos) return std::nullopt;
  if (from) *from = end + close.size();
  return xml.substr(start, end - start);
}

std::vector<std::string_view> Elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  size_t from = 0;
  while (auto e = Element(xml, tag, &from)) out.push_back(*e);
  return out;
}

}  // namespace

Result<S3Uri> ParseS3Uri(std::string_view uri) {
  constexpr std::string_view kScheme = "s3://";
  const std::string where(uri);
  if (uri.size() < kScheme.size() || Lower(uri.substr(0, kScheme.size())) != kScheme) {
    return InvalidArgument("not an s3:// URI", where);
  }
  // Everything after the bucket is the key: '?' is a glob character there.
  std::string_view rest = uri.substr(kScheme.size());
  const size_t slash = rest.find('/');
  S3Uri out;
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) out.key = std::string(rest.substr(slash + 1));
  const std::string& b = out.bucket;
  bool ok = b.size() >= 3 && b.size() <= 63 && std::isalnum(static_cast<unsigned char>(b.front())) &&
            std::isalnum(static_cast<unsigned char>(b.back()));
  for (char c : b) {
    ok = ok && (std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
                c == '.' || c == '-');
  }
  if (!ok) {
    return InvalidArgument("\"" + b +
                               "\" is not a bucket name (3 to 63 characters of a-z, 0-9, '.' and '-', "
                               "beginning and ending with a letter or digit): s3://BUCKET/KEY",
                           where);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(digest, sizeof digest);
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string UriEncode(std::string_view s, bool keep_slash) { return PercentEncode(s, keep_slash); }

std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> query) {
  for (auto& [k, v] : query) {
    k = UriEncode(k, false);
    v = UriEncode(v, false);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [k, v] : query) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

SigV4Result SignV4(const SigV4Request& request, std::string_view access_key_id, std::string_view secret_access_key,
                   std::string_view region, std::string_view amz_date) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : request.headers) headers.emplace_back(Lower(name), Trim(value));
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += name + ":" + value + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  SigV4Result out;
  out.canonical_request = request.method + "\n" + request.path + "\n" + request.query + "\n" + canonical_headers +
                          "\n" + signed_headers + "\n" + request.payload_hash;
  const std::string date(amz_date.substr(0, 8));
  const std::string scope = date + "/" + std::string(region) + "/s3/aws4_request";
  out.string_to_sign =
      "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + scope + "\n" + Sha256Hex(out.canonical_request);
  std::string key = HmacSha256("AWS4" + std::string(secret_access_key), date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, "s3");
  key = HmacSha256(key, "aws4_request");
  const std::string signature = HmacSha256(key, out.string_to_sign);
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + std::string(access_key_id) + "/" + scope +
                      ", SignedHeaders=" + signed_headers +
                      ", Signature=" + Hex(reinterpret_cast<const unsigned char*>(signature.data()), signature.size());
  return out;
}

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    std::string_view entity = s.substr(i + 1, semi - i - 1);
    uint32_t code = 0;
    bool known = true;
    if (entity == "amp")
      code = '&';
    else if (entity == "lt")
      code = '<';
    else if (entity == "gt")
      code = '>';
    else if (entity == "quot")
      code = '"';
    else if (entity == "apos")
      code = '\'';
    else if (entity.size() > 1 && entity[0] == '#') {
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const std::string digits(entity.substr(hex ? 2 : 1));
      char* end = nullptr;
      code = static_cast<uint32_t>(std::strtoul(digits.c_str(), &end, hex ? 16 : 10));
      known = !digits.empty() && end && *end == '\0' && code <= 0x10FFFF;
    } else {
      known = false;
    }
    if (!known) {
      out += s[i];
      continue;
    }
    // UTF-8.
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
    i = semi;
  }
  return out;
}

Result<S3ListPage> ParseListObjectsV2(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return DataLoss("not a ListObjectsV2 result (no <ListBucketResult>): \"" + std::string(xml.substr(0, 120)) + "\"");
  }
  S3ListPage page;
  size_t index = 0;
  for (std::string_view contents : Elements(xml, "Contents")) {
    auto key = Element(contents, "Key");
    auto size = Element(contents, "Size");
    std::optional<uint64_t> bytes = size ? ParseDecimal(*size) : std::nullopt;
    if (!key || !bytes) {
      return DataLoss("<Contents> " + std::to_string(index) + " of the listing has no " +
                      (key ? "usable <Size>" : "<Key>"));
    }
    auto etag = Element(contents, "ETag");
    page.objects.push_back({XmlUnescape(*key), *bytes, etag ? XmlUnescape(*etag) : std::string()});
    ++index;
  }
  for (std::string_view prefix : Elements(xml, "CommonPrefixes")) {
    if (auto p = Element(prefix, "Prefix")) page.common_prefixes.push_back(XmlUnescape(*p));
  }
  auto truncated = Element(xml, "IsTruncated");
  page.truncated = truncated && *truncated == "true";
  if (auto token = Element(xml, "NextContinuationToken")) page.next_token = XmlUnescape(*token);
  if (page.truncated && page.next_token.empty()) {
    return DataLoss("the listing is truncated and gives no <NextContinuationToken>");
  }
  return page;
}

std::optional<S3Error> ParseS3Error(std::string_view xml) {
  auto error = Element(xml, "Error");
  if (!error) return std::nullopt;
  auto code = Element(*error, "Code");
  if (!code) return std::nullopt;
  S3Error out;
  out.code = XmlUnescape(*code);
  if (auto m = Element(*error, "Message")) out.message = XmlUnescape(*m);
  if (auto r = Element(*error, "Region")) out.region = XmlUnescape(*r);
  return out;
}

bool GlobMatch(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star_p = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_n = n;
      continue;
    }
    bool matched = false;
    size_t next = p + 1;
    if (p < pattern.size() && name[n] != '/') {
      if (pattern[p] == '?') {
        matched = true;
      } else if (pattern[p] == '[') {
        size_t q = p + 1;
        const bool negate = q < pattern.size() && (pattern[q] == '!' || pattern[q] == '^');
        if (negate) ++q;
        bool in = false;
        const size_t first = q;
        while (q < pattern.size() && (pattern[q] != ']' || q == first)) {
          if (q + 2 < pattern.size() && pattern[q + 1] == '-' && pattern[q + 2] != ']') {
            in = in || (name[n] >= pattern[q] && name[n] <= pattern[q + 2]);
            q += 3;
          } else {
            in = in || name[n] == pattern[q];
            ++q;
          }
        }
        if (q < pattern.size()) {  // a closed set
          matched = in != negate;
          next = q + 1;
        } else {
          matched = name[n] == '[';  // an unclosed '[' is itself
        }
      } else {
        matched = pattern[p] == name[n];
      }
    }
    if (matched) {
      p = next;
      ++n;
    } else if (star_p != std::string_view::npos && name[star_n] != '/') {
      p = star_p + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

HttpUrl S3RequestUrl(const HttpUrl& endpoint, bool virtual_hosted, const std::string& bucket, const std::string& key,
                     const std::string& query) {
  HttpUrl url;
  url.scheme = endpoint.scheme;
  const std::string path = UriEncode(key, true);
  if (virtual_hosted) {
    const std::string host = endpoint.origin.substr(url.scheme.size() + 3);
    url.origin = url.scheme + "://" + bucket + "." + host;
    url.target = "/" + path;
  } else {
    url.origin = endpoint.origin;
    url.target = "/" + bucket + (key.empty() && !query.empty() ? "" : "/" + path);
  }
  if (!query.empty()) url.target += "?" + query;
  url.redacted = "s3://" + bucket + "/" + key;
  return url;
}

}  // namespace internal

namespace {

using internal::HttpUrl;
using internal::S3Uri;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string FirstLine(const std::string& path, bool* found) {
  std::ifstream in(path);
  *found = static_cast<bool>(in);
  std::string line;
  if (in) std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// [profile] key = value from an AWS shared credentials file.
std::map<std::string, std::string> IniSection(const std::string& path, const std::string& profile) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t\r"));
    s.erase(s.find_last_not_of(" \t\r") + 1);
    return s;
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trim(line.substr(1, line.size() - 2)) == profile;
      continue;
    }
    const size_t eq = line.find('=');
    if (inside && eq != std::string::npos) out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

bool AwsEndpoint(const std::string& host) {
  return host.size() >= 14 && host.compare(host.size() - 14, 14, ".amazonaws.com") == 0;
}

// Thread safety: thread-safe (the transport is; the rest is immutable).
class S3Source final : public Source {
 public:
  static Result<std::unique_ptr<Source>> Create(const SourceOptions& options) {
    const S3Options& s3 = options.s3;
    if (s3.list_page_size < 1 || s3.list_page_size > 1000) {
      return InvalidArgument("must be 1 to 1000, got " + std::to_string(s3.list_page_size), "s3.list_page_size");
    }
    if (!s3.access_key_id.empty() && s3.secret_access_key.empty()) {
      return InvalidArgument("an S3 access key without its secret access key", "s3 credentials");
    }
    const std::string region = s3.region.empty() ? "us-east-1" : s3.region;
    const std::string endpoint = s3.endpoint.empty() ? "https://s3." + region + ".amazonaws.com" : s3.endpoint;
    auto parsed = internal::ParseHttpUrl(endpoint);
    if (!parsed.ok()) {
      return InvalidArgument("the S3 endpoint " + parsed.status().message() + " (want http(s)://host[:port])",
                             "spec.dataset.s3.endpoint");
    }
    if (parsed->target != "/") {
      return InvalidArgument("the S3 endpoint \"" + parsed->redacted + "\" has a path; give http(s)://host[:port]",
                             "spec.dataset.s3.endpoint");
    }
    return std::unique_ptr<Source>(new S3Source(options, region, *parsed));
  }

  Result<ObjectInfo> Stat(const std::string& uri) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, ObjectUrl(uri));
    ObjectInfo info;
    MESHLOAD_RETURN_IF_ERROR(transport_.Stat(url, &info.size, &info.version));
    return info;
  }

  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, ObjectUrl(uri));
    return transport_.ReadV(url, offset, iov);
  }

  Status ReadTo(const std::string& uri, uint64_t offset, uint64_t len, const Sink& sink) override {
    MESHLOAD_ASSIGN_OR_RETURN(HttpUrl url, ObjectUrl(uri));
    return transport_.ReadTo(url, offset, len, sink);
  }

  bool LatencyBound() const override { return true; }
  uint64_t GapWorthReading() const override { return transport_.GapWorthReading(); }

  Result<std::vector<Listed>> List(const std::string& uri) override {
    MESHLOAD_ASSIGN_OR_RETURN(S3Uri loc, internal::ParseS3Uri(uri));
    const std::string where = "s3://" + loc.bucket + "/" + loc.key;
    const std::string& key = loc.key;
    std::vector<Listed> out;
    const size_t glob = key.find_first_of("*?[");
    if (glob != std::string::npos) {
      const size_t dir_end = key.rfind('/', glob);
      const std::string dir = dir_end == std::string::npos ? "" : key.substr(0, dir_end + 1);
      const std::string pattern = key.substr(dir.size());
      if (pattern.find('/') != std::string::npos) {
        return InvalidArgument("a glob may only be in the last path segment", where);
      }
      MESHLOAD_ASSIGN_OR_RETURN(internal::S3ListPage all, ListAll(loc.bucket, dir));
      for (auto& o : all.objects) {
        const std::string name = o.name.substr(dir.size());
        if ((name.empty() || name[0] != '.' || pattern[0] == '.') && internal::GlobMatch(pattern, name)) {
          out.push_back({"s3://" + loc.bucket + "/" + o.name, o.size, o.version});
        }
      }
      if (out.empty()) return NotFound("the glob matches no object", where);
    } else if (key.empty() || key.back() == '/') {
      MESHLOAD_ASSIGN_OR_RETURN(out, Directory(loc.bucket, key, where));
    } else {
      MESHLOAD_ASSIGN_OR_RETURN(internal::S3ListPage all, ListAll(loc.bucket, key));
      for (auto& o : all.objects) {
        if (o.name == key) out.push_back({"s3://" + loc.bucket + "/" + o.name, o.size, o.version});
      }
      if (out.empty()) {
        if (std::find(all.common_prefixes.begin(), all.common_prefixes.end(), key + "/") == all.common_prefixes.end()) {
          return NotFound("no such object, and no objects under " + where + "/", where);
        }
        MESHLOAD_ASSIGN_OR_RETURN(out, Directory(loc.bucket, key + "/", where));
      }
    }
    std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) { return a.name < b.name; });
    return out;
  }

 private:
  S3Source(const SourceOptions& options, std::string region, HttpUrl endpoint)
      : s3_(options.s3),
        region_(std::move(region)),
        endpoint_(std::move(endpoint)),
        virtual_hosted_(s3_.addressing == S3Options::Addressing::kVirtualHosted ||
                        (s3_.addressing == S3Options::Addressing::kAuto && AwsEndpoint(HostOf(endpoint_, false)))),
        transport_(options, "s3", Hooks()) {}

  // host or host:port (the port only when it is not the scheme's default).
  static std::string HostOf(const HttpUrl& url, bool with_port) {
    std::string host = url.origin.substr(url.scheme.size() + 3);
    const size_t colon = host.rfind(':');
    const std::string port = host.substr(colon + 1);
    const bool default_port = (url.scheme == "https" && port == "443") || (url.scheme == "http" && port == "80");
    if (!with_port || default_port) host.resize(colon);
    return host;
  }

  internal::HttpHooks Hooks() {
    internal::HttpHooks hooks;
    if (!s3_.access_key_id.empty()) {
      hooks.sign = [this](std::string_view method, const HttpUrl& url, httplib::Headers& headers) {
        Sign(method, url, headers);
      };
    }
    hooks.explain = [this](int status, std::string_view body) { return Explain(status, body); };
    return hooks;
  }

  // The request URL of the object `uri` names; an error for a prefix.
  Result<HttpUrl> ObjectUrl(const std::string& uri) const {
    MESHLOAD_ASSIGN_OR_RETURN(S3Uri loc, internal::ParseS3Uri(uri));
    if (loc.key.empty() || loc.key.back() == '/') return InvalidArgument("names a prefix, not an object", uri);
    return Url(loc.bucket, loc.key, "");
  }

  HttpUrl Url(const std::string& bucket, const std::string& key, const std::string& query) const {
    // Auto: a bucket with dots stays path-style, as a wildcard certificate
    // covers one label only.
    const bool dotted = s3_.addressing == S3Options::Addressing::kAuto && bucket.find('.') != std::string::npos;
    return internal::S3RequestUrl(endpoint_, virtual_hosted_ && !dotted, bucket, key, query);
  }

  void Sign(std::string_view method, const HttpUrl& url, httplib::Headers& headers) const {
    char amz_date[17];
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
    internal::SigV4Request request;
    request.method = std::string(method);
    const size_t q = url.target.find('?');
    request.path = url.target.substr(0, q);
    if (q != std::string::npos) request.query = url.target.substr(q + 1);
    request.payload_hash = std::string(internal::kEmptySha256);
    const std::string host = HostOf(url, true);
    headers.emplace("Host", host);
    headers.emplace("x-amz-date", amz_date);
    headers.emplace("x-amz-content-sha256", request.payload_hash);
    if (!s3_.session_token.empty()) headers.emplace("x-amz-security-token", s3_.session_token);
    for (const auto& [name, value] : headers) {
      const std::string lower = internal::Lower(name);
      if (lower == "host" || lower == "range" || lower.rfind("x-amz-", 0) == 0)
        request.headers.emplace_back(lower, value);
    }
    headers.emplace(
        "Authorization",
        internal::SignV4(request, s3_.access_key_id, s3_.secret_access_key, region_, amz_date).authorization);
  }

  internal::HttpErrorDetail Explain(int status, std::string_view body) const {
    internal::HttpErrorDetail detail;
    std::optional<internal::S3Error> e = internal::ParseS3Error(body);
    if (!e) {
      // A HEAD's answer has no body to say which error it is.
      if (status == 503) {
        detail.text = "S3 SlowDown (a 503 without a body: the store asks for fewer requests)";
        detail.throttled = true;
      } else if (status == 404) {
        detail.text = "S3 NoSuchKey or NoSuchBucket (the answer has no body to say which)";
      } else if (status == 403 || status == 400) {
        detail.text =
            "S3 refused the request (the answer has no body to say why; check the credentials and the "
            "region, " +
            region_ + ")";
      }
      return detail;
    }
    detail.text = "S3 " + e->code + (e->message.empty() ? "" : ": " + e->message);
    if (!e->region.empty() && e->region != region_) {
      detail.text += " (the bucket is in region " + e->region + ", requests are signed for " + region_ +
                     ": set spec.dataset.s3.region or AWS_REGION)";
    } else if (e->code == "AuthorizationHeaderMalformed" || e->code == "SignatureDoesNotMatch" ||
               e->code == "InvalidAccessKeyId") {
      detail.text += " (check the credentials and the region, " + region_ + ")";
    }
    detail.throttled =
        e->code == "SlowDown" || e->code == "Throttling" || e->code == "RequestLimitExceeded" || (status == 429);
    return detail;
  }

  // Every page of ListObjectsV2 under `prefix`, one level deep ('/' delimited).
  Result<internal::S3ListPage> ListAll(const std::string& bucket, const std::string& prefix) {
    internal::S3ListPage all;
    std::string token;
    for (int page = 0;; ++page) {
      std::vector<std::pair<std::string, std::string>> query = {
          {"list-type", "2"}, {"prefix", prefix}, {"delimiter", "/"}, {"max-keys", std::to_string(s3_.list_page_size)}};
      if (!token.empty()) query.emplace_back("continuation-token", token);
      HttpUrl url = Url(bucket, "", internal::CanonicalQuery(query));
      url.redacted = "s3://" + bucket + "/" + prefix;
      std::string body;
      MESHLOAD_RETURN_IF_ERROR(transport_.GetBody(url, &body, 64ull << 20));
      auto parsed = internal::ParseListObjectsV2(body);
      if (!parsed.ok()) {
        return Status(parsed.status().code(),
                      "listing page " + std::to_string(page + 1) + ": " + parsed.status().message(), url.redacted);
      }
      for (auto& o : parsed->objects) all.objects.push_back(std::move(o));
      for (auto& p : parsed->common_prefixes) all.common_prefixes.push_back(std::move(p));
      if (!parsed->truncated) break;
      if (parsed->next_token == token) {
        return DataLoss("the listing repeats its continuation token", url.redacted);
      }
      token = parsed->next_token;
    }
    return all;
  }

  // The direct, non-hidden objects under `prefix` (which ends in '/' or is empty).
  Result<std::vector<Listed>> Directory(const std::string& bucket, const std::string& prefix,
                                        const std::string& where) {
    MESHLOAD_ASSIGN_OR_RETURN(internal::S3ListPage all, ListAll(bucket, prefix));
    std::vector<Listed> out;
    for (auto& o : all.objects) {
      const std::string name = o.name.substr(prefix.size());
      if (name.empty() || name[0] == '.') continue;  // the "directory" marker, hidden objects
      out.push_back({"s3://" + bucket + "/" + o.name, o.size, o.version});
    }
    if (out.empty()) return NotFound("no objects under the prefix", where);
    return out;
  }

  const S3Options s3_;
  const std::string region_;
  const HttpUrl endpoint_;
  const bool virtual_hosted_;
  internal::HttpTransport transport_;
};

}  // namespace

Result<std::unique_ptr<Source>> MakeS3Source(const SourceOptions& options) { return S3Source::Create(options); }

Status S3OptionsFromEnvironment(S3Options& s3) {
  if (s3.endpoint.empty()) s3.endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (s3.endpoint.empty()) s3.endpoint = Env("AWS_ENDPOINT_URL");
  if (s3.region.empty()) s3.region = Env("AWS_REGION");
  if (s3.region.empty()) s3.region = Env("AWS_DEFAULT_REGION");
  if (!s3.access_key_id.empty()) return Status::Ok();
  if (!Env("AWS_ACCESS_KEY_ID").empty()) {
    s3.access_key_id = Env("AWS_ACCESS_KEY_ID");
    s3.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
    s3.session_token = Env("AWS_SESSION_TOKEN");
    if (s3.secret_access_key.empty()) {
      return InvalidArgument("AWS_ACCESS_KEY_ID is set and AWS_SECRET_ACCESS_KEY is not", "environment");
    }
    return Status::Ok();
  }
  if (const std::string dir = Env("MESHLOAD_S3_CREDENTIALS_DIR"); !dir.empty()) {
    bool found = false, secret_found = false, token_found = false;
    s3.access_key_id = FirstLine(dir + "/AWS_ACCESS_KEY_ID", &found);
    s3.secret_access_key = FirstLine(dir + "/AWS_SECRET_ACCESS_KEY", &secret_found);
    s3.session_token = FirstLine(dir + "/AWS_SESSION_TOKEN", &token_found);
    if (!found || s3.access_key_id.empty() || !secret_found || s3.secret_access_key.empty()) {
      s3.access_key_id.clear();
      s3.secret_access_key.clear();
      s3.session_token.clear();
      return InvalidArgument(
          "MESHLOAD_S3_CREDENTIALS_DIR needs the files AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the keys of "
          "the Secret named in spec.dataset.s3.credentialsSecret), not empty",
          dir);
    }
    return Status::Ok();
  }
  std::string file = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty() && !Env("HOME").empty()) file = Env("HOME") + "/.aws/credentials";
  if (file.empty()) return Status::Ok();
  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::map<std::string, std::string> section = IniSection(file, profile);
  if (section.empty()) return Status::Ok();
  s3.access_key_id = section["aws_access_key_id"];
  s3.secret_access_key = section["aws_secret_access_key"];
  s3.session_token = section["aws_session_token"];
  if (s3.access_key_id.empty() != s3.secret_access_key.empty()) {
    s3.access_key_id.clear();
    s3.secret_access_key.clear();
    s3.session_token.clear();
    return InvalidArgument("profile [" + profile + "] needs both aws_access_key_id and aws_secret_access_key", file);
  }
  if (s3.region.empty() && !section["region"].empty()) s3.region = section["region"];
  return Status::Ok();
}

}  // namespace meshload::sidecar::source
