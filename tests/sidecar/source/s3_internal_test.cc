// The pure parts of the "s3" source (sidecar/source/s3_internal.h): s3://
// URIs, Signature Version 4 against the worked examples of the S3 API
// reference, the XML of listings and errors, globs, and credentials from the
// environment.
#include "sidecar/source/s3_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "planner/spec.h"
#include "sidecar/source/source.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar::source::internal {
namespace {

using meshload::testing::StatusIs;
using ::testing::HasSubstr;

constexpr const char* kAccessKey = "AKIAIOSFODNN7EXAMPLE";
constexpr const char* kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(SignV4, TheGetObjectExampleOfTheS3Reference) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/test.txt";
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Range", "bytes=0-9"},
               {"x-amz-content-sha256", kEmpty},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_hash = kEmpty;
  SigV4Result s = SignV4(r, kAccessKey, kSecret, "us-east-1", "20130524T000000Z");
  EXPECT_EQ(s.canonical_request,
            std::string("GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
                        "x-amz-content-sha256:") +
                kEmpty + "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" + kEmpty);
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SignV4, TheListObjectsExampleOfTheS3Reference) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.query = CanonicalQuery({{"prefix", "J"}, {"max-keys", "2"}});
  EXPECT_EQ(r.query, "max-keys=2&prefix=J");
  r.headers = {
      {"host", "examplebucket.s3.amazonaws.com"}, {"x-amz-content-sha256", kEmpty}, {"x-amz-date", "20130524T000000Z"}};
  r.payload_hash = kEmpty;
  EXPECT_EQ(SignV4(r, kAccessKey, kSecret, "us-east-1", "20130524T000000Z").authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SignV4, HeaderValuesAreTrimmedAndNamesLowerCased) {
  SigV4Request a, b;
  a.method = b.method = "GET";
  a.path = b.path = "/k";
  a.payload_hash = b.payload_hash = kEmpty;
  a.headers = {{"Host", "  h   x  "}, {"X-Amz-Date", "20200101T000000Z"}};
  b.headers = {{"x-amz-date", "20200101T000000Z"}, {"host", "h x"}};
  EXPECT_EQ(SignV4(a, "k", "s", "r", "20200101T000000Z").authorization,
            SignV4(b, "k", "s", "r", "20200101T000000Z").authorization);
}

TEST(UriEncode, EverythingButUnreservedIsEscapedWithUpperCaseHex) {
  EXPECT_EQ(UriEncode("a b/c~d_e.f-g*h", true), "a%20b/c~d_e.f-g%2Ah");
  EXPECT_EQ(UriEncode("a b/c", false), "a%20b%2Fc");
  EXPECT_EQ(UriEncode("\xc3\xa9=&", false), "%C3%A9%3D%26");
  EXPECT_EQ(CanonicalQuery({{"prefix", "data/x y"}, {"delimiter", "/"}, {"list-type", "2"}}),
            "delimiter=%2F&list-type=2&prefix=data%2Fx%20y");
}

TEST(S3RequestUrl, PathStyleAndVirtualHosted) {
  auto endpoint = ParseHttpUrl("https://s3.eu-west-1.amazonaws.com");
  ASSERT_OK(endpoint);
  HttpUrl v = S3RequestUrl(*endpoint, true, "corpus", "tokens/part 1.bin", "");
  EXPECT_EQ(v.origin, "https://corpus.s3.eu-west-1.amazonaws.com:443");
  EXPECT_EQ(v.target, "/tokens/part%201.bin");
  EXPECT_EQ(v.redacted, "s3://corpus/tokens/part 1.bin");
  HttpUrl p = S3RequestUrl(*endpoint, false, "corpus", "tokens/part 1.bin", "");
  EXPECT_EQ(p.origin, "https://s3.eu-west-1.amazonaws.com:443");
  EXPECT_EQ(p.target, "/corpus/tokens/part%201.bin");
  const std::string list = CanonicalQuery({{"list-type", "2"}, {"prefix", "tokens/"}});
  EXPECT_EQ(S3RequestUrl(*endpoint, false, "corpus", "", list).target, "/corpus?list-type=2&prefix=tokens%2F");
  EXPECT_EQ(S3RequestUrl(*endpoint, true, "corpus", "", list).target, "/?list-type=2&prefix=tokens%2F");
}

