/// \file
/// Structured logging: one event per line, as JSON or as key=value pairs.
///
///   Log(LogLevel::kInfo, "plan computed", {{"step", step}, {"process", p}});
///
/// emits (format json)
///   {"ts":"2026-11-21T11:40:02.123Z","level":"info","msg":"plan computed","step":3,"process":0}
/// or (format kv)
///   ts=2026-11-21T11:40:02.123Z level=info msg="plan computed" step=3 process=0
///
/// The level and format come from ConfigureLogging(), usually fed by the
/// `--log-level`/`--log-format` flags or the MESHLOAD_LOG_LEVEL and
/// MESHLOAD_LOG_FORMAT environment variables. Logs go to stderr so that
/// stdout stays free for a command's output.
///
/// Thread safety: all functions are thread-safe; a line is written with one
/// write(2) call, so lines from different threads never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"

namespace meshload {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
enum class LogFormat { kJson, kKeyValue };

/// One structured field. Values are strings, integers, doubles or booleans.
struct LogField {
  using Value = std::variant<std::string, int64_t, uint64_t, double, bool>;
  LogField(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, int v) : key(k), value(int64_t{v}) {}
  LogField(std::string_view k, long v) : key(k), value(int64_t{v}) {}
  LogField(std::string_view k, long long v) : key(k), value(int64_t{v}) {}
  LogField(std::string_view k, unsigned v) : key(k), value(uint64_t{v}) {}
  LogField(std::string_view k, unsigned long v) : key(k), value(uint64_t{v}) {}
  LogField(std::string_view k, unsigned long long v) : key(k), value(uint64_t{v}) {}
  LogField(std::string_view k, double v) : key(k), value(v) {}
  LogField(std::string_view k, bool v) : key(k), value(v) {}
  std::string key;
  Value value;
};

/// Parses "debug", "info", "warn"/"warning", "error", "off".
Result<LogLevel> ParseLogLevel(std::string_view text);
/// Parses "json" or "kv"/"keyvalue"/"logfmt".
Result<LogFormat> ParseLogFormat(std::string_view text);

/// Sets the process-wide level and format.
void ConfigureLogging(LogLevel level, LogFormat format);
/// Reads MESHLOAD_LOG_LEVEL and MESHLOAD_LOG_FORMAT; an invalid value is
/// returned as an error naming the variable, and the setting is left as is.
Status ConfigureLoggingFromEnv();

/// Applies --log-level / --log-format values; each, when not empty,
/// overrides only what it names. Errors say which flag was wrong.
Status ConfigureLoggingFromFlags(std::string_view level, std::string_view format);

LogLevel CurrentLogLevel();
LogFormat CurrentLogFormat();
bool LogEnabled(LogLevel level);

/// Formats one event as a line (with the trailing newline). Exposed for tests.
std::string FormatLogLine(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields,
                          LogFormat format);

/// Emits one event to stderr if `level` is enabled.
void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields = {});

inline void LogDebug(std::string_view m, std::initializer_list<LogField> f = {}) { Log(LogLevel::kDebug, m, f); }
inline void LogInfo(std::string_view m, std::initializer_list<LogField> f = {}) { Log(LogLevel::kInfo, m, f); }
inline void LogWarn(std::string_view m, std::initializer_list<LogField> f = {}) { Log(LogLevel::kWarn, m, f); }
inline void LogError(std::string_view m, std::initializer_list<LogField> f = {}) { Log(LogLevel::kError, m, f); }

/// Escapes `s` as the body of a JSON string (without the quotes).
std::string JsonEscape(std::string_view s);

}  // namespace meshload
