// The sidecar end to end, in process: a real Sidecar on a real Unix socket,
// the real C++ client, real files (and a real HTTP server for remote data).
// Longer than the ~700-line rule on purpose: every case drives the same
// harness (SidecarHarness and its helpers at the top), and the cases read
// in the order of a connection's life, then the real binary's restarts
// (SidecarProcess); the GPU variants are in staging/device_staging_test.cc.

#include "sidecar/source/dataset_facts.h"
#include "common/loopback.h"
#include "sidecar/sidecar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>
#include <iterator>
#include <regex>
#include <thread>

#include "client/client.h"
#include "common/clock.h"
#include "protocol/protocol.h"
#include "sidecar/exchange/peer_exchange.h"
#include "protocol/seqpacket.h"
#include "tests/testing/job_fixtures.h"
#include "tools/synthetic_dataset.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace meshload::sidecar {
namespace {

using meshload::testing::CurrentThreadId;
using meshload::testing::StatusIs;
using meshload::testing::TempDir;
using meshload::testing::ThreadIsAsleep;
using meshload::testing::WaitFor;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

std::string JobYaml(const std::string& uri, int64_t prefetch, const std::string& extra_dataset = "") {
  return "apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nmetadata: {name: sidecar-test}\nspec:\n"
         "  mesh:\n    processes: 2\n    devicesPerProcess: 2\n    axes: [{name: data, size: 4}]\n"
         "  strategy: PerProcess\n"
         "  dataset:\n    uri: " +
         uri + "\n    format: FixedRecord\n    recordBytes: 512\n" + extra_dataset +
         "  batch: {globalBatchSize: 16, prefetch: " + std::to_string(prefetch) +
         "}\n"
         "  shuffle: {mode: Global, seed: 5}\n";
}

// A synthetic FixedRecord dataset of `samples` records of `record_bytes`,
// in `files` files under `folder`: its URI.
Result<std::string> FixedRecordDataset(const std::string& folder, int64_t record_bytes, uint64_t samples, int files) {
  planner::DatasetSpec ds;
  ds.format = planner::DatasetFormat::kFixedRecord;
  ds.record_bytes = record_bytes;
  return tools::GenerateSyntheticDataset(ds, folder, samples, files);
}

// A DataLoadJob named `name` (YAML), with `spec` (its lines indented) under `spec:`.
std::string NamedJobYaml(const std::string& name, const std::string& spec) {
  return "apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nmetadata: {name: " + name + "}\nspec:\n" + spec;
}

// Client options for `sock` that do not retry a failed connection.
client::ClientOptions NoRetry(const std::string& sock) {
  client::ClientOptions o;
  o.socket_path = sock;
  o.max_reconnect_attempts = 0;
  return o;
}

// A sidecar serving process 1 of a 2-process job, on a generated dataset.
class SidecarHarness {
 public:
  explicit SidecarHarness(int64_t prefetch = 3, std::vector<uid_t> allowed = {}, std::string uri = {},
                          uint64_t samples = 320) {
    if (uri.empty()) {
      auto u = FixedRecordDataset(dir_.path() + "/data", 512, samples, 2);
      EXPECT_OK(u);
      uri = *u;
    }
    uri_ = uri;
    job_path_ = dir_.Write("job.yaml", JobYaml(uri, prefetch));
    options_.job_path = job_path_;
    options_.process = 1;
    options_.socket_path = dir_.path() + "/s.sock";
    options_.metrics_port = 0;
    options_.metrics_address = "127.0.0.1";
    options_.allowed_uids = std::move(allowed);
    options_.stall_report_after = milliseconds(300);
    options_.staging = "host";  // these tests read the bytes on the host (GPU staging: device_staging_test)
    options_.source_options.backoff_initial = milliseconds(1);
    options_.source_options.backoff_max = milliseconds(5);
  }
  ~SidecarHarness() { Stop(); }

  Status Start() {
    auto s = Sidecar::Create(testing::MustLoad(job_path_), options_);
    if (!s.ok()) return s.status();
    sidecar_ = std::move(*s);
    thread_ = std::thread([this] { rc_ = sidecar_->Run(); });
    return Status::Ok();
  }
  void Stop() {
    if (sidecar_) sidecar_->RequestStop();
    if (thread_.joinable()) thread_.join();
    sidecar_.reset();
  }
  std::string Metrics() { return meshload::testing::ScrapeMetrics(sidecar_->metrics_port()); }
  double Metric(const std::string& series) { return meshload::testing::SampleValue(Metrics(), series); }
  std::unique_ptr<client::Client> Connect(std::optional<int64_t> start = std::nullopt) {
    client::ClientOptions o;
    o.socket_path = options_.socket_path;
    o.start_step = start;
    o.max_reconnect_attempts = 3;
    o.reconnect_backoff_initial = milliseconds(5);
    auto c = client::Client::Connect(o);
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Verifies a batch against the plan and the synthetic bytes.
  void ExpectBatchIsPlanned(const client::Batch& b) {
    if (!planner_) {
      Diagnostics d;
      auto r = source::ResolveReadingDataset(testing::MustLoad(job_path_), {}, source::Unreachable::kFail, d);
      ASSERT_OK(r) << d.ToString();
      planner_ = std::make_unique<planner::ShardPlanner>(std::move(*r));
    }
    planner::StepPlan plan = planner_->PlanStep(b.step, planner_->DefaultLoading(), 1);
    ASSERT_EQ(b.tensors.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& ids = plan.devices[i].samples;
      ASSERT_EQ(b.tensors[i].ids_checksum, protocol::SampleIdsChecksum(ids.data(), ids.size()));
      ASSERT_EQ(b.tensors[i].shape, (std::vector<int64_t>{4, 512}));
      for (size_t k = 0; k < ids.size(); ++k) {
        ASSERT_EQ(tools::FirstMismatch(planner_->job().dataset, ids[k],
                                       static_cast<const uint8_t*>(b.tensors[i].data) + k * 512),
                  -1);
      }
    }
  }

  TempDir dir_;
  std::string uri_, job_path_;
  SidecarOptions options_;
  std::unique_ptr<Sidecar> sidecar_;
  std::unique_ptr<planner::ShardPlanner> planner_;
  std::thread thread_;
  std::atomic<int> rc_{-1};
};

std::string Bytes(const client::Batch& b) {
  std::string s;
  for (const auto& t : b.tensors) s.append(static_cast<const char*>(t.data), t.nbytes);
  return s;
}

TEST(Sidecar, ServesConsecutiveStepsWithThePlannedBytes) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  auto c = h.Connect();
  ASSERT_TRUE(c);
  for (int64_t step = 0; step < 45; ++step) {  // more than an epoch (20 steps)
    auto b = c->Next(milliseconds(5000));
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    h.ExpectBatchIsPlanned(*b);
  }
  // The last RELEASEs may still be on their way to the server thread.
  (void)WaitFor([&] { return h.Metric("meshload_batches_consumed_total") >= 44; }, seconds(20));
  EXPECT_GE(h.Metric("meshload_batches_consumed_total"), 44);
  EXPECT_EQ(h.Metric("meshload_clients_connected"), 1);
}

// A trainer speaking the protocol by hand: what a process that dies (its
// socket closes with no BYE and no RELEASE), or that misbehaves, looks like.
class RawTrainer {
 public:
  explicit RawTrainer(const std::string& socket, int64_t want_step = 0) {
    auto fd = protocol::ConnectSeqpacket(socket);
    EXPECT_OK(fd);
    if (!fd.ok()) return;
    fd_ = std::move(*fd);
    EXPECT_OK(protocol::SendMessage(fd_.get(),
                                    protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, want_step})));
    auto got = protocol::ReceiveMessage(fd_.get(), protocol::kMaxMessageBytes);
    EXPECT_TRUE(got.ok() && got->fds.size() == 1) << got.status().ToString();
    if (!got.ok() || got->fds.size() != 1) return;
    hello_ = std::get<protocol::ServerHello>(protocol::Decode(got->bytes).value());
    void* p = ::mmap(nullptr, hello_.pool_bytes, PROT_READ, MAP_SHARED, got->fds[0].get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<const char*>(p);
  }
  ~RawTrainer() {
    if (base_) ::munmap(const_cast<char*>(base_), hello_.pool_bytes);
  }
  // The next READY (a lease), or nullopt.
  std::optional<protocol::Ready> NextReady() {
    auto got = protocol::ReceiveMessage(fd_.get(), protocol::kMaxMessageBytes);
    if (!got.ok()) return std::nullopt;
    auto m = protocol::Decode(got->bytes);
    if (!m.ok() || !std::holds_alternative<protocol::Ready>(*m)) return std::nullopt;
    return std::get<protocol::Ready>(*m);
  }
  // The next `n` READYs (a test failure if they do not come).
  std::vector<protocol::Ready> Take(int n) {
    std::vector<protocol::Ready> out;
    for (int i = 0; i < n; ++i) {
      auto r = NextReady();
      EXPECT_TRUE(r) << "READY " << i << " of " << n;
      if (!r) break;
      out.push_back(*r);
    }
    return out;
  }
  // Sends something that does not decode and reads the sidecar's ERROR:
  // the sidecar drops this connection, keeping every lease.
  void MisbehaveAndGetDropped() {
    SendRaw("garbage!!garbage");
    auto err = protocol::ReceiveMessage(fd_.get(), protocol::kMaxMessageBytes);
    ASSERT_OK(err);
    auto m = protocol::Decode(err->bytes);
    ASSERT_TRUE(m.ok() && std::holds_alternative<protocol::ErrorMessage>(*m));
  }
  // The bytes of a leased batch, as the trainer sees them now.
  std::string Bytes(const protocol::Ready& r) const {
    std::string s;
    for (size_t i = 0; i < r.tensors.size(); ++i) {
      uint64_t n = r.tensors[i].dtype_bits / 8;
      for (int64_t d : r.tensors[i].shape) n *= static_cast<uint64_t>(d);
      s.append(base_ + r.slot * hello_.slot_bytes + r.tensors[i].offset, n);
    }
    return s;
  }
  void Send(const protocol::Message& m) { ASSERT_OK(protocol::SendMessage(fd_.get(), protocol::Encode(m))); }
  void SendRaw(const std::string& bytes) { ASSERT_OK(protocol::SendMessage(fd_.get(), bytes)); }
  void Close() { fd_ = UniqueFd(); }
  int fd() const { return fd_.get(); }
  // The sidecar closed its end (not just shut it for writing: a hang-up).
  bool ClosedBySidecar() const {
    pollfd p{fd_.get(), 0, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
  }

 private:
  UniqueFd fd_;
  protocol::ServerHello hello_;
  const char* base_ = nullptr;
};

// Polls the sidecar's metric until it reaches `want` (at most 20 s).
bool MetricReaches(SidecarHarness& h, const std::string& series, double want) {
  return WaitFor([&] { return h.Metric(series) >= want; }, seconds(20));
}

// This process's threads whose name starts with `prefix` (their kernel ids).
std::vector<pid_t> ThreadsNamed(const std::string& prefix) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind(prefix, 0) == 0) out.push_back(static_cast<pid_t>(std::stol(task.path().filename().string())));
  }
  return out;
}

