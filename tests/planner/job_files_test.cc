// The files the controller publishes for the sidecars (planner/job_files.h):
// what it writes reads back the same, and what is not the controller's is
// an error naming the file and the field.
#include "planner/job_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace meshload::planner {
namespace {

using ::testing::HasSubstr;

TEST(JobFiles, AssignmentsReadBackAsWritten) {
  Assignments a;
  a.processes = 3;
  a.pods["p0"] = {"u0", 0, "10.0.0.1"};
  a.pods["p2"] = {"u2", 2, ""};
  a.samples = 600;
  auto back = Assignments::Parse(a.ToJson().dump(2), "assignments.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->processes, 3);
  EXPECT_EQ(back->samples, 600);
  ASSERT_EQ(back->pods.size(), 2u);
  EXPECT_EQ(back->pods["p0"].ip, "10.0.0.1");
  EXPECT_EQ(back->pods["p2"].uid, "u2");
  EXPECT_EQ(back->pods["p2"].index, 2);
  EXPECT_EQ(back->ToJson(), a.ToJson());
}

TEST(JobFiles, AssignmentsThatAreNotTheControllersNameTheFileAndField) {
  struct Case {
    const char* text;
    const char* error;
  } cases[] = {
      {"not json", "expected the controller's assignments (processes, pods)"},
      {R"({"pods": {}})", "expected the controller's assignments (processes, pods)"},
      {R"({"processes": 0, "pods": {}})", "processes: out of range"},
      {R"({"processes": 2, "pods": {"a": {"index": "1"}}})", "pods.a.index: expected an integer"},
      {R"({"processes": 2, "pods": {"a": {"index": 2}}})", "pods.a.index: out of range"},
      {R"({"processes": 2, "pods": {}, "samples": 0})", "samples: expected a positive integer"},
  };
  for (const auto& c : cases) {
    auto r = Assignments::Parse(c.text, "/etc/meshload/job/assignments.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().ToString(), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(r.status().ToString(), HasSubstr("/etc/meshload/job/assignments.json")) << c.text;
  }
}

TEST(JobFiles, ALenientReadKeepsEveryEntryThatCanBeRead) {
  const Assignments a = Assignments::ReadLeniently(
      R"({"processes": "x", "samples": 0, "pods": {"a": {"uid": "ua", "index": 1, "ip": "10.0.0.1"},
          "b": {"index": "2"}, "c": {"index": -1}, "d": 7, "e": {"index": 0, "uid": 5}}})");
  EXPECT_EQ(a.processes, 0);
  ASSERT_EQ(a.pods.size(), 2u);
  EXPECT_EQ(a.pods.at("a").uid, "ua");
  EXPECT_EQ(a.pods.at("a").index, 1);
  EXPECT_EQ(a.pods.at("e").uid, "");
  EXPECT_TRUE(Assignments::ReadLeniently("not json").pods.empty());
}

TEST(JobFiles, AResumeRecordReadsBackAndABadOneSaysWhatIsExpected) {
  auto back = ResumeRecord::Parse(ResumeRecord{12, 3}.ToJson().dump(), "resume.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, 12);
  EXPECT_EQ(back->spec_step, 3);
  for (const char* bad : {"[]", R"({"step": -1, "specStep": 0})", R"({"step": 1})"}) {
    auto r = ResumeRecord::Parse(bad, "resume.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().ToString(), HasSubstr("expected {\"step\": N, \"specStep\": S}")) << bad;
  }
}

}  // namespace
}  // namespace meshload::planner
