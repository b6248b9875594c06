#include "sidecar/step_loader.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <filesystem>
#include <thread>

#include "common/loopback.h"
#include "sidecar/source/dataset_facts.h"
#include "protocol/protocol.h"
#include "tests/testing/job_fixtures.h"
#include "tools/synthetic_dataset.h"
#include "tests/testing/status_matchers.h"

namespace meshload::sidecar {
namespace {

using meshload::testing::StatusIs;
using meshload::testing::TempDir;
using planner::DatasetFormat;
using planner::ShuffleMode;
using planner::Strategy;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Case {
  DatasetFormat format;
  Strategy strategy;
  ShuffleMode shuffle;
  std::vector<planner::MeshAxis> axes;  // the batch is split along `data`
  int64_t devices_per_process;
};

planner::JobSpec SpecFor(const Case& c, const std::string& dir) {
  planner::JobSpec spec;
  spec.mesh.axes = c.axes;
  int64_t d = 1;
  for (const auto& a : c.axes) d *= a.size;
  spec.mesh.devices_per_process = c.devices_per_process;
  spec.mesh.processes = d / c.devices_per_process;
  spec.mesh.batch_axes = {"data"};
  spec.mesh.batch_axes_set = true;
  spec.strategy = c.strategy;
  spec.dataset.uri = dir;
  spec.dataset.format = c.format;
  switch (c.format) {
    case DatasetFormat::kFixedRecord: spec.dataset.record_bytes = 100; break;  // not a multiple of 8
    case DatasetFormat::kTokenStream:
      spec.dataset.dtype = formats::DType::kUint16;
      spec.dataset.sequence_length = 9;
      break;
    case DatasetFormat::kNpy:
      spec.dataset.dtype = formats::DType::kFloat32;
      spec.dataset.record_bytes = 64;
      break;
    case DatasetFormat::kMegatronIndexed: spec.dataset.dtype = formats::DType::kUint16; break;
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kMDS:
    case DatasetFormat::kTFRecord:
    case DatasetFormat::kParquet:
    case DatasetFormat::kArrow: break;  // not generated: the formats' own writers' files (RecordFormats below)
  }
  spec.batch.global_batch_size = 24;
  spec.shuffle.mode = c.shuffle;
  spec.shuffle.seed = 11;
  spec.shuffle.block_size = 5;
  return spec;
}

// A case of one process with one device: the whole batch is its shard.
Case OneDevice(DatasetFormat format, Strategy strategy, ShuffleMode shuffle) {
  return {format, strategy, shuffle, {{"data", 1}}, 1};
}

// Generates the dataset, resolves the job and returns a planner.
std::unique_ptr<planner::ShardPlanner> Prepare(const planner::JobSpec& spec_in, const std::string& dir,
                                               uint64_t samples, int files) {
  planner::JobSpec spec = spec_in;
  auto uri = tools::GenerateSyntheticDataset(spec.dataset, dir, samples, files);
  EXPECT_OK(uri);
  spec.dataset.uri = *uri;
  Diagnostics d;
  auto job = source::ResolveReadingDataset(testing::MustValidate(spec), {}, source::Unreachable::kFail, d);
  EXPECT_OK(job) << d.ToString() << job.status().ToString();
  return std::make_unique<planner::ShardPlanner>(std::move(*job));
}

// Prepare() for a case's spec as SpecFor() writes it.
std::unique_ptr<planner::ShardPlanner> Prepare(const Case& c, const TempDir& dir, uint64_t samples, int files) {
  return Prepare(SpecFor(c, dir.path()), dir.path(), samples, files);
}

void ExpectSlotMatchesPlan(const planner::ShardPlanner& planner, int64_t process, int64_t step, const uint8_t* slot,
                           const staging::BatchLayout& layout, const std::vector<staging::StagedTensor>& staged) {
  planner::StepPlan plan = planner.PlanStep(step, planner.DefaultLoading(), process);
  const planner::DatasetIndex& ds = planner.job().dataset;
  ASSERT_EQ(plan.devices.size(), layout.devices.size());
  ASSERT_EQ(staged.size(), layout.devices.size());
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const auto& ids = plan.devices[i].samples;
    EXPECT_EQ(staged[i].ids_checksum, protocol::SampleIdsChecksum(ids.data(), ids.size()));
    EXPECT_EQ(staged[i].values_bytes, std::vector<uint64_t>{ds.BytesOf(ids.data(), ids.size())});
    EXPECT_EQ(staged[i].samples, ids.size());
    // Ragged: the offsets (in elements) before the values, then the
    // samples back to back; dense: sample k at k × sample bytes.
    const staging::FieldLayout& field = layout.fields[0];
    const staging::FieldTensor& tensor = layout.devices[i].fields[0];
    const auto* offsets = reinterpret_cast<const int64_t*>(slot + tensor.offsets_offset);
    const uint64_t es = formats::DTypeSize(field.dtype);
    uint64_t at = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (field.ragged) {
        ASSERT_EQ(static_cast<uint64_t>(offsets[k]) * es, at) << "step " << step << " device " << i << " offset " << k;
      }
      const uint8_t* bytes = slot + tensor.offset + at;
      ASSERT_EQ(tools::FirstMismatch(ds, ids[k], bytes), -1)
          << "step " << step << " device " << i << " sample " << ids[k];
      at += field.ragged ? ds.SampleBytes(ids[k]) : field.sample_bytes;
    }
    if (field.ragged) {
      ASSERT_EQ(static_cast<uint64_t>(offsets[ids.size()]) * es, at) << "step " << step << " device " << i;
      EXPECT_LE(at, tensor.nbytes) << "the values fit their room";
    }
  }
}