TEST(Sidecar, AConsumerKilledHoldingLeasesIsReclaimedAndAReconnectGetsIdenticalBytes) {
  SidecarHarness h(/*prefetch=*/3);
  ASSERT_OK(h.Start());
  std::vector<std::string> first_run;
  {
    RawTrainer dying(h.options_.socket_path);
    for (const auto& r : dying.Take(3)) first_run.push_back(dying.Bytes(r));  // the trainer holds every slot ...
    ASSERT_EQ(first_run.size(), 3u);
    dying.Close();  // ... and dies: its socket closes, with no BYE and no RELEASE
  }
  EXPECT_TRUE(MetricReaches(h, "meshload_leases_reclaimed_total", 3));
  EXPECT_EQ(h.Metric("meshload_leases_reclaimed_total"), 3);
  auto c2 = h.Connect(/*start=*/1);
  for (int64_t step = 1; step < 3; ++step) {
    auto b = c2->Next(milliseconds(5000));
    ASSERT_OK(b);
    EXPECT_EQ(b->step, step);
    EXPECT_EQ(Bytes(*b), first_run[static_cast<size_t>(step)]);
  }
}

// The trainer closes its client (or reconnects) while it still holds two
// batches: their slots stay lent, so their bytes never change while the next
// connection streams on, and they go back when the trainer drops them.
TEST(Sidecar, BatchesHeldAcrossACloseKeepTheirBytesUntilTheTrainerDropsThem) {
  SidecarHarness h(/*prefetch=*/3);
  ASSERT_OK(h.Start());
  auto c = h.Connect();
  std::vector<client::Batch> held;
  std::vector<std::string> bytes;
  for (int i = 0; i < 2; ++i) {
    auto b = c->Next(milliseconds(5000));
    ASSERT_OK(b);
    bytes.push_back(Bytes(*b));
    held.push_back(std::move(*b));
  }
  c->Close();  // BYE: steps 0 and 1 are held; a READY not yet handed out (step 2) comes back
  auto c2 = h.Connect(/*start=*/2);
  for (int64_t step = 2; step < 40; ++step) {  // the one free slot goes round many times
    auto b = c2->Next(milliseconds(5000));
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    h.ExpectBatchIsPlanned(*b);
    for (size_t i = 0; i < held.size(); ++i) ASSERT_EQ(Bytes(held[i]), bytes[i]) << "held step " << i << " changed";
  }
  for (const auto& b : held) h.ExpectBatchIsPlanned(b);
  EXPECT_LE(h.Metric("meshload_leases_reclaimed_total"), 1) << "only a READY that was never handed out";
  // Dropping them releases their slots on the old connection. (The new
  // connection's 38 RELEASEs first: the last may still be on its way.)
  EXPECT_TRUE(MetricReaches(h, "meshload_batches_consumed_total", 38));
  const double consumed = h.Metric("meshload_batches_consumed_total");
  EXPECT_EQ(consumed, 38);
  held.clear();
  EXPECT_TRUE(MetricReaches(h, "meshload_batches_consumed_total", consumed + 2));
  EXPECT_EQ(h.Metric("meshload_trainer_wait_seconds_count"), consumed + 2) << "each RELEASE records its wait";
  std::vector<client::Batch> three;  // all three slots serve the new connection again
  for (int i = 0; i < 3; ++i) {
    auto b = c2->Next(milliseconds(5000));
    ASSERT_OK(b);
    three.push_back(std::move(*b));
  }
}

// A sidecar (prefetch 3) whose trainer `old` took all three slots, then
// sent something malformed and was dropped: the sidecar keeps its leases.
class SidecarWithADroppedTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    h.options_.clock = &clock;  // the server's timeouts: a closed connection's drain
    ASSERT_OK(h.Start());
    old = std::make_unique<RawTrainer>(h.options_.socket_path);
    leases = old->Take(3);
    ASSERT_EQ(leases.size(), 3u);
    held = old->Bytes(leases[0]);
    old->MisbehaveAndGetDropped();
  }

  SimulatedClock clock;  // outlives the sidecar
  SidecarHarness h{/*prefetch=*/3};
  std::unique_ptr<RawTrainer> old;
  std::vector<protocol::Ready> leases;  // all three, kept
  std::string held;                     // leases[0]'s bytes when it was dropped
};

