/// \file
/// Prometheus metrics with prometheus-cpp's core library (its registry,
/// families, counters, gauges, histograms and text serializer), behind the
/// calls meshload's components make:
///
///   Registry registry;
///   auto& bytes = BuildCounter()
///                     .Name("meshload_bytes_read_total")
///                     .Help("Bytes read from storage.")
///                     .Register(registry);
///   Counter& file_bytes = bytes.Add({{"source", "file"}});
///   file_bytes.Increment(4096);               // from any thread
///   std::string text = registry.Serialize();  // what GET /metrics returns
///
/// What this layer adds to prometheus-cpp:
/// - Families and series live as long as the Registry; the references that
///   Register() and Add() return stay valid until it is destroyed, so hot paths
///   look a series up once and then only update it.
/// - Mistakes in names are programming errors, found the first time the code
///   runs, so they abort with a message on stderr instead of the library's
///   exception. Register() aborts when
///     * a metric name does not match `[a-zA-Z_:][a-zA-Z0-9_:]*`;
///     * a counter's name does not end in `_total`, or a gauge's or
///       histogram's name ends in `_total`, `_bucket`, `_sum` or `_count`
///       (Prometheus conventions, which `promtool check metrics` enforces);
///     * the help text is empty (promtool flags it), or holds a backslash or
///       a newline (prometheus-cpp 1.0 writes HELP lines unescaped);
///     * a name is registered again with a different type, help text or
///       constant labels (registering it again with the same ones returns the
///       existing family, so two components may share a family).
///   Register() and Add() abort when a label name does not match
///   `[a-zA-Z_][a-zA-Z0-9_]*`, starts with `__`, is `le` or `quantile`, or
///   repeats a constant label of the family. Label *values* may be any text.
/// - A counter ignores a negative or NaN increment (prometheus-cpp ignores
///   only negative ones); a histogram's trailing `+Inf` bound is dropped (the
///   `+Inf` bucket always exists).
/// - Serialize() runs the collect hooks, then prometheus-cpp's TextSerializer
///   (text exposition 0.0.4) over the families sorted by name and the series
///   by label set (labels in a series by name, a histogram's `le` last),
///   leaving out families without series. Numbers are the library's: up to
///   16 significant digits without trailing zeros (`1048576`, `0.0005`,
///   `1.5e-07`, `0.1 + 0.2` as `0.3`), `+Inf`, `-Inf` and `Nan`; a histogram's
///   `_count` and `_sum` come before its buckets.
///
/// Thread safety: every class here is thread-safe except the builders, which
/// are values used by one thread. Counter and Gauge updates are atomic;
/// prometheus-cpp's Histogram::Observe takes the series' mutex.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace meshload::metrics {

/// Label name -> value. A std::map, so a label set has one canonical order.
using Labels = std::map<std::string, std::string>;

/// Upper bounds of a histogram's buckets, strictly increasing; the `+Inf`
/// bucket is implicit.
using BucketBoundaries = std::vector<double>;

enum class MetricType { kCounter, kGauge, kHistogram };

/// "counter", "gauge" or "histogram", as in a `# TYPE` line.
std::string_view MetricTypeName(MetricType type);

/// A value that only goes up: bytes read, samples served, errors
/// (prometheus::Counter).
///
/// Thread safety: thread-safe.
class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;
  using Library = prometheus::Counter;
  /// A counter of its own (no registry: tests, local tallies).
  Counter() : owned_(std::make_unique<Library>()), c_(owned_.get()) {}
  /// A handle on a series of a registry's family.
  explicit Counter(Library& counter) : c_(&counter) {}

  /// Adds `v`. A negative or NaN `v` is ignored — not applied, logged or
  /// counted anywhere — because a counter that goes down reads as a process
  /// restart to Prometheus' rate(); callers must not rely on it to report bugs.
  void Increment(double v = 1.0) {
    if (!(v >= 0.0)) return;
    c_->Increment(v);
  }
  double Value() const { return c_->Value(); }

 private:
  std::unique_ptr<Library> owned_;
  Library* c_;
};

