#include "common/flags.h"

#include <cstdlib>

#include <iostream>
#include <limits>

namespace meshload {

int UsageError(const std::string& message, const std::string& program) {
  std::cerr << program << ": " << message << "\n";
  return 2;
}

bool ParseInt64(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (text[0] == '-' || text[0] == '+') {
    neg = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return false;
  uint64_t v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

void FlagParser::String(std::vector<std::string> names, std::string* out) {
  flags_.push_back({std::move(names), true, [out](const std::string& v, std::string&) {
                      *out = v;
                      return true;
                    }});
}

void FlagParser::OptionalString(std::vector<std::string> names, std::optional<std::string>* out) {
  flags_.push_back({std::move(names), true, [out](const std::string& v, std::string&) {
                      *out = v;
                      return true;
                    }});
}

void FlagParser::Int(std::vector<std::string> names, int64_t* out) {
  flags_.push_back({std::move(names), true, [out](const std::string& v, std::string& err) {
                      if (!ParseInt64(v, out)) {
                        err = "expected an integer, got '" + v + "'";
                        return false;
                      }
                      return true;
                    }});
}

void FlagParser::OptionalInt(std::vector<std::string> names, std::optional<int64_t>* out) {
  flags_.push_back({std::move(names), true, [out](const std::string& v, std::string& err) {
                      int64_t x = 0;
                      if (!ParseInt64(v, &x)) {
                        err = "expected an integer, got '" + v + "'";
                        return false;
                      }
                      *out = x;
                      return true;
                    }});
}

void FlagParser::Bool(std::vector<std::string> names, bool* out) {
  flags_.push_back({std::move(names), false, [out](const std::string&, std::string&) {
                      *out = true;
                      return true;
                    }});
}

int FlagParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << usage_;
      return 0;
    }
    if (arg == "--version" && !version_.empty()) {
      std::cout << version_;
      return 0;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (positional_) {
        positional_->push_back(arg);
        continue;
      }
      return UsageError(
          (command_.empty() ? "" : command_ + ": ") + "unexpected argument '" + arg + "' (see " + Name() + " --help)",
          program_);
    }
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const Flag* flag = nullptr;
    for (const auto& f : flags_) {
      for (const auto& n : f.names) {
        if (n == arg) flag = &f;
      }
    }
    if (!flag) {
      return UsageError(
          (command_.empty() ? "" : command_ + ": ") + "unknown flag " + arg + " (see " + Name() + " --help)", program_);
    }
    std::string value;
    if (flag->takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return UsageError((command_.empty() ? "" : command_ + ": ") + arg + " needs a value", program_);
      }
    } else if (inline_value) {
      return UsageError((command_.empty() ? "" : command_ + ": ") + arg + " takes no value", program_);
    }
    std::string err;
    if (!flag->set(value, err))
      return UsageError((command_.empty() ? "" : command_ + ": ") + arg + ": " + err, program_);
  }
  return -1;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace meshload