// The sidecar drops a trainer that sent something malformed, but the trainer
// may still be using its batches: they stay lent until it says which it holds
// (BYE), releases them on the old connection, or closes it.
TEST_F(SidecarWithADroppedTrainer, ADroppedTrainerKeepsItsBatchesUntilItSaysWhichItHoldsOrCloses) {
  // Every slot is still the old trainer's: the next connection gets nothing.
  auto c = h.Connect(/*start=*/3);
  auto none = c->Next(milliseconds(300));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded) << none.status().ToString();
  EXPECT_EQ(h.Metric("meshload_leases_reclaimed_total"), 0);

  // BYE: only step 0 is still held; the two others come back.
  old->Send(protocol::Bye{{{leases[0].slot, leases[0].step}}});
  EXPECT_TRUE(MetricReaches(h, "meshload_leases_reclaimed_total", 2));
  for (int64_t step = 3; step < 20; ++step) {
    auto b = c->Next(milliseconds(5000));
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    h.ExpectBatchIsPlanned(*b);
    ASSERT_EQ(old->Bytes(leases[0]), held) << "a held batch changed under the old trainer";
  }
  // Its RELEASE on the old connection is taken; a RELEASE of a lease it
  // gave up, and a second one, change nothing. (The new trainer's 17
  // RELEASEs first: the last may still be on its way.)
  EXPECT_TRUE(MetricReaches(h, "meshload_batches_consumed_total", 17));
  const double consumed = h.Metric("meshload_batches_consumed_total");
  EXPECT_EQ(consumed, 17);
  old->Send(protocol::Release{leases[1].slot, leases[1].step, 0});
  old->Send(protocol::Release{leases[0].slot, leases[0].step, 0});
  old->Send(protocol::Release{leases[0].slot, leases[0].step, 0});
  EXPECT_TRUE(MetricReaches(h, "meshload_batches_consumed_total", consumed + 1));
  // With no lease left, the sidecar closes the old connection a second
  // later (time moves on while the test waits): what it had sent before
  // was read by then or never will be.
  EXPECT_TRUE(WaitFor(
      [&] {
        clock.Advance(milliseconds(500));
        return old->ClosedBySidecar();
      },
      seconds(20), milliseconds(20)))
      << "the drained connection was not closed";
  EXPECT_EQ(h.Metric("meshload_batches_consumed_total"), consumed + 1);
  EXPECT_EQ(h.Metric("meshload_leases_reclaimed_total"), 2);

  // A trainer dropped while holding batches that then dies: they come back at its EOF.
  c.reset();
  RawTrainer second(h.options_.socket_path, 40);
  ASSERT_EQ(second.Take(3).size(), 3u);
  second.MisbehaveAndGetDropped();
  const double reclaimed = h.Metric("meshload_leases_reclaimed_total");
  second.Close();
  EXPECT_TRUE(MetricReaches(h, "meshload_leases_reclaimed_total", reclaimed + 3));
  auto c3 = h.Connect(/*start=*/43);
  auto b = c3->Next(milliseconds(5000));
  ASSERT_OK(b);
  h.ExpectBatchIsPlanned(*b);
}

// Kept leases belong to their connection: a flood of refused connections
// cannot evict them, and another connection cannot release them.
TEST_F(SidecarWithADroppedTrainer, KeptLeasesSurviveAFloodOfRefusedConnectionsAndOnlyTheirConnectionReleasesThem) {
  // A trainer connects (it gets no slot: all are kept), and 80 more are
  // refused as busy: each of those drains, more than 64 at once.
  RawTrainer current(h.options_.socket_path, 3);
  std::vector<UniqueFd> refused;
  for (int i = 0; i < 80; ++i) {
    auto fd = protocol::ConnectSeqpacket(h.options_.socket_path);
    (void)WaitFor(  // while the listen queue (8) is full: the sidecar catches up
        [&] {
          if (fd.ok() || fd.status().code() != StatusCode::kUnavailable) return true;
          fd = protocol::ConnectSeqpacket(h.options_.socket_path);
          return false;
        },
        seconds(20), milliseconds(2));
    ASSERT_OK(fd);
    refused.push_back(std::move(*fd));
  }
  for (auto& fd : refused) ASSERT_OK(protocol::ReceiveMessage(fd.get(), protocol::kMaxMessageBytes));  // ERROR busy
  EXPECT_EQ(h.Metric("meshload_leases_reclaimed_total"), 0);
  EXPECT_EQ(old->Bytes(leases[0]), held);

  // The current trainer cannot release the old one's lease.
  current.Send(protocol::Release{leases[0].slot, leases[0].step, 0});
  auto err = protocol::ReceiveMessage(current.fd(), protocol::kMaxMessageBytes);
  ASSERT_OK(err);
  auto m = protocol::Decode(err->bytes);
  ASSERT_TRUE(m.ok() && std::holds_alternative<protocol::ErrorMessage>(*m));
  EXPECT_THAT(std::get<protocol::ErrorMessage>(*m).message, HasSubstr("which this connection does not lease"));

  // The old connection still keeps all three: its BYE lists one, and
  // exactly the two others come back.
  old->Send(protocol::Bye{{{leases[0].slot, leases[0].step}}});
  EXPECT_TRUE(MetricReaches(h, "meshload_leases_reclaimed_total", 2));
  // A kept lease has no deadline: an hour on, the sidecar has looked at
  // its connections again (it does before it answers a trainer's hello)
  // and the lease is still out.
  clock.Advance(std::chrono::hours(1));
  RawTrainer probe(h.options_.socket_path, 3);
  ASSERT_GE(probe.fd(), 0);
  EXPECT_EQ(h.Metric("meshload_leases_reclaimed_total"), 2);
  EXPECT_EQ(old->Bytes(leases[0]), held);
  EXPECT_FALSE(old->ClosedBySidecar());
}

TEST(Sidecar, StoppingNeverRestagesASlotTheTrainerHolds) {
  // The trainer holds every slot when the sidecar is stopped (a container
  // restart): it keeps its batches and reconnects to the next sidecar, so
  // the stopping one must not stage into their slots on the way out.
  for (int round = 0; round < 3; ++round) {
    SidecarHarness h(/*prefetch=*/3);
    ASSERT_OK(h.Start());
    RawTrainer t(h.options_.socket_path);
    const std::vector<protocol::Ready> leases = t.Take(3);
    ASSERT_EQ(leases.size(), 3u);
    std::vector<std::string> held;
    for (const auto& r : leases) held.push_back(t.Bytes(r));
    // Both producers wait for a slot (asleep in the pool: every slot is the trainer's).
    EXPECT_TRUE(WaitFor(
        [&] {
          const std::vector<pid_t> producers = ThreadsNamed("ml-stage-");
          return !producers.empty() && std::all_of(producers.begin(), producers.end(), ThreadIsAsleep);
        },
        seconds(10)))
        << "round " << round << ": the producers never waited for a slot";
    h.Stop();
    for (size_t i = 0; i < leases.size(); ++i) {
      EXPECT_EQ(t.Bytes(leases[i]), held[i])
          << "round " << round << ": the slot of step " << leases[i].step << " was restaged while the trainer held it";
    }
  }
}

// The sidecar drops a trainer without an ERROR (a datagram over 64 KiB):
// the trainer still sees end of file after what was queued, so it can
// leave (BYE) and reconnect instead of waiting for ever; what it holds stays.
TEST(Sidecar, ATrainerDroppedWithoutAnErrorSeesEndOfFileAndKeepsWhatItHolds) {
  SidecarHarness h(/*prefetch=*/3);
  ASSERT_OK(h.Start());
  RawTrainer old(h.options_.socket_path);
  auto first = old.NextReady();
  ASSERT_TRUE(first);
  const std::string held = old.Bytes(*first);
  (void)protocol::SendMessage(old.fd(), std::string(70000, 'x'));  // the sidecar truncates it: no ERROR
  int readies = 0;
  while (old.NextReady()) ++readies;  // the READYs queued, then end of file (not a hang)
  EXPECT_LE(readies, 2);
  old.Send(protocol::Bye{{{first->slot, first->step}}});
  auto c = h.Connect(/*start=*/first->step + 1);
  for (int64_t step = first->step + 1; step < 15; ++step) {
    auto b = c->Next(milliseconds(5000));
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    ASSERT_EQ(old.Bytes(*first), held);
  }
}

// A trainer's BYE reaches the sidecar before its next connection does, and
// the sidecar serves the trainer's messages before new connections: closing
// and connecting again at once is never refused as busy (no retry here).
TEST(Sidecar, ATrainerThatLeavesAndConnectsAgainAtOnceIsNotToldBusy) {
  SidecarHarness h(/*prefetch=*/3);
  ASSERT_OK(h.Start());
  int64_t step = 0;
  for (int round = 0; round < 20; ++round) {
    client::ClientOptions o = NoRetry(h.options_.socket_path);
    o.start_step = step;
    auto c = client::Client::Connect(o);
    ASSERT_OK(c) << "round " << round << ": " << c.status().ToString();
    auto b = (*c)->Next(milliseconds(5000));
    ASSERT_OK(b);
    ASSERT_EQ(b->step, step);
    ++step;
    (*c)->Close();  // BYE (holding this batch), then at once the next connection
  }
}

