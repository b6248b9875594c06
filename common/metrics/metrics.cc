#include "common/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace meshload::metrics {
namespace {

// Registration mistakes are bugs in the calling code, found the first time it
// runs; aborting with the reason is louder than a Status nobody checks.
[[noreturn]] void Die(const std::string& message) {
  std::string line = "meshload metrics: " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  std::abort();
}

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool MatchesLabelCharset(std::string_view name) {
  if (name.empty() || !(IsAsciiLetter(name[0]) || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsAsciiLetter(c) || IsDigit(c) || c == '_'; });
}

void CheckLabelName(std::string_view metric, std::string_view label) {
  std::string where = "label " + Quote(label) + " of metric " + Quote(metric);
  if (!MatchesLabelCharset(label)) Die("invalid " + where + ": must match [a-zA-Z_][a-zA-Z0-9_]*");
  if (label.substr(0, 2) == "__") {
    Die("invalid " + where + ": names starting with \"__\" are reserved for Prometheus");
  }
  if (label == "le" || label == "quantile") {
    Die("invalid " + where + ": \"le\" and \"quantile\" are reserved for histogram and summary samples");
  }
}

// Rounds to 15 significant digits, the most a double always round-trips, so
// that computed bucket bounds print as the decimals a person would write.
double RoundForDisplay(double v) {
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 15).ptr;
  double out = v;
  std::from_chars(buf, end, out);
  return out;
}

// Validates bucket bounds and drops a trailing +Inf (that bucket always exists).
BucketBoundaries NormalizeBoundaries(BucketBoundaries bounds) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      Die("histogram bucket bound [" + std::to_string(i) + "] is " + FormatValue(bounds[i]) +
          ": bounds must be finite (the +Inf bucket is implicit)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      Die("histogram bucket bounds must be strictly increasing, got " + FormatValue(bounds[i - 1]) + " then " +
          FormatValue(bounds[i]) + " at [" + std::to_string(i) + "]");
    }
  }
  return bounds;
}

std::string RenderLabels(const Labels& constant, const Labels& series) {
  Labels merged = constant;
  merged.insert(series.begin(), series.end());
  std::string out;
  for (const auto& [name, value] : merged) {
    if (!out.empty()) out += ',';
    out += name;
    out += "=\"";
    out += EscapeLabelValue(value);
    out += '"';
  }
  return out;
}

void AppendSample(std::string* out, std::string_view name, std::string_view suffix, std::string_view labels,
                  std::string_view value) {
  *out += name;
  *out += suffix;
  if (!labels.empty()) {
    *out += '{';
    *out += labels;
    *out += '}';
  }
  *out += ' ';
  *out += value;
  *out += '\n';
}

}  // namespace

std::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

// ---- values -----------------------------------------------------------------

void Gauge::SetToCurrentTime() {
  auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  Set(std::chrono::duration<double>(since_epoch).count());
}

