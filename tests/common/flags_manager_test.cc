// The declared flags (help generated from them, environment variables,
// ranges) and the Manager's start and stop order.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "common/flags.h"
#include "common/manager.h"
#include "tests/testing/status_matchers.h"

namespace meshload {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Declared {
  std::string path;
  int64_t workers = 4;
  FlagParser parser{"", "usage: prog [options]\n", "prog"};
  Declared() {
    parser.Section("options:");
    parser.Text({{"--path"}, "PATH", "where it is\nand more about it", "PROG_TEST_PATH"}, &path);
    parser.Section("tuning:");
    parser.Integer({{"--workers"}, "N", "how many (default 4)"}, &workers, 1, 256);
    parser.Version("prog 1\n");
  }
};

TEST(Flags, HelpIsGeneratedFromTheDeclaredFlags) {
  Declared d;
  EXPECT_EQ(d.parser.Usage(),
            "usage: prog [options]\n"
            "\noptions:\n"
            "  --path PATH                     where it is\n"
            "                                  and more about it [$PROG_TEST_PATH]\n"
            "\ntuning:\n"
            "  --workers N                     how many (default 4)\n"
            "  --version                       print the version\n");
}

TEST(Flags, TheEnvironmentGivesAValueTheCommandLineOverrides) {
  ::setenv("PROG_TEST_PATH", "/from/env", 1);
  {
    Declared d;
    EXPECT_EQ(d.parser.Parse({}), -1);
    EXPECT_EQ(d.path, "/from/env");
  }
  {
    Declared d;
    EXPECT_EQ(d.parser.Parse({"--path", "/from/flag"}), -1);
    EXPECT_EQ(d.path, "/from/flag");
  }
  ::unsetenv("PROG_TEST_PATH");
}

TEST(Flags, AnIntegerOutOfItsRangeIsAUsageErrorNamingTheFlag) {
  Declared d;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(d.parser.Parse({"--workers", "0"}), 2);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("prog: --workers: expected an integer from 1 to 256, got '0'"));
  EXPECT_EQ(d.workers, 4);
}

TEST(Manager, StartsInOrderAndStopsInReverse) {
  std::vector<std::string> log;
  Manager m("test");
  for (const char* name : {"a", "b", "c"}) {
    m.Add({name,
           [&log, name] {
             log.push_back(std::string("start ") + name);
             return Status::Ok();
           },
           [&log, name] { log.push_back(std::string("stop ") + name); }});
  }
  ASSERT_OK(m.Start());
  m.Stop();
  m.Stop();  // once each
  EXPECT_THAT(log, ElementsAre("start a", "start b", "start c", "stop c", "stop b", "stop a"));
}

TEST(Manager, APartThatCannotStartStopsTheOnesBeforeItAndIsNamed) {
  std::vector<std::string> log;
  Manager m("test");
  m.Add({"metrics", [&] { return Status::Ok(); }, [&] { log.push_back("stop metrics"); }});
  m.Add({"webhook", [&] { return InvalidArgument("port 9443 is taken"); }, [&] { log.push_back("stop webhook"); }});
  m.Add({"never",
         [&] {
           log.push_back("start never");
           return Status::Ok();
         },
         nullptr});
  Status st = m.Start();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), HasSubstr("webhook: port 9443 is taken"));
  EXPECT_THAT(log, ElementsAre("stop metrics"));
}

}  // namespace
}  // namespace meshload
