#include "sidecar/sidecar_metrics.h"

namespace meshload::sidecar {

const metrics::BucketBoundaries kReadLatencyBuckets = metrics::ExponentialBuckets(1e-5, 2, 20);

SidecarMetrics::SidecarMetrics(metrics::Registry& r)
    : bytes_read(metrics::BuildCounter()
                     .Name("meshload_bytes_read_total")
                     .Help("Bytes read from storage, by source scheme.")
                     .Register(r)),
      samples_read(metrics::BuildCounter()
                       .Name("meshload_samples_read_total")
                       .Help("Samples read from storage (a sample read twice counts twice).")
                       .Register(r)
                       .Add({})),
      batches_staged(metrics::BuildCounter()
                         .Name("meshload_batches_staged_total")
                         .Help("Batches staged in a slot and ready for the trainer.")
                         .Register(r)
                         .Add({})),
      batches_delivered(metrics::BuildCounter()
                            .Name("meshload_batches_delivered_total")
                            .Help("Batches handed to the trainer (READY sent).")
                            .Register(r)
                            .Add({})),
      batches_consumed(metrics::BuildCounter()
                           .Name("meshload_batches_consumed_total")
                           .Help("Batches the trainer finished with (RELEASE received).")
                           .Register(r)
                           .Add({})),
      current_step(metrics::BuildGauge()
                       .Name("meshload_current_step")
                       .Help("The last step handed to the trainer.")
                       .Register(r)
                       .Add({})),
      next_staged_step(metrics::BuildGauge()
                           .Name("meshload_next_staged_step")
                           .Help("The next step the producer will stage.")
                           .Register(r)
                           .Add({})),
      slots(metrics::BuildGauge().Name("meshload_slots").Help("Staging slots by state.").Register(r)),
      trainer_wait(metrics::BuildHistogram()
                       .Name("meshload_trainer_wait_seconds")
                       .Help("How long the trainer waited for each batch (measured by the client).")
                       .Register(r)
                       .Add({}, metrics::ExponentialBuckets(1e-6, 4, 12))),
      read_latency(metrics::BuildHistogram()
                       .Name("meshload_storage_read_seconds")
                       .Help("Latency of one storage request, by source scheme.")
                       .Register(r)),
      step_load(metrics::BuildHistogram()
                    .Name("meshload_step_load_seconds")
                    .Help("Time to read one step's batch into its slot.")
                    .Register(r)
                    .Add({}, metrics::ExponentialBuckets(1e-4, 2, 16))),
      device_copy(metrics::BuildHistogram()
                      .Name("meshload_device_copy_seconds")
                      .Help("GPU staging: time to copy one step's batch to the GPUs and wait for it (the fence "
                            "before READY), included in meshload_step_load_seconds.")
                      .Register(r)
                      .Add({}, metrics::ExponentialBuckets(1e-5, 2, 18))),
      device_memory(metrics::BuildGauge()
                        .Name("meshload_device_memory_bytes")
                        .Help("GPU memory held by the staging slots, all local GPUs together (0 with host staging).")
                        .Register(r)
                        .Add({})),
      retries(metrics::BuildCounter()
                  .Name("meshload_storage_retries_total")
                  .Help("Storage requests retried, by source scheme and reason.")
                  .Register(r)),
      errors(metrics::BuildCounter().Name("meshload_errors_total").Help("Errors by kind.").Register(r)),
      connections(metrics::BuildCounter()
                      .Name("meshload_client_connections_total")
                      .Help("Trainer connections by outcome.")
                      .Register(r)),
      clients(metrics::BuildGauge()
                  .Name("meshload_clients_connected")
                  .Help("Trainers connected (0 or 1).")
                  .Register(r)
                  .Add({})),
      leases_reclaimed(metrics::BuildCounter()
                           .Name("meshload_leases_reclaimed_total")
                           .Help("Slots taken back from trainers that disconnected while holding them.")
                           .Register(r)
                           .Add({})),
      oldest_read(metrics::BuildGauge()
                      .Name("meshload_oldest_inflight_read_seconds")
                      .Help("Age of the oldest storage read in flight (0 when none): a stuck read grows it.")
                      .Register(r)
                      .Add({})),
      producer_blocked(metrics::BuildGauge()
                           .Name("meshload_producer_blocked_seconds")
                           .Help("How long the producer has waited for a free slot (0 when not waiting): "
                                 "every slot is staged or leased and none is released.")
                           .Register(r)
                           .Add({})),
      staging_mode(metrics::BuildGauge()
                       .Name("meshload_staging_mode")
                       .Help("1 for the active staging mode (host or cuda).")
                       .Register(r)),
      peer_bytes(metrics::BuildCounter()
                     .Name("meshload_peer_bytes_total")
                     .Help("Sample bytes moved to or from other processes' sidecars (Broadcast, LoadAndReshard), "
                           "by direction.")
                     .Register(r)),
      peer_parts(metrics::BuildCounter()
                     .Name("meshload_peer_parts_total")
                     .Help("Step parts handled for peers: sent, received, skipped (the peer had moved past them), "
                           "served (read again from storage on a peer's demand).")
                     .Register(r)),
      peer_reconnects(metrics::BuildCounter()
                          .Name("meshload_peer_reconnects_total")
                          .Help("Connections to other processes' sidecars re-established after a loss (a peer "
                                "restarted, or the network dropped the connection).")
                          .Register(r)
                          .Add({})),
      peers_connected(metrics::BuildGauge()
                          .Name("meshload_peers_connected")
                          .Help("Connections to other processes' sidecars that are up.")
                          .Register(r)
                          .Add({})),
      peer_wait(metrics::BuildHistogram()
                    .Name("meshload_peer_wait_seconds")
                    .Help("Time a step waited on its peers after its own reads were done.")
                    .Register(r)
                    .Add({}, metrics::ExponentialBuckets(1e-5, 4, 10))) {}

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
  peer_reconnects.Increment(static_cast<double>(now.reconnects - peer_seen_.reconnects));
  peer_seen_.reconnects = now.reconnects;
}

void RegisterJobInfo(metrics::Registry& r, const std::string& job, int64_t process, std::string_view strategy) {
  metrics::BuildGauge()
      .Name("meshload_job_info")
      .Help("The DataLoadJob and process this sidecar serves, and the job's loading strategy; the value is always 1.")
      .Register(r)
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
