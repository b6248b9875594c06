// status.progress from the sidecars' reports, and when it is rewritten: the
// pure functions of controller/progress_poller.h (the poller against the
// real control plane is in controller_test.cc).
#include "controller/progress_poller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace meshload::controller {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

ProcessProgress Reached(int64_t process, int64_t step, double rate) {
  ProcessProgress p;
  p.process = process;
  p.pod = "trainer-" + std::to_string(process);
  p.reached = true;
  p.report = {{"process", process}, {"consumedStep", step}, {"stepsPerSecond", rate}};
  return p;
}

// A sidecar that did not answer; `error` says why.
ProcessProgress Unreachable(int64_t process, std::string error, std::string pod = "") {
  ProcessProgress p;
  p.process = process;
  p.pod = std::move(pod);
  p.error = std::move(error);
  return p;
}

TEST(ProgressStatus, TheStepEveryProcessConsumedIsTheMinimumAndResumeIsOneMore) {
  JobProgress poll;
  poll.processes = 3;
  poll.sidecars = {Reached(0, 120, 2.0), Reached(1, 118, 2.1), Reached(2, 125, 1.9)};
  json s = ProgressStatus(poll, /*global_batch=*/64, HealthThresholds{});
  EXPECT_EQ(s["step"], 118);
  EXPECT_EQ(s["resumeStep"], 119);
  EXPECT_EQ(s["maxStep"], 125);
  EXPECT_EQ(s["processesReporting"], 3);
  EXPECT_DOUBLE_EQ(s["samplesPerSecond"].get<double>(), 128.0);  // the median rate x 64
  EXPECT_FALSE(s.contains("lagging"));
  EXPECT_FALSE(s.contains("unreachable"));
}

// Per dataset: what the job took up to the lowest step (that sidecar's
// figure), and the tokens of every reporting sidecar together.
TEST(ProgressStatus, DatasetsAreTakenAtTheLowestStepWithEveryProcesssTokens) {
  JobProgress poll;
  poll.processes = 2;
  poll.sidecars = {Reached(0, 12, 1.0), Reached(1, 10, 1.0)};
  poll.sidecars[0].report["datasets"] = {
      {{"name", "web"}, {"weight", 0.75}, {"samplesConsumed", 156}, {"epoch", 2}, {"processTokens", 1000}},
      {{"name", "code"}, {"weight", 0.25}, {"samplesConsumed", 52}, {"epoch", 0}, {"processTokens", 300}}};
  poll.sidecars[1].report["datasets"] = {
      {{"name", "web"}, {"weight", 0.75}, {"samplesConsumed", 132}, {"epoch", 2}, {"processTokens", 900}},
      {{"name", "code"}, {"weight", 0.25}, {"samplesConsumed", 44}, {"epoch", 0}, {"processTokens", 250}}};
  json s = ProgressStatus(poll, 16, HealthThresholds{});
  EXPECT_EQ(s["step"], 10);
  EXPECT_EQ(s["datasets"], json::parse(R"([
      {"name": "web", "tokens": 1900, "weight": 0.75, "samples": 132, "epoch": 2},
      {"name": "code", "tokens": 550, "weight": 0.25, "samples": 44, "epoch": 0}])"));
  // Only the moving figures changed: not rewritten before a move is due.
  json later = s;
  later["datasets"][0]["tokens"] = 2000;
  EXPECT_EQ(ProgressToWrite(s, later, 100, false), s);
}

TEST(ProgressStatus, AnUnreachableSidecarIsNamedAndNoResumeStepIsGuessed) {
  JobProgress poll;
  poll.processes = 2;
  const ProcessProgress gone = Unreachable(1, "GET http://10.0.0.7:9464/progress: Connection refused", "trainer-1");
  poll.sidecars = {Reached(0, 50, 1.0), gone};
  json s = ProgressStatus(poll, 8, HealthThresholds{});
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
  EXPECT_FALSE(ProgressStatus(poll, 8, HealthThresholds{}).contains("resumeStep"));
}

TEST(ProgressStatus, AProcessFarBehindTheMedianLags) {
  JobProgress poll;
  poll.processes = 4;
  poll.sidecars = {Reached(0, 1000, 3), Reached(1, 1001, 3), Reached(2, 850, 3), Reached(3, 1002, 3)};
  json s = ProgressStatus(poll, 8, HealthThresholds{});
  ASSERT_EQ(s["lagging"].size(), 1u);
  EXPECT_EQ(s["lagging"][0]["process"], 2);
  EXPECT_EQ(s["lagging"][0]["step"], 850);
  EXPECT_EQ(s["lagging"][0]["behind"], 151);  // median 1000.5
  EXPECT_EQ(s["step"], 850);
}

