// Property tests of the data semantics (docs/data-semantics.md) over many
// random meshes, batch shardings, strategies and datasets.

#include "planner/shard_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "formats/npy.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace meshload::planner {
namespace {

using ::testing::HasSubstr;
using testing::MakePlanner;
using testing::RandomSpec;
using testing::TempDir;

constexpr int kRandomSpecs = 300;

std::vector<Loading> SupportedLoadings(const ShardPlanner& planner) {
  std::vector<Loading> out;
  for (Strategy s : kAllStrategies) {
    for (Fanout f : kAllFanouts) {
      if (planner.Unsupported({s, f}).empty()) out.push_back({s, f});
    }
  }
  return out;
}

std::string Describe(const JobSpec& spec, const Loading& l) {
  std::string s = "mesh P=" + std::to_string(spec.mesh.processes) +
                  " L=" + std::to_string(spec.mesh.devices_per_process) + " axes [";
  for (const auto& a : spec.mesh.axes) s += a.name + "=" + std::to_string(a.size) + " ";
  s += "] batchAxes " + FormatNameList(EffectiveBatchAxes(spec.mesh)) +
       " B=" + std::to_string(spec.batch.global_batch_size) + " " + std::string(ToString(l.strategy)) + "/" +
       std::string(ToString(l.fanout)) + " shuffle " + std::string(ToString(spec.shuffle.mode));
  return s;
}

// Samples available at process p: read by it or received by it.
std::map<int64_t, std::multiset<uint64_t>> Available(const StepPlan& plan, bool include_received) {
  std::map<int64_t, std::multiset<uint64_t>> have;
  for (const auto& r : plan.reads) have[r.process].insert(r.samples.begin(), r.samples.end());
  if (include_received) {
    for (const auto& t : plan.transfers) have[t.to].insert(t.samples.begin(), t.samples.end());
  }
  return have;
}

// The property tests: check(spec, planner) for `count` random specs drawn
// from `seed`, stopping at the first fatal failure (as an ASSERT in a loop would).
template <typename Check>
void ForRandomSpecs(uint64_t seed, int count, Check check) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < count && !::testing::Test::HasFatalFailure(); ++i) {
    const JobSpec spec = RandomSpec(rng);
    check(spec, MakePlanner(spec));
  }
}

TEST(ShardPlanner, DeviceSamplesAreIdenticalAcrossStrategiesAndFanouts) {
  ForRandomSpecs(1, kRandomSpecs, [](const JobSpec& spec, const ShardPlanner& planner) {
    for (int64_t step : {int64_t{0}, int64_t{1}, static_cast<int64_t>(planner.job().steps_per_epoch) + 1}) {
      std::vector<DevicePlan> reference;
      for (const Loading& l : SupportedLoadings(planner)) {
        StepPlan plan = planner.PlanStep(step, l);
        ASSERT_EQ(plan.devices.size(), static_cast<size_t>(planner.job().mesh.devices()));
        if (reference.empty()) {
          reference = plan.devices;
          continue;
        }
        for (size_t d = 0; d < reference.size(); ++d) {
          ASSERT_EQ(plan.devices[d].samples, reference[d].samples)
              << Describe(spec, l) << " device " << d << " step " << step;
        }
      }
    }
  });
}

TEST(ShardPlanner, ReplicasHoldTheSameSamplesAndShardsConcatenateToTheGlobalBatch) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < kRandomSpecs; ++i) {
    JobSpec spec = RandomSpec(rng);
    ShardPlanner planner = MakePlanner(spec);
    const int64_t step = static_cast<int64_t>(rng() % 20);
    StepPlan plan = planner.PlanStep(step, planner.DefaultLoading());
    std::map<int64_t, std::vector<uint64_t>> by_shard;
    for (const auto& d : plan.devices) {
      auto [it, inserted] = by_shard.emplace(d.shard, d.samples);
      if (!inserted) {
        ASSERT_EQ(it->second, d.samples) << "replicas of shard " << d.shard << " differ";
      }
      ASSERT_EQ(d.samples.size(), planner.job().global_batch / static_cast<uint64_t>(planner.job().mesh.shards()));
    }
    ASSERT_EQ(by_shard.size(), static_cast<size_t>(planner.job().mesh.shards()));
    std::vector<uint64_t> concat;
    for (const auto& [s, samples] : by_shard) concat.insert(concat.end(), samples.begin(), samples.end());
    ASSERT_EQ(concat, planner.GlobalBatch(step)) << Describe(spec, planner.DefaultLoading());
  }
}

