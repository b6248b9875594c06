// status.progress from the sidecars' reports, and when it is rewritten: the
// pure functions of controller/progress_poller.h (the poller against the
// real control plane is in controller_test.cc).
#include "controller/progress_poller.h"

#include <gtest/gtest.h>

namespace meshload::controller {
namespace {

using nlohmann::json;

ProcessProgress Reached(int64_t process, int64_t step, double rate) {
  ProcessProgress p;
  p.process = process;
  p.pod = "trainer-" + std::to_string(process);
  p.reached = true;
  p.report = {{"process", process}, {"consumedStep", step}, {"stepsPerSecond", rate}};
  return p;
}

TEST(ProgressStatus, TheStepEveryProcessConsumedIsTheMinimumAndResumeIsOneMore) {
  JobProgress poll;
  poll.processes = 3;
  poll.sidecars = {Reached(0, 120, 2.0), Reached(1, 118, 2.1), Reached(2, 125, 1.9)};
  json s = ProgressStatus(poll, /*global_batch=*/64, /*lag_steps=*/100);
  EXPECT_EQ(s["step"], 118);
  EXPECT_EQ(s["resumeStep"], 119);
  EXPECT_EQ(s["maxStep"], 125);
  EXPECT_EQ(s["processesReporting"], 3);
  EXPECT_DOUBLE_EQ(s["samplesPerSecond"].get<double>(), 128.0);  // the median rate x 64
  EXPECT_FALSE(s.contains("lagging"));
  EXPECT_FALSE(s.contains("unreachable"));
}

TEST(ProgressStatus, AnUnreachableSidecarIsNamedAndNoResumeStepIsGuessed) {
  JobProgress poll;
  poll.processes = 2;
  ProcessProgress gone;
  gone.process = 1;
  gone.pod = "trainer-1";
  gone.error = "GET http://10.0.0.7:9464/progress: Connection refused";
  poll.sidecars = {Reached(0, 50, 1.0), gone};
  json s = ProgressStatus(poll, 8, 100);
  EXPECT_FALSE(s.contains("step"));
  EXPECT_FALSE(s.contains("resumeStep"));
  EXPECT_EQ(s["maxStep"], 50);
  EXPECT_EQ(s["processesReporting"], 1);
  ASSERT_EQ(s["unreachable"].size(), 1u);
  EXPECT_EQ(s["unreachable"][0]["process"], 1);
  EXPECT_EQ(s["unreachable"][0]["pod"], "trainer-1");
  EXPECT_EQ(s["unreachable"][0]["reason"], gone.error);

  // A process without a ready sidecar is not polled: still no resume step.
  poll.sidecars = {Reached(0, 50, 1.0)};
  EXPECT_FALSE(ProgressStatus(poll, 8, 100).contains("resumeStep"));
}

TEST(ProgressStatus, AProcessFarBehindTheMedianLags) {
  JobProgress poll;
  poll.processes = 4;
  poll.sidecars = {Reached(0, 1000, 3), Reached(1, 1001, 3), Reached(2, 850, 3), Reached(3, 1002, 3)};
  json s = ProgressStatus(poll, 8, 100);
  ASSERT_EQ(s["lagging"].size(), 1u);
  EXPECT_EQ(s["lagging"][0]["process"], 2);
  EXPECT_EQ(s["lagging"][0]["step"], 850);
  EXPECT_EQ(s["lagging"][0]["behind"], 151);  // median 1000.5
  EXPECT_EQ(s["step"], 850);
}

TEST(ProgressToWrite, SmallMovesKeepTheWrittenStatusAndRealChangesReplaceIt) {
  json written = {{"step", 1000}, {"resumeStep", 1001}, {"maxStep", 1002}, {"samplesPerSecond", 256.0},
                  {"processesReporting", 4}};
  json fresh = {{"step", 1060}, {"resumeStep", 1061}, {"maxStep", 1062}, {"samplesPerSecond", 250.0},
                {"processesReporting", 4}};
  EXPECT_EQ(ProgressToWrite(written, fresh, 100), written);  // 60 steps, 2% rate: no write
  fresh["step"] = 1100;
  EXPECT_EQ(ProgressToWrite(written, fresh, 100), fresh);  // a whole granularity
  fresh["step"] = 1060;
  fresh["samplesPerSecond"] = 200.0;
  EXPECT_EQ(ProgressToWrite(written, fresh, 100), fresh);  // the rate moved 22%
  fresh["samplesPerSecond"] = 250.0;
  fresh["processesReporting"] = 3;
  EXPECT_EQ(ProgressToWrite(written, fresh, 100), fresh);  // anything else
  fresh["processesReporting"] = 4;
  fresh["samplesPerSecond"] = 0.0;
  EXPECT_EQ(ProgressToWrite(written, fresh, 100), fresh);  // stopped: the exact step
  EXPECT_EQ(ProgressToWrite(fresh, fresh, 100), fresh);
  json later = fresh;
  later["step"] = 1061;
  later["resumeStep"] = 1062;
  EXPECT_EQ(ProgressToWrite(fresh, later, 100), later);  // stopped, and moved at all: exact
  EXPECT_EQ(ProgressToWrite(json(), fresh, 100), fresh);  // nothing written yet
}

}  // namespace
}  // namespace meshload::controller