TEST(Sidecar, ASlowConsumerKeepsMemoryBoundedAndIsReported) {
  SidecarHarness h(/*prefetch=*/2);
  ASSERT_OK(h.Start());
  auto c = h.Connect();
  auto a = c->Next(milliseconds(5000));
  auto b = c->Next(milliseconds(5000));
  ASSERT_TRUE(a.ok() && b.ok());
  auto none = c->Next(milliseconds(300));  // the trainer holds both slots: nothing more is staged
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
  (void)WaitFor([&] { return h.Metric("meshload_producer_blocked_seconds") > 0.3; }, seconds(20));
  const std::string m = h.Metrics();
  EXPECT_THAT(m, HasSubstr("meshload_slots{state=\"leased\"} 2"));
  EXPECT_THAT(m, HasSubstr("meshload_slots{state=\"ready\"} 0"));
  EXPECT_GT(h.Metric("meshload_producer_blocked_seconds"), 0.3);
  a = Status(StatusCode::kUnavailable, "released");
  auto next = c->Next(milliseconds(5000));
  ASSERT_OK(next);
  EXPECT_EQ(next->step, 2);
}

TEST(Sidecar, AUidOutsideTheAllowListIsRefused) {
  SidecarHarness h(3, {::getuid() + 4242});
  ASSERT_OK(h.Start());
  auto c = client::Client::Connect(NoRetry(h.options_.socket_path));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("uid " + std::to_string(::getuid()) + " is not allowed"));
  EXPECT_THAT(h.Metrics(), HasSubstr("meshload_client_connections_total{outcome=\"refused_uid\"} 1"));
}

TEST(Sidecar, TheSocketIsGroupOnly) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  struct stat st {};
  ASSERT_EQ(::stat(h.options_.socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST(Sidecar, ASecondTrainerIsToldTheSidecarIsBusy) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  auto first = h.Connect();
  auto second = client::Client::Connect(NoRetry(h.options_.socket_path));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("another trainer")) << second.status().ToString();
}

TEST(Sidecar, MalformedTruncatedAndOversizedMessagesAreRefusedAndServingGoesOn) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  const std::string hello = protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, 0});
  for (const std::string& bad : {std::string("garbage!!garbage"), hello.substr(0, hello.size() - 3),
                                 std::string(70000, 'x'), protocol::Encode(protocol::Release{0, 0, 0})}) {
    auto fd = protocol::ConnectSeqpacket(h.options_.socket_path);
    ASSERT_OK(fd);
    ASSERT_TRUE(protocol::SendMessage(fd->get(), bad).ok() || bad.size() > protocol::kMaxMessageBytes);
    auto reply = protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes);
    if (reply.ok()) {  // an ERROR, then the sidecar hangs up
      auto m = protocol::Decode(reply->bytes);
      ASSERT_OK(m);
      EXPECT_EQ(std::get<protocol::ErrorMessage>(*m).code, protocol::ErrorCode::kBadRequest);
      EXPECT_FALSE(protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes).ok());
    }
  }
  auto c = h.Connect();
  auto b = c->Next(milliseconds(5000));
  ASSERT_OK(b);
  h.ExpectBatchIsPlanned(*b);
  EXPECT_GE(h.Metric("meshload_client_connections_total{outcome=\"bad_hello\"}"), 1) << h.Metrics();
}

// A client of protocol version 3 (before named fields) gets the version
// error, in the header or in the hello's payload, and serving goes on.
TEST(Sidecar, AnOlderProtocolVersionGetsTheVersionError) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  std::string old_header = protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, 0});
  old_header[4] = 3;  // the header's version
  std::string old_payload = protocol::Encode(protocol::ClientHello{3, 1, 0});
  for (const std::string& hello : {old_header, old_payload}) {
    auto fd = protocol::ConnectSeqpacket(h.options_.socket_path);
    ASSERT_OK(fd);
    ASSERT_OK(protocol::SendMessage(fd->get(), hello));
    auto reply = protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes);
    ASSERT_OK(reply);
    auto m = protocol::Decode(reply->bytes);
    ASSERT_OK(m);
    const auto& err = std::get<protocol::ErrorMessage>(*m);
    EXPECT_EQ(err.code, protocol::ErrorCode::kVersionMismatch);
    EXPECT_EQ(err.message, "this sidecar speaks protocol version 4");
  }
  auto c = h.Connect();
  ASSERT_OK(c->Next(milliseconds(5000)));
}

// A connection that never says CLIENT_HELLO holds the socket for the hello
// timeout (5 s, on a simulated clock), no longer: then a trainer gets in.
TEST(Sidecar, AConnectionThatNeverSaysHelloIsDroppedAfterTheHelloTimeout) {
  SimulatedClock clock;  // outlives the sidecar
  SidecarHarness h;
  h.options_.clock = &clock;
  ASSERT_OK(h.Start());
  auto silent = protocol::ConnectSeqpacket(h.options_.socket_path);
  ASSERT_OK(silent);
  // A reply to a second connection, in at most 20 s of real time.
  auto reply_to_another = [&]() -> std::optional<protocol::ErrorMessage> {
    auto fd = protocol::ConnectSeqpacket(h.options_.socket_path);
    if (!fd.ok()) return std::nullopt;
    pollfd p{fd->get(), POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return std::nullopt;
    auto got = protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes);
    if (!got.ok()) return std::nullopt;
    auto m = protocol::Decode(got->bytes);
    if (!m.ok() || !std::holds_alternative<protocol::ErrorMessage>(*m)) return std::nullopt;
    return std::get<protocol::ErrorMessage>(*m);
  };
  // Another connection is refused as busy: the silent one was accepted
  // (its 5 s run from now).
  auto busy = reply_to_another();
  ASSERT_TRUE(busy) << "no answer to a second connection";
  EXPECT_EQ(busy->code, protocol::ErrorCode::kBusy);
  // 4.9 s on it still has the socket: the sidecar looks at the timeout
  // after each connection it refuses, so the second of these two was
  // refused after a look at 4.9 s.
  clock.Advance(milliseconds(4900));
  for (int i = 0; i < 2; ++i) {
    busy = reply_to_another();
    ASSERT_TRUE(busy && busy->code == protocol::ErrorCode::kBusy) << "dropped before its 5 s";
  }
  EXPECT_LT(h.Metric("meshload_client_connections_total{outcome=\"bad_hello\"}"), 1);
  // Past 5 s: it is dropped (hung up on, counted), and a trainer gets in.
  clock.Advance(milliseconds(200));
  pollfd hup{silent->get(), POLLIN, 0};
  ASSERT_EQ(::poll(&hup, 1, 20000), 1) << "the silent connection was not dropped";
  EXPECT_TRUE(hup.revents & POLLHUP);
  EXPECT_EQ(h.Metric("meshload_client_connections_total{outcome=\"bad_hello\"}"), 1);
  auto c = h.Connect();
  auto b = c->Next(milliseconds(5000));
  ASSERT_OK(b);
  h.ExpectBatchIsPlanned(*b);
}

TEST(Sidecar, AFileTruncatedWhileServingReachesTheTrainerAsAClearError) {
  SidecarHarness h(/*prefetch=*/1);
  ASSERT_OK(h.Start());
  auto c = h.Connect();
  auto b = c->Next(milliseconds(5000));
  ASSERT_OK(b);
  const std::string file = h.uri_ + "/part-00001.bin";
  ASSERT_EQ(::truncate(file.c_str(), 1000), 0);
  Status last;
  b = Status(StatusCode::kUnavailable, "released");  // let the producer go on
  for (int i = 0; i < 40 && last.ok(); ++i) {
    auto n = c->Next(milliseconds(5000));
    if (!n.ok()) last = n.status();
  }
  ASSERT_FALSE(last.ok());
  EXPECT_THAT(last, StatusIs(StatusCode::kDataLoss, HasSubstr(file + "@")));
  // The sidecar stays up to say why: /healthz is 503 with the reason, and a
  // trainer that connects now is told the same; stopped, it exits 1.
  httplib::Client http("127.0.0.1", h.sidecar_->metrics_port());
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, HasSubstr(file));
  auto late = client::Client::Connect(NoRetry(h.options_.socket_path));
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr("short read")) << late.status().ToString();
  h.Stop();
  EXPECT_EQ(h.rc_, 1);
}

