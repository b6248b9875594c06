#include "common/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/diagnostics.h"
#include "tests/testing/status_matchers.h"

namespace meshload {
namespace {

using ::meshload::testing::HasMessage;
using ::meshload::testing::IsOk;
using ::meshload::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

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

TEST(StatusMatchers, MatchStatusesAndResults) {
  const Status bad = InvalidArgument("must be even, got 3", "x");
  EXPECT_THAT(Status::Ok(), IsOk());
  EXPECT_THAT(Quarter(8), IsOk());
  EXPECT_THAT(bad, Not(IsOk()));
  EXPECT_THAT(Quarter(6), Not(IsOk()));

  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Quarter(6), StatusIs(StatusCode::kInvalidArgument, HasSubstr("got 3")));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "must be even, got 3"));
  EXPECT_THAT(bad, Not(StatusIs(StatusCode::kNotFound)));
  EXPECT_THAT(bad, Not(StatusIs(StatusCode::kInvalidArgument, HasSubstr("odd"))));
  EXPECT_THAT(Status::Ok(), StatusIs(StatusCode::kOk));
  EXPECT_THAT(Quarter(8), Not(StatusIs(StatusCode::kInvalidArgument)));

  EXPECT_THAT(bad, HasMessage(HasSubstr("even")));
  EXPECT_THAT(Quarter(6), HasMessage("must be even, got 3"));
  EXPECT_THAT(bad, Not(HasMessage(HasSubstr("x:"))));  // the location is not the message
  EXPECT_THAT(Status::Ok(), Not(HasMessage(::testing::_)));
}

TEST(StatusMatchers, DescribeThemselvesAndWhatTheyGot) {
  const ::testing::Matcher<const Status&> is = StatusIs(StatusCode::kInvalidArgument, HasSubstr("axes"));
  EXPECT_EQ(::testing::DescribeMatcher<const Status&>(is),
            "has code invalid_argument and a message that has substring \"axes\"");
  EXPECT_EQ(::testing::DescribeMatcher<const Status&>(is, /*negation=*/true),
            "has a code other than invalid_argument or has a message that has no substring "
            "\"axes\"");
  EXPECT_EQ(::testing::DescribeMatcher<const Status&>(IsOk()), "is OK");
  EXPECT_EQ(::testing::DescribeMatcher<const Status&>(IsOk(), true), "is not OK");
  EXPECT_EQ(::testing::DescribeMatcher<const Result<int>&>(HasMessage(HasSubstr("b"))),
            "is an error (any code) and a message that has substring \"b\"");

  ::testing::StringMatchResultListener why;
  EXPECT_FALSE(is.MatchAndExplain(NotFound("no such file", "/d/a.npy"), &why));
  EXPECT_EQ(why.str(), "whose code is not_found and message is \"no such file\" (location \"/d/a.npy\")");

  const ::testing::Matcher<const Result<int>&> ok = IsOk();
  ::testing::StringMatchResultListener why_not_ok;
  EXPECT_FALSE(ok.MatchAndExplain(Quarter(6), &why_not_ok));
  EXPECT_EQ(why_not_ok.str(), "whose code is invalid_argument and message is \"must be even, got 3\" (location \"x\")");

  EXPECT_EQ(::testing::PrintToString(InvalidArgument("bad", "f")), "invalid_argument: \"f: bad\"");
  EXPECT_EQ(::testing::PrintToString(Quarter(8)), "ok: 2");
  EXPECT_EQ(::testing::PrintToString(Status::Ok()), "ok");
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
  EXPECT_THAT(d.ToStatus().message(), HasSubstr("2 problems"));
}

}  // namespace
}  // namespace meshload