Histogram::Histogram(BucketBoundaries boundaries)
    : boundaries_(NormalizeBoundaries(std::move(boundaries))),
      counts_(new std::atomic<uint64_t>[boundaries_.size() + 1]) {
  for (size_t i = 0; i <= boundaries_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

size_t Histogram::BucketOf(double v) const {
  // The first bound >= v; `!(b >= v)` rather than `b < v` so that NaN, which
  // compares false with everything, falls through to the +Inf bucket.
  auto it = std::partition_point(boundaries_.begin(), boundaries_.end(), [v](double bound) { return !(bound >= v); });
  return static_cast<size_t>(it - boundaries_.begin());
}

void Histogram::Observe(double v) {
  counts_[BucketOf(v)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void Histogram::ObserveMany(const double* values, size_t n) {
  if (n == 0) return;
  double sum = 0.0;
  size_t bucket = BucketOf(values[0]);
  uint64_t run = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t b = BucketOf(values[i]);
    if (b != bucket) {
      counts_[bucket].fetch_add(run, std::memory_order_relaxed);
      bucket = b;
      run = 0;
    }
    ++run;
    sum += values[i];
  }
  counts_[bucket].fetch_add(run, std::memory_order_relaxed);
  sum_.fetch_add(sum, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(boundaries_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

uint64_t Histogram::Count() const { return CumulativeCounts().back(); }

BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die("ExponentialBuckets(" + FormatValue(start) + ", " + FormatValue(factor) + ", " + std::to_string(count) +
        "): needs start > 0, factor > 1 and count >= 1");
  }
  BucketBoundaries out;
  out.reserve(static_cast<size_t>(count));
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(RoundForDisplay(bound));
  return out;
}

BucketBoundaries LinearBuckets(double start, double width, int count) {
  if (!std::isfinite(start) || !(width > 0) || count < 1) {
    Die("LinearBuckets(" + FormatValue(start) + ", " + FormatValue(width) + ", " + std::to_string(count) +
        "): needs a finite start, width > 0 and count >= 1");
  }
  BucketBoundaries out;
  out.reserve(static_cast<size_t>(count));
  // start + i·width rather than repeated addition, so errors do not accumulate.
  for (int i = 0; i < count; ++i) out.push_back(RoundForDisplay(start + i * width));
  return out;
}

// ---- families ---------------------------------------------------------------

FamilyBase::FamilyBase(MetricType type, std::string name, std::string help, Labels constant_labels)
    : type_(type), name_(std::move(name)), help_(std::move(help)), constant_labels_(std::move(constant_labels)) {}

template <typename T>
Family<T>::Family(std::string name, std::string help, Labels constant_labels)
    : FamilyBase(T::kType, std::move(name), std::move(help), std::move(constant_labels)) {}

template <typename T>
typename Family<T>::Series& Family<T>::FindOrInsertLocked(const Labels& labels) {
  auto it = series_.find(labels);
  if (it != series_.end()) return it->second;
  for (const auto& [label, value] : labels) {
    CheckLabelName(name(), label);
    if (constant_labels().count(label)) {
      Die("label " + Quote(label) + " of metric " + Quote(name()) + " is already a constant label of the family");
    }
  }
  Series series{RenderLabels(constant_labels(), labels), nullptr};
  return series_.emplace(labels, std::move(series)).first->second;
}

template <typename T>
T& Family<T>::Add(const Labels& labels) requires(T::kType != MetricType::kHistogram) {
  MutexLock lock(mu_);
  Series& series = FindOrInsertLocked(labels);
  // if constexpr as well as the constraint: clang before 15 instantiates a
  // constrained-out member in `template class Family<Histogram>`.
  if constexpr (T::kType != MetricType::kHistogram) {
    if (!series.metric) series.metric = std::make_unique<T>();
  }
  return *series.metric;
}

template <typename T>
T& Family<T>::Add(const Labels& labels,
                  const BucketBoundaries& boundaries) requires(T::kType == MetricType::kHistogram) {
  BucketBoundaries normalized = NormalizeBoundaries(boundaries);
  MutexLock lock(mu_);
  Series& series = FindOrInsertLocked(labels);
  if constexpr (T::kType == MetricType::kHistogram) {  // as above
    if (!series.metric) {
      series.metric = std::make_unique<T>(std::move(normalized));
    } else if (series.metric->Boundaries() != normalized) {
      Die("histogram " + Quote(name()) + "{" + series.label_text + "} already exists with other bucket bounds");
    }
  }
  return *series.metric;
}

template <typename T>
void Family<T>::ForEach(const std::function<void(const Labels&, const T&)>& fn) const {
  MutexLock lock(mu_);
  for (const auto& [labels, series] : series_) fn(labels, *series.metric);
}

template <typename T>
bool Family<T>::AppendSamples(std::string* out) const {
  MutexLock lock(mu_);
  if (series_.empty()) return false;
  for (const auto& [labels, series] : series_) {
    const T& metric = *series.metric;
    if constexpr (T::kType == MetricType::kHistogram) {
      std::vector<uint64_t> cumulative = metric.CumulativeCounts();
      const BucketBoundaries& bounds = metric.Boundaries();
      std::string prefix = series.label_text.empty() ? "" : series.label_text + ",";
      for (size_t i = 0; i < cumulative.size(); ++i) {
        std::string le = i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
        AppendSample(out, name(), "_bucket", prefix + "le=\"" + le + "\"", std::to_string(cumulative[i]));
      }
      AppendSample(out, name(), "_sum", series.label_text, FormatValue(metric.Sum()));
      // From the buckets, not a separate atomic, so that _count always equals
      // the +Inf bucket even while observations race with the scrape.
      AppendSample(out, name(), "_count", series.label_text, std::to_string(cumulative.back()));
    } else {
      AppendSample(out, name(), "", series.label_text, FormatValue(metric.Value()));
    }
  }
  return true;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ---------------------------------------------------------------

Registry::Registry() = default;
Registry::~Registry() = default;

template <typename T>
Family<T>& Registry::Register(std::string name, std::string help, Labels constant_labels) {
  const std::string_view type_name = MetricTypeName(T::kType);
  if (!IsValidMetricName(name)) {
    Die("invalid metric name " + Quote(name) + ": must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  if (T::kType == MetricType::kCounter && !EndsWith(name, "_total")) {
    Die("counter " + Quote(name) + " must end in \"_total\" (Prometheus naming convention)");
  }
  if (T::kType != MetricType::kCounter) {
    for (std::string_view suffix : {"_total", "_bucket", "_sum", "_count"}) {
      if (EndsWith(name, suffix)) {
        Die(std::string(type_name) + " " + Quote(name) + " must not end in " + Quote(suffix) +
            ": the suffix is reserved for counters and histogram samples");
      }
    }
  }
  if (help.empty()) {
    Die("metric " + Quote(name) + " has no help text; set Help() (promtool rejects families without it)");
  }
  for (const auto& [label, value] : constant_labels) CheckLabelName(name, label);

  MutexLock lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    FamilyBase& existing = *it->second;
    if (existing.type() != T::kType) {
      Die("metric " + Quote(name) + " is already registered as a " + std::string(MetricTypeName(existing.type())) +
          "; cannot register it as a " + std::string(type_name));
    }
    if (existing.help() != help || existing.constant_labels() != constant_labels) {
      Die("metric " + Quote(name) + " is already registered with another help text or other constant labels");
    }
    return static_cast<Family<T>&>(existing);
  }
  auto* family = new Family<T>(name, std::move(help), std::move(constant_labels));
  families_.emplace(std::move(name), std::unique_ptr<FamilyBase>(family));
  return *family;
}

template Family<Counter>& Registry::Register<Counter>(std::string, std::string, Labels);
template Family<Gauge>& Registry::Register<Gauge>(std::string, std::string, Labels);
template Family<Histogram>& Registry::Register<Histogram>(std::string, std::string, Labels);

void Registry::AddCollectHook(std::function<void()> hook) {
  MutexLock lock(hooks_mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Serialize() const {
  MutexLock collect(collect_mu_);
  // Run copies outside hooks_mu_ so that a hook may itself register families
  // or series without deadlocking.
  std::vector<std::function<void()>> hooks;
  {
    MutexLock lock(hooks_mu_);
    hooks = hooks_;
  }
  for (const auto& hook : hooks) {
    if (hook) hook();
  }

  std::string out;
  std::string samples;
  MutexLock lock(mu_);
  for (const auto& [name, family] : families_) {
    samples.clear();
    if (!family->AppendSamples(&samples)) continue;
    out += "# HELP ";
    out += name;
    out += ' ';
    out += EscapeHelp(family->help());
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += MetricTypeName(family->type());
    out += '\n';
    out += samples;
  }
  return out;
}

Gauge& RegisterBuildInfo(Registry& registry, std::string_view version, std::string_view component) {
  auto& family = BuildGauge()
                     .Name("meshload_build_info")
                     .Help("Version of the running meshload component; the value is always 1.")
                     .Register(registry);
  Gauge& gauge = family.Add({{"component", std::string(component)}, {"version", std::string(version)}});
  gauge.Set(1);
  return gauge;
}

// ---- text format ------------------------------------------------------------

bool IsValidMetricName(std::string_view name) {
  if (name.empty() || !(IsAsciiLetter(name[0]) || name[0] == '_' || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return IsAsciiLetter(c) || IsDigit(c) || c == '_' || c == ':'; });
}

bool IsValidLabelName(std::string_view name) {
  return MatchesLabelCharset(name) && name.substr(0, 2) != "__" && name != "le" && name != "quantile";
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values below 2^63 print as integers: every such double is an
  // exact integer, and `1048576` reads better than the shortest form `1.048576e+06`.
  if (v == std::trunc(v) && std::fabs(v) < 9.2e18) {
    return std::to_string(static_cast<int64_t>(v));
  }
  // Shortest round-trip digits, in fixed notation unless the exponent is below
  // -4 (Go's strconv 'g' rule, so `le` labels match client_golang's: `0.0005`,
  // not `5e-04`, and PromQL selectors on `le` work across both) or 21 and up
  // (only integers past 2^63 get there; fixed would be a wall of zeros).
  char buf[64];
  char* end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr;
  const char* e = std::find(buf, end, 'e');
  int exponent = 0;
  std::from_chars(e + 1 + (e[1] == '+'), end, exponent);
  if (exponent >= -4 && exponent < 21) {
    end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed).ptr;
  }
  return std::string(buf, end);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace meshload::metrics