TEST(ShardPlanner, AnEpochHasNoRepeatsAndKTimesBDistinctSamples) {
  ForRandomSpecs(3, 100, [](const JobSpec& /*spec*/, const ShardPlanner& planner) {
    const uint64_t K = planner.job().steps_per_epoch;
    const uint64_t B = planner.job().global_batch;
    for (uint64_t epoch : {uint64_t{0}, uint64_t{3}}) {
      std::set<uint64_t> seen;
      for (uint64_t j = 0; j < K; ++j) {
        for (uint64_t id : planner.GlobalBatch(static_cast<int64_t>(epoch * K + j))) {
          ASSERT_LT(id, planner.job().samples);
          ASSERT_TRUE(seen.insert(id).second) << "sample " << id << " repeats in epoch " << epoch;
        }
      }
      ASSERT_EQ(seen.size(), K * B);
    }
  });
}

TEST(ShardPlanner, GlobalBatchesDoNotDependOnTheMesh) {
  // Elastic resize: same B, seed and dataset on another mesh -> same batches.
  std::mt19937_64 rng(4);
  for (int i = 0; i < 100; ++i) {
    JobSpec a = RandomSpec(rng);
    JobSpec b = a;
    JobSpec other = RandomSpec(rng);
    b.mesh = other.mesh;
    // B must suit the new mesh: use a multiple of both meshes' shard counts.
    auto shards = [](const MeshSpec& m) {
      int64_t s = 1;
      for (const auto& name : EffectiveBatchAxes(m)) {
        for (const auto& ax : m.axes) {
          if (ax.name == name) s *= ax.size;
        }
      }
      return s;
    };
    const int64_t B = std::lcm(shards(a.mesh), shards(b.mesh)) * 2;
    a.batch.global_batch_size = b.batch.global_batch_size = B;
    a.strategy = b.strategy = Strategy::kPerProcess;
    a.dataset.samples = b.dataset.samples = B * 5 + 1;
    ShardPlanner pa = MakePlanner(a), pb = MakePlanner(b);
    for (int64_t t = 0; t < 12; ++t) ASSERT_EQ(pa.GlobalBatch(t), pb.GlobalBatch(t)) << "step " << t;
  }
}

TEST(ShardPlanner, ResumeStepReproducesTheUninterruptedSequence) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    JobSpec spec = RandomSpec(rng);
    ShardPlanner uninterrupted = MakePlanner(spec);
    JobSpec resumed_spec = spec;
    resumed_spec.resume.step = 7;
    ShardPlanner resumed = MakePlanner(resumed_spec);
    for (int64_t t = 7; t < 15; ++t) {
      StepPlan a = uninterrupted.PlanStep(t, uninterrupted.DefaultLoading());
      StepPlan b = resumed.PlanStep(t, resumed.DefaultLoading());
      for (size_t d = 0; d < a.devices.size(); ++d) ASSERT_EQ(a.devices[d].samples, b.devices[d].samples);
    }
  }
}

TEST(ShardPlanner, DevicesAreCoveredByReadsPlusTransfersAndNothingIsReadInVain) {
  ForRandomSpecs(6, kRandomSpecs, [](const JobSpec& spec, const ShardPlanner& planner) {
    for (const Loading& l : SupportedLoadings(planner)) {
      StepPlan plan = planner.PlanStep(2, l);
      auto have = Available(plan, /*include_received=*/true);
      auto read = Available(plan, /*include_received=*/false);
      std::map<int64_t, std::set<uint64_t>> needed;
      for (const auto& d : plan.devices) {
        for (uint64_t id : d.samples) {
          ASSERT_TRUE(have[d.process].count(id)) << Describe(spec, l) << ": device " << d.device << " needs " << id
                                                 << " but its process neither reads nor receives it";
          needed[d.process].insert(id);
        }
      }
      // A process receives each sample at most once, and never one it reads.
      for (const auto& [p, ids] : have) {
        std::set<uint64_t> received;
        for (const auto& t : plan.transfers) {
          if (t.to != p) continue;
          for (uint64_t id : t.samples) {
            ASSERT_TRUE(received.insert(id).second)
                << Describe(spec, l) << ": process " << p << " receives " << id << " twice";
            ASSERT_FALSE(read[p].count(id)) << Describe(spec, l) << ": process " << p << " reads and receives " << id;
          }
        }
      }
      // A sender has what it sends.
      for (const auto& t : plan.transfers) {
        ASSERT_NE(t.from, t.to);
        for (uint64_t id : t.samples) {
          ASSERT_TRUE(read[t.from].count(id))
              << Describe(spec, l) << ": process " << t.from << " sends " << id << " without reading it";
        }
      }
      // Nothing is read that no local device needs and nobody is sent
      // (except under GlobalLoad/Load, which reads the whole batch by design).
      if (l.strategy == Strategy::kGlobalLoad && l.fanout == Fanout::kLoad) continue;
      std::map<int64_t, std::set<uint64_t>> sent;
      for (const auto& t : plan.transfers) sent[t.from].insert(t.samples.begin(), t.samples.end());
      for (const auto& r : plan.reads) {
        for (uint64_t id : r.samples) {
          ASSERT_TRUE(needed[r.process].count(id) || sent[r.process].count(id))
              << Describe(spec, l) << ": process " << r.process << " reads " << id << " in vain";
        }
      }
    }
  });
}