/// A value that goes up and down: the current step, slots leased
/// (prometheus::Gauge).
///
/// Thread safety: thread-safe.
class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;
  using Library = prometheus::Gauge;
  /// A gauge of its own (no registry).
  Gauge() : owned_(std::make_unique<Library>()), g_(owned_.get()) {}
  /// A handle on a series of a registry's family.
  explicit Gauge(Library& gauge) : g_(&gauge) {}

  void Set(double v) { g_->Set(v); }
  void Increment(double v = 1.0) { g_->Increment(v); }
  void Decrement(double v = 1.0) { g_->Decrement(v); }
  /// Sets the gauge to the Unix time in seconds (with a fractional part), for
  /// "last time X happened" gauges.
  void SetToCurrentTime();
  double Value() const { return g_->Value(); }

 private:
  std::unique_ptr<Library> owned_;
  Library* g_;
};

/// A distribution of observations (latencies, sizes) in cumulative buckets
/// (prometheus::Histogram).
///
/// Thread safety: thread-safe; each update takes the series' mutex, so the
/// count always equals the `+Inf` bucket.
class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;
  using Library = prometheus::Histogram;
  /// A histogram of its own (no registry). Aborts unless `boundaries` are
  /// strictly increasing and finite; a trailing `+Inf` is dropped since the
  /// `+Inf` bucket always exists.
  explicit Histogram(BucketBoundaries boundaries);
  /// A handle on a series of a registry's family, whose bounds (normalized
  /// as above) are `boundaries`.
  Histogram(Library& histogram, BucketBoundaries boundaries) : h_(&histogram), boundaries_(std::move(boundaries)) {}

  /// Counts `v` in the first bucket whose bound is >= v (`le` is inclusive)
  /// and adds it to the sum. NaN lands in the `+Inf` bucket only and makes the
  /// sum NaN.
  void Observe(double v);
  /// Observe() for each of `values` with one update of the series (its
  /// mutex taken once): a reader thread reporting a batch of reads touches
  /// the shared series once, not per read.
  void ObserveMany(const double* values, size_t n);

  const BucketBoundaries& Boundaries() const { return boundaries_; }
  /// Cumulative counts, one per boundary and a last one for `+Inf`.
  std::vector<uint64_t> CumulativeCounts() const;
  uint64_t Count() const;
  double Sum() const;

 private:
  size_t BucketOf(double v) const;

  std::unique_ptr<Library> owned_;
  Library* h_;
  BucketBoundaries boundaries_;
};

/// `count` bounds: start, start·factor, start·factor², …. Aborts unless
/// start > 0, factor > 1 and count >= 1. Bounds are rounded to 15 significant
/// digits so that they print cleanly as `le` values.
BucketBoundaries ExponentialBuckets(double start, double factor, int count);
/// `count` bounds: start, start + width, …. Aborts unless width > 0 and
/// count >= 1. Rounded like ExponentialBuckets, so LinearBuckets(0.1, 0.1, 3)
/// is {0.1, 0.2, 0.3}, not {…, 0.30000000000000004}.
BucketBoundaries LinearBuckets(double start, double width, int count);

class Registry;

/// The part of a family that does not depend on the metric type: what
/// registering the name again must match.
///
/// Thread safety: immutable after construction.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const Labels& constant_labels() const { return constant_labels_; }

 protected:
  FamilyBase(MetricType type, std::string name, std::string help, Labels constant_labels);

 private:
  MetricType type_;
  std::string name_;
  std::string help_;
  Labels constant_labels_;
};

/// All series of one metric name, e.g. meshload_bytes_read_total for every
/// `source`: a prometheus::Family, with the handles its series were given.
/// Created by a builder's Register().
///
/// Thread safety: thread-safe; Add() takes the family's mutex, so call it once
/// per series and keep the reference rather than calling it per event.
template <typename T>
class Family final : public FamilyBase {
 public:
  using Library = prometheus::Family<typename T::Library>;

  /// The series with these labels, created (at zero) on first use. The same
  /// labels always return the same object. Aborts on an invalid label name
  /// (see the file comment).
  T& Add(const Labels& labels) requires(T::kType != MetricType::kHistogram) MESHLOAD_EXCLUDES(mu_);

  /// The histogram series with these labels and bucket bounds. Aborts on an
  /// invalid label name or bounds, and when the series exists with other
  /// bounds (one series cannot have two bucket layouts).
  T& Add(const Labels& labels, const BucketBoundaries& boundaries) requires(T::kType == MetricType::kHistogram)
      MESHLOAD_EXCLUDES(mu_);

