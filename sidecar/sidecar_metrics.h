/// \file
/// The sidecar's metrics: every family it exports on /metrics, registered
/// in one Registry, and the handles the sidecar updates (SidecarMetrics);
/// storage events turned into metrics (StorageMetricsObserver).
///
/// Names follow Prometheus conventions (meshload_ prefix, base units,
/// _total counters); every label has a bounded set of values.
///
/// Thread safety: the handles are metrics::Counter, Gauge and Histogram
/// (thread-safe, lock-free) and their families (thread-safe).
/// SidecarMetrics::CountPeers runs in the registry's collect hook only.
/// StorageMetricsObserver is called by every reader thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics/metrics.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/source/source.h"
#include "sidecar/staging/slot_pool.h"

namespace meshload::sidecar {

/// Storage request latency buckets (every source the same, so /progress can
/// add them up): 10 µs to about 5 s.
extern const metrics::BucketBoundaries kReadLatencyBuckets;

/// The sidecar's metric families, registered in `r` by the constructor, and
/// the series it updates. They live as long as the registry.
struct SidecarMetrics {
  explicit SidecarMetrics(metrics::Registry& r);

  metrics::Family<metrics::Counter>& bytes_read;
  metrics::Counter& samples_read;
  metrics::Counter& samples_skipped;
  metrics::Counter& batches_staged;
  metrics::Counter& batches_delivered;
  metrics::Counter& batches_consumed;
  metrics::Gauge& current_step;
  metrics::Gauge& next_staged_step;
  metrics::Family<metrics::Gauge>& slots;
  metrics::Histogram& trainer_wait;
  metrics::Family<metrics::Histogram>& read_latency;
  metrics::Histogram& step_load;
  metrics::Histogram& device_copy;
  metrics::Gauge& device_memory;
  metrics::Family<metrics::Counter>& retries;
  metrics::Family<metrics::Counter>& errors;
  metrics::Family<metrics::Counter>& connections;
  metrics::Gauge& clients;
  metrics::Counter& leases_reclaimed;
  metrics::Gauge& oldest_read;
  metrics::Gauge& producer_blocked;
  metrics::Family<metrics::Gauge>& staging_mode;
  metrics::Family<metrics::Counter>& peer_bytes;
  metrics::Family<metrics::Counter>& peer_parts;
  metrics::Counter& peer_reconnects;
  metrics::Gauge& peers_connected;
  metrics::Histogram& peer_wait;
  metrics::Family<metrics::Counter>& dataset_samples;
  metrics::Family<metrics::Counter>& dataset_tokens;
  metrics::Family<metrics::Counter>& dataset_padding;
  // The block cache of a remote dataset (sidecar/cache/).
  metrics::Family<metrics::Gauge>& cache_mode;
  metrics::Gauge& cache_capacity;
  metrics::Gauge& cache_bytes;
  metrics::Counter& cache_hits;
  metrics::Counter& cache_misses;
  metrics::Counter& cache_fetched_bytes;
  metrics::Counter& cache_delivered_bytes;
  metrics::Counter& cache_evicted_bytes;
  metrics::Counter& cache_found_blocks;
  metrics::Family<metrics::Counter>& cache_errors;
  metrics::Gauge& cache_lookahead_steps;
  metrics::Gauge& cache_lookahead_bytes;
  metrics::Gauge& time_to_first_batch;
  metrics::Counter& parquet_row_groups_decoded;
  metrics::Counter& parquet_chunk_bytes;

  void Error(std::string_view kind) { errors.Add({{"kind", std::string(kind)}}).Increment(); }

  /// meshload_slots: the slot pool's slots by state.
  void SetSlotCounts(const staging::SlotCounts& c);

  /// The peer exchange's counters, `now`: the peer families follow (each
  /// call adds what is new since the last). Call from the registry's
  /// collect hook only (its collect lock orders the calls).
  void CountPeers(const exchange::ExchangeCounters& now);

  /// The block cache's counts, `now` (as CountPeers: from the collect hook).
  struct CacheCounts {
    uint64_t hits = 0, misses = 0, fetched_bytes = 0, delivered_bytes = 0, evicted_bytes = 0;
    uint64_t corrupt = 0, write_errors = 0, ahead_errors = 0, found = 0;
  };
  void CountCache(const CacheCounts& now);

  /// Parquet row groups decoded so far and the column-chunk bytes fetched
  /// for them (as CountPeers: from the collect hook).
  void CountParquet(uint64_t row_groups, uint64_t chunk_bytes);

  /// A batch handed to the trainer (READY sent): counted, and the first
  /// one's time since `started_ns` (the sidecar's start, steady clock) kept.
  void Delivered();
  std::atomic<int64_t> started_ns{0};

 private:
  exchange::ExchangeCounters peer_seen_;  // what the peer families have counted
  CacheCounts cache_seen_;                // what the cache families have counted
  uint64_t parquet_seen_groups_ = 0, parquet_seen_bytes_ = 0;
  std::atomic<bool> delivered_once_{false};
};

/// Registers meshload_job_info{dataloadjob, process, strategy} 1: which job
/// and process this sidecar serves, for dashboards and alerts to join on
/// (one series per sidecar).
void RegisterJobInfo(metrics::Registry& r, const std::string& job, int64_t process, std::string_view strategy);

/// Storage events -> metrics.
/// Reads are the hot path: the series of the built-in schemes are looked up
/// once; another scheme (a registered driver) goes through the family.
class StorageMetricsObserver : public source::SourceObserver {
 public:
  explicit StorageMetricsObserver(SidecarMetrics& m);
  void OnRead(std::string_view scheme, uint64_t bytes, double seconds) override;
  // One add to the bytes counter and a few to the latency histogram per
  // batch (these atomics are shared by every reader thread).
  void OnReads(std::string_view scheme, const ReadSample* reads, size_t count) override;
  void OnRetry(std::string_view scheme, std::string_view reason) override;
  void OnError(std::string_view scheme, std::string_view kind) override;

 private:
  metrics::Counter& Bytes(std::string_view scheme);
  metrics::Histogram& Latency(std::string_view scheme);
  struct Known {
    std::string_view scheme;
    metrics::Counter* bytes;
    metrics::Histogram* latency;
  };
  SidecarMetrics& m_;
  std::vector<Known> known_;
};

}  // namespace meshload::sidecar
