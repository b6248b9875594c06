#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "sidecar/source/dataset_facts.h"
#include "sidecar/source/source.h"
#include "test_support.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar::source {
namespace {

using testing::RandomBytes;
using testing::TempDir;

// `make`, counting the sources it makes in `made`.
SourceFactory Counted(std::atomic<int>& made, SourceFactory make) {
  return [&made, make](const SourceOptions& o) {
    made.fetch_add(1);
    return make(o);
  };
}

TEST(SchemeOfTest, PlainPathsAreFilesAndSchemesAreLowerCased) {
  EXPECT_EQ(SourceRegistry::SchemeOf("/data/a.bin"), "file");
  EXPECT_EQ(SourceRegistry::SchemeOf("relative/a.bin"), "file");
  EXPECT_EQ(SourceRegistry::SchemeOf("file:///data/a.bin"), "file");
  EXPECT_EQ(SourceRegistry::SchemeOf("HTTPS://host/a"), "https");
  EXPECT_EQ(SourceRegistry::SchemeOf("s3://bucket/key"), "s3");
  // "://" after something that cannot be a scheme is part of a path.
  EXPECT_EQ(SourceRegistry::SchemeOf("/odd/dir://x"), "file");
  EXPECT_EQ(SourceRegistry::SchemeOf("://x"), "file");
}

TEST(RedactUriTest, DropsQueryFragmentAndCredentials) {
  EXPECT_EQ(RedactUri("https://h/a.bin?X-Amz-Signature=s3cr3t"), "https://h/a.bin");
  EXPECT_EQ(RedactUri("http://h/a#frag"), "http://h/a");
  EXPECT_EQ(RedactUri("http://user:pw@h:80/a?q"), "http://h:80/a");
  EXPECT_EQ(RedactUri("/data/a@b.bin"), "/data/a@b.bin");
  EXPECT_EQ(RedactUri("http://h/dir@x/a"), "http://h/dir@x/a");
}

TEST(SourceRegistryTest, FileUrisAndPlainPathsReadThroughTheFileSource) {
  TempDir dir;
  const std::string data = RandomBytes(100, 7);
  const std::string path = dir.Write("r.bin", data);
  auto registry = SourceRegistry::WithBuiltins({});
  for (const std::string& uri : {"file://" + path, "FILE://" + path, "file://localhost" + path, path}) {
    auto found = registry->For(uri);
    ASSERT_OK(found) << uri << ": " << found.status().ToString();
    EXPECT_EQ(found->second, path) << uri;
    std::string out(10, '\0');
    ASSERT_OK(found->first->Read(found->second, 20, out.data(), out.size())) << uri;
    EXPECT_EQ(out, data.substr(20, 10));
  }
}

TEST(SourceRegistryTest, FileUriWithARemoteHostIsRejected) {
  auto registry = SourceRegistry::WithBuiltins({});
  auto found = registry->For("file://otherhost/data/a.bin");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kInvalidArgument);
}

TEST(SourceRegistryTest, HttpObjectNameIsTheWholeUrl) {
  auto registry = SourceRegistry::WithBuiltins({});
  const std::string url = "http://store:8080/a.bin?sig=1";
  auto found = registry->For(url);
  ASSERT_OK(found);
  EXPECT_EQ(found->second, url);
  auto https = registry->For("https://store/a.bin");
  ASSERT_OK(https);
  EXPECT_EQ(https->second, "https://store/a.bin");
}

TEST(SourceRegistryTest, SourcesAreCreatedOncePerSchemeAndShared) {
  SourceRegistry registry({});
  std::atomic<int> made{0};
  registry.Register("file", Counted(made, MakeFileSource));
  auto a = registry.For("/a");
  auto b = registry.For("file:///b");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->first, b->first);
  EXPECT_EQ(made.load(), 1);
}

TEST(SourceRegistryTest, NoSourceIsCreatedBeforeItsSchemeIsUsed) {
  SourceRegistry registry({});
  std::atomic<int> made{0};
  registry.Register("http", Counted(made, MakeHttpSource));
  registry.Register("file", MakeFileSource);
  ASSERT_OK(registry.For("/a"));
  EXPECT_EQ(made.load(), 0);
}

// Whether a dataset is read over a network comes from how its scheme was
// registered, not from a list of scheme names: a new remote scheme gets the
// sidecar's remote reader count.
TEST(SourceRegistryTest, ASchemesLatencyClassIsWhatItsRegistrationSays) {
  auto builtins = SourceRegistry::WithBuiltins({});
  EXPECT_TRUE(builtins->Network("s3://bucket/key"));
  EXPECT_TRUE(builtins->Network("HTTPS://host/a"));
  EXPECT_TRUE(builtins->Network("http://host/a"));
  EXPECT_FALSE(builtins->Network("/data/a"));
  EXPECT_FALSE(builtins->Network("file:///data/a"));
  EXPECT_FALSE(builtins->Network("gs://bucket/key"));  // unknown: For() says so

  std::atomic<int> made{0};
  builtins->Register("gs", Counted(made, MakeHttpSource), SourceRegistry::Latency::kNetwork);
  EXPECT_TRUE(builtins->Network("gs://bucket/key"));
  EXPECT_EQ(made.load(), 0) << "asked without making a source";

  planner::JobSpec spec;
  spec.dataset.uri = "/data/train/";
  EXPECT_FALSE(ReadsOverNetwork(spec, *builtins));
  spec.dataset.uri = "gs://bucket/train/";
  EXPECT_TRUE(ReadsOverNetwork(spec, *builtins));
}

// A source interposed over an interposed one (decompression over the block
// cache over the remote source): For() gives the last.
TEST(SourceRegistryTest, InterposedSourcesChain) {
  auto registry = SourceRegistry::WithBuiltins({});
  auto file = registry->For("/a");
  ASSERT_OK(file);
  auto outer = MakeFileSource({});
  auto outermost = MakeFileSource({});
  ASSERT_OK(outer);
  ASSERT_OK(outermost);
  registry->Interpose(file->first, outer->get());
  registry->Interpose(outer->get(), outermost->get());
  auto found = registry->For("/b");
  ASSERT_OK(found);
  EXPECT_EQ(found->first, outermost->get());
  EXPECT_EQ(found->second, "/b");
}

TEST(SourceRegistryTest, UnknownSchemeNamesTheUriAndListsKnownSchemes) {
  auto registry = SourceRegistry::WithBuiltins({});
  auto found = registry->For("gs://bucket/key.bin?X-Goog-Signature=abc");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(found.status().location(), "gs://bucket/key.bin");
  EXPECT_EQ(found.status().message(), "unknown URI scheme \"gs\" (known schemes: file, http, https, s3)");
}

TEST(SourceRegistryTest, FactoryErrorsReachTheCaller) {
  SourceOptions options;
  options.max_open_files = 0;
  auto registry = SourceRegistry::WithBuiltins(options);
  auto found = registry->For("/a");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().location(), "max_open_files");
}

TEST(NullObserverTest, IsOneSharedInstance) {
  EXPECT_EQ(&NullObserver(), &NullObserver());
  NullObserver().OnRead("file", 1, 0.1);  // must not crash
}

}  // namespace
}  // namespace meshload::sidecar::source