TEST(ProgressStatus, StarvingProcessesAreNamedAndStayListedDownToHalfTheThreshold) {
  JobProgress poll;
  poll.processes = 3;
  auto with_wait = [](ProcessProgress p, double wait) {
    p.report["trainerConnected"] = true;
    p.report["trainerWaitFraction"] = wait;
    return p;
  };
  poll.sidecars = {with_wait(Reached(0, 10, 1), 0.30), with_wait(Reached(1, 10, 1), 0.02),
                   with_wait(Reached(2, 10, 1), 0.20)};
  json s = ProgressStatus(poll, 8, HealthThresholds{});
  ASSERT_EQ(s["starving"], json::array({{{"process", 0}, {"pod", "trainer-0"}}}));
  // 0 at 20%: still listed (above half of 25%); 2 at 20% was not listed: not added.
  poll.sidecars[0] = with_wait(Reached(0, 20, 1), 0.20);
  json again = ProgressStatus(poll, 8, HealthThresholds{}, s);
  EXPECT_EQ(again["starving"], s["starving"]);
  poll.sidecars[0] = with_wait(Reached(0, 30, 1), 0.10);
  EXPECT_FALSE(ProgressStatus(poll, 8, HealthThresholds{}, again).contains("starving"));
}

TEST(ProgressToWrite, SmallMovesKeepTheWrittenStatusAndRealChangesReplaceIt) {
  json written = {
      {"step", 1000}, {"resumeStep", 1001}, {"maxStep", 1002}, {"samplesPerSecond", 256.0}, {"processesReporting", 4}};
  json fresh = {
      {"step", 1060}, {"resumeStep", 1061}, {"maxStep", 1062}, {"samplesPerSecond", 250.0}, {"processesReporting", 4}};
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
  EXPECT_EQ(ProgressToWrite(fresh, later, 100), later);   // stopped, and moved at all: exact
  EXPECT_EQ(ProgressToWrite(json(), fresh, 100), fresh);  // nothing written yet
}

TEST(ProgressToWrite, BeforeTheMinimumIntervalOnlyRealChangesAreWritten) {
  json written = {
      {"step", 1000}, {"resumeStep", 1001}, {"maxStep", 1002}, {"samplesPerSecond", 256.0}, {"processesReporting", 4}};
  json moved = {
      {"step", 1500}, {"resumeStep", 1501}, {"maxStep", 1502}, {"samplesPerSecond", 128.0}, {"processesReporting", 4}};
  EXPECT_EQ(ProgressToWrite(written, moved, 100, /*moves_due=*/false), written);
  EXPECT_EQ(ProgressToWrite(written, moved, 100, /*moves_due=*/true), moved);
  json lost = moved;
  lost["processesReporting"] = 3;
  EXPECT_EQ(ProgressToWrite(written, lost, 100, false), lost);  // who reports changed: at once
  json stopped = moved;
  stopped["samplesPerSecond"] = 0.0;
  EXPECT_EQ(ProgressToWrite(written, stopped, 100, false), stopped);  // stopped: the exact step at once
}

ProcessProgress Full(int64_t process, int64_t step, double wait, std::optional<double> p99) {
  ProcessProgress p = Reached(process, step, 2.0);
  p.report["trainerConnected"] = true;
  p.report["trainerWaitFraction"] = wait;
  p.report["storageReadSeconds"] = {{"p99", p99 ? json(*p99) : json()}};
  return p;
}

std::vector<JobCondition> Status(const std::vector<ProgressCondition>& cs) {
  std::vector<JobCondition> out;
  for (const auto& c : cs) out.push_back({c.type, c.status, c.reason, c.message, 0, ""});
  return out;
}

const ProgressCondition& Get(const std::vector<ProgressCondition>& cs, const std::string& type) {
  for (const auto& c : cs) {
    if (c.type == type) return c;
  }
  static ProgressCondition none;
  return none;
}

TEST(ProgressConditions, StarvedNamesTheWaitingTrainersAndClearsOnlyBelowHalfTheThreshold) {
  JobProgress poll;
  poll.processes = 3;
  poll.sidecars = {Full(0, 10, 0.02, 0.001), Full(1, 10, 0.40, 0.001), Full(2, 10, 0.30, 0.001)};
  auto cs = ProgressConditions(poll, {}, {});
  EXPECT_EQ(Get(cs, "Starved").status, "True");
  EXPECT_EQ(Get(cs, "Starved").reason, "TrainersWaitForData");
  EXPECT_EQ(Get(cs, "Starved").message,
            "the trainers of process 1 (pod trainer-1), process 2 (pod trainer-2) waited for data more than 25% of "
            "the last window: the loader, not the model, is the bottleneck");
  // 20% and 15%: below the threshold, above half of it: stays as it was.
  poll.sidecars = {Full(0, 20, 0.02, 0.001), Full(1, 20, 0.20, 0.001), Full(2, 20, 0.15, 0.001)};
  auto held = ProgressConditions(poll, {}, Status(cs));
  EXPECT_EQ(Get(held, "Starved").status, "True");
  EXPECT_EQ(Get(held, "Starved").message, Get(cs, "Starved").message);
  // The same figures on a job that was not starved: not starved.
  EXPECT_EQ(Get(ProgressConditions(poll, {}, {}), "Starved").status, "False");
  // Everyone below 12.5%: cleared.
  poll.sidecars = {Full(0, 30, 0.02, 0.001), Full(1, 30, 0.10, 0.001), Full(2, 30, 0.05, 0.001)};
  auto cleared = ProgressConditions(poll, {}, Status(held));
  EXPECT_EQ(Get(cleared, "Starved").status, "False");
  EXPECT_EQ(Get(cleared, "Starved").reason, "LoaderKeepsUp");
}

