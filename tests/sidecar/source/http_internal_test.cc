#include "sidecar/source/http_internal.h"
#include "tests/testing/status_matchers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace meshload::sidecar::source::internal {
namespace {

using std::chrono::milliseconds;

// Expects `url` to parse, into `origin` (the pool key) and `target` (the
// request line's).
void ExpectOriginAndTarget(const std::string& url, const std::string& origin, const std::string& target) {
  auto parsed = ParseHttpUrl(url);
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->origin, origin) << url;
  EXPECT_EQ(parsed->target, target) << url;
}

TEST(ParseHttpUrlTest, SplitsOriginAndTargetKeepingTheQueryOnTheWire) {
  auto url = ParseHttpUrl("HTTP://Store.Example:8080/a/b.bin?X-Sig=abc#frag");
  ASSERT_OK(url);
  EXPECT_EQ(url->scheme, "http");
  EXPECT_EQ(url->origin, "http://store.example:8080");
  EXPECT_EQ(url->target, "/a/b.bin?X-Sig=abc");
  EXPECT_EQ(url->redacted, "HTTP://Store.Example:8080/a/b.bin");
}

TEST(ParseHttpUrlTest, DefaultsPortsAndPath) {
  ExpectOriginAndTarget("https://host", "https://host:443", "/");
  ExpectOriginAndTarget("http://host?k=v", "http://host:80", "/?k=v");
}

TEST(ParseHttpUrlTest, AcceptsBracketedIpv6) {
  auto url = ParseHttpUrl("http://[::1]:9000/x");
  ASSERT_OK(url);
  EXPECT_EQ(url->origin, "http://[::1]:9000");
}

TEST(ParseHttpUrlTest, RejectsBadUrls) {
  for (const char* bad : {"ftp://host/x", "http:///x", "http://host:0/x", "http://host:99999/", "http://host:8a/",
                          "http://[::1/x", "/plain/path"}) {
    auto url = ParseHttpUrl(bad);
    EXPECT_FALSE(url.ok()) << bad;
    EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseContentRangeTest, ParsesTheThreeForms) {
  auto full = ParseContentRange("bytes 10-19/100");
  ASSERT_TRUE(full.has_value());
  EXPECT_TRUE(full->has_range);
  EXPECT_EQ(full->first, 10u);
  EXPECT_EQ(full->last, 19u);
  EXPECT_EQ(full->size, 100u);
  auto unknown = ParseContentRange("bytes 0-0/*");
  ASSERT_TRUE(unknown.has_value());
  EXPECT_FALSE(unknown->size.has_value());
  auto unsatisfied = ParseContentRange("bytes */4096");
  ASSERT_TRUE(unsatisfied.has_value());
  EXPECT_FALSE(unsatisfied->has_range);
  EXPECT_EQ(unsatisfied->size, 4096u);
}

TEST(ParseContentRangeTest, RejectsMalformedValues) {
  for (const char* bad : {"", "bytes", "bytes 1-2", "items 1-2/3", "bytes 5-4/10", "bytes 1-10/10", "bytes */*",
                          "bytes a-2/3", "bytes 1-2/x", "bytes -2/3", "bytes 1-99999999999999999999/*"}) {
    EXPECT_FALSE(ParseContentRange(bad).has_value()) << bad;
  }
}

TEST(ParseDecimalTest, AcceptsOnlyPlainDigitsWithoutOverflow) {
  EXPECT_EQ(ParseDecimal("0"), 0u);
  EXPECT_EQ(ParseDecimal("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(ParseDecimal("18446744073709551616").has_value());
  EXPECT_FALSE(ParseDecimal("").has_value());
  EXPECT_FALSE(ParseDecimal(" 1").has_value());
  EXPECT_FALSE(ParseDecimal("-1").has_value());
}

TEST(BackoffBoundTest, DoublesFromTheInitialDelayUpToTheCap) {
  const milliseconds initial(50), cap(2000);
  EXPECT_EQ(BackoffBound(0, initial, cap), milliseconds(50));
  EXPECT_EQ(BackoffBound(1, initial, cap), milliseconds(100));
  EXPECT_EQ(BackoffBound(5, initial, cap), milliseconds(1600));
  EXPECT_EQ(BackoffBound(6, initial, cap), milliseconds(2000));
  EXPECT_EQ(BackoffBound(10000, initial, cap), milliseconds(2000));
}

// A request costs its latency and its bytes over the bandwidth; a gap is
// worth reading while it takes less than a second request's latency.
TEST(TransferCostModel, AGapIsWorthReadingUpToLatencyTimesBandwidth) {
  TransferCostModel m(0.002, 100e6);
  EXPECT_EQ(m.GapWorthReading(), 200000u) << "assumed: 2 ms at 100 MB/s";
  // Small requests of 0.5 ms: the latency.
  for (int i = 0; i < 50; ++i) m.Add(4096, 0.0005);
  EXPECT_NEAR(m.latency(), 0.0005, 1e-9);
  // 8 MiB in 0.5 ms + 8 ms: about 1 GB/s once started.
  for (int i = 0; i < 50; ++i) m.Add(8 << 20, 0.0085);
  EXPECT_NEAR(m.bandwidth(), (8 << 20) / 0.008, 1e3);
  EXPECT_NEAR(static_cast<double>(m.GapWorthReading()), 0.0005 * (8 << 20) / 0.008, 2.0);
  // A slower network moves the figure with it (weighted toward the recent).
  for (int i = 0; i < 200; ++i) m.Add(1024, 0.02);
  EXPECT_NEAR(m.latency(), 0.02, 1e-4);
  EXPECT_GT(m.GapWorthReading(), 10u << 20);
  // The figure stays in bounds.
  TransferCostModel fast(1e-7, 1e6);
  EXPECT_EQ(fast.GapWorthReading(), 4096u);
  TransferCostModel slow(10, 1e9);
  EXPECT_EQ(slow.GapWorthReading(), 64u << 20);
}

}  // namespace
}  // namespace meshload::sidecar::source::internal
