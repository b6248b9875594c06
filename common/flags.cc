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

bool FlagParser::ParseIntIn(const std::string& text, int64_t min, int64_t max, int64_t* out, std::string& err) {
  if (!ParseInt64(text, out) || *out < min || *out > max) {
    err = "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got '" + text + "'";
    return false;
  }
  return true;
}

void FlagParser::Add(FlagSpec spec, std::function<bool(const std::string&, std::string&)> set) {
  Flag f{spec.names, !spec.value.empty(), std::move(set), spec};
  help_lines_.push_back({"", flags_.size(), false});
  flags_.push_back(std::move(f));
}

void FlagParser::Text(FlagSpec spec, std::string* out) {
  Add(std::move(spec), [out](const std::string& v, std::string&) {
    *out = v;
    return true;
  });
}

void FlagParser::Section(std::string heading) { help_lines_.push_back({std::move(heading), 0, true}); }

std::string FlagParser::Usage() const {
  if (help_lines_.empty()) return usage_;
  // The flag and its value in a column of this width, the help after it
  // (on the next line when the flag is wider), the variable at the end.
  constexpr size_t kColumn = 34;
  std::string out = usage_;
  for (const HelpLine& line : help_lines_) {
    if (line.is_heading) {
      out += "\n" + line.heading + "\n";
      continue;
    }
    const FlagSpec& spec = *flags_[line.flag].spec;
    std::string left = "  ";
    for (size_t i = 0; i < spec.names.size(); ++i) left += (i ? ", " : "") + spec.names[i];
    if (!spec.value.empty()) left += " " + spec.value;
    std::vector<std::string> lines;
    for (size_t at = 0; at <= spec.help.size();) {
      size_t nl = spec.help.find('\n', at);
      if (nl == std::string::npos) nl = spec.help.size();
      lines.push_back(spec.help.substr(at, nl - at));
      at = nl + 1;
    }
    if (!spec.env.empty()) {
      // The variable at the end of the help, or on a line of its own when
      // it would run past 100 columns.
      const std::string env = "[$" + spec.env + "]";
      if (kColumn + lines.back().size() + 1 + env.size() > 100) {
        lines.push_back(env);
      } else {
        lines.back() += (lines.back().empty() ? "" : " ") + env;
      }
    }
    if (left.size() + 1 > kColumn) {
      out += left + "\n";
      left.clear();
    }
    for (const std::string& l : lines) {
      left.resize(kColumn, ' ');
      out += left + l + "\n";
      left.clear();
    }
  }
  if (!version_.empty()) {
    std::string left = "  --version";
    left.resize(kColumn, ' ');
    out += left + "print the version\n";
  }
  return out;
}

int FlagParser::Parse(const std::vector<std::string>& args) {
  // Declared flags take their environment variable's value first; the
  // command line wins over it.
  for (const Flag& f : flags_) {
    if (!f.spec || f.spec->env.empty()) continue;
    const std::string value = Env(f.spec->env.c_str());
    if (value.empty()) continue;
    std::string err;
    if (!f.set(value, err)) {
      return UsageError(
          (command_.empty() ? "" : command_ + ": ") + f.names.front() + " (from $" + f.spec->env + "): " + err,
          program_);
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << Usage();
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