  /// Calls `fn` for each series, in label order, under the family's lock:
  /// `fn` must not add series to this family.
  void ForEach(const std::function<void(const Labels&, const T&)>& fn) const MESHLOAD_EXCLUDES(mu_);

 private:
  friend class Registry;
  Family(Library& library, std::string name, std::string help, Labels constant_labels);
  void CheckLabels(const Labels& labels) const;

  Library* library_;
  mutable Mutex mu_;
  // The handles of the library's series, by label set. Never removed, so the
  // references Add() returns stay valid without the lock.
  std::map<Labels, std::unique_ptr<T>> series_ MESHLOAD_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

/// Owns metric families and renders them for a scrape.
///
/// Thread safety: thread-safe. Serialize() calls are serialized with each
/// other, so collect hooks never run concurrently.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Adds a hook that Serialize() runs before rendering, in the order added,
  /// so a component can refresh gauges that are cheaper to read on demand than
  /// to keep current (slots leased, queue depth). A hook may register
  /// families and add series, but must not call Serialize() (it would
  /// deadlock); a hook it adds with AddCollectHook() first runs on the next
  /// scrape. It should be fast: it runs on the scrape's thread while the
  /// scraper waits. Hooks are never removed, so
  /// whatever a hook captures must outlive the registry or its last scrape.
  void AddCollectHook(std::function<void()> hook) MESHLOAD_EXCLUDES(hooks_mu_);

  /// Runs the collect hooks, then renders every family in the text exposition
  /// format 0.0.4 (see the file comment for the ordering and number rules).
  std::string Serialize() const MESHLOAD_EXCLUDES(collect_mu_, hooks_mu_, mu_);

 private:
  template <typename T>
  friend class Builder;

  template <typename T>
  Family<T>& Register(std::string name, std::string help, Labels constant_labels) MESHLOAD_EXCLUDES(mu_);

  // prometheus-cpp's registry: the families and series, collected for
  // each scrape.
  std::unique_ptr<prometheus::Registry> library_;
  // Lock order: collect_mu_ before mu_ and hooks_mu_ (never held
  // together); mu_ before a family's mutex.
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_ MESHLOAD_GUARDED_BY(mu_);
  mutable Mutex hooks_mu_;
  std::vector<std::function<void()>> hooks_ MESHLOAD_GUARDED_BY(hooks_mu_);
  // Held for a whole Serialize(), so hooks never run concurrently; guards
  // no data.
  mutable Mutex collect_mu_ MESHLOAD_ACQUIRED_BEFORE(mu_, hooks_mu_);
};

/// Describes a family and registers it; see BuildCounter().
///
/// Thread safety: not thread-safe; a builder is a temporary of one thread.
template <typename T>
class Builder {
 public:
  Builder& Name(std::string_view name) {
    name_ = name;
    return *this;
  }
  Builder& Help(std::string_view help) {
    help_ = help;
    return *this;
  }
  /// Constant labels, added to every series of the family (e.g. a pod-wide
  /// `job_id`). Prefer target labels set by Prometheus where possible.
  Builder& Labels(const ::meshload::metrics::Labels& labels) {
    labels_ = labels;
    return *this;
  }
  /// Registers the family, or returns the existing one with the same name,
  /// type, help and constant labels. Aborts on the mistakes listed in the file
  /// comment.
  Family<T>& Register(Registry& registry) const { return registry.Register<T>(name_, help_, labels_); }

 private:
  std::string name_;
  std::string help_;
  ::meshload::metrics::Labels labels_;
};

inline Builder<Counter> BuildCounter() { return {}; }
inline Builder<Gauge> BuildGauge() { return {}; }
inline Builder<Histogram> BuildHistogram() { return {}; }

/// Registers `meshload_build_info{component="...",version="..."} 1`, the
/// gauge dashboards join on to show which version runs where. Calling it again
/// with another component adds a series to the same family.
Gauge& RegisterBuildInfo(Registry& registry, std::string_view version, std::string_view component);

// ---- building blocks, exposed for tests and for code that checks names
// coming from configuration before it would abort on them -------------------

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
bool IsValidMetricName(std::string_view name);
/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__`, and not `le` or
/// `quantile`.
bool IsValidLabelName(std::string_view name);

}  // namespace meshload::metrics