TEST(ParseS3Uri, BucketAndKey) {
  auto u = ParseS3Uri("s3://my-bucket.data/a/b/c.bin");
  ASSERT_OK(u);
  EXPECT_EQ(u->bucket, "my-bucket.data");
  EXPECT_EQ(u->key, "a/b/c.bin");
  EXPECT_EQ(ParseS3Uri("s3://bkt")->key, "");
  EXPECT_EQ(ParseS3Uri("s3://bkt/pre/")->key, "pre/");
  EXPECT_EQ(ParseS3Uri("s3://bkt/part-?.bin")->key, "part-?.bin") << "'?' is a glob character in a key";
  for (const char* bad : {"s3://", "s3:///key", "s3://AB/k", "s3://ab/k", "s3://-bucket/k", "http://bkt/k"}) {
    auto r = ParseS3Uri(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseS3Uri("s3://AB/k").status().message(), HasSubstr("\"AB\" is not a bucket name"));
}

TEST(ParseListObjectsV2, KeysSizesPrefixesAndTheContinuationToken) {
  const char* xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>d/</Prefix>
<KeyCount>3</KeyCount><MaxKeys>2</MaxKeys><Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>
<Contents><Key>d/a&amp;b.bin</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>4096</Size></Contents>
<Contents><Key>d/c&#233;.bin</Key><Size>0</Size></Contents>
<CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes>
<NextContinuationToken>tok+/=</NextContinuationToken></ListBucketResult>)";
  auto page = ParseListObjectsV2(xml);
  ASSERT_OK(page);
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].name, "d/a&b.bin");
  EXPECT_EQ(page->objects[0].size, 4096u);
  // The ETag as a HEAD's header gives it (quotes included): blocks cached
  // under either match.
  EXPECT_EQ(page->objects[0].version, "\"9b2cf535f27731c974343645a3985328\"");
  EXPECT_EQ(page->objects[1].version, "");
  EXPECT_EQ(page->objects[1].name, "d/c\xc3\xa9.bin");
  EXPECT_EQ(page->common_prefixes, std::vector<std::string>{"d/sub/"});
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok+/=");

  EXPECT_EQ(ParseListObjectsV2("<html>proxy error</html>").status().code(), StatusCode::kDataLoss);
  auto bad = ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>x</Size></Contents></ListBucketResult>");
  EXPECT_THAT(bad, StatusIs(StatusCode::kDataLoss, HasSubstr("<Contents> 0")));
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").ok());
}

TEST(ParseS3Error, CodeMessageAndRegion) {
  auto e = ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>AuthorizationHeaderMalformed</Code><Message>the region is "
      "wrong</Message><Region>eu-west-1</Region><RequestId>1</RequestId></Error>");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "AuthorizationHeaderMalformed");
  EXPECT_EQ(e->message, "the region is wrong");
  EXPECT_EQ(e->region, "eu-west-1");
  EXPECT_FALSE(ParseS3Error("").has_value());
  EXPECT_FALSE(ParseS3Error("<Error><Message>no code</Message></Error>").has_value());
}