// Loads `step` of `process` into `slot` and, where that worked, checks the
// slot holds the planned bytes. Returns the load's status.
Status LoadAndExpectPlanned(StepLoader& loader, const planner::ShardPlanner& planner, int64_t process,
                            const staging::BatchLayout& layout, int64_t step, uint8_t* slot,
                            StepLoadStats* stats = nullptr, int caller = 0) {
  std::vector<staging::StagedTensor> staged;
  Status st = loader.Load(step, slot, staged, stats, caller);
  if (st.ok()) ExpectSlotMatchesPlan(planner, process, step, slot, layout, staged);
  return st;
}

TEST(StepLoader, EveryFormatStrategyAndShuffleDeliversThePlannedBytes) {
  std::vector<Case> cases;
  for (DatasetFormat f : {DatasetFormat::kFixedRecord, DatasetFormat::kTokenStream, DatasetFormat::kNpy,
                          DatasetFormat::kMegatronIndexed}) {
    for (Strategy s : {Strategy::kGlobalLoad, Strategy::kPerDevice, Strategy::kPerProcess}) {
      for (ShuffleMode m : {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
        // 2 processes x 2 devices; `model` replicas inside each process.
        cases.push_back({f, s, m, {{"data", 2}, {"model", 2}}, 2});
        // 1 process x 4 devices, every device its own shard.
        cases.push_back({f, s, m, {{"data", 4}}, 4});
      }
    }
  }
  auto sources = source::SourceRegistry::WithBuiltins({});
  for (const Case& c : cases) {
    TempDir dir;
    auto planner = Prepare(c, dir, 100, 3);
    for (int64_t p = 0; p < planner->job().mesh.processes(); ++p) {
      const auto layout = staging::ComputeBatchLayout(planner->job(), p);
      StepLoaderOptions opts;
      opts.reader_threads = 3;
      opts.max_read_bytes = 150;  // split coalesced ranges often
      auto loader = StepLoader::Create(*planner, p, planner->DefaultLoading(), *sources, layout, opts);
      ASSERT_OK(loader);
      ASSERT_OK((*loader)->VerifyFiles());
      std::vector<uint8_t> slot(layout.slot_bytes);
      for (int64_t step = 0; step < 6; ++step) {
        StepLoadStats stats;
        ASSERT_OK(LoadAndExpectPlanned(**loader, *planner, p, layout, step, slot.data(), &stats));
        EXPECT_GT(stats.bytes_read, 0u);
      }
    }
  }
}

// The file source, recording the hints and reads it gets, in order.
class RecordingSource final : public source::Source {
 public:
  // `gap`: what a latency-bound source says a gap costs (GapWorthReading).
  explicit RecordingSource(std::unique_ptr<source::Source> real, bool latency_bound = false, uint64_t gap = 1 << 20)
      : real_(std::move(real)), latency_bound_(latency_bound), gap_(gap) {}
  bool LatencyBound() const override { return latency_bound_; }
  uint64_t GapWorthReading() const override { return latency_bound_ ? gap_ : 0; }
  struct Event {
    bool hint;
    std::string uri;
    uint64_t offset, length;
    size_t call;        // which Prefetch call (hints)
    int64_t step = -1;  // source::ReadingStep() on the reading thread (reads)
  };
  Result<source::ObjectInfo> Stat(const std::string& uri) override { return real_->Stat(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override {
    uint64_t n = 0;
    for (const iovec& v : iov) n += v.iov_len;
    {
      std::lock_guard lock(mu_);
      events_.push_back({false, uri, offset, n, 0, source::ReadingStep()});
    }
    return real_->ReadV(uri, offset, iov);
  }
  // Recorded, then run as the default does (a ReadV each, recorded too).
  Status ReadMany(const std::string& uri, const ReadRequest* reads, size_t count, BeforeRead before,
                  void* context) override {
    {
      std::lock_guard lock(mu_);
      batches_.push_back(count);
    }
    return Source::ReadMany(uri, reads, count, before, context);
  }
  std::vector<size_t> batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }
  void Prefetch(const std::string& uri, const Range* ranges, size_t count) override {
    {
      std::lock_guard lock(mu_);
      ++calls_;
      for (size_t i = 0; i < count; ++i) events_.push_back({true, uri, ranges[i].offset, ranges[i].length, calls_});
    }
    real_->Prefetch(uri, ranges, count);
  }
  std::vector<Event> events() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::unique_ptr<source::Source> real_;
  const bool latency_bound_;
  const uint64_t gap_;
  std::mutex mu_;
  std::vector<Event> events_;
  std::vector<size_t> batches_;  // ReadMany calls: reads in each
  size_t calls_ = 0;
};

// Checks a recording: every read was hinted, with its exact range, before
// it ran, and every hint was read. Returns, for each read in order, how many
// hinted reads were pending when it ran (itself included).
std::vector<size_t> CheckHints(const std::vector<RecordingSource::Event>& events, size_t* calls_with_one_uri,
                               size_t* calls) {
  std::map<size_t, std::set<std::string>> uris_per_call;
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> pending;  // hinted, not read yet
  std::vector<size_t> ahead;
  for (const auto& e : events) {
    if (e.hint) {
      uris_per_call[e.call].insert(e.uri);
      pending.emplace_back(e.uri, e.offset, e.length);
      continue;
    }
    ahead.push_back(pending.size());
    auto it = std::find(pending.begin(), pending.end(), std::make_tuple(e.uri, e.offset, e.length));
    EXPECT_NE(it, pending.end()) << e.uri << "@" << e.offset << " was read without a hint";
    if (it != pending.end()) pending.erase(it);
  }
  EXPECT_TRUE(pending.empty()) << pending.size() << " hints were never read";
  *calls = uris_per_call.size();
  *calls_with_one_uri = 0;
  for (const auto& [call, uris] : uris_per_call) *calls_with_one_uri += uris.size() == 1;
  return ahead;
}

// What the file source saw of one step's load, behind a RecordingSource.
struct RecordedLoad {
  Status status;  // creating the loader, then loading the step
  StepLoadStats stats;
  uint64_t sample_bytes = 0;
  bool recorded = false;  // the loader made its RecordingSource
  std::vector<RecordingSource::Event> events;
  std::vector<size_t> batches;
};

// Loads `step` of a one-device, globally shuffled job of `batch` samples
// (`samples` of `format` in `files` files) through the file source behind a
// RecordingSource, and checks the slot holds the planned bytes.
RecordedLoad LoadRecorded(DatasetFormat format, int64_t batch, uint64_t samples, int files, bool latency_bound,
                          const StepLoaderOptions& opts, int64_t step, uint64_t gap = 1 << 20) {
  TempDir dir;
  planner::JobSpec spec = SpecFor(OneDevice(format, Strategy::kPerProcess, ShuffleMode::kGlobal), dir.path());
  spec.batch.global_batch_size = batch;
  auto planner = Prepare(spec, dir.path(), samples, files);
  source::SourceRegistry sources({});
  RecordingSource* recorder = nullptr;
  sources.Register("file", [&](const source::SourceOptions& o) -> Result<std::unique_ptr<source::Source>> {
    MESHLOAD_ASSIGN_OR_RETURN(auto real, source::MakeFileSource(o));
    auto r = std::make_unique<RecordingSource>(std::move(real), latency_bound, gap);
    recorder = r.get();
    return std::unique_ptr<source::Source>(std::move(r));
  });
  const auto layout = staging::ComputeBatchLayout(planner->job(), 0);
  RecordedLoad out;
  out.sample_bytes = layout.fields[0].sample_bytes;
  auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), sources, layout, opts);
  if (!loader.ok()) {
    out.status = loader.status();
    return out;
  }
  std::vector<uint8_t> slot(layout.slot_bytes);
  out.status = LoadAndExpectPlanned(**loader, *planner, 0, layout, step, slot.data(), &out.stats);
  if (recorder != nullptr) {
    out.recorded = true;
    out.events = recorder->events();
    out.batches = recorder->batches();
  }
  return out;
}