// An HTTP object store stand-in with range support and injectable faults.
class RangeServer {
 public:
  explicit RangeServer(std::string body) : body_(std::move(body)) {
    server_.Get("/data.bin", [this](const httplib::Request&, httplib::Response& res) {
      ++requests_;
      if (stall_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_.load()));  // a slow store
      if (fail_next_ > 0) {
        --fail_next_;
        res.status = 500;
        return;
      }
      // httplib answers a Range request with 206 and Content-Range itself.
      res.set_content(body_, "application/octet-stream");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(WaitFor([&] { return server_.is_running(); }, seconds(10))) << "the range server did not start";
  }
  ~RangeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/data.bin"; }
  std::atomic<int> fail_next_{0};
  std::atomic<int> requests_{0};
  std::atomic<int> stall_ms_{0};  // every GET hangs this long

 private:
  std::string body_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// The bytes of a one-file synthetic dataset in `dir` (what the harness's job
// describes: 320 records of 512 bytes), to serve over HTTP.
std::string GeneratedDatasetBytes(const TempDir& dir) {
  EXPECT_OK(FixedRecordDataset(dir.path(), 512, 320, 1));
  std::ifstream in(dir.path() + "/part-00000.bin", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(Sidecar, ServesAnHttpDatasetAndRetriesServerErrors) {
  TempDir data;
  RangeServer server(GeneratedDatasetBytes(data));
  SidecarHarness h(3, {}, server.url());
  ASSERT_OK(h.Start());
  server.fail_next_ = 2;  // the next two requests fail with 500
  auto c = h.Connect(/*start=*/5);
  // The reference plan reads the same bytes from the local copy.
  h.job_path_ = h.dir_.Write("local.yaml", JobYaml(data.path(), 3));
  for (int i = 0; i < 8; ++i) {
    auto b = c->Next(milliseconds(5000));
    ASSERT_OK(b);
    h.ExpectBatchIsPlanned(*b);
  }
  EXPECT_EQ(h.Metric("meshload_storage_retries_total{reason=\"http_5xx\",source=\"http\"}"), 2);
  EXPECT_GT(h.Metric("meshload_bytes_read_total{source=\"http\"}"), 0);
}

TEST(Sidecar, AStuckStorageReadIsVisibleWithinSecondsInMetricsAndLogs) {
  TempDir data;
  RangeServer server(GeneratedDatasetBytes(data));
  SidecarHarness h(3, {}, server.url());
  h.options_.source_options.read_timeout = milliseconds(5000);
  server.stall_ms_ = 1500;  // every read hangs 1.5 s; the report comes after 0.3 s
  ::testing::internal::CaptureStderr();
  ASSERT_OK(h.Start());
  double oldest = 0;
  (void)WaitFor([&] { return (oldest = h.Metric("meshload_oldest_inflight_read_seconds")) >= 0.5; }, seconds(20),
                milliseconds(50));
  EXPECT_GE(oldest, 0.5);
  // The watchdog (every 0.5 s) has reported it: it logs, then counts the error.
  EXPECT_TRUE(WaitFor([&] { return h.Metric("meshload_errors_total{kind=\"read_stalled\"}") >= 1; }, seconds(20)))
      << "no stuck read was reported";
  server.stall_ms_ = 0;
  h.Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("\"msg\":\"storage read stuck\""));
  EXPECT_THAT(log, HasSubstr("\"object\":\"" + server.url() + "\""));
}

TEST(Sidecar, AnHttpDatasetThatIsNotThereFailsFastAtStart) {
  RangeServer server("x");
  SidecarHarness h(3, {}, server.url() + ".missing", 320);
  auto st = h.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.ToString(), HasSubstr("404"));
  EXPECT_EQ(server.requests_, 0);  // HEAD requests are not counted by the GET handler
}

// The scheduling policy (proc(5) stat field 41) of this process's threads
// whose name starts with `prefix`, once `want` of them are there.
std::vector<int> PoliciesOf(const std::string& prefix, size_t want) {
  std::vector<int> out;
  (void)WaitFor(
      [&] {
        out.clear();
        std::error_code ec;
        for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
          std::ifstream comm(task.path() / "comm");
          std::string name;
          std::getline(comm, name);
          if (name.rfind(prefix, 0) != 0) continue;
          std::ifstream stat(task.path() / "stat");
          std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
          std::istringstream rest(all.substr(all.rfind(')') + 2));
          std::string field;
          for (int i = 3; rest >> field; ++i) {
            if (i == 41) out.push_back(std::stoi(field));
          }
        }
        return out.size() >= want;
      },
      seconds(10), milliseconds(10));
  return out;
}

TEST(Sidecar, TheDataPathThreadsRunAsBatchUnlessToldOtherwise) {
  for (const ThreadSched sched : {ThreadSched::kBatch, ThreadSched::kNormal}) {
    SCOPED_TRACE(ToString(sched));
    const int want = sched == ThreadSched::kBatch ? SCHED_BATCH : SCHED_OTHER;
    SidecarHarness h;
    h.options_.thread_sched = sched;
    h.options_.staging_threads = 2;
    h.options_.reader_threads = 3;
    // "normal" must hold even when the sidecar inherits batch (`chrt -b`):
    // its threads are then created in batch.
    if (sched == ThreadSched::kNormal) {
      ASSERT_OK(SetCurrentThreadSched(ThreadSched::kBatch));
    }
    Status started = h.Start();
    ASSERT_OK(SetCurrentThreadSched(ThreadSched::kNormal));
    ASSERT_OK(started);
    auto c = h.Connect();  // served: the producers have started
    ASSERT_TRUE(c);
    ASSERT_OK(c->Next());
    EXPECT_EQ(PoliciesOf("ml-stage-", 2), std::vector<int>(2, want));
    // The loader's readers: the producer is one of the reader_threads.
    EXPECT_EQ(PoliciesOf("ml-read", 2), std::vector<int>(2, want));
    int policy = -1;
    sched_param param{};
    ASSERT_EQ(::pthread_getschedparam(h.thread_.native_handle(), &policy, &param), 0);
    EXPECT_EQ(policy, want) << "the server loop";
  }
}

TEST(Sidecar, ReadinessWaitsForTheFirstBatch) {
  SidecarHarness h;
  ASSERT_OK(h.Start());
  httplib::Client http("127.0.0.1", h.sidecar_->metrics_port());
  int status = 0;
  (void)WaitFor(
      [&] {
        auto r = http.Get("/readyz");
        status = r ? r->status : 0;
        return status == 200;
      },
      seconds(20), milliseconds(10));
  EXPECT_EQ(status, 200);
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(Sidecar, ATrainerThatNeverReadsCannotStallTheSidecar) {
  // 600 slots: far more READYs than a socket queue holds. The trainer takes
  // SERVER_HELLO and reads nothing more; staging and stopping go on.
  SidecarHarness h(/*prefetch=*/600, {}, {}, /*samples=*/9600);
  ASSERT_OK(h.Start());
  auto fd = protocol::ConnectSeqpacket(h.options_.socket_path);
  ASSERT_OK(fd);
  ASSERT_OK(
      protocol::SendMessage(fd->get(), protocol::Encode(protocol::ClientHello{protocol::kProtocolVersion, 1, 0})));
  ASSERT_OK(protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes));
  // Every slot staged (the READYs the sidecar may send queued in the socket, the rest ready).
  EXPECT_TRUE(WaitFor(
      [&] {
        return h.Metric("meshload_slots{state=\"free\"}") == 0 && h.Metric("meshload_slots{state=\"filling\"}") == 0;
      },
      seconds(30)))
      << "staging did not go on: " << h.Metrics();
  const auto t0 = std::chrono::steady_clock::now();
  h.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(Sidecar, ATrainerOfAWideJobIsNeverSentMoreReadysThanItsSocketHolds) {
  // 16 local devices: a READY of about 1 KiB, of which a socket queue holds
  // far fewer than 128. A trainer that is slow to read (it waits 500 ms
  // here) must not be dropped for it: the sidecar sends at most half of
  // what the queue holds, measured at start-up.
  TempDir dir;
  auto uri = FixedRecordDataset(dir.path() + "/data", 64, 4096, 1);
  ASSERT_OK(uri);
  const std::string job = dir.Write(
      "job.yaml",
      NamedJobYaml("wide",
                   "  mesh:\n    processes: 1\n    devicesPerProcess: 16\n    axes: [{name: data, size: 16}]\n"
                   "  strategy: PerProcess\n"
                   "  dataset:\n    uri: " +
                       *uri +
                       "\n    format: FixedRecord\n    recordBytes: 64\n"
                       "  batch: {globalBatchSize: 16, prefetch: 200}\n"));
  SidecarOptions o;
  o.job_path = job;
  o.process = 0;
  o.socket_path = dir.path() + "/s.sock";
  o.staging = "host";
  auto sc = Sidecar::Create(testing::MustLoad(job), o);
  ASSERT_OK(sc);
  int rc = -1;
  std::thread run([&] { rc = (*sc)->Run(); });
  {
    RawTrainer t(o.socket_path);
    // The trainer slow to read (the case under test): meanwhile every slot
    // is staged and the READYs are queued.
    std::this_thread::sleep_for(milliseconds(500));
    int readys = 0;
    while (true) {
      pollfd p{t.fd(), POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) break;
      auto got = protocol::ReceiveMessage(t.fd(), protocol::kMaxMessageBytes);
      ASSERT_OK(got) << "the sidecar dropped a trainer that was only slow to read: " << got.status().ToString();
      auto m = protocol::Decode(got->bytes);
      ASSERT_OK(m);
      ASSERT_TRUE(std::holds_alternative<protocol::Ready>(*m)) << "expected READYs only";
      ++readys;
    }
    EXPECT_GE(readys, 8);
    EXPECT_LT(readys, 128);  // the fixed cap alone would have overflowed the queue
  }
  (*sc)->RequestStop();
  run.join();
  EXPECT_EQ(rc, 0);
}

// A stand-in sidecar that answers the handshake with whatever the test says.
class FakeSidecar {
 public:
  FakeSidecar(std::string path, protocol::ServerHello hello, std::vector<protocol::Message> then, bool seal = true)
      : path_(std::move(path)) {
    listen_ = protocol::ListenSeqpacket(path_).value();
    thread_ = std::thread([this, hello, then, seal] {
      auto fd = protocol::Accept(listen_.get());
      while (!fd.ok()) fd = protocol::Accept(listen_.get());
      (void)protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes);
      int mem = ::memfd_create("fake-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      EXPECT_EQ(::ftruncate(mem, static_cast<off_t>(hello.pool_bytes)), 0);
      if (seal) ::fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
      (void)protocol::SendMessage(fd->get(), protocol::Encode(hello), {mem});
      ::close(mem);
      for (const auto& m : then) (void)protocol::SendMessage(fd->get(), protocol::Encode(m));
      while (protocol::ReceiveMessage(fd->get(), protocol::kMaxMessageBytes).ok()) {
      }  // until the client closes (a BYE comes first)
      client_gone_ = true;
    });
  }
  ~FakeSidecar() { thread_.join(); }
  bool client_gone() const { return client_gone_.load(); }

 private:
  std::atomic<bool> client_gone_{false};
  std::string path_;
  UniqueFd listen_;
  std::thread thread_;
};

protocol::ServerHello OneDeviceHello() {
  protocol::ServerHello h;
  h.job = "fake";
  h.devices = {{0, 1, ""}};
  h.slots = 1;
  h.slot_bytes = 4096;
  h.pool_bytes = 4096;
  h.fd_count = 1;
  h.layout = {{0, 1, 8, {4, 16}, {16, 1}, 64, {}}};
  h.mesh = {1, 1, {{"data", 1}}, {"data"}};
  return h;
}

TEST(Client, RefusesReadyTensorsThatAreNotCompactOrOverflow) {
  TempDir dir;
  for (const protocol::TensorReady& bad : {protocol::TensorReady{0, 1, 8, {4, 16}, {1099511627776, 1}, 0, {}},
                                           protocol::TensorReady{0, 2, 64, {int64_t{1} << 61}, {1}, 0, {}}}) {
    const std::string sock = dir.path() + "/fake-" + std::to_string(bad.dtype_bits) + ".sock";
    FakeSidecar fake(sock, OneDeviceHello(), {protocol::Ready{0, 0, {bad}}});
    auto c = client::Client::Connect(NoRetry(sock));
    ASSERT_OK(c);
    auto b = (*c)->Next(milliseconds(2000));
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().ToString();
    (*c)->Close();
  }
}

// A ragged READY must be the ragged tensor SERVER_HELLO described: the same
// offsets, at most its samples (fewer when some were skipped), its values
// within the room.
TEST(Client, RefusesARaggedReadyThatIsNotTheTensorTheHelloDescribed) {
  TempDir dir;
  protocol::ServerHello hello = OneDeviceHello();
  hello.layout = {{256, 1, 16, {1000}, {1}, 2000, protocol::RaggedInfo{0, 4}}};
  const protocol::TensorReady good{256, 1, 16, {700}, {1}, 0, protocol::RaggedInfo{0, 4}};
  int n = 0;
  for (const protocol::TensorReady& bad :
       {protocol::TensorReady{256, 1, 16, {700}, {1}, 0, {}},
        protocol::TensorReady{256, 1, 16, {1001}, {1}, 0, protocol::RaggedInfo{0, 4}},
        protocol::TensorReady{256, 1, 16, {700}, {1}, 0, protocol::RaggedInfo{8, 4}},
        protocol::TensorReady{256, 1, 16, {700}, {1}, 0, protocol::RaggedInfo{0, 5}},
        protocol::TensorReady{256, 2, 16, {700}, {1}, 0, protocol::RaggedInfo{0, 4}}}) {
    const std::string sock = dir.path() + "/fake-" + std::to_string(n++) + ".sock";
    FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {bad}}});
    auto c = client::Client::Connect(NoRetry(sock));
    ASSERT_OK(c);
    auto b = (*c)->Next(milliseconds(2000));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.status().ToString(), HasSubstr("is not the ragged tensor SERVER_HELLO described"));
    (*c)->Close();
  }
  const std::string sock = dir.path() + "/fake-good.sock";
  FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {good}}});
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_OK(c);
  auto b = (*c)->Next(milliseconds(2000));
  ASSERT_OK(b);
  ASSERT_EQ(b->tensors.size(), 1u);
  const client::Tensor& t = b->tensors[0];
  EXPECT_EQ(t.samples, 4u);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.offsets) + 256, static_cast<const uint8_t*>(t.data));
  EXPECT_EQ(t.nbytes, 1400u);
  (*c)->Close();
}