TEST(ShardPlanner, EachStrategyReadsWhatItsDefinitionSays) {
  ForRandomSpecs(7, kRandomSpecs, [](const JobSpec& /*spec*/, const ShardPlanner& planner) {
    const auto& job = planner.job();
    const int64_t P = job.mesh.processes();
    const uint64_t B = job.global_batch;
    const std::vector<uint64_t> batch = planner.GlobalBatch(3);
    for (const Loading& l : SupportedLoadings(planner)) {
      StepPlan plan = planner.PlanStep(3, l);
      std::map<int64_t, std::vector<uint64_t>> read_by;
      for (const auto& r : plan.reads) {
        read_by[r.process].insert(read_by[r.process].end(), r.samples.begin(), r.samples.end());
      }
      std::map<int64_t, std::set<uint64_t>> union_of;
      for (const auto& d : plan.devices) union_of[d.process].insert(d.samples.begin(), d.samples.end());
      for (int64_t p = 0; p < P; ++p) {
        const auto& r = read_by[p];
        switch (l.strategy) {
          case Strategy::kGlobalLoad:
            if (l.fanout == Fanout::kLoad || p == 0) {
              ASSERT_EQ(r, batch);
            } else {
              ASSERT_TRUE(r.empty());
            }
            break;
          case Strategy::kPerDevice:
            if (l.fanout == Fanout::kLoad) {
              // One read per device, each its own shard: duplicates for local replicas.
              size_t expected = 0;
              for (const auto& d : plan.devices) {
                if (d.process == p) expected += d.samples.size();
              }
              ASSERT_EQ(r.size(), expected);
            }
            break;
          case Strategy::kPerProcess: {
            std::set<uint64_t> distinct(r.begin(), r.end());
            ASSERT_EQ(distinct.size(), r.size()) << "PerProcess reads a sample twice";
            if (l.fanout == Fanout::kLoad) {
              ASSERT_EQ(distinct, union_of[p]);
            }
            break;
          }
          case Strategy::kLoadAndReshard: {
            const uint64_t blk = B / static_cast<uint64_t>(P);
            std::vector<uint64_t> expected(batch.begin() + static_cast<int64_t>(blk * static_cast<uint64_t>(p)),
                                           batch.begin() + static_cast<int64_t>(blk * static_cast<uint64_t>(p + 1)));
            ASSERT_EQ(r, expected);
            break;
          }
        }
      }
    }
  });
}