TEST(StepLoader, EveryReadIsHintedToItsSourceAWindowAhead) {
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " reading threads");
    StepLoaderOptions opts;
    opts.reader_threads = threads;
    opts.inline_step_bytes = 0;  // with 3 threads: the step is cut into chunks
    // 80 samples a step: more reads per step than one window of hints.
    const RecordedLoad load = LoadRecorded(DatasetFormat::kTokenStream, /*batch=*/80, /*samples=*/400, /*files=*/3,
                                           /*latency_bound=*/false, opts, /*step=*/3);
    ASSERT_OK(load.status);
    ASSERT_TRUE(load.recorded);

    size_t calls = 0, calls_with_one_uri = 0;
    const std::vector<size_t> ahead = CheckHints(load.events, &calls_with_one_uri, &calls);
    EXPECT_EQ(ahead.size(), load.stats.read_ranges);
    EXPECT_GT(ahead.size(), 32u);
    EXPECT_EQ(calls_with_one_uri, calls) << "one object per hint call";
    EXPECT_GT(calls, 3u);  // three files, more than one window
    if (threads == 1) {
      // One thread, one chunk: between 17 and 32 reads are hinted ahead of
      // each one (itself included), fewer only at the end of the step.
      for (size_t i = 0; i < ahead.size(); ++i) {
        EXPECT_LE(ahead[i], 32u) << "read " << i << ": hints go a window ahead, not the whole step";
        EXPECT_GE(ahead[i], std::min<size_t>(17, ahead.size() - i)) << "read " << i;
      }
      EXPECT_EQ(ahead.front(), 32u);
    }
    // Reads of one object go to the source in runs of at most 16 (one
    // ReadMany call each; the files are three, so the runs are long).
    const std::vector<size_t>& batches = load.batches;
    size_t batched = 0;
    for (size_t n : batches) {
      EXPECT_GE(n, 1u);
      EXPECT_LE(n, 16u);
      batched += n;
    }
    EXPECT_EQ(batched, ahead.size()) << "every read is in a batch";
    if (threads == 1) {
      EXPECT_LE(batches.size() * 4, ahead.size()) << "runs, not a call per read";
    }
  }
}

