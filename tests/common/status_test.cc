#include "common/status.h"

#include <gtest/gtest.h>

#include "common/diagnostics.h"

namespace meshload {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("must be even, got " + std::to_string(x), "x");
  return x / 2;
}

Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
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
  EXPECT_TRUE(Status::Ok().WithLocationPrefix("f").ok());
}

TEST(Result, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToString(), "x: must be even, got 3");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

TEST(Result, AnOkStatusIsNotAValue) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
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
  EXPECT_TRUE(d.ToStatus().ok());
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