TEST(ShardPlanner, ReportedCostsEqualCountedBytes) {
  ForRandomSpecs(8, kRandomSpecs, [](const JobSpec& spec, const ShardPlanner& planner) {
    const auto& job = planner.job();
    for (const Loading& l : SupportedLoadings(planner)) {
      const int64_t step = 1;
      StepPlan plan = planner.PlanStep(step, l);
      StepCost cost = planner.ComputeCost(step, l);
      // Count bytes independently: every byte offset each read touches, per read.
      uint64_t counted_read = 0;
      std::vector<uint64_t> read_by(static_cast<size_t>(job.mesh.processes()));
      for (const auto& r : plan.reads) {
        std::set<std::pair<uint32_t, uint64_t>> bytes;
        std::vector<Extent> ex;
        for (uint64_t id : r.samples) job.dataset.AppendExtents(id, ex);
        for (const auto& e : ex) {
          for (uint64_t o = e.offset; o < e.offset + e.length; ++o) bytes.insert({e.file, o});
        }
        ASSERT_EQ(r.bytes, bytes.size()) << Describe(spec, l);
        uint64_t range_sum = 0;
        for (const auto& e : r.ranges) range_sum += e.length;
        ASSERT_EQ(range_sum, r.bytes);
        counted_read += bytes.size();
        read_by[static_cast<size_t>(r.process)] += bytes.size();
      }
      uint64_t counted_xfer = 0;
      std::vector<uint64_t> sent(read_by.size()), recv(read_by.size());
      for (const auto& t : plan.transfers) {
        const uint64_t b = t.samples.size() * job.dataset.sample_bytes();
        ASSERT_EQ(t.bytes, b);
        counted_xfer += b;
        sent[static_cast<size_t>(t.from)] += b;
        recv[static_cast<size_t>(t.to)] += b;
      }
      ASSERT_EQ(plan.bytes_read, counted_read) << Describe(spec, l);
      ASSERT_EQ(plan.bytes_transferred, counted_xfer) << Describe(spec, l);
      ASSERT_EQ(cost.bytes_read, counted_read) << Describe(spec, l);
      ASSERT_EQ(cost.bytes_transferred, counted_xfer) << Describe(spec, l);
      for (size_t p = 0; p < read_by.size(); ++p) {
        ASSERT_EQ(cost.per_process[p].bytes_read, read_by[p]);
        ASSERT_EQ(cost.per_process[p].bytes_sent, sent[p]);
        ASSERT_EQ(cost.per_process[p].bytes_received, recv[p]);
      }
    }
  });
}

TEST(ShardPlanner, OneProcessPlanEqualsTheWholeMeshPlanRestrictedToIt) {
  ForRandomSpecs(9, 100, [](const JobSpec& spec, const ShardPlanner& planner) {
    for (const Loading& l : SupportedLoadings(planner)) {
      StepPlan whole = planner.PlanStep(4, l);
      for (int64_t p = 0; p < planner.job().mesh.processes(); ++p) {
        StepPlan one = planner.PlanStep(4, l, p);
        std::vector<std::vector<uint64_t>> a, b;
        for (const auto& d : whole.devices) {
          if (d.process == p) a.push_back(d.samples);
        }
        for (const auto& d : one.devices) b.push_back(d.samples);
        ASSERT_EQ(a, b);
        std::vector<std::tuple<int64_t, int64_t, std::vector<uint64_t>>> ta, tb;
        for (const auto& t : whole.transfers) {
          if (t.from == p || t.to == p) ta.emplace_back(t.from, t.to, t.samples);
        }
        for (const auto& t : one.transfers) tb.emplace_back(t.from, t.to, t.samples);
        std::sort(ta.begin(), ta.end());
        std::sort(tb.begin(), tb.end());
        ASSERT_EQ(ta, tb) << Describe(spec, l) << " process " << p;
      }
    }
  });
}

TEST(ShardPlanner, ASamplesOnlyPlanIsTheFullPlanWithoutItsRanges) {
  ForRandomSpecs(10, 100, [](const JobSpec& spec, const ShardPlanner& planner) {
    for (const Loading& l : SupportedLoadings(planner)) {
      for (int64_t p = 0; p < planner.job().mesh.processes(); ++p) {
        const StepPlan full = planner.PlanStep(3, l, p);
        const StepPlan lean = planner.PlanStep(3, l, p, ShardPlanner::Detail::kSamples);
        ASSERT_EQ(full.devices.size(), lean.devices.size());
        for (size_t d = 0; d < full.devices.size(); ++d) {
          EXPECT_EQ(full.devices[d].device, lean.devices[d].device);
          EXPECT_EQ(full.devices[d].samples, lean.devices[d].samples);
        }
        ASSERT_EQ(full.reads.size(), lean.reads.size()) << Describe(spec, l);
        for (size_t r = 0; r < full.reads.size(); ++r) {
          EXPECT_EQ(full.reads[r].device, lean.reads[r].device);
          EXPECT_EQ(full.reads[r].samples, lean.reads[r].samples);
          EXPECT_TRUE(lean.reads[r].ranges.empty());
          EXPECT_EQ(lean.reads[r].bytes, 0u);
          if (!full.reads[r].samples.empty()) {
            EXPECT_FALSE(full.reads[r].ranges.empty());
          }
        }
        EXPECT_EQ(lean.bytes_read, 0u);
        ASSERT_EQ(full.transfers.size(), lean.transfers.size());
        for (size_t t = 0; t < full.transfers.size(); ++t) {
          EXPECT_EQ(full.transfers[t].samples, lean.transfers[t].samples);
          EXPECT_EQ(full.transfers[t].bytes, lean.transfers[t].bytes);
        }
        EXPECT_EQ(full.bytes_transferred, lean.bytes_transferred);
      }
    }
  });
}