// Every thread that reads for a step, the reader threads included, tells
// the sources which step (source::ReadingStep): the block cache keeps a
// read's block for that step (a reader thread that said nothing had its
// blocks kept only for the step after the last one passed, and a block a
// later step needed could evict one the step being read still needed).
TEST(StepLoader, EveryThreadReadingAStepTellsTheSourcesWhichStep) {
  StepLoaderOptions opts;
  opts.reader_threads = 3;
  opts.inline_step_bytes = 0;  // the step cut into chunks, read on three threads
  const RecordedLoad load = LoadRecorded(DatasetFormat::kTokenStream, /*batch=*/80, /*samples=*/400, /*files=*/3,
                                         /*latency_bound=*/false, opts, /*step=*/3);
  ASSERT_OK(load.status);
  ASSERT_TRUE(load.recorded);
  size_t reads = 0;
  for (const RecordingSource::Event& e : load.events) {
    if (e.hint) continue;
    ++reads;
    EXPECT_EQ(e.step, 3) << "the read at " << e.uri << "@" << e.offset;
  }
  EXPECT_GT(reads, 32u);
}

// Reads of one step that wait for another step to pass: the file source,
// except that a read for step `held` blocks until Release() (or 5 s).
class GateSource final : public source::Source {
 public:
  GateSource(std::unique_ptr<source::Source> real, int64_t held) : real_(std::move(real)), held_(held) {}
  Result<source::ObjectInfo> Stat(const std::string& uri) override { return real_->Stat(uri); }
  Status ReadV(const std::string& uri, uint64_t offset, const std::vector<iovec>& iov) override {
    if (source::ReadingStep() == held_) {
      std::unique_lock lock(mu_);
      ++blocked_;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(5), [&] { return released_; });
    }
    return real_->ReadV(uri, offset, iov);
  }
  // Waits until `n` reads of the held step are blocked.
  void AwaitBlocked(int n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return blocked_ >= n; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<source::Source> real_;
  const int64_t held_;
  std::mutex mu_;
  std::condition_variable cv_;
  int blocked_ = 0;
  bool released_ = false;
};

// Two staging threads share the reader threads. When every reader thread
// reads for step 8 and those reads wait for step 7 to pass (a block cache
// with no room for step 8's blocks until then), step 7's loader reads its
// own chunks itself instead of waiting for a reader thread.
TEST(StepLoader, AStepNeverWaitsForReaderThreadsBusyWithAnotherStep) {
  TempDir dir;
  planner::JobSpec spec =
      SpecFor(OneDevice(DatasetFormat::kTokenStream, Strategy::kPerProcess, ShuffleMode::kGlobal), dir.path());
  spec.batch.global_batch_size = 80;
  auto planner = Prepare(spec, dir.path(), 400, 3);
  source::SourceRegistry sources({});
  GateSource* gate = nullptr;
  sources.Register("file", [&](const source::SourceOptions& o) -> Result<std::unique_ptr<source::Source>> {
    MESHLOAD_ASSIGN_OR_RETURN(auto real, source::MakeFileSource(o));
    auto g = std::make_unique<GateSource>(std::move(real), /*held=*/8);
    gate = g.get();
    return std::unique_ptr<source::Source>(std::move(g));
  });
  const auto layout = staging::ComputeBatchLayout(planner->job(), 0);
  StepLoaderOptions opts;
  opts.reader_threads = 3;  // the caller and two reader threads
  opts.callers = 2;
  opts.inline_step_bytes = 0;
  auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), sources, layout, opts);
  ASSERT_OK(loader);
  ASSERT_NE(gate, nullptr);
  std::vector<uint8_t> slot8(layout.slot_bytes), slot7(layout.slot_bytes);
  Status st8;
  std::thread later([&] { st8 = LoadAndExpectPlanned(**loader, *planner, 0, layout, 8, slot8.data(), nullptr, 1); });
  gate->AwaitBlocked(3);  // step 8's three chunks: its caller's and both reader threads'
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_OK(LoadAndExpectPlanned(**loader, *planner, 0, layout, 7, slot7.data(), nullptr, 0));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "step 7 waited for step 8's readers";
  gate->Release();
  later.join();
  EXPECT_OK(st8);
}