TEST(ProgressConditions, StragglingSaysWhetherStorageTheTrainerTheExchangeOrStagingIsSlow) {
  JobProgress poll;
  poll.processes = 8;
  auto exchanging = [](ProcessProgress p, double peer_wait) {
    p.report["peerWaitFraction"] = peer_wait;
    return p;
  };
  poll.sidecars = {exchanging(Full(0, 1000, 0.01, 0.002), 0.1), exchanging(Full(1, 1001, 0.01, 0.002), 0.1),
                   exchanging(Full(2, 850, 0.01, 0.002), 0.1),   // behind, not waiting: its trainer
                   exchanging(Full(3, 1000, 0.01, 0.050), 0.1),  // storage 25x the median
                   exchanging(Full(4, 820, 0.60, 0.002), 0.2),   // behind, waiting, no peer wait: staging
                   exchanging(Full(5, 840, 0.50, 0.002), 0.8),   // behind, waiting on its peers: the exchange
                   exchanging(Full(6, 1000, 0.01, 0.002), 0.1), exchanging(Full(7, 1000, 0.01, 0.002), 0.1)};
  HealthThresholds t;
  auto cs = ProgressConditions(poll, t, {});
  const auto& s = Get(cs, "Straggling");
  EXPECT_EQ(s.status, "True");
  EXPECT_EQ(s.reason, "ProcessesStraggle");
  EXPECT_THAT(s.message,
              HasSubstr("process 2 (pod trainer-2) is more than 100 steps behind the median: its trainer is slow"));
  EXPECT_THAT(s.message, HasSubstr("process 3 (pod trainer-3): its storage is slow"));
  EXPECT_THAT(s.message, HasSubstr("process 4 (pod trainer-4) is more than 100 steps behind the median: its staging is "
                                   "slow (its trainer waits; neither its storage nor the exchange is slow)"));
  EXPECT_THAT(s.message,
              HasSubstr("process 5 (pod trainer-5) is more than 100 steps behind the median: the exchange is "
                        "slow"));
  EXPECT_THAT(s.message, Not(HasSubstr("process 0")));
  // Process 4 (starving) also makes the job Starved.
  EXPECT_EQ(Get(cs, "Starved").status, "True");
  // status.progress names the laggards with the same cause.
  json status = ProgressStatus(poll, 8, t);
  EXPECT_EQ(status["lagging"],
            json::parse(R"([{"process": 2, "pod": "trainer-2", "step": 850, "behind": 150, "slow": "trainer"},
                            {"process": 4, "pod": "trainer-4", "step": 820, "behind": 180, "slow": "staging"},
                            {"process": 5, "pod": "trainer-5", "step": 840, "behind": 160, "slow": "exchange"}])"))
      << status.dump();

  // Without the exchange (no peerWaitFraction), a waiting laggard's staging is slow.
  EXPECT_EQ(WhatIsSlow(Full(0, 0, 0.6, 0.002).report, 0.002, 4), SlowPart::kStaging);
  EXPECT_EQ(WhatIsSlow(Full(0, 0, 0.6, 0.009).report, 0.002, 4), SlowPart::kStorage);
  EXPECT_EQ(WhatIsSlow(Full(0, 0, 0.6, std::nullopt).report, 0.0, 4), SlowPart::kStaging);

  // 60 steps behind (more than half of 100): held; 40: cleared.
  poll.sidecars = {Full(0, 2000, 0.01, 0.002), Full(1, 2000, 0.01, 0.002), Full(2, 1940, 0.01, 0.002)};
  poll.processes = 3;
  EXPECT_EQ(Get(ProgressConditions(poll, t, Status(cs)), "Straggling").message, s.message);
  poll.sidecars[2] = Full(2, 1960, 0.01, 0.002);
  EXPECT_EQ(Get(ProgressConditions(poll, t, Status(cs)), "Straggling").status, "False");
}

TEST(ProgressConditions, NoAnswerIsUnknownNeverAGuess) {
  JobProgress poll;
  poll.processes = 2;
  poll.sidecars = {Unreachable(0, "timeout")};
  auto cs = ProgressConditions(poll, {}, {});
  EXPECT_EQ(Get(cs, "Starved").status, "Unknown");
  EXPECT_EQ(Get(cs, "Straggling").status, "Unknown");
  EXPECT_EQ(Get(cs, "Straggling").reason, "NoProgress");
}

}  // namespace
}  // namespace meshload::controller
