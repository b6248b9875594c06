#include "sidecar/sidecar_metrics.h"

#include <chrono>

namespace meshload::sidecar {

const metrics::BucketBoundaries kReadLatencyBuckets = metrics::ExponentialBuckets(1e-5, 2, 20);

namespace {

using metrics::Counter;
using metrics::Gauge;
using metrics::Histogram;

// A family whose series the sidecar adds by label.
template <typename T>
metrics::Family<T>& Labelled(metrics::Registry& r, std::string_view name, std::string_view help) {
  return metrics::Builder<T>().Name(name).Help(help).Register(r);
}

// The one series of a family without labels (a histogram's with its bucket
// bounds).
template <typename T, typename... Buckets>
T& Unlabelled(metrics::Registry& r, std::string_view name, std::string_view help, const Buckets&... buckets) {
  return Labelled<T>(r, name, help).Add({}, buckets...);
}

}  // namespace

SidecarMetrics::SidecarMetrics(metrics::Registry& r)
    : bytes_read(Labelled<Counter>(r, "meshload_bytes_read_total", "Bytes read from storage, by source scheme.")),
      samples_read(Unlabelled<Counter>(r, "meshload_samples_read_total",
                                       "Samples read from storage (a sample read twice counts twice).")),
      samples_skipped(Unlabelled<Counter>(r, "meshload_samples_skipped_total",
                                          "WebDataset and MDS samples left out of their batch because they lack a "
                                          "wanted field (spec.dataset.missingField: Skip)")),
      batches_staged(Unlabelled<Counter>(r, "meshload_batches_staged_total",
                                         "Batches staged in a slot and ready for the trainer.")),
      batches_delivered(
          Unlabelled<Counter>(r, "meshload_batches_delivered_total", "Batches handed to the trainer (READY sent).")),
      batches_consumed(Unlabelled<Counter>(r, "meshload_batches_consumed_total",
                                           "Batches the trainer finished with (RELEASE received).")),
      current_step(Unlabelled<Gauge>(r, "meshload_current_step", "The last step handed to the trainer.")),
      next_staged_step(Unlabelled<Gauge>(r, "meshload_next_staged_step", "The next step the producer will stage.")),
      slots(Labelled<Gauge>(r, "meshload_slots", "Staging slots by state.")),
      trainer_wait(Unlabelled<Histogram>(r, "meshload_trainer_wait_seconds",
                                         "How long the trainer waited for each batch (measured by the client).",
                                         metrics::ExponentialBuckets(1e-6, 4, 12))),
      read_latency(
          Labelled<Histogram>(r, "meshload_storage_read_seconds", "Latency of one storage request, by source scheme.")),
      step_load(Unlabelled<Histogram>(r, "meshload_step_load_seconds", "Time to read one step's batch into its slot.",
                                      metrics::ExponentialBuckets(1e-4, 2, 16))),
      device_copy(
          Unlabelled<Histogram>(r, "meshload_device_copy_seconds",
                                "GPU staging: time to copy one step's batch to the GPUs and wait for it (the fence "
                                "before READY), included in meshload_step_load_seconds.",
                                metrics::ExponentialBuckets(1e-5, 2, 18))),
      device_memory(
          Unlabelled<Gauge>(r, "meshload_device_memory_bytes",
                            "GPU memory held by the staging slots, all local GPUs together (0 with host staging).")),
      retries(Labelled<Counter>(r, "meshload_storage_retries_total",
                                "Storage requests retried, by source scheme and reason.")),
      errors(Labelled<Counter>(r, "meshload_errors_total", "Errors by kind.")),
      connections(Labelled<Counter>(r, "meshload_client_connections_total", "Trainer connections by outcome.")),
      clients(Unlabelled<Gauge>(r, "meshload_clients_connected", "Trainers connected (0 or 1).")),
      leases_reclaimed(Unlabelled<Counter>(r, "meshload_leases_reclaimed_total",
                                           "Slots taken back from trainers that disconnected while holding them.")),
      oldest_read(Unlabelled<Gauge>(r, "meshload_oldest_inflight_read_seconds",
                                    "Age of the oldest storage read in flight (0 when none): a stuck read grows it.")),
      producer_blocked(Unlabelled<Gauge>(r, "meshload_producer_blocked_seconds",
                                         "How long the producer has waited for a free slot (0 when not waiting): "
                                         "every slot is staged or leased and none is released.")),
      staging_mode(Labelled<Gauge>(r, "meshload_staging_mode", "1 for the active staging mode (host or cuda).")),
      peer_bytes(
          Labelled<Counter>(r, "meshload_peer_bytes_total",
                            "Sample bytes moved to or from other processes' sidecars (Broadcast, LoadAndReshard), "
                            "by direction.")),
      peer_parts(
          Labelled<Counter>(r, "meshload_peer_parts_total",
                            "Step parts handled for peers: sent, received, skipped (the peer had moved past them), "
                            "served (read again from storage on a peer's demand), served_unsent (read again, but "
                            "the peer's connection dropped first), credited (asked for by a peer).")),
      peer_reconnects(
          Unlabelled<Counter>(r, "meshload_peer_reconnects_total",
                              "Connections to other processes' sidecars re-established after a loss (a peer "
                              "restarted, or the network dropped the connection).")),
      peers_connected(
          Unlabelled<Gauge>(r, "meshload_peers_connected", "Connections to other processes' sidecars that are up.")),
      peer_wait(Unlabelled<Histogram>(r, "meshload_peer_wait_seconds",
                                      "Time a step waited on its peers after its own reads were done.",
                                      metrics::ExponentialBuckets(1e-5, 4, 10))),
      dataset_samples(Labelled<Counter>(r, "meshload_dataset_samples_total",
                                        "Samples of the steps the trainer consumed, by dataset (a mixture's, else "
                                        "'default'): this process's shards, each shard counted by the lowest process "
                                        "holding it, so the sum over sidecars counts every sample of a step once.")),
      dataset_tokens(Labelled<Counter>(r, "meshload_dataset_tokens_total",
                                       "Tokens (a sample's elements; record bytes for WebDataset and MDS) of the "
                                       "samples meshload_dataset_samples_total counts, by dataset.")),
      dataset_padding(Labelled<Counter>(r, "meshload_dataset_padding_tokens_total",
                                        "Padding tokens of the packed rows (spec.tokens.mode Pack) that "
                                        "meshload_dataset_samples_total counts, by dataset: their rows' "
                                        "sequenceLength minus their document tokens.")),
      cache_mode(Labelled<Gauge>(r, "meshload_cache_mode",
                                 "How a remote dataset is read: blocks (through the node-local block cache), direct "
                                 "(each read's bytes from the source) or none (a local dataset); 1 for the mode in "
                                 "use.")),
      cache_capacity(Unlabelled<Gauge>(r, "meshload_cache_capacity_bytes",
                                       "The block cache's capacity (spec.dataset.cache.capacityBytes).")),
      cache_bytes(Unlabelled<Gauge>(r, "meshload_cache_bytes",
                                    "Bytes of the blocks in the cache directory (this job's and those it found).")),
      cache_hits(Unlabelled<Counter>(r, "meshload_cache_hits_total", "Block reads that found their block cached.")),
      cache_misses(Unlabelled<Counter>(r, "meshload_cache_misses_total",
                                       "Block reads that waited for their block (fetched then, or being fetched).")),
      cache_fetched_bytes(Unlabelled<Counter>(
          r, "meshload_cache_fetched_bytes_total",
          "Bytes fetched from remote storage for the dataset (blocks, and direct reads while the cache's disk "
          "refuses blocks); over meshload_cache_delivered_bytes_total, the fetch amplification.")),
      cache_delivered_bytes(Unlabelled<Counter>(r, "meshload_cache_delivered_bytes_total",
                                                "Bytes of the remote dataset read into batches.")),
      cache_evicted_bytes(Unlabelled<Counter>(r, "meshload_cache_evicted_bytes_total",
                                              "Block bytes evicted from the cache to make room.")),
      cache_found_blocks(Unlabelled<Counter>(
          r, "meshload_cache_found_blocks_total",
          "Blocks read from the cache directory that this sidecar did not fetch: written by another sidecar "
          "sharing the node's cache, or by this pod before a restart (each verified by its checksum first).")),
      cache_errors(Labelled<Counter>(r, "meshload_cache_errors_total",
                                     "Block cache problems by kind: corrupt (a block failed its checksum or was "
                                     "truncated: fetched again), write (the disk refused a block: reads went to the "
                                     "source), fetch_ahead (a fill ahead of need failed: the read fetched it).")),
      cache_lookahead_steps(Unlabelled<Gauge>(r, "meshload_cache_lookahead_steps",
                                              "Steps planned and fetched ahead of the last one consumed.")),
      cache_lookahead_bytes(
          Unlabelled<Gauge>(r, "meshload_cache_lookahead_bytes", "Block bytes fetched for steps not consumed yet.")),
      time_to_first_batch(Unlabelled<Gauge>(r, "meshload_time_to_first_batch_seconds",
                                            "From the sidecar's start to the first batch handed to a trainer (0 "
                                            "until then).")),
      parquet_row_groups_decoded(Unlabelled<Counter>(
          r, "meshload_parquet_row_groups_decoded_total",
          "Parquet row groups (Arrow record batches) decoded (a group evicted from memory and read again counts "
          "again); over the row "
          "groups an epoch reads, how often each is decoded (meshload plan --compare estimates it).")),
      parquet_chunk_bytes(Unlabelled<Counter>(
          r, "meshload_parquet_chunk_bytes_total",
          "Bytes of Parquet column chunks (Arrow record batch messages) fetched from storage to decode row "
          "groups.")) {}

void SidecarMetrics::SetSlotCounts(const staging::SlotCounts& c) {
  slots.Add({{"state", "free"}}).Set(c.free);
  slots.Add({{"state", "filling"}}).Set(c.filling);
  slots.Add({{"state", "ready"}}).Set(c.ready);
  slots.Add({{"state", "leased"}}).Set(c.leased);
}

void SidecarMetrics::CountPeers(const exchange::ExchangeCounters& now) {
  // The exchange counts; the counters follow (each collect adds what
  // is new, under the registry's collect lock).
  peers_connected.Set(now.peers_connected);
  auto add = [&](const char* family_label, uint64_t value, uint64_t& seen, bool bytes) {
    auto& family = bytes ? peer_bytes : peer_parts;
    const char* key = bytes ? "direction" : "outcome";
    family.Add({{key, family_label}}).Increment(static_cast<double>(value - seen));
    seen = value;
  };
  add("sent", now.bytes_sent, peer_seen_.bytes_sent, true);
  add("received", now.bytes_received, peer_seen_.bytes_received, true);
  add("sent", now.parts_sent, peer_seen_.parts_sent, false);
  add("received", now.parts_received, peer_seen_.parts_received, false);
  add("skipped", now.parts_skipped, peer_seen_.parts_skipped, false);
  add("served", now.parts_served, peer_seen_.parts_served, false);
  add("served_unsent", now.serves_unsent, peer_seen_.serves_unsent, false);
  add("credited", now.credits_received, peer_seen_.credits_received, false);
  peer_reconnects.Increment(static_cast<double>(now.reconnects - peer_seen_.reconnects));
  peer_seen_.reconnects = now.reconnects;
}

void SidecarMetrics::CountCache(const CacheCounts& now) {
  auto add = [](metrics::Counter& c, uint64_t value, uint64_t& seen) {
    c.Increment(static_cast<double>(value - seen));
    seen = value;
  };
  add(cache_hits, now.hits, cache_seen_.hits);
  add(cache_misses, now.misses, cache_seen_.misses);
  add(cache_fetched_bytes, now.fetched_bytes, cache_seen_.fetched_bytes);
  add(cache_delivered_bytes, now.delivered_bytes, cache_seen_.delivered_bytes);
  add(cache_evicted_bytes, now.evicted_bytes, cache_seen_.evicted_bytes);
  add(cache_found_blocks, now.found, cache_seen_.found);
  add(cache_errors.Add({{"kind", "corrupt"}}), now.corrupt, cache_seen_.corrupt);
  add(cache_errors.Add({{"kind", "write"}}), now.write_errors, cache_seen_.write_errors);
  add(cache_errors.Add({{"kind", "fetch_ahead"}}), now.ahead_errors, cache_seen_.ahead_errors);
}

void SidecarMetrics::CountParquet(uint64_t row_groups, uint64_t chunk_bytes) {
  parquet_row_groups_decoded.Increment(static_cast<double>(row_groups - parquet_seen_groups_));
  parquet_chunk_bytes.Increment(static_cast<double>(chunk_bytes - parquet_seen_bytes_));
  parquet_seen_groups_ = row_groups;
  parquet_seen_bytes_ = chunk_bytes;
}

void SidecarMetrics::Delivered() {
  batches_delivered.Increment();
  if (!delivered_once_.exchange(true)) {
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    time_to_first_batch.Set(static_cast<double>(now - started_ns.load()) / 1e9);
  }
}

void RegisterJobInfo(metrics::Registry& r, const std::string& job, int64_t process, std::string_view strategy) {
  Labelled<Gauge>(
      r, "meshload_job_info",
      "The DataLoadJob and process this sidecar serves, and the job's loading strategy; the value is always 1.")
      .Add({{"dataloadjob", job}, {"process", std::to_string(process)}, {"strategy", std::string(strategy)}})
      .Set(1);
}

// ---------------------------------------------------------------------------

StorageMetricsObserver::StorageMetricsObserver(SidecarMetrics& m) : m_(m) {
  for (const char* s : {"file", "http", "https"}) {
    known_.push_back({s, &Bytes(s), &Latency(s)});
  }
}

void StorageMetricsObserver::OnRead(std::string_view scheme, uint64_t bytes, double seconds) {
  const ReadSample one{bytes, seconds};
  OnReads(scheme, &one, 1);
}

void StorageMetricsObserver::OnReads(std::string_view scheme, const ReadSample* reads, size_t count) {
  thread_local std::vector<double> seconds;
  seconds.clear();
  uint64_t bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    bytes += reads[i].bytes;
    seconds.push_back(reads[i].seconds);
  }
  metrics::Counter* bytes_total = nullptr;
  metrics::Histogram* latency = nullptr;
  for (const auto& k : known_) {
    if (k.scheme == scheme) {
      bytes_total = k.bytes;
      latency = k.latency;
      break;
    }
  }
  if (bytes_total == nullptr) {
    bytes_total = &Bytes(scheme);
    latency = &Latency(scheme);
  }
  bytes_total->Increment(static_cast<double>(bytes));
  latency->ObserveMany(seconds.data(), seconds.size());
}

void StorageMetricsObserver::OnRetry(std::string_view scheme, std::string_view reason) {
  m_.retries.Add({{"source", std::string(scheme)}, {"reason", std::string(reason)}}).Increment();
}

void StorageMetricsObserver::OnError(std::string_view scheme, std::string_view kind) {
  (void)scheme;
  m_.Error(std::string("storage_") + std::string(kind));
}

metrics::Counter& StorageMetricsObserver::Bytes(std::string_view scheme) {
  return m_.bytes_read.Add({{"source", std::string(scheme)}});
}

metrics::Histogram& StorageMetricsObserver::Latency(std::string_view scheme) {
  return m_.read_latency.Add({{"source", std::string(scheme)}}, kReadLatencyBuckets);
}

}  // namespace meshload::sidecar