// A latency-bound (remote) source gets one request for ranges of an object
// whose gaps cost less read than a second request (at what the source
// measured, GapWorthReading), the bytes between them dropped; across a
// longer gap, a request of its own. The slot still holds exactly the planned
// samples. A local source gets a read per range.
TEST(StepLoader, CloseRangesOfARemoteObjectAreOneRequest) {
  struct Case {
    bool remote;
    uint64_t gap;  // what the source says a gap costs
  };
  for (const Case& k : {Case{false, 0}, Case{true, 1 << 20}, Case{true, 8}}) {
    SCOPED_TRACE(!k.remote ? "local source" : k.gap > 8 ? "remote, gaps cheap" : "remote, gaps dear");
    StepLoaderOptions opts;
    opts.reader_threads = 1;
    // 40 of 400 shuffled samples: gaps between them.
    const RecordedLoad load = LoadRecorded(DatasetFormat::kFixedRecord, /*batch=*/40, /*samples=*/400, /*files=*/2,
                                           /*latency_bound=*/k.remote, opts, /*step=*/5, k.gap);
    ASSERT_OK(load.status);
    size_t reads = 0;
    for (const auto& e : load.events) reads += !e.hint;
    if (k.remote && k.gap > 8) {
      EXPECT_EQ(reads, 2u) << "one request per file: the files are far smaller than the gap worth reading";
      EXPECT_GT(load.stats.bytes_read, 40 * load.sample_bytes) << "the gaps were read and dropped";
    } else {
      EXPECT_GT(reads, 20u) << "a read per range";
      EXPECT_EQ(load.stats.bytes_read, 40 * load.sample_bytes);
    }
  }
}