TEST(ShardPlanner, BroadcastReadsEachShardOnceAcrossProcesses) {
  ForRandomSpecs(10, kRandomSpecs, [](const JobSpec& /*spec*/, const ShardPlanner& planner) {
    StepPlan plan = planner.PlanStep(0, {Strategy::kPerProcess, Fanout::kBroadcast});
    std::multiset<uint64_t> all;
    for (const auto& r : plan.reads) all.insert(r.samples.begin(), r.samples.end());
    const auto batch = planner.GlobalBatch(0);
    ASSERT_EQ(all, std::multiset<uint64_t>(batch.begin(), batch.end()));
  });
}

TEST(ShardPlanner, KnownPlanForATwoByTwoHybridMesh) {
  // processes 2 × 2 devices, axes data=2, model=2 with batchAxes [data]:
  // devices 0,1 (process 0) are shard 0, devices 2,3 (process 1) shard 1.
  // With model along processes instead (axes model=2, data=2), each process
  // holds both shards and LoadAndReshard must exchange half of each.
  JobSpec spec;
  spec.mesh.processes = 2;
  spec.mesh.devices_per_process = 2;
  spec.mesh.axes = {{"model", 2}, {"data", 2}};
  spec.mesh.batch_axes = {"data"};
  spec.mesh.batch_axes_set = true;
  spec.batch.global_batch_size = 4;
  spec.dataset.uri = "/virtual";
  spec.dataset.format = DatasetFormat::kFixedRecord;
  spec.dataset.record_bytes = 10;
  spec.dataset.samples = 8;
  spec.shuffle.mode = ShuffleMode::kNone;
  spec.strategy = Strategy::kLoadAndReshard;
  ShardPlanner planner = MakePlanner(spec);
  StepPlan plan = planner.PlanStep(1, planner.DefaultLoading());
  // Global batch of step 1 = samples 4..7; shard 0 = {4,5}, shard 1 = {6,7}.
  ASSERT_EQ(plan.devices.size(), 4u);
  EXPECT_EQ(plan.devices[0].samples, (std::vector<uint64_t>{4, 5}));  // (model 0, data 0)
  EXPECT_EQ(plan.devices[1].samples, (std::vector<uint64_t>{6, 7}));  // (model 0, data 1)
  EXPECT_EQ(plan.devices[2].samples, (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(plan.devices[3].samples, (std::vector<uint64_t>{6, 7}));
  // Process 0 reads positions [0,2) = {4,5}, process 1 reads {6,7}; each sends its block.
  ASSERT_EQ(plan.reads.size(), 2u);
  EXPECT_EQ(plan.reads[0].samples, (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(plan.reads[1].samples, (std::vector<uint64_t>{6, 7}));
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_EQ(plan.transfers[0].from, 0);
  EXPECT_EQ(plan.transfers[0].to, 1);
  EXPECT_EQ(plan.transfers[0].samples, (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(plan.transfers[1].samples, (std::vector<uint64_t>{6, 7}));
  EXPECT_EQ(plan.bytes_read, 40u);  // two coalesced ranges of 20 bytes
  EXPECT_EQ(plan.reads[0].ranges.size(), 1u);
  EXPECT_EQ(plan.bytes_transferred, 40u);
}

// `processes` processes of one device each along one mesh axis "data", a
// global batch of `batch` samples, the dataset at `uri`; the rest to set.
JobSpec DataParallelSpec(int64_t processes, int64_t batch, std::string uri) {
  JobSpec spec;
  spec.mesh.processes = processes;
  spec.mesh.axes = {{"data", processes}};
  spec.batch.global_batch_size = batch;
  spec.dataset.uri = std::move(uri);
  return spec;
}

// A planner for `spec` over files of these sizes (the facts the storage
// sources would gather).
ShardPlanner PlannerOver(const JobSpec& spec, const std::vector<std::pair<std::string, uint64_t>>& sizes) {
  std::vector<DatasetIndex::FileFacts> files;
  for (const auto& [path, size] : sizes) {
    DatasetIndex::FileFacts f;
    f.path = path;
    f.size = size;
    files.push_back(std::move(f));
  }
  Diagnostics d;
  auto index = DatasetIndex::FromFiles(spec.dataset, std::move(files), d);
  EXPECT_TRUE(index.ok() && d.ok()) << d.ToString();
  ResolveOptions o;
  o.index = std::move(*index);
  auto job = ResolveJob(testing::MustValidate(spec), o, d);
  EXPECT_OK(job) << d.ToString();
  return ShardPlanner(std::move(*job));
}

TEST(ShardPlanner, AdjacentSamplesInOneFileAreCoalescedAcrossFileBoundariesNot) {
  JobSpec spec = DataParallelSpec(1, 8, "/data");
  spec.dataset.format = DatasetFormat::kFixedRecord;
  spec.dataset.record_bytes = 8;
  spec.shuffle.mode = ShuffleMode::kNone;
  // Samples 0..3 in a.bin, 4..7 in b.bin.
  ShardPlanner planner = PlannerOver(spec, {{"/data/a.bin", 4 * 8}, {"/data/b.bin", 4 * 8}});
  StepPlan plan = planner.PlanStep(0, planner.DefaultLoading());
  ASSERT_EQ(plan.reads.size(), 1u);
  ASSERT_EQ(plan.reads[0].ranges.size(), 2u);  // one per file
  EXPECT_EQ(plan.reads[0].ranges[0].file, 0u);
  EXPECT_EQ(plan.reads[0].ranges[0].length, 32u);
  EXPECT_EQ(plan.reads[0].ranges[1].file, 1u);
  EXPECT_EQ(plan.reads[0].ranges[1].offset, 0u);
  EXPECT_EQ(plan.bytes_read, 64u);
}

TEST(ShardPlanner, TokenStreamNeighboursShareTheirOverlappingToken) {
  // T = 4 tokens of uint16: sample i is tokens [4i, 4i+5); samples 0 and 1
  // coalesce into tokens [0, 9) = 18 bytes, not 2 × 10.
  JobSpec spec = DataParallelSpec(1, 2, "/data/tokens.bin");
  spec.dataset.format = DatasetFormat::kTokenStream;
  spec.dataset.dtype = formats::DType::kUint16;
  spec.dataset.sequence_length = 4;
  spec.shuffle.mode = ShuffleMode::kNone;
  ShardPlanner planner = PlannerOver(spec, {{"/data/tokens.bin", 2 * 41}});  // 41 tokens -> N = 10
  EXPECT_EQ(planner.job().samples, 10u);
  StepPlan plan = planner.PlanStep(0, planner.DefaultLoading());
  ASSERT_EQ(plan.reads[0].ranges.size(), 1u);
  EXPECT_EQ(plan.reads[0].ranges[0].length, 18u);
  EXPECT_EQ(plan.bytes_read, 18u);
}

TEST(ShardPlanner, UnsupportedLoadAndReshardIsExplained) {
  JobSpec spec = DataParallelSpec(3, 3, "/v");
  spec.dataset.record_bytes = 4;
  spec.dataset.samples = 10;
  ShardPlanner planner = MakePlanner(spec);
  EXPECT_TRUE(planner.Unsupported({Strategy::kLoadAndReshard, Fanout::kLoad}).empty());
  spec.mesh.axes = {{"data", 3}, {"model", 2}};
  spec.mesh.devices_per_process = 2;
  spec.mesh.batch_axes = {"model"};
  spec.mesh.batch_axes_set = true;
  spec.batch.global_batch_size = 2;
  ShardPlanner p2 = MakePlanner(spec);
  EXPECT_THAT(p2.Unsupported({Strategy::kLoadAndReshard, Fanout::kLoad}), HasSubstr("divisible by processes"));
}

TEST(ParseStepRange, AcceptsRangesAndSingleStepsAndRejectsTheRest) {
  auto r = ParseStepRange("3:7");
  ASSERT_OK(r);
  EXPECT_EQ(r->first, 3);
  EXPECT_EQ(r->second, 7);
  r = ParseStepRange("5");
  ASSERT_OK(r);
  EXPECT_EQ(r->second, 6);
  EXPECT_FALSE(ParseStepRange("7:3").ok());
  EXPECT_FALSE(ParseStepRange("a:b").ok());
  EXPECT_FALSE(ParseStepRange("-1:3").ok());
  EXPECT_FALSE(ParseStepRange("").ok());
  EXPECT_EQ(ParseStepRange("4:4").status().location(), "--steps");
}

}  // namespace
}  // namespace meshload::planner