// A batch of named fields (WebDataset, MDS): a tensor per (device, field),
// each named; a dense field may hold fewer rows than the layout (skipped
// samples), never more, nor another row shape or dtype.
TEST(Client, ABatchOfNamedFieldsHasATensorPerFieldAndRefusesOthers) {
  TempDir dir;
  protocol::ServerHello hello = OneDeviceHello();
  hello.fields = {"jpg", "cls"};
  hello.layout = {{256, 1, 8, {1000}, {1}, 1000, protocol::RaggedInfo{0, 4}}, {1280, 0, 64, {4}, {1}, 32, {}}};
  const protocol::TensorReady jpg{256, 1, 8, {600}, {1}, 0, protocol::RaggedInfo{0, 3}};
  int n = 0;
  for (const protocol::TensorReady& bad :
       {protocol::TensorReady{1280, 0, 64, {5}, {1}, 0, {}}, protocol::TensorReady{1280, 0, 32, {4}, {1}, 0, {}},
        protocol::TensorReady{1280, 0, 64, {2, 2}, {2, 1}, 0, {}},
        protocol::TensorReady{1288, 0, 64, {3}, {1}, 0, {}}}) {
    const std::string sock = dir.path() + "/fake-" + std::to_string(n++) + ".sock";
    FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {jpg, bad}}});
    auto c = client::Client::Connect(NoRetry(sock));
    ASSERT_OK(c);
    auto b = (*c)->Next(milliseconds(2000));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.status().ToString(), HasSubstr("is not the dense tensor SERVER_HELLO described"));
    (*c)->Close();
  }
  {
    const std::string sock = dir.path() + "/fake-one.sock";
    FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {jpg}}});
    auto c = client::Client::Connect(NoRetry(sock));
    ASSERT_OK(c);
    auto b = (*c)->Next(milliseconds(2000));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.status().ToString(), HasSubstr("READY has 1 tensors; SERVER_HELLO described 2"));
    (*c)->Close();
  }
  const std::string sock = dir.path() + "/fake-good.sock";
  FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {jpg, protocol::TensorReady{1280, 0, 64, {3}, {1}, 0, {}}}}});
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_OK(c);
  auto b = (*c)->Next(milliseconds(2000));
  ASSERT_OK(b);
  ASSERT_EQ(b->tensors.size(), 2u);
  EXPECT_EQ(b->tensors[0].field, "jpg");
  EXPECT_EQ(b->tensors[0].samples, 3u);
  EXPECT_EQ(b->tensors[1].field, "cls");
  EXPECT_EQ(b->tensors[1].shape, std::vector<int64_t>{3});
  EXPECT_EQ(b->tensors[1].offsets, nullptr);
  (*c)->Close();
}