// Several producers call Load() at once, each with its caller index, on
// consecutive steps; small steps are read inline, large ones are shared with
// the reader threads, whose queue then holds chunks of several steps.
// Loads steps 0..29 of `process` on `callers` threads at once (caller c
// takes steps c, c + callers, ...), each checked against the plan.
void LoadOnConcurrentCallers(StepLoader& loader, const planner::ShardPlanner& planner, int64_t process,
                             const staging::BatchLayout& layout, int callers) {
  std::vector<std::thread> threads;
  for (int caller = 0; caller < callers; ++caller) {
    threads.emplace_back([&, caller] {
      std::vector<uint8_t> slot(layout.slot_bytes);
      for (int64_t step = caller; step < 30; step += callers) {
        ASSERT_OK(LoadAndExpectPlanned(loader, planner, process, layout, step, slot.data(), nullptr, caller));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(StepLoader, ConcurrentCallersEachGetThePlannedBytes) {
  auto sources = source::SourceRegistry::WithBuiltins({});
  for (uint64_t inline_below : {uint64_t{1} << 30, uint64_t{0}}) {
    TempDir dir;
    const Case c{
        DatasetFormat::kTokenStream, Strategy::kGlobalLoad, ShuffleMode::kGlobal, {{"data", 2}, {"model", 2}}, 2};
    auto planner = Prepare(c, dir, 200, 3);
    const auto layout = staging::ComputeBatchLayout(planner->job(), 1);
    StepLoaderOptions opts;
    opts.reader_threads = 3;
    opts.callers = 3;
    opts.max_read_bytes = 60;
    opts.inline_step_bytes = inline_below;
    auto loader = StepLoader::Create(*planner, 1, planner->DefaultLoading(), *sources, layout, opts);
    ASSERT_OK(loader);
    LoadOnConcurrentCallers(**loader, *planner, 1, layout, 3);
    std::vector<staging::StagedTensor> staged;
    std::vector<uint8_t> slot(layout.slot_bytes);
    Status bad = (*loader)->Load(0, slot.data(), staged, nullptr, 3);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.ToString();
  }
}

// A mixture of two generated Megatron corpora with token-balanced shards:
// callers on three threads load interleaved steps while the checks plan the
// same steps again (the planner keeps the dealt batches: under TSan, that
// memo is shared by every thread), and every byte is its own corpus's.
void RunExchange(const planner::ShardPlanner* planner, int64_t steps);  // below, with the exchange cases

// Two generated Megatron corpora (300 and 41 sequences) mixed 0.75 : 0.25,
// then 0.75 : 0.5 from step 7, with token-balanced shards, for case `c`.
std::unique_ptr<planner::ShardPlanner> PrepareMixture(const Case& c, planner::Fanout fanout, const TempDir& dir) {
  planner::JobSpec spec = SpecFor(c, dir.path());
  spec.replication.fanout = fanout;
  for (const char* name : {"web", "code"}) {
    EXPECT_OK(tools::GenerateSyntheticDataset(spec.dataset, dir.path() + "/" + name,
                                              std::string(name) == "web" ? 300 : 41, 2));
  }
  planner::MixtureSpec mix;
  mix.datasets = {{"web", "web", 0.75, std::nullopt, {}}, {"code", "code", 0.25, std::nullopt, {{7, 0.5}}}};
  spec.mixture = mix;
  spec.batch.balance.mode = planner::BalanceMode::kTokens;
  spec.batch.balance.tolerance = 0.05;
  Diagnostics d;
  auto job = source::ResolveReadingDataset(testing::MustValidate(spec), {}, source::Unreachable::kFail, d);
  EXPECT_OK(job) << d.ToString();
  return std::make_unique<planner::ShardPlanner>(std::move(*job));
}

TEST(StepLoader, AMixtureWithBalancedShardsDeliversThePlannedBytesFromManyCallers) {
  auto sources = source::SourceRegistry::WithBuiltins({});
  TempDir dir;
  const Case c{DatasetFormat::kMegatronIndexed, Strategy::kPerProcess, ShuffleMode::kGlobal, {{"data", 4}}, 2};
  auto prepared = PrepareMixture(c, planner::Fanout::kLoad, dir);
  const planner::ShardPlanner& planner = *prepared;
  ASSERT_EQ(planner.job().dataset.parts().size(), 2u);
  ASSERT_EQ(planner.BalanceState(), planner::ShardPlanner::Balancing::kApplied);
  for (int64_t process : {0, 1}) {
    const auto layout = staging::ComputeBatchLayout(planner.job(), process);
    StepLoaderOptions opts;
    opts.reader_threads = 3;
    opts.callers = 3;
    auto loader = StepLoader::Create(planner, process, planner.DefaultLoading(), *sources, layout, opts);
    ASSERT_OK(loader);
    LoadOnConcurrentCallers(**loader, planner, process, layout, 3);
  }
  // Both corpora are drawn from, in the schedule's proportions (0.75 : 0.25,
  // then 0.75 : 0.5 from step 7, 14.4 and 9.6 of 24), and the small one
  // repeats: its epoch ended inside some step, which then holds one of its
  // samples twice, each place with its bytes (checked above).
  std::vector<uint64_t> per(2, 0);
  for (uint64_t id : planner.GlobalBatch(3)) ++per[planner.job().dataset.PartOf(id)];
  EXPECT_EQ(per, (std::vector<uint64_t>{18, 6}));
  per.assign(2, 0);
  for (uint64_t id : planner.GlobalBatch(8)) ++per[planner.job().dataset.PartOf(id)];
  EXPECT_TRUE(per == (std::vector<uint64_t>{14, 10}) || per == (std::vector<uint64_t>{15, 9})) << per[0];
  bool repeated = false;
  for (int64_t step = 0; step < 30; ++step) {
    std::vector<uint64_t> b = planner.GlobalBatch(step);
    std::sort(b.begin(), b.end());
    repeated = repeated || std::adjacent_find(b.begin(), b.end()) != b.end();
  }
  EXPECT_TRUE(repeated) << "no step holds a sample twice: the test proves nothing about duplicates";
  // Samples moving between processes, a repeated one included.
  for (Strategy s : {Strategy::kLoadAndReshard, Strategy::kPerProcess}) {
    SCOPED_TRACE(std::string(ToString(s)));
    TempDir exchanged;
    const Case moving_case{DatasetFormat::kMegatronIndexed, s, ShuffleMode::kGlobal, {{"model", 2}, {"data", 2}}, 2};
    auto moving = PrepareMixture(
        moving_case, s == Strategy::kPerProcess ? planner::Fanout::kBroadcast : planner::Fanout::kLoad, exchanged);
    RunExchange(moving.get(), 30);
  }
}

// GlobalLoad on a TokenStream drops overlapping samples whose scratch pieces
// have different lengths; a fresh thread (empty scratch) once freed the
// scratch under an earlier piece (a use-after-free write ASan reports).
TEST(StepLoader, GlobalLoadTokenStreamOnAFreshThreadDeliversThePlannedBytes) {
  TempDir dir;
  const Case c{DatasetFormat::kTokenStream, Strategy::kGlobalLoad, ShuffleMode::kNone, {{"data", 2}}, 1};
  auto planner = Prepare(c, dir, 100, 2);
  auto sources = source::SourceRegistry::WithBuiltins({});
  std::thread fresh([&] {
    const auto layout = staging::ComputeBatchLayout(planner->job(), 0);
    StepLoaderOptions opts;
    opts.reader_threads = 1;
    auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), *sources, layout, opts);
    ASSERT_OK(loader);
    std::vector<uint8_t> slot(layout.slot_bytes);
    ASSERT_OK(LoadAndExpectPlanned(**loader, *planner, 0, layout, 1, slot.data()));
  });
  fresh.join();
}

TEST(StepLoader, StrategiesThatMoveSamplesBetweenProcessesNeedPeers) {
  TempDir dir;
  const Case c{
      DatasetFormat::kFixedRecord, Strategy::kLoadAndReshard, ShuffleMode::kNone, {{"model", 2}, {"data", 2}}, 2};
  auto planner = Prepare(c, dir, 100, 1);
  auto sources = source::SourceRegistry::WithBuiltins({});
  auto layout = staging::ComputeBatchLayout(planner->job(), 0);
  auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), *sources, layout, {});
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader, StatusIs(StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr("moves samples between processes"), HasSubstr("--peers"))));
  auto bcast =
      StepLoader::Create(*planner, 0, {Strategy::kPerProcess, planner::Fanout::kBroadcast}, *sources, layout, {});
  EXPECT_FALSE(bcast.ok());
}

