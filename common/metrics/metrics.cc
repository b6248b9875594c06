#include "common/metrics/metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

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

// A number in a message.
std::string Number(double v) {
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

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
      Die("histogram bucket bound [" + std::to_string(i) + "] is " + Number(bounds[i]) +
          ": bounds must be finite (the +Inf bucket is implicit)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      Die("histogram bucket bounds must be strictly increasing, got " + Number(bounds[i - 1]) + " then " +
          Number(bounds[i]) + " at [" + std::to_string(i) + "]");
    }
  }
  return bounds;
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

Histogram::Histogram(BucketBoundaries boundaries) : boundaries_(NormalizeBoundaries(std::move(boundaries))) {
  owned_ = std::make_unique<Library>(boundaries_);
  h_ = owned_.get();
}

void Histogram::Observe(double v) {
  // prometheus-cpp counts NaN in the first bucket; it belongs in +Inf only.
  if (std::isnan(v)) {
    ObserveMany(&v, 1);
    return;
  }
  h_->Observe(v);
}

size_t Histogram::BucketOf(double v) const {
  // The first bound >= v; `!(b >= v)` rather than `b < v` so that NaN, which
  // compares false with everything, falls through to the +Inf bucket.
  auto it = std::partition_point(boundaries_.begin(), boundaries_.end(), [v](double bound) { return !(bound >= v); });
  return static_cast<size_t>(it - boundaries_.begin());
}

void Histogram::ObserveMany(const double* values, size_t n) {
  if (n == 0) return;
  // prometheus-cpp's ObserveMultiple takes per-bucket (not cumulative)
  // increments, the +Inf bucket's last.
  std::vector<double> increments(boundaries_.size() + 1, 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    increments[BucketOf(values[i])] += 1.0;
    sum += values[i];
  }
  h_->ObserveMultiple(increments, sum);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  const prometheus::ClientMetric m = h_->Collect();
  std::vector<uint64_t> out;
  out.reserve(m.histogram.bucket.size());
  for (const auto& b : m.histogram.bucket) out.push_back(b.cumulative_count);
  return out;
}

uint64_t Histogram::Count() const { return h_->Collect().histogram.sample_count; }

double Histogram::Sum() const { return h_->Collect().histogram.sample_sum; }

BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die("ExponentialBuckets(" + Number(start) + ", " + Number(factor) + ", " + std::to_string(count) +
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
    Die("LinearBuckets(" + Number(start) + ", " + Number(width) + ", " + std::to_string(count) +
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
Family<T>::Family(Library& library, std::string name, std::string help, Labels constant_labels)
    : FamilyBase(T::kType, std::move(name), std::move(help), std::move(constant_labels)), library_(&library) {}

template <typename T>
void Family<T>::CheckLabels(const Labels& labels) const {
  for (const auto& [label, value] : labels) {
    CheckLabelName(name(), label);
    if (constant_labels().count(label)) {
      Die("label " + Quote(label) + " of metric " + Quote(name()) + " is already a constant label of the family");
    }
  }
}

template <typename T>
T& Family<T>::Add(const Labels& labels) requires(T::kType != MetricType::kHistogram) {
  MutexLock lock(mu_);
  auto it = series_.find(labels);
  if (it != series_.end()) return *it->second;
  CheckLabels(labels);
  // if constexpr as well as the constraint: clang before 15 instantiates a
  // constrained-out member in `template class Family<Histogram>`.
  if constexpr (T::kType != MetricType::kHistogram) {
    it = series_.emplace(labels, std::make_unique<T>(library_->Add(labels))).first;
  }
  return *it->second;
}

template <typename T>
T& Family<T>::Add(const Labels& labels,
                  const BucketBoundaries& boundaries) requires(T::kType == MetricType::kHistogram) {
  // The whole body under if constexpr, as above: clang before 15
  // instantiates it in `template class Family<Counter>` too.
  if constexpr (T::kType == MetricType::kHistogram) {
    BucketBoundaries normalized = NormalizeBoundaries(boundaries);
    MutexLock lock(mu_);
    auto it = series_.find(labels);
    if (it != series_.end()) {
      if (it->second->Boundaries() != normalized) {
        Die("histogram " + Quote(name()) + " already exists with other bucket bounds for these labels");
      }
      return *it->second;
    }
    CheckLabels(labels);
    auto& series = library_->Add(labels, normalized);
    it = series_.emplace(labels, std::make_unique<T>(series, std::move(normalized))).first;
    return *it->second;
  } else {
    std::abort();  // never called: the constraint allows histograms only
  }
}

template <typename T>
void Family<T>::ForEach(const std::function<void(const Labels&, const T&)>& fn) const {
  MutexLock lock(mu_);
  for (const auto& [labels, series] : series_) fn(labels, *series);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ---------------------------------------------------------------

Registry::Registry() : library_(std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}
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
  if (help.find_first_of("\\\n") != std::string::npos) {
    Die("the help text of metric " + Quote(name) +
        " holds a backslash or a newline, which prometheus-cpp's serializer writes unescaped");
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
  typename Family<T>::Library* library = nullptr;
  if constexpr (T::kType == MetricType::kCounter) {
    library = &prometheus::BuildCounter().Name(name).Help(help).Labels(constant_labels).Register(*library_);
  } else if constexpr (T::kType == MetricType::kGauge) {
    library = &prometheus::BuildGauge().Name(name).Help(help).Labels(constant_labels).Register(*library_);
  } else {
    library = &prometheus::BuildHistogram().Name(name).Help(help).Labels(constant_labels).Register(*library_);
  }
  auto* family = new Family<T>(*library, name, std::move(help), std::move(constant_labels));
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

  // prometheus-cpp collects families in registration order and series in
  // hash order: sorted here, so a scrape reads the same every time.
  std::vector<prometheus::MetricFamily> families = library_->Collect();
  families.erase(std::remove_if(families.begin(), families.end(),
                                [](const prometheus::MetricFamily& f) { return f.metric.empty(); }),
                 families.end());
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) { return a.name < b.name; });
  auto key = [](const prometheus::ClientMetric& m) {
    std::vector<std::pair<std::string, std::string>> k;
    for (const auto& l : m.label) k.emplace_back(l.name, l.value);
    std::sort(k.begin(), k.end());
    return k;
  };
  for (auto& f : families) {
    // Constant and series labels in one order, by name (the library puts
    // the constant ones first); a histogram's `le` comes last.
    for (auto& m : f.metric) {
      std::sort(m.label.begin(), m.label.end(),
                [](const prometheus::ClientMetric::Label& a, const prometheus::ClientMetric::Label& b) {
                  return a.name < b.name;
                });
    }
    std::stable_sort(
        f.metric.begin(), f.metric.end(),
        [&](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) { return key(a) < key(b); });
  }
  return prometheus::TextSerializer().Serialize(families);
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

}  // namespace meshload::metrics