TEST(GlobMatch, StarQuestionAndSetsWithinOneSegment) {
  EXPECT_TRUE(GlobMatch("*.bin", "part-00001.bin"));
  EXPECT_FALSE(GlobMatch("*.bin", "part-00001.bin.tmp"));
  EXPECT_TRUE(GlobMatch("part-0000?.bin", "part-00007.bin"));
  EXPECT_TRUE(GlobMatch("part-0000[0-3].bin", "part-00002.bin"));
  EXPECT_FALSE(GlobMatch("part-0000[0-3].bin", "part-00004.bin"));
  EXPECT_TRUE(GlobMatch("part-0000[!0-3].bin", "part-00004.bin"));
  EXPECT_FALSE(GlobMatch("*", "a/b"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXXbYYc"));
  EXPECT_TRUE(GlobMatch("[[]x", "[x"));
}

TEST(XmlUnescape, EntitiesAndCharacterReferences) {
  EXPECT_EQ(XmlUnescape("a&lt;b&gt;&amp;&quot;&apos;&#65;&#x263A;"), "a<b>&\"'A\xe2\x98\xba");
  EXPECT_EQ(XmlUnescape("&unknown; & alone"), "&unknown; & alone");
}

// The environment of one test, put back as it was after.
class Env {
 public:
  ~Env() {
    for (auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }
  // None of the variables S3OptionsFromEnvironment reads, and HOME at
  // `home` (no shared credentials file there).
  void ClearS3(const std::string& home) {
    for (const char* k : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                          "MESHLOAD_S3_CREDENTIALS_DIR", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE"}) {
      Set(k, nullptr);
    }
    Set("HOME", home.c_str());
  }
  void Set(const std::string& k, const char* v) {
    if (!saved_.count(k)) {
      const char* old = ::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    v ? ::setenv(k.c_str(), v, 1) : ::unsetenv(k.c_str());
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Options holding these credentials.
::testing::Matcher<const S3Options&> HoldsCredentials(const std::string& key_id, const std::string& secret,
                                                      const std::string& token) {
  return ::testing::AllOf(::testing::Field("access_key_id", &S3Options::access_key_id, key_id),
                          ::testing::Field("secret_access_key", &S3Options::secret_access_key, secret),
                          ::testing::Field("session_token", &S3Options::session_token, token));
}

TEST(S3OptionsFromEnvironment, VariablesThenTheMountedSecretThenTheSharedFile) {
  meshload::testing::TempDir dir;
  Env env;
  env.ClearS3(dir.path());
  env.Set("AWS_ENDPOINT_URL", "http://general:1");
  env.Set("AWS_ENDPOINT_URL_S3", "http://s3-only:2");
  env.Set("AWS_DEFAULT_REGION", "eu-west-1");
  env.Set("AWS_ACCESS_KEY_ID", "AKID");
  env.Set("AWS_SECRET_ACCESS_KEY", "SECRET");
  S3Options o;
  ASSERT_OK(S3OptionsFromEnvironment(o));
  EXPECT_EQ(o.endpoint, "http://s3-only:2");
  EXPECT_EQ(o.region, "eu-west-1");
  EXPECT_EQ(o.access_key_id, "AKID");
  EXPECT_EQ(o.secret_access_key, "SECRET");
  // What the job says wins.
  S3Options given;
  given.endpoint = "http://spec:3";
  given.region = "us-west-2";
  ASSERT_OK(S3OptionsFromEnvironment(given));
  EXPECT_EQ(given.endpoint, "http://spec:3");
  EXPECT_EQ(given.region, "us-west-2");

  // A key without its secret names the variable, never the value.
  env.Set("AWS_SECRET_ACCESS_KEY", nullptr);
  S3Options half;
  Status st = S3OptionsFromEnvironment(half);
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, HasSubstr("AWS_SECRET_ACCESS_KEY")));
  EXPECT_THAT(st.ToString(), ::testing::Not(HasSubstr("AKID")));

  // The mounted Secret's files.
  env.Set("AWS_ACCESS_KEY_ID", nullptr);
  std::ofstream(dir.path() + "/AWS_ACCESS_KEY_ID") << "FROMFILE\n";
  std::ofstream(dir.path() + "/AWS_SECRET_ACCESS_KEY") << "FILESECRET";
  env.Set("MESHLOAD_S3_CREDENTIALS_DIR", dir.path().c_str());
  S3Options mounted;
  ASSERT_OK(S3OptionsFromEnvironment(mounted));
  EXPECT_THAT(mounted, HoldsCredentials("FROMFILE", "FILESECRET", ""));

  // The shared credentials file, profile AWS_PROFILE.
  env.Set("MESHLOAD_S3_CREDENTIALS_DIR", nullptr);
  std::ofstream(dir.path() + "/credentials")
      << "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n[train]\naws_access_key_id=T\n"
         "aws_secret_access_key=TS\naws_session_token = TT\n";
  env.Set("AWS_SHARED_CREDENTIALS_FILE", (dir.path() + "/credentials").c_str());
  env.Set("AWS_PROFILE", "train");
  S3Options shared;
  ASSERT_OK(S3OptionsFromEnvironment(shared));
  EXPECT_THAT(shared, HoldsCredentials("T", "TS", "TT"));
}

// A job's storage options come from the schemes its datasets use, each
// filling its own: an s3 dataset (or a mixture of them under an s3 prefix)
// gets spec.dataset.s3 and then the environment; a job on local files never
// reads the environment's S3 settings, so a broken one does not touch it.
TEST(SourceOptionsForJob, EachSchemeTheJobUsesFillsItsOwnSettings) {
  meshload::testing::TempDir dir;
  Env env;
  env.ClearS3(dir.path());
  env.Set("AWS_REGION", "eu-west-1");
  env.Set("AWS_ACCESS_KEY_ID", "AKID");
  env.Set("AWS_SECRET_ACCESS_KEY", "SECRET");
  planner::JobSpec spec;
  spec.dataset.uri = "s3://bucket/data/";
  spec.dataset.s3 = planner::DatasetS3{};
  spec.dataset.s3->endpoint = "http://store:9000";
  spec.dataset.s3->addressing = "Path";
  SourceOptions base;
  base.max_idle_connections = 77;  // what the caller set stays
  const Result<SourceOptions> o = SourceOptionsForJob(spec, base);
  ASSERT_OK(o.status());
  EXPECT_EQ(o->s3.endpoint, "http://store:9000");
  EXPECT_EQ(o->s3.region, "eu-west-1");
  EXPECT_EQ(o->s3.addressing, S3Options::Addressing::kPath);
  EXPECT_THAT(o->s3, HoldsCredentials("AKID", "SECRET", ""));
  EXPECT_EQ(o->max_idle_connections, 77);

  // A mixture whose datasets are relative to an s3:// prefix.
  planner::JobSpec mixed = spec;
  mixed.mixture = planner::MixtureSpec{};
  for (const char* name : {"web", "code"}) {
    planner::MixtureDataset ds;
    ds.name = name;
    ds.uri = name;
    ds.weight = 1;
    mixed.mixture->datasets.push_back(ds);
  }
  const Result<SourceOptions> m = SourceOptionsForJob(mixed);
  ASSERT_OK(m.status());
  EXPECT_EQ(m->s3.endpoint, "http://store:9000");
  EXPECT_THAT(m->s3, HoldsCredentials("AKID", "SECRET", ""));

  // A broken environment (a key without its secret) is an error for s3
  // data, naming the variable, and nothing to a job on local files.
  env.Set("AWS_SECRET_ACCESS_KEY", nullptr);
  EXPECT_THAT(SourceOptionsForJob(spec).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("AWS_SECRET_ACCESS_KEY")));
  EXPECT_THAT(SourceOptionsForUris({"/data/a.tar", "s3://bucket/b.tar"}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("AWS_SECRET_ACCESS_KEY")));
  planner::JobSpec local = spec;
  local.dataset.uri = "/data/shards/";
  const Result<SourceOptions> l = SourceOptionsForJob(local);
  ASSERT_OK(l.status());
  EXPECT_EQ(l->s3.endpoint, "");
  EXPECT_EQ(l->s3.access_key_id, "");
  ASSERT_OK(SourceOptionsForUris({"/data/a.tar", "https://host/b.tar"}).status());
}

}  // namespace
}  // namespace meshload::sidecar::source::internal