// A listening loopback socket (kept open for the test's life) and its port.
std::pair<int, uint16_t> Listen() {
  auto l = ListenLoopback();
  EXPECT_OK(l);
  return {l->first.Release(), l->second};
}

// One loader per process, connected by real PeerExchanges over loopback;
// each process stages steps on its own thread with two callers (so steps
// overlap), and every slot must hold exactly the planned bytes.
void RunExchange(const planner::ShardPlanner* planner, int64_t steps) {
  const planner::Loading loading = planner->DefaultLoading();
  const int64_t P = planner->job().mesh.processes();
  auto sources = source::SourceRegistry::WithBuiltins({});
  std::vector<exchange::PeerAddress> peers;
  std::vector<int> fds;
  for (int64_t p = 0; p < P; ++p) {
    auto [fd, port] = Listen();
    fds.push_back(fd);
    peers.push_back({"127.0.0.1", port});
  }
  std::vector<staging::BatchLayout> layouts;
  std::vector<std::unique_ptr<StepLoader>> loaders;
  for (int64_t p = 0; p < P; ++p) {
    layouts.push_back(staging::ComputeBatchLayout(planner->job(), p));
    StepLoaderOptions opts;
    opts.reader_threads = 2;
    opts.callers = 2;
    exchange::ExchangeOptions xo;
    xo.peers = peers;
    xo.listen_fd = fds[static_cast<size_t>(p)];
    xo.connect_timeout = std::chrono::seconds(20);
    opts.peers = xo;
    auto loader = StepLoader::Create(*planner, p, loading, *sources, layouts.back(), opts);
    ASSERT_OK(loader);
    loaders.push_back(std::move(*loader));
  }
  uint64_t moved = 0;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int64_t p = 0; p < P; ++p) {
    for (int caller = 0; caller < 2; ++caller) {
      threads.emplace_back([&, p, caller] {
        const auto& layout = layouts[static_cast<size_t>(p)];
        std::vector<uint8_t> slot(layout.slot_bytes);
        for (int64_t step = caller; step < steps; step += 2) {
          StepLoadStats stats;
          Status st = LoadAndExpectPlanned(*loaders[static_cast<size_t>(p)], *planner, p, layout, step, slot.data(),
                                           &stats, caller);
          ASSERT_OK(st) << "process " << p << " step " << step << ": " << st.ToString();
          std::lock_guard lock(mu);
          moved += stats.bytes_received;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  uint64_t planned = 0;
  for (int64_t step = 0; step < steps; ++step) planned += planner->ComputeCost(step, loading).bytes_transferred;
  EXPECT_EQ(moved, planned) << "the bytes received are the plan's transfers";
  EXPECT_GT(moved, 0u);
}

void RunExchangeCase(const Case& c, planner::Fanout fanout, int64_t steps) {
  TempDir dir;
  planner::JobSpec spec = SpecFor(c, dir.path());
  spec.replication.fanout = fanout;
  auto planner = Prepare(spec, dir.path(), 100, 3);
  RunExchange(planner.get(), steps);
}

TEST(StepLoader, BroadcastAndReshardMoveThePlannedBytesBetweenProcesses) {
  for (DatasetFormat f : {DatasetFormat::kFixedRecord, DatasetFormat::kTokenStream, DatasetFormat::kNpy,
                          DatasetFormat::kMegatronIndexed}) {
    SCOPED_TRACE(std::string(ToString(f)));
    // 2 processes x 2 devices, each process holding both shards (`model`
    // spans the processes): each reads half and receives the other half.
    RunExchangeCase({f, Strategy::kLoadAndReshard, ShuffleMode::kGlobal, {{"model", 2}, {"data", 2}}, 2},
                    planner::Fanout::kLoad, 8);
    // Replicas across processes: `model` spans the processes.
    for (Strategy s : {Strategy::kGlobalLoad, Strategy::kPerDevice, Strategy::kPerProcess}) {
      SCOPED_TRACE(std::string(ToString(s)));
      RunExchangeCase({f, s, ShuffleMode::kGlobal, {{"model", 2}, {"data", 2}}, 2}, planner::Fanout::kBroadcast, 8);
    }
  }
  // 3 processes, all-to-all: each reads a third and receives the rest.
  RunExchangeCase(
      {DatasetFormat::kTokenStream, Strategy::kLoadAndReshard, ShuffleMode::kBlock, {{"model", 3}, {"data", 2}}, 2},
      planner::Fanout::kLoad, 10);
}

TEST(StepLoader, AFileTruncatedAfterPlanningIsAnErrorNamingFileAndOffset) {
  TempDir dir;
  auto planner = Prepare(OneDevice(DatasetFormat::kFixedRecord, Strategy::kPerProcess, ShuffleMode::kNone), dir, 96, 1);
  const std::string file = planner->job().dataset.files()[0].path;
  auto sources = source::SourceRegistry::WithBuiltins({});
  auto layout = staging::ComputeBatchLayout(planner->job(), 0);
  auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), *sources, layout, {});
  ASSERT_OK(loader);
  ASSERT_EQ(::truncate(file.c_str(), 50 * 100 + 30), 0);
  Status verify = (*loader)->VerifyFiles();
  EXPECT_EQ(verify.code(), StatusCode::kDataLoss);
  EXPECT_EQ(verify.location(), file);
  EXPECT_THAT(verify.message(), HasSubstr("the file changed"));
  std::vector<uint8_t> slot(layout.slot_bytes);
  std::vector<staging::StagedTensor> staged;
  Status st = (*loader)->Load(2, slot.data(), staged, nullptr);  // samples 48..71
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.location().rfind(file + "@", 0), 0u) << st.ToString();
}

TEST(StepLoader, VerifyingManyFilesAtOnceReportsTheFirstChangedOneInFileOrder) {
  TempDir dir;
  auto planner =
      Prepare(OneDevice(DatasetFormat::kFixedRecord, Strategy::kPerProcess, ShuffleMode::kNone), dir, 960, 40);
  const auto& files = planner->job().dataset.files();
  ASSERT_EQ(files.size(), 40u);
  auto sources = source::SourceRegistry::WithBuiltins({});
  auto layout = staging::ComputeBatchLayout(planner->job(), 0);
  auto loader = StepLoader::Create(*planner, 0, planner->DefaultLoading(), *sources, layout, {});
  ASSERT_OK(loader);
  ASSERT_OK((*loader)->VerifyFiles());
  // Files are checked 16 at a time; whichever finishes first, the error
  // names the first changed file of the dataset's order.
  for (size_t i : {37u, 23u, 9u}) ASSERT_EQ(::truncate(files[i].path.c_str(), 10), 0);
  for (int round = 0; round < 5; ++round) {
    Status verify = (*loader)->VerifyFiles();
    EXPECT_EQ(verify.code(), StatusCode::kDataLoss);
    EXPECT_EQ(verify.location(), files[9].path);
  }
}

TEST(StepLoader, ANpyFileShorterThanItsHeaderClaimsIsRefusedAtIndexing) {
  TempDir dir;
  planner::JobSpec spec =
      SpecFor(OneDevice(DatasetFormat::kNpy, Strategy::kPerProcess, ShuffleMode::kNone), dir.path());
  ASSERT_OK(tools::GenerateSyntheticDataset(spec.dataset, dir.path(), 50, 1));
  const std::string file = dir.path() + "/part-00000.npy";
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(std::filesystem::file_size(file) - 10)), 0);
  Diagnostics d;
  EXPECT_FALSE(source::ResolveReadingDataset(testing::MustValidate(spec), {}, source::Unreachable::kFail, d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr(file + ": size"));
  EXPECT_THAT(d.ToString(), HasSubstr("(truncated)"));
}

}  // namespace
}  // namespace meshload::sidecar
