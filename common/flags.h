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

class FlagParser {
 public:
  /// `command` is the subcommand ("plan"), or empty for a program without
  /// subcommands; messages name `program` and `command`.
  FlagParser(std::string command, std::string usage, std::string program = "meshload")
      : command_(std::move(command)), usage_(std::move(usage)), program_(std::move(program)) {}

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
  };
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
