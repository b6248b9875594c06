/// \file
/// Diagnostics: a list of problems found in one pass over some input, so a
/// user sees every mistake in a spec at once instead of one per run.
///
/// Each problem names where it is (`spec.mesh.axes[1].size`) and what is
/// wrong and what would be right (`must be >= 1, got 0`).
///
/// Thread safety: not thread-safe; one collector per validation pass.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace meshload {

struct Problem {
  std::string path;     // where: a field path, a file, or file@offset
  std::string message;  // what is wrong and what would be right
  std::string ToString() const { return path.empty() ? message : path + ": " + message; }
};

class Diagnostics {
 public:
  void Add(std::string path, std::string message) { problems_.push_back({std::move(path), std::move(message)}); }
  /// Records a non-OK status as a problem (its location becomes the path).
  void Add(const Status& status) {
    if (!status.ok()) problems_.push_back({status.location(), status.message()});
  }
  void Append(const Diagnostics& other) {
    problems_.insert(problems_.end(), other.problems_.begin(), other.problems_.end());
  }

  bool ok() const { return problems_.empty(); }
  const std::vector<Problem>& problems() const { return problems_; }

  /// "1 problem", "2 problems": how messages count them.
  static std::string Count(size_t n) { return std::to_string(n) + (n == 1 ? " problem" : " problems"); }

  /// `<what> (N problems):` and then each problem on an indented line: how
  /// the tools report an invalid input, e.g.
  ///   job.yaml: invalid DataLoadJob (1 problem):
  ///     spec.batch.globalBatchSize: must be >= 1, got 0
  std::string Report(const std::string& what) const {
    std::string out = what + " (" + Count(problems_.size()) + "):\n";
    for (const auto& p : problems_) out += "  " + p.ToString() + "\n";
    return out;
  }

  /// One line per problem.
  std::string ToString() const {
    std::string out;
    for (const auto& p : problems_) {
      out += p.ToString();
      out += '\n';
    }
    return out;
  }
  /// OK when there are no problems; otherwise kInvalidArgument whose message
  /// lists every problem (the first one's path is the status location).
  Status ToStatus() const {
    if (problems_.empty()) return Status::Ok();
    if (problems_.size() == 1) return InvalidArgument(problems_[0].message, problems_[0].path);
    std::string msg = Count(problems_.size()) + ":";
    for (const auto& p : problems_) msg += "\n  " + p.ToString();
    return InvalidArgument(std::move(msg));
  }

 private:
  std::vector<Problem> problems_;
};

}  // namespace meshload
