#include "common/status.h"

#include <gtest/gtest.h>

#include "common/diagnostics.h"
#include "tests/testing/status_matchers.h"

namespace meshload {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("must be even, got " + std::to_string(x), "x");
  return x / 2;
}

Result<int> Quarter(int x) {
  MESHLOAD_ASSIGN_OR_RETURN(int h, Half(x));
  MESHLOAD_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  MESHLOAD_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(Status, RendersLocationThenMessage) {
  Status s = InvalidArgument("must be >= 1, got 0", "spec.mesh.axes[1].size");
  EXPECT_EQ(s.ToString(), "spec.mesh.axes[1].size: must be >= 1, got 0");
  EXPECT_EQ(Status::Ok().ToString(), "ok");
  EXPECT_EQ(InvalidArgument("bad").ToString(), "bad");
}

TEST(Status, LocationPrefixesJoinFilesOffsetsAndFields) {
  EXPECT_EQ(DataLoss("truncated", "@12").WithLocationPrefix("/d/a.npy").location(), "/d/a.npy@12");
  EXPECT_EQ(InvalidArgument("x", "mesh").WithLocationPrefix("spec").location(), "spec.mesh");
  EXPECT_EQ(InvalidArgument("x", "[2]").WithLocationPrefix("axes").location(), "axes[2]");
  EXPECT_EQ(InvalidArgument("x").WithLocationPrefix("f").location(), "f");
  EXPECT_OK(Status::Ok().WithLocationPrefix("f"));
}

TEST(Result, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToString(), "x: must be even, got 3");
  EXPECT_OK(CheckEven(4));
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

// Broken invariants crash, saying what broke; likely errors are statuses.
TEST(ResultDeathTest, AResultMadeFromAnOkStatusAborts) {
  EXPECT_DEATH({ Result<int> r{Status::Ok()}; }, "invariant broken at .*a Result made from an OK status");
}

TEST(ResultDeathTest, TheValueOfAnErrorAbortsPrintingTheError) {
  EXPECT_DEATH({ (void)Quarter(6).value(); }, "value\\(\\) of a Result holding an error: x: must be even, got 3");
}

TEST(ResultDeathTest, MeshloadCheckAbortsWithItsMessage) {
  EXPECT_DEATH(MESHLOAD_CHECK(1 + 1 == 3, "arithmetic"), "invariant broken at .*status_test.cc:[0-9]+: arithmetic");
}

TEST(StatusMatchers, AFailedExpectOkPrintsTheError) {
  const Result<int> r = Quarter(6);
  const ::testing::AssertionResult a = ::meshload::testing::IsOkFormat("Quarter(6)", r);
  EXPECT_FALSE(a);
  EXPECT_STREQ(a.message(), "Quarter(6) is not OK: x: must be even, got 3 (invalid_argument)");
  EXPECT_TRUE(::meshload::testing::IsOkFormat("Quarter(8)", Quarter(8)));
}

TEST(Status, ErrnoErrorsSayWhatFailed) {
  Status s = IoErrorFromErrno("open", "/x", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "/x: open: No such file or directory");
  EXPECT_EQ(IoErrorFromErrno("read", "/x", EIO).code(), StatusCode::kIoError);
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "data_loss");
}

TEST(Diagnostics, CollectsEveryProblemAndSummarisesThem) {
  Diagnostics d;
  EXPECT_OK(d.ToStatus());
  d.Add("spec.a", "bad a");
  EXPECT_EQ(d.ToStatus().ToString(), "spec.a: bad a");
  d.Add(DataLoss("short", "f@3"));
  d.Add(Status::Ok());
  EXPECT_EQ(d.problems().size(), 2u);
  EXPECT_EQ(d.ToString(), "spec.a: bad a\nf@3: short\n");
  EXPECT_NE(d.ToStatus().message().find("2 problems"), std::string::npos);
}

}  // namespace
}  // namespace meshload
