#include "common/logging.h"
#include "tests/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

namespace meshload {
namespace {

using ::testing::HasSubstr;

TEST(Logging, JsonLinesCarryLevelMessageAndTypedFields) {
  std::string line =
      FormatLogLine(LogLevel::kWarn, "slow \"read\"",
                    {{"file", "/d/a.bin"}, {"offset", uint64_t{4096}}, {"ok", false}, {"ms", 1.5}}, LogFormat::kJson);
  EXPECT_EQ(line.back(), '\n');
  EXPECT_THAT(line, HasSubstr("\"level\":\"warn\""));
  EXPECT_THAT(line, HasSubstr("\"msg\":\"slow \\\"read\\\"\""));
  EXPECT_THAT(line, HasSubstr("\"file\":\"/d/a.bin\",\"offset\":4096,\"ok\":false,\"ms\":1.5}"));
  EXPECT_EQ(line.rfind("{\"ts\":\"", 0), 0u);
}

TEST(Logging, KeyValueQuotesOnlyWhatNeedsIt) {
  std::string line =
      FormatLogLine(LogLevel::kInfo, "plan computed", {{"step", 3}, {"job", "a b"}, {"p", "x"}}, LogFormat::kKeyValue);
  EXPECT_THAT(line, HasSubstr("level=info msg=\"plan computed\" step=3 job=\"a b\" p=x\n"));
}

TEST(Logging, EscapesControlCharacters) { EXPECT_EQ(JsonEscape("a\nb\t\x01"), "a\\nb\\t\\u0001"); }

TEST(Logging, LevelsFilterAndParse) {
  ConfigureLogging(LogLevel::kWarn, LogFormat::kJson);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  EXPECT_EQ(*ParseLogLevel("WARNING"), LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud").ok());
  EXPECT_EQ(*ParseLogFormat("logfmt"), LogFormat::kKeyValue);
  ConfigureLogging(LogLevel::kOff, LogFormat::kJson);
  EXPECT_FALSE(LogEnabled(LogLevel::kError));
  ConfigureLogging(LogLevel::kInfo, LogFormat::kJson);
}

TEST(Logging, EnvironmentSetsLevelAndRejectsNonsenseByName) {
  ::setenv("MESHLOAD_LOG_LEVEL", "debug", 1);
  ASSERT_OK(ConfigureLoggingFromEnv());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kDebug);
  ::setenv("MESHLOAD_LOG_LEVEL", "chatty", 1);
  Status s = ConfigureLoggingFromEnv();
  EXPECT_EQ(s.location(), "MESHLOAD_LOG_LEVEL");
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kDebug);
  ::unsetenv("MESHLOAD_LOG_LEVEL");
  ConfigureLogging(LogLevel::kInfo, LogFormat::kJson);
}

}  // namespace
}  // namespace meshload
