#include "planner/spec_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace meshload::planner {

std::string LineOf(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return {};
  return " (line " + std::to_string(m.line + 1) + ")";
}

std::string NodeKind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "something else";
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Suggest(std::string_view got, const std::vector<std::string_view>& options) {
  std::string_view best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (auto o : options) {
    size_t d = EditDistance(got, o);
    if (d < best_d) best_d = d, best = o;
  }
  if (best_d <= std::max<size_t>(2, got.size() / 3)) return " (did you mean " + std::string(best) + "?)";
  return {};
}

namespace {

std::string Join(const std::vector<std::string_view>& options) {
  std::string s;
  for (auto o : options) {
    if (!s.empty()) s += ", ";
    s += o;
  }
  return s;
}

}  // namespace

void AddOnce(Diagnostics& d, const std::string& path, std::string msg) {
  for (const auto& p : d.problems()) {
    if (p.path == path) return;
    if (path.size() > p.path.size() && path.compare(0, p.path.size(), p.path) == 0 &&
        (path[p.path.size()] == '.' || path[p.path.size()] == '[')) {
      return;
    }
  }
  d.Add(path, std::move(msg));
}

bool SpecReader::Map(const YAML::Node& n, const std::string& path, const std::vector<std::string_view>& known) {
  if (!n.IsMap()) {
    d_.Add(path.empty() ? "(document)" : path, "expected a mapping, got " + NodeKind(n) + LineOf(n));
    return false;
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      d_.Add(path.empty() ? key : path + "." + key,
             "unknown field" + Suggest(key, known) + "; known fields: " + Join(known) + LineOf(kv.first));
    }
  }
  return true;
}

bool SpecReader::List(const YAML::Node& n, const std::string& path, const std::string& what) {
  if (n.IsSequence()) return true;
  d_.Add(path, "expected " + what + ", got " + NodeKind(n) + LineOf(n));
  return false;
}

std::optional<int64_t> SpecReader::Int(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar() || n.Tag() == "!") {  // "!" marks a quoted scalar: a string
    d_.Add(path, "expected an integer, got " + NodeKind(n) + (n.Tag() == "!" ? " (a quoted string)" : "") + LineOf(n));
    return std::nullopt;
  }
  const std::string& s = n.Scalar();
  // Hand parse: yaml-cpp accepts floats and octal-ish forms we do not want.
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  if (i == s.size()) {
    d_.Add(path, "expected an integer, got '" + s + "'" + LineOf(n));
    return std::nullopt;
  }
  uint64_t v = 0;
  bool digits = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && digits) continue;  // YAML 1.1 digit separators: 1_000
    digits = true;
    if (s[i] < '0' || s[i] > '9') {
      d_.Add(path, "expected an integer, got '" + s + "'" + LineOf(n));
      return std::nullopt;
    }
    uint64_t digit = static_cast<uint64_t>(s[i] - '0');
    if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
      d_.Add(path, "integer '" + s + "' is out of range (max 9223372036854775807)" + LineOf(n));
      return std::nullopt;
    }
    v = v * 10 + digit;
  }
  return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

std::optional<double> SpecReader::Number(const YAML::Node& n, const std::string& path) {
  double v = 0;
  if (!n.IsScalar() || n.Tag() == "!" || !YAML::convert<double>::decode(n, v)) {
    d_.Add(path, "expected a number, got " + NodeKind(n) + (n.Tag() == "!" ? " (a quoted string)" : "") + LineOf(n));
    return std::nullopt;
  }
  if (!std::isfinite(v)) {
    // YAML's .nan and .inf: no bound or proportion means anything with them.
    d_.Add(path, "must be a finite number, got " + n.Scalar() + LineOf(n));
    return std::nullopt;
  }
  return v;
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  // to_chars writes exponents with two digits at least ("1e-07").
  if (size_t e = s.find('e'); e != std::string::npos) {
    size_t digits = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+' ? 1 : 0);
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
    if (s[e + 1] == '+') s.erase(e + 1, 1);
  }
  return s;
}

std::optional<bool> SpecReader::Bool(const YAML::Node& n, const std::string& path) {
  if (n.IsScalar() && n.Tag() != "!") {
    if (n.Scalar() == "true") return true;
    if (n.Scalar() == "false") return false;
  }
  d_.Add(path, "expected true or false, got " + NodeKind(n) + (n.Tag() == "!" ? " (a quoted string)" : "") + LineOf(n));
  return std::nullopt;
}

std::optional<std::string> SpecReader::Str(const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) {
    d_.Add(path, "expected a string, got " + NodeKind(n) + LineOf(n));
    return std::nullopt;
  }
  return n.Scalar();
}

std::vector<std::string> SpecReader::StrList(const YAML::Node& n, const std::string& path) {
  std::vector<std::string> out;
  if (!List(n, path, "a list of strings")) return out;
  for (size_t i = 0; i < n.size(); ++i) {
    if (auto s = Str(n[i], path + "[" + std::to_string(i) + "]")) out.push_back(*s);
  }
  return out;
}

std::vector<int64_t> SpecReader::IntList(const YAML::Node& n, const std::string& path) {
  std::vector<int64_t> out;
  if (!List(n, path, "a list of integers")) return out;
  for (size_t i = 0; i < n.size(); ++i) {
    if (auto v = Int(n[i], path + "[" + std::to_string(i) + "]")) out.push_back(*v);
  }
  return out;
}

std::map<std::string, std::string> SpecReader::StrMap(const YAML::Node& n, const std::string& path,
                                                      const std::string& what) {
  std::map<std::string, std::string> out;
  if (!n.IsMap()) {
    d_.Add(path, "expected " + what + ", got " + NodeKind(n) + LineOf(n));
    return out;
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    if (auto v = Str(kv.second, path + "." + key)) out[key] = *v;
  }
  return out;
}

void SpecReader::UnknownValue(const YAML::Node& n, const std::string& path, const std::string& got,
                              const std::vector<std::string_view>& names) {
  std::string suggestion;
  size_t best = std::numeric_limits<size_t>::max();
  for (const auto& name : names) {
    size_t dist = EditDistance(got, name);
    if (dist < best) best = dist, suggestion = std::string(name);
  }
  std::string hint = best <= 2 ? " (did you mean " + suggestion + "?)" : "";
  d_.Add(path, "unknown value '" + got + "'" + hint + "; expected one of " + Join(names) + LineOf(n));
}

}  // namespace meshload::planner
