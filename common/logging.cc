#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace meshload {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kJson)};

std::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "info";
}

std::string Timestamp() {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool NeedsQuotes(std::string_view s) {
  if (s.empty()) return true;
  for (char c : s) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return true;
  }
  return false;
}

void AppendValue(std::string& out, const LogField::Value& v, LogFormat format) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    if (format == LogFormat::kJson || NeedsQuotes(*s)) {
      out += '"';
      out += JsonEscape(*s);
      out += '"';
    } else {
      out += *s;
    }
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    out += std::to_string(*i);
  } else if (const auto* u = std::get_if<uint64_t>(&v)) {
    out += std::to_string(*u);
  } else if (const auto* d = std::get_if<double>(&v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *d);
    out += buf;
  } else if (const auto* b = std::get_if<bool>(&v)) {
    out += *b ? "true" : "false";
  }
}

}  // namespace

Result<LogLevel> ParseLogLevel(std::string_view text) {
  std::string t = Lower(text);
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warn" || t == "warning") return LogLevel::kWarn;
  if (t == "error") return LogLevel::kError;
  if (t == "off" || t == "none") return LogLevel::kOff;
  return InvalidArgument("unknown log level '" + std::string(text) +
                         "'; expected one of debug, info, warn, error, off");
}

Result<LogFormat> ParseLogFormat(std::string_view text) {
  std::string t = Lower(text);
  if (t == "json") return LogFormat::kJson;
  if (t == "kv" || t == "keyvalue" || t == "logfmt") return LogFormat::kKeyValue;
  return InvalidArgument("unknown log format '" + std::string(text) + "'; expected json or kv");
}

void ConfigureLogging(LogLevel level, LogFormat format) {
  g_level.store(static_cast<int>(level));
  g_format.store(static_cast<int>(format));
}

Status ConfigureLoggingFromFlags(std::string_view level, std::string_view format) {
  if (!level.empty()) {
    auto lv = ParseLogLevel(level);
    if (!lv.ok()) return InvalidArgument("--log-level: " + lv.status().message());
    ConfigureLogging(*lv, CurrentLogFormat());
  }
  if (!format.empty()) {
    auto fm = ParseLogFormat(format);
    if (!fm.ok()) return InvalidArgument("--log-format: " + fm.status().message());
    ConfigureLogging(CurrentLogLevel(), *fm);
  }
  return Status::Ok();
}

Status ConfigureLoggingFromEnv() {
  if (const char* lv = std::getenv("MESHLOAD_LOG_LEVEL"); lv && *lv) {
    auto r = ParseLogLevel(lv);
    if (!r.ok()) return r.status().WithLocationPrefix("MESHLOAD_LOG_LEVEL");
    g_level.store(static_cast<int>(*r));
  }
  if (const char* fm = std::getenv("MESHLOAD_LOG_FORMAT"); fm && *fm) {
    auto r = ParseLogFormat(fm);
    if (!r.ok()) return r.status().WithLocationPrefix("MESHLOAD_LOG_FORMAT");
    g_format.store(static_cast<int>(*r));
  }
  return Status::Ok();
}

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(g_level.load()); }
LogFormat CurrentLogFormat() { return static_cast<LogFormat>(g_format.load()); }

bool LogEnabled(LogLevel level) { return level != LogLevel::kOff && static_cast<int>(level) >= g_level.load(); }

std::string JsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string FormatLogLine(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields,
                          LogFormat format) {
  std::string line;
  line.reserve(128);
  if (format == LogFormat::kJson) {
    line += "{\"ts\":\"" + Timestamp() + "\",\"level\":\"";
    line += LevelName(level);
    line += "\",\"msg\":\"" + JsonEscape(msg) + "\"";
    for (const auto& f : fields) {
      line += ",\"" + JsonEscape(f.key) + "\":";
      AppendValue(line, f.value, format);
    }
    line += "}\n";
  } else {
    line += "ts=" + Timestamp() + " level=";
    line += LevelName(level);
    line += " msg=";
    AppendValue(line, LogField::Value(std::string(msg)), format);
    for (const auto& f : fields) {
      line += ' ';
      line += f.key;
      line += '=';
      AppendValue(line, f.value, format);
    }
    line += '\n';
  }
  return line;
}

void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::string line = FormatLogLine(level, msg, fields, static_cast<LogFormat>(g_format.load()));
  // One write per line keeps lines whole across threads; a short write to a
  // pipe is retried, an error is dropped (logging must never fail the caller).
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace meshload
