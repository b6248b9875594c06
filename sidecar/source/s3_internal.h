/// \file
/// The pieces of the "s3" source, exposed for tests: s3:// URIs, AWS
/// Signature Version 4, and the XML of ListObjectsV2 and error responses.
/// Not part of the source interface; the sidecar uses source.h only.
///
/// Signature Version 4 (docs.aws.amazon.com/IAM/latest/UserGuide/
/// reference_sigv-create-signed-request.html), for service "s3":
///   canonical request = METHOD \n URI-encoded path \n sorted, encoded query
///                       \n "name:value\n" per signed header (lower-case,
///                       sorted) \n signed header names joined by ';' \n
///                       payload hash
///   string to sign    = "AWS4-HMAC-SHA256" \n amz-date \n
///                       date/region/s3/aws4_request \n hex SHA-256 of the
///                       canonical request
///   signing key       = HMAC chain "AWS4"+secret, date, region, "s3",
///                       "aws4_request"
///   Authorization     = AWS4-HMAC-SHA256 Credential=KEY/scope,
///                       SignedHeaders=..., Signature=hex HMAC of the
///                       string to sign
///
/// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sidecar/source/http_internal.h"
#include "sidecar/source/source.h"

namespace meshload::sidecar::source::internal {

/// s3://bucket/key. kInvalidArgument naming the URI when the bucket is
/// missing or not a valid bucket name (3-63 of a-z 0-9 . -).
struct S3Uri {
  std::string bucket;
  std::string key;  // may be empty (the whole bucket) or end in '/' (a prefix)
};
Result<S3Uri> ParseS3Uri(std::string_view uri);

/// The request URL of `key` in `bucket` at `endpoint`: path-style
/// (endpoint/bucket/key) or virtual-hosted (bucket.endpoint/key), the key
/// percent-encoded but for '/', with a canonical `query` (CanonicalQuery);
/// `redacted`, what errors and logs name, is s3://bucket/key.
HttpUrl S3RequestUrl(const HttpUrl& endpoint, bool virtual_hosted, const std::string& bucket, const std::string& key,
                     const std::string& query);

/// Hex SHA-256 of `data`; raw HMAC-SHA256 of `data` with `key`.
std::string Sha256Hex(std::string_view data);
std::string HmacSha256(std::string_view key, std::string_view data);

/// RFC 3986 percent-encoding as SigV4 wants it: every byte but A-Z a-z 0-9
/// - . _ ~ is %XX (upper-case hex); '/' too unless `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);

/// One request to sign. `path` and `query` are as sent (`query` made by
/// CanonicalQuery, without '?'); `headers` are the ones to sign, in any
/// case (host is required).
struct SigV4Request {
  std::string method;
  std::string path;
  std::string query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
};

struct SigV4Result {
  std::string authorization;      // the Authorization header's value
  std::string canonical_request;  // for tests and debugging (no secret in it)
  std::string string_to_sign;
};

/// Signs `request` at `amz_date` (YYYYMMDDTHHMMSSZ) for `region`.
SigV4Result SignV4(const SigV4Request& request, std::string_view access_key_id, std::string_view secret_access_key,
                   std::string_view region, std::string_view amz_date);

/// The query string as sent and signed: names sorted, names and values
/// encoded, joined by '&'.
std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> query);

/// A ListObjectsV2 result page.
struct S3ListPage {
  std::vector<Source::Listed> objects;  // name = the key
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_token;
};
/// kDataLoss (naming the first bad element) when `xml` is not a
/// ListBucketResult.
Result<S3ListPage> ParseListObjectsV2(std::string_view xml);

/// An S3 <Error> body's Code, Message and, when it says so, the Region the
/// bucket is in. nullopt when `xml` is not one.
struct S3Error {
  std::string code, message, region;
};
std::optional<S3Error> ParseS3Error(std::string_view xml);

/// The five XML entities and numeric character references decoded.
std::string XmlUnescape(std::string_view s);

/// fnmatch-style match of one path segment: * (any run without '/'), ?
/// (one character), [...] (a set; ! or ^ negates; ranges a-z).
bool GlobMatch(std::string_view pattern, std::string_view name);

}  // namespace meshload::sidecar::source::internal
