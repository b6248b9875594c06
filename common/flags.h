/// \file
/// A small command-line flag parser for the meshload tools: `--name value`,
/// `--name=value`, short aliases, `--help` and `--version`. Unknown flags and missing
/// values are usage errors (exit code 2) that name the flag.
///
/// Thread safety: not thread-safe; used once per command on the main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace meshload {

/// Prints `<program>: <message>` to stderr and returns 2.
int UsageError(const std::string& message, const std::string& program = "meshload");

/// A flag declared once: what it is called, what --help says of it, and the
/// environment variable that gives its value when the flag is not on the
/// command line. The programs' --help is generated from these.
struct FlagSpec {
  std::vector<std::string> names = {};  // "--job" (and short aliases)
  std::string value = {};               // the value's name in --help ("PATH"); empty for a switch
  std::string help = {};                // what it does; '\n' starts a new line in --help
  std::string env = {};                 // e.g. "MESHLOAD_JOB"; empty: none
};

class FlagParser {
 public:
  /// `command` is the subcommand ("plan"), or empty for a program without
  /// subcommands; messages name `program` and `command`. `usage` is the
  /// --help text; for a parser of FlagSpecs it is the text before the
  /// generated list of options (the usage line and what the program does).
  FlagParser(std::string command, std::string usage, std::string program = "meshload")
      : command_(std::move(command)), usage_(std::move(usage)), program_(std::move(program)) {}

  /// Declared flags (FlagSpec): the value goes through `set`, which says
  /// what is wrong with it (the error names the flag, whether the value came
  /// from the command line or the environment).
  void Add(FlagSpec spec, std::function<bool(const std::string& value, std::string& error)> set);
  void Text(FlagSpec spec, std::string* out);
  /// An integer from `min` to `max` ("expected an integer from MIN to MAX").
  template <typename T>
  void Integer(FlagSpec spec, T* out, int64_t min, int64_t max) {
    Add(std::move(spec), [out, min, max](const std::string& v, std::string& err) {
      int64_t x = 0;
      if (!ParseIntIn(v, min, max, &x, err)) return false;
      *out = static_cast<T>(x);
      return true;
    });
  }
  /// A heading in the generated --help, before the flags added after it.
  void Section(std::string heading);
  /// The generated --help: `usage`, then each section and its flags, the
  /// value's name and the help aligned, the environment variable after it.
  std::string Usage() const;

  /// An integer from `min` to `max`, or false and `err` saying what was wanted.
  static bool ParseIntIn(const std::string& text, int64_t min, int64_t max, int64_t* out, std::string& err);

  void String(std::vector<std::string> names, std::string* out);
  void OptionalString(std::vector<std::string> names, std::optional<std::string>* out);
  void Int(std::vector<std::string> names, int64_t* out);
  void OptionalInt(std::vector<std::string> names, std::optional<int64_t>* out);
  void Bool(std::vector<std::string> names, bool* out);
  /// `--version` prints `text` and ends parsing like `--help`; without it
  /// `--version` is an unknown flag.
  void Version(std::string text) { version_ = std::move(text); }
  /// Positional arguments go here; without it they are errors.
  void Positional(std::vector<std::string>* out) { positional_ = out; }

  /// Returns -1 to go on, 0 after printing --help or --version, or 2 after a
  /// usage error.
  int Parse(const std::vector<std::string>& args);

 private:
  struct Flag {
    std::vector<std::string> names;
    bool takes_value = true;
    std::function<bool(const std::string&, std::string&)> set;  // false + error on bad value
    std::optional<FlagSpec> spec = std::nullopt;                // declared flags: help and environment
  };
  // The generated --help's lines: a heading ("" before the first), or a flag.
  struct HelpLine {
    std::string heading;
    size_t flag = 0;
    bool is_heading = false;
  };
  std::vector<HelpLine> help_lines_;
  std::string Name() const { return command_.empty() ? program_ : program_ + " " + command_; }
  std::string command_;
  std::string usage_;
  std::string program_;
  std::string version_;
  std::vector<Flag> flags_;
  std::vector<std::string>* positional_ = nullptr;
};

/// The value of environment variable `name`, or "" when it is unset.
std::string Env(const char* name);

/// Parses a whole decimal integer (optionally signed); false when it is not one.
bool ParseInt64(const std::string& text, int64_t* out);

}  // namespace meshload