TEST(Client, AReadyItCannotAcceptClosesTheConnectionSoTheSidecarTakesItsSlotsBack) {
  // Without closing, the client would stay connected and out of step:
  // every later READY refused, the slots never given back.
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  FakeSidecar fake(sock, OneDeviceHello(), {protocol::Ready{5, 0, {}}});  // step 5 where 0 is due
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_OK(c);
  auto b = (*c)->Next(milliseconds(2000));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().ToString();
  (void)WaitFor([&] { return fake.client_gone(); }, seconds(10));
  EXPECT_TRUE(fake.client_gone()) << "the client kept the connection after a READY it refused";
  EXPECT_EQ((*c)->next_step(), 0);  // a reconnect asks for step 0 again
}

TEST(Client, AHandshakeThatGetsNoAnswerEndsAtTheCallersTimeout) {
  // The sidecar says it is stopping; where it listened, something accepts
  // and never answers. Next(300 ms) must give up at its timeout, not after
  // the 5 s a handshake may otherwise take.
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  FakeSidecar fake(sock, OneDeviceHello(),
                   {protocol::ErrorMessage{protocol::ErrorCode::kShuttingDown, "the sidecar is stopping"}});
  client::ClientOptions o;
  o.socket_path = sock;
  o.max_reconnect_attempts = 100;
  o.reconnect_backoff_initial = milliseconds(1);
  o.reconnect_backoff_max = milliseconds(2);
  auto c = client::Client::Connect(o);
  ASSERT_OK(c);
  ASSERT_EQ(::unlink(sock.c_str()), 0);
  auto silent = protocol::ListenSeqpacket(sock);  // never accepts
  ASSERT_OK(silent);
  const auto t0 = std::chrono::steady_clock::now();
  auto b = (*c)->Next(milliseconds(300));
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kDeadlineExceeded) << b.status().ToString();
  EXPECT_LT(elapsed, milliseconds(2000));
  (*c)->Close();
}

TEST(Client, RefusesAPoolThatIsNotSealedAgainstShrinking) {
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  FakeSidecar fake(sock, OneDeviceHello(), {}, /*seal=*/false);
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("not sealed")) << c.status().ToString();
}

TEST(Client, RefusesAReadyForASlotALiveBatchStillHolds) {
  // Two batches in one slot: the first one's bytes would change under it.
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  protocol::ServerHello hello = OneDeviceHello();
  hello.slots = 2;
  hello.pool_bytes = 8192;
  const protocol::TensorReady t{0, 1, 8, {4, 16}, {16, 1}, 0, {}};
  FakeSidecar fake(sock, hello, {protocol::Ready{0, 0, {t}}, protocol::Ready{1, 0, {t}}});
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_OK(c);
  auto first = (*c)->Next(milliseconds(2000));
  ASSERT_OK(first);
  auto second = (*c)->Next(milliseconds(2000));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second, StatusIs(StatusCode::kInvalidArgument, HasSubstr("slot 0, which a live batch still holds")));
}

TEST(Client, RefusesASidecarThatStartsAtAnotherStepThanAskedFor) {
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  protocol::ServerHello hello = OneDeviceHello();
  hello.first_step = 7;
  FakeSidecar fake(sock, hello, {});
  client::ClientOptions o = NoRetry(sock);
  o.start_step = 3;
  auto c = client::Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c, StatusIs(StatusCode::kInvalidArgument, HasSubstr("starts at step 7, step 3 was asked for")));
}

TEST(Client, AFullListenQueueIsUnavailableNotABlockedConnect) {
  // A sidecar that stopped accepting (it is stopping, or stuck): connect()
  // must not block the trainer past its timeout and its signals.
  TempDir dir;
  const std::string sock = dir.path() + "/full.sock";
  auto listener = protocol::ListenSeqpacket(sock);  // never accepts
  ASSERT_OK(listener);
  std::vector<UniqueFd> queued;
  Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    auto fd = protocol::ConnectSeqpacket(sock);
    if (fd.ok()) {
      queued.push_back(std::move(*fd));
    } else {
      refused = fd.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "64 connections queued on a listener with a backlog of 8";
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnavailable, HasSubstr("listen queue is full")));
  // A queued connection is an ordinary blocking socket.
  ASSERT_FALSE(queued.empty());
  EXPECT_EQ(::fcntl(queued[0].get(), F_GETFL) & O_NONBLOCK, 0);
}

TEST(Client, InterruptWakesANextWaitingInAnotherThread) {
  TempDir dir;
  const std::string sock = dir.path() + "/fake.sock";
  FakeSidecar fake(sock, OneDeviceHello(), {});  // never sends a READY
  auto c = client::Client::Connect(NoRetry(sock));
  ASSERT_OK(c);
  Status got;
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  std::thread reader([&] {
    tid = CurrentThreadId();
    got = (*c)->Next().status();
    returned = true;
  });
  // The reader waits in Next (or, wrongly, is back already).
  EXPECT_TRUE(WaitFor([&] { return returned || (tid != 0 && ThreadIsAsleep(tid)); }, seconds(10)));
  const auto t0 = std::chrono::steady_clock::now();
  (*c)->Interrupt();
  reader.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  EXPECT_THAT(got, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("closed")));
  EXPECT_EQ((*c)->Next(milliseconds(10)).status().code(), StatusCode::kFailedPrecondition);
  (*c)->Close();
}

// The real binary, killed and restarted under a connected trainer.
TEST(SidecarProcess, ARestartedSidecarResumesTheTrainerWithIdenticalBytes) {
  SidecarHarness h;  // only for its dataset, job and checks
  auto spawn = [&]() {
    std::vector<std::string> args = {MESHLOAD_SIDECAR_BIN,   "--job",       h.job_path_, "--process", "1",   "--socket",
                                     h.options_.socket_path, "--log-level", "warn",      "--staging", "host"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    return pid;
  };
  pid_t pid = spawn();
  client::ClientOptions o;
  o.socket_path = h.options_.socket_path;
  o.max_reconnect_attempts = 8;  // 20 ms doubling: about 5 s in all
  o.reconnect_backoff_initial = milliseconds(20);
  auto connected = client::Client::Connect(o);
  ASSERT_OK(connected);
  auto& c = *connected;
  for (int64_t step = 0; step < 4; ++step) {
    auto b = c->Next(milliseconds(10000));
    ASSERT_OK(b);
    h.ExpectBatchIsPlanned(*b);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  pid = spawn();
  for (int64_t step = 4; step < 10; ++step) {
    auto b = c->Next(milliseconds(10000));
    ASSERT_OK(b);
    EXPECT_EQ(b->step, step);
    h.ExpectBatchIsPlanned(*b);
  }
  EXPECT_EQ(c->reconnects(), 1);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  // While it reconnects, Next() keeps to its timeout (after the READYs
  // still queued in the socket).
  auto t0 = std::chrono::steady_clock::now();
  auto late = c->Next(milliseconds(200));
  auto took = std::chrono::steady_clock::now() - t0;
  for (int i = 0; i < 8 && late.ok(); ++i) {
    t0 = std::chrono::steady_clock::now();
    late = c->Next(milliseconds(200));
    took = std::chrono::steady_clock::now() - t0;
  }
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late, StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("still reconnecting to the sidecar")));
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LT(took, milliseconds(1500));
  // Gone for good: a clear error after the bounded reconnects.
  auto gone = c->Next(milliseconds(10000));
  for (int i = 0; i < 5 && gone.ok(); ++i) gone = c->Next(milliseconds(10000));
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(gone, StatusIs(StatusCode::kUnavailable, HasSubstr("the sidecar is gone")));
}

// Two sidecar processes of a job that moves samples between them exchange
// over TCP; one (`victim`) is killed and started again. Its peer waits for
// it (it does not fail its steps), both trainers go on from where they were,
// and every byte of every batch is the planned one.
void RestartOneSidecarOfAMovingJob(const std::string& strategy, const std::string& fanout, int victim) {
  TempDir dir;
  auto uri = FixedRecordDataset(dir.path() + "/data", 512, 400, 2);
  ASSERT_OK(uri);
  const std::string job_path = dir.Write(
      "job.yaml", NamedJobYaml("peers-restart",
                               "  mesh:\n    processes: 2\n    devicesPerProcess: 2\n"
                               "    axes: [{name: model, size: 2}, {name: data, size: 2}]\n    batchAxes: [data]\n"
                               "  replication: {mode: Partial, fanout: " +
                                   fanout + "}\n  strategy: " + strategy +
                                   "\n"
                                   "  dataset: {uri: " +
                                   *uri +
                                   ", format: FixedRecord, recordBytes: 512}\n"
                                   "  batch: {globalBatchSize: 8, prefetch: 3}\n  shuffle: {mode: Global, seed: 9}\n"));
  Diagnostics d;
  auto resolved = source::ResolveReadingDataset(testing::MustLoad(job_path), {}, source::Unreachable::kFail, d);
  ASSERT_OK(resolved) << d.ToString();
  planner::ShardPlanner planner(std::move(*resolved));
  // Each sidecar's peer socket stays open here, so a restarted sidecar
  // listens on the same port (as a restarted container keeps its pod's IP).
  int listen_fd[2];
  std::string peers;
  for (int p = 0; p < 2; ++p) {
    auto l = ListenLoopback();
    ASSERT_OK(l);
    listen_fd[p] = l->first.Release();
    peers += (p ? "," : "") + std::string("127.0.0.1:") + std::to_string(l->second);
  }
  // Authenticated, as a job should be: a restarted sidecar proves itself again.
  const std::string secret = dir.Write("peer-secret", "a secret of this test's, 40 bytes long..\n");
  auto spawn = [&](int p, const std::string& log) {
    std::vector<std::string> args = {MESHLOAD_SIDECAR_BIN,
                                     "--job",
                                     job_path,
                                     "--process",
                                     std::to_string(p),
                                     "--socket",
                                     dir.path() + "/s" + std::to_string(p) + ".sock",
                                     "--peers",
                                     peers,
                                     "--peer-listen-fd",
                                     "3",
                                     "--peer-reconnect-timeout",
                                     "30",
                                     "--peer-secret-file",
                                     secret,
                                     "--metrics-port",
                                     "0",
                                     "--metrics-address",
                                     "127.0.0.1",
                                     "--staging",
                                     "host",
                                     "--log-level",
                                     "info"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, listen_fd[p], 3);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(log_fd);
    return pid;
  };
  pid_t pid[2] = {spawn(0, dir.path() + "/s0.log"), spawn(1, dir.path() + "/s1.log")};
  struct Reaper {  // no sidecar outlives a failed assertion; a failure shows their logs
    pid_t* pid;
    std::string dir;
    ~Reaper() {
      for (int p = 0; p < 2; ++p) {
        if (pid[p] > 0 && ::kill(pid[p], SIGKILL) == 0) ::waitpid(pid[p], nullptr, 0);
      }
      if (!::testing::Test::HasFailure()) return;
      for (int p = 0; p < 2; ++p) {
        std::ifstream log(dir + "/s" + std::to_string(p) + ".log");
        std::cerr << "---- sidecar " << p << " log\n" << log.rdbuf() << "\n";
      }
    }
  } reaper{pid, dir.path()};
  std::unique_ptr<client::Client> c[2];
  for (int p = 0; p < 2; ++p) {
    client::ClientOptions o;
    o.socket_path = dir.path() + "/s" + std::to_string(p) + ".sock";
    o.max_reconnect_attempts = 9;  // 20 ms doubling: about 10 s in all
    o.reconnect_backoff_initial = milliseconds(20);
    auto connected = client::Client::Connect(o);
    ASSERT_OK(connected);
    c[p] = std::move(*connected);
  }
  auto check = [&](int p, int64_t step) {
    auto b = c[p]->Next(milliseconds(20000));
    ASSERT_OK(b) << "process " << p << " step " << step << ": " << b.status().ToString();
    ASSERT_EQ(b->step, step);
    const planner::StepPlan plan = planner.PlanStep(step, planner.DefaultLoading(), p);
    ASSERT_EQ(b->tensors.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& ids = plan.devices[i].samples;
      ASSERT_EQ(b->tensors[i].ids_checksum, protocol::SampleIdsChecksum(ids.data(), ids.size()));
      for (size_t k = 0; k < ids.size(); ++k) {
        ASSERT_EQ(tools::FirstMismatch(planner.job().dataset, ids[k],
                                       static_cast<const uint8_t*>(b->tensors[i].data) + k * 512),
                  -1)
            << "process " << p << " step " << step << " device " << i << " sample " << ids[k];
      }
    }
  };
  // Each trainer on its own thread, as trainers run (one that waits on its
  // batch must not keep the other from reconnecting).
  auto consume = [&](int64_t from, int64_t to) {
    std::thread t[2];
    for (int p = 0; p < 2; ++p) {
      t[p] = std::thread([&, p] {
        for (int64_t step = from; step < to && !::testing::Test::HasFatalFailure(); ++step) check(p, step);
      });
    }
    for (auto& th : t) th.join();
  };
  consume(0, 6);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int other = 1 - victim;
  ::kill(pid[victim], SIGKILL);
  ::waitpid(pid[victim], nullptr, 0);
  // The other notices, and waits for it: the wait measured below, so a fixed time.
  std::this_thread::sleep_for(milliseconds(300));
  pid[victim] = spawn(victim, dir.path() + "/s" + std::to_string(victim) + ".log");
  consume(6, 30);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(c[victim]->reconnects(), 1);
  EXPECT_EQ(c[other]->reconnects(), 0) << "that sidecar never went away";
  // The sidecar that waited says so in its /progress: the share of its
  // staging time spent waiting on its peer (what tells the controller that
  // the exchange, not its storage or staging, held it up).
  {
    std::ifstream log(dir.path() + "/s" + std::to_string(other) + ".log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex("\"metrics_port\":([0-9]+)"))) << text;
    httplib::Client http("127.0.0.1", std::stoi(m[1].str()));
    auto r = http.Get("/progress");
    ASSERT_TRUE(r && r->status == 200);
    const nlohmann::json progress = nlohmann::json::parse(r->body);
    ASSERT_TRUE(progress["peerWaitFraction"].is_number()) << r->body;
    ASSERT_TRUE(progress["stagingSecondsPerStep"].is_number()) << r->body;
    // It waited at least 300 ms for its restarted peer; its own reads of 30
    // steps of 512-byte records take a few milliseconds.
    EXPECT_GT(progress["peerWaitFraction"].get<double>(), 0.5) << r->body;
    EXPECT_LE(progress["peerWaitFraction"].get<double>(), 1.0) << r->body;
  }
  for (int p = 0; p < 2; ++p) {
    c[p]->Close();
    ::kill(pid[p], SIGTERM);
    ::waitpid(pid[p], nullptr, 0);
    pid[p] = -1;
    ::close(listen_fd[p]);
  }
  std::ifstream log(dir.path() + "/s" + std::to_string(other) + ".log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("lost a peer; waiting for it to come back"));
  EXPECT_THAT(text, HasSubstr("peer reconnected"));
  EXPECT_THAT(text, Not(HasSubstr("peer connection failed")));
}

TEST(SidecarProcess, ARestartedBroadcastSenderRejoinsItsReceiver) {
  RestartOneSidecarOfAMovingJob("PerProcess", "Broadcast", 0);
}

TEST(SidecarProcess, ARestartedBroadcastReceiverIsDialledAgain) {
  RestartOneSidecarOfAMovingJob("PerProcess", "Broadcast", 1);
}

TEST(SidecarProcess, ARestartedSidecarOfALoadAndReshardJobRejoins) {
  RestartOneSidecarOfAMovingJob("LoadAndReshard", "Load", 0);
}

}  // namespace
}  // namespace meshload::sidecar
