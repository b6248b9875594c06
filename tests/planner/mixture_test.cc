// Mixtures (planner/mixture.h, spec.mixture): per-batch counts, the
// schedule, each dataset's own epochs, mesh independence and resume, the
// combined index, and the spec's errors.

#include "planner/mixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "planner/shard_planner.h"
#include "planner/spec.h"
#include "planner/spec_reader.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace meshload::planner {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t R = MixtureSchedule::kResolution;

MixtureSpec Weights(const std::vector<double>& w) {
  MixtureSpec m;
  for (size_t d = 0; d < w.size(); ++d) {
    MixtureDataset ds;
    ds.name = "d" + std::to_string(d);
    ds.uri = "d" + std::to_string(d);
    ds.weight = w[d];
    m.datasets.push_back(ds);
  }
  return m;
}

// Every step's counts add up to B and are the floor or the ceiling of
// B·w_d (to 1/R of a sample); what a dataset gave in n steps stays within
// one sample of n·B·w_d (to n/R·B of quantisation); consumption is the sum
// of the counts.
TEST(MixtureSchedule, CountsAreWithinOneOfExactEveryStepAndInTotal) {
  std::mt19937_64 rng(21);
  for (int round = 0; round < 200; ++round) {
    const size_t D = 2 + rng() % 6;
    const uint64_t B = 1 + rng() % 300;
    std::vector<double> w(D);
    for (double& x : w) x = (rng() % 4 == 0) ? 0.0 : std::uniform_real_distribution<double>(0.01, 5)(rng);
    if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) w[0] = 1;
    MixtureSchedule s(Weights(w), B);
    const std::vector<double> norm = s.WeightsAt(0);
    std::vector<uint64_t> total(D, 0);
    const int64_t steps = static_cast<int64_t>(R) + 1 + static_cast<int64_t>(rng() % 1500);
    for (int64_t t = 0; t < steps; ++t) {
      const std::vector<uint64_t> c = s.CountsAt(t);
      ASSERT_EQ(s.ConsumedBefore(t), total) << "round " << round << " step " << t;
      uint64_t sum = 0;
      for (size_t d = 0; d < D; ++d) {
        sum += c[d];
        ASSERT_LT(std::abs(static_cast<double>(c[d]) - static_cast<double>(B) * norm[d]), 1.0 + 1.0 / R)
            << "round " << round << " step " << t << " dataset " << d;
        total[d] += c[d];
        const double exact = static_cast<double>(t + 1) * static_cast<double>(B) * norm[d];
        ASSERT_LT(std::abs(static_cast<double>(total[d]) - exact), 1.0 + static_cast<double>(t + 1) / R)
            << "round " << round << " step " << t << " dataset " << d;
        if (norm[d] == 0) {
          ASSERT_EQ(c[d], 0u);
        }
      }
      ASSERT_EQ(sum, B);
    }
  }
}

// The cumulative drift docs/sampler.md states: quotas in 1/R of a sample
// leave each dataset's total within 1 + n/R samples of its exact share
// after n steps, and the figure it gives (batch 64, weights 0.5/0.3/0.2, a
// million steps: 195 samples over and under) is what the schedule does.
TEST(MixtureSchedule, TheCumulativeDriftIsWithinTheDocumentedBoundAndFigure) {
  MixtureSchedule s(Weights({0.5, 0.3, 0.2}), 64);
  const int64_t n = 1000000;
  const std::vector<uint64_t> c = s.ConsumedBefore(n);
  const std::vector<double> w = s.WeightsAt(0);
  std::vector<double> off(3);
  for (size_t d = 0; d < 3; ++d) off[d] = static_cast<double>(c[d]) - static_cast<double>(n) * 64 * w[d];
  EXPECT_NEAR(off[0], 0, 1);
  EXPECT_NEAR(off[1], 195.3, 1);
  EXPECT_NEAR(off[2], -195.3, 1);
  std::mt19937_64 rng(5);
  for (int round = 0; round < 100; ++round) {
    const size_t D = 2 + rng() % 6;
    const uint64_t B = 1 + rng() % 4096;
    std::vector<double> wr(D);
    for (double& x : wr) x = std::uniform_real_distribution<double>(0.01, 5)(rng);
    MixtureSchedule m(Weights(wr), B);
    const std::vector<double> norm = m.WeightsAt(0);
    for (int64_t steps : {int64_t{999983}, int64_t{123456789}}) {
      const std::vector<uint64_t> got = m.ConsumedBefore(steps);
      for (size_t d = 0; d < D; ++d) {
        const double exact = static_cast<double>(steps) * static_cast<double>(B) * norm[d];
        ASSERT_LE(std::abs(static_cast<double>(got[d]) - exact), 1.0 + static_cast<double>(steps) / R)
            << "round " << round << " dataset " << d << " steps " << steps;
      }
    }
  }
}

TEST(MixtureSchedule, AScheduleChangesTheWeightsFromItsStep) {
  MixtureSpec m = Weights({3, 1});
  m.datasets[0].schedule = {{100, 1}};
  m.datasets[1].schedule = {{100, 1}, {250, 0}};
  MixtureSchedule s(m, 64);
  EXPECT_EQ(s.CountsAt(0), (std::vector<uint64_t>{48, 16}));
  EXPECT_EQ(s.CountsAt(99), (std::vector<uint64_t>{48, 16}));
  EXPECT_EQ(s.CountsAt(100), (std::vector<uint64_t>{32, 32}));
  EXPECT_EQ(s.CountsAt(249), (std::vector<uint64_t>{32, 32}));
  EXPECT_EQ(s.CountsAt(250), (std::vector<uint64_t>{64, 0}));
  EXPECT_EQ(s.ConsumedBefore(100), (std::vector<uint64_t>{4800, 1600}));
  EXPECT_EQ(s.ConsumedBefore(300), (std::vector<uint64_t>{4800 + 150 * 32 + 50 * 64, 1600 + 150 * 32}));
  EXPECT_EQ(s.WeightsAt(260), (std::vector<double>{1.0, 0.0}));
}

TEST(MixtureSchedule, UnevenWeightsTakeTurnsWithTheExtraSample) {
  // B·w = 10/3 each: every step gives 3 + 3 + 4 in some order; the quotas
  // are 3413, 3413 and 3414 units of 1/1024, so after n steps each dataset
  // has had 10n/3 within one sample and n/1024.
  MixtureSchedule s(Weights({1, 1, 1}), 10);
  std::vector<uint64_t> total(3, 0);
  for (int64_t t = 0; t < 3000; ++t) {
    const auto c = s.CountsAt(t);
    for (size_t d = 0; d < 3; ++d) {
      ASSERT_TRUE(c[d] == 3 || c[d] == 4);
      total[d] += c[d];
      ASSERT_LT(std::abs(static_cast<double>(total[d]) - 10.0 * static_cast<double>(t + 1) / 3),
                1.0 + static_cast<double>(t + 1) / 1024)
          << "step " << t;
    }
  }
}

JobSpec MixtureJob(int64_t processes, int64_t batch, const std::vector<std::pair<int64_t, double>>& datasets) {
  JobSpec spec;
  spec.mesh.processes = processes;
  spec.mesh.devices_per_process = 2;
  spec.mesh.axes = {{"data", processes * 2}};
  spec.batch.global_batch_size = batch;
  spec.dataset.uri = "s3://bucket/corpora";
  spec.dataset.format = DatasetFormat::kFixedRecord;
  spec.dataset.record_bytes = 16;
  spec.shuffle.seed = 5;
  MixtureSpec m;
  for (size_t d = 0; d < datasets.size(); ++d) {
    MixtureDataset ds;
    ds.name = "set" + std::to_string(d);
    ds.uri = "set" + std::to_string(d) + "/";
    ds.weight = datasets[d].second;
    ds.samples = datasets[d].first;
    m.datasets.push_back(ds);
  }
  spec.mixture = m;
  return spec;
}

// Each dataset's samples, step after step, are its own epochs one after
// another: every epoch holds each of its samples once, whatever the others do.
TEST(MixtureBatches, EachDatasetRunsThroughItsOwnEpochs) {
  const JobSpec spec = MixtureJob(2, 64, {{37, 1}, {1000, 3}, {200000, 4}});
  ShardPlanner planner = testing::MakePlanner(spec);
  const auto& parts = planner.job().dataset.parts();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].first, 37u);
  EXPECT_EQ(parts[2].first, 1037u);
  std::vector<std::vector<uint64_t>> streams(3);
  for (int64_t t = 0; t < 200; ++t) {
    std::vector<uint64_t> batch = planner.GlobalBatch(t);
    ASSERT_EQ(batch.size(), 64u);
    std::vector<uint64_t> per(3, 0);
    for (uint64_t id : batch) ++per[planner.job().dataset.PartOf(id)];
    ASSERT_EQ(per, planner.mixture()->CountsAt(t)) << "step " << t;
    for (size_t d = 0; d < 3; ++d) {
      for (uint64_t id : batch) {
        if (planner.job().dataset.PartOf(id) == d) streams[d].push_back(id - parts[d].first);
      }
    }
  }
  // Dataset 0 (37 samples, weight 1/8): 8 a step, 1600 in all: 43 whole
  // epochs and part of one. Each whole epoch holds every sample once and the
  // part at most once, so every sample appears 43 or 44 times.
  const auto consumed = planner.mixture()->ConsumedBefore(200);
  for (size_t d = 0; d < 2; ++d) {
    const uint64_t n = parts[d].samples;
    ASSERT_EQ(streams[d].size(), consumed[d]);
    std::map<uint64_t, uint64_t> times;
    for (uint64_t id : streams[d]) ++times[id];
    const uint64_t whole = consumed[d] / n;
    ASSERT_EQ(times.size(), whole > 0 ? n : consumed[d]);
    for (const auto& [id, k] : times) {
      ASSERT_TRUE(k == whole || k == whole + 1) << "dataset " << d << " sample " << id << " appears " << k << " times";
    }
  }
  EXPECT_EQ(consumed[0], 1600u);
}

TEST(MixtureBatches, TheSameOnEveryMeshAndAfterAResume) {
  std::vector<std::vector<uint64_t>> reference;
  for (int64_t P : {4, 8, 16}) {
    JobSpec spec = MixtureJob(P, 96, {{500, 0.5}, {3000, 0.3}, {90, 0.2}});
    spec.mixture->datasets[2].schedule = {{30, 0.6}};
    spec.resume.step = P == 16 ? 40 : 0;
    ShardPlanner planner = testing::MakePlanner(spec);
    std::vector<std::vector<uint64_t>> batches;
    for (int64_t t = 0; t < 60; ++t) batches.push_back(planner.GlobalBatch(t));
    if (reference.empty()) {
      reference = batches;
    } else {
      ASSERT_EQ(batches, reference) << "P=" << P;
    }
  }
}

// Every strategy gives every device the same samples, and what a process
// reads and receives holds what its devices need.
TEST(MixtureBatches, EveryStrategyAgrees) {
  for (Strategy s : kAllStrategies) {
    for (Fanout f : kAllFanouts) {
      JobSpec spec = MixtureJob(4, 32, {{100, 1}, {50, 2}});
      ShardPlanner planner = testing::MakePlanner(spec);
      const Loading l{s, f};
      if (!planner.Unsupported(l).empty()) continue;
      for (int64_t step : {0, 7, 33}) {
        StepPlan whole = planner.PlanStep(step, l);
        for (int64_t p = 0; p < 4; ++p) {
          StepPlan one = planner.PlanStep(step, l, p, ShardPlanner::Detail::kSamples);
          std::multiset<uint64_t> have;
          for (const auto& r : one.reads) have.insert(r.samples.begin(), r.samples.end());
          for (const auto& t : one.transfers) {
            if (t.to == p) have.insert(t.samples.begin(), t.samples.end());
          }
          for (const auto& d : one.devices) {
            ASSERT_EQ(d.samples, whole.devices[static_cast<size_t>(d.device)].samples);
            for (uint64_t id : d.samples) ASSERT_TRUE(have.count(id)) << "process " << p << " lacks " << id;
          }
        }
      }
    }
  }
}

// TokenStream datasets keep their own streams: a sample never reads
// another dataset's tokens.
TEST(MixtureIndex, TokenStreamDatasetsKeepTheirOwnStreams) {
  JobSpec spec = MixtureJob(1, 4, {{10, 1}, {7, 1}});
  spec.dataset.format = DatasetFormat::kTokenStream;
  spec.dataset.record_bytes = 0;
  spec.dataset.dtype = formats::DType::kUint16;
  spec.dataset.sequence_length = 8;
  ShardPlanner planner = testing::MakePlanner(spec);
  const DatasetIndex& ds = planner.job().dataset;
  ASSERT_EQ(ds.files().size(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    const DatasetIndex::Part& part = ds.parts()[d];
    for (uint64_t i = part.first; i < part.first + part.samples; ++i) {
      std::vector<Extent> e;
      ds.AppendExtents(i, e);
      uint64_t bytes = 0;
      for (const Extent& x : e) {
        EXPECT_EQ(x.file, d) << "sample " << i;
        bytes += x.length;
      }
      EXPECT_EQ(bytes, 9u * 2) << "sample " << i;
    }
  }
}

std::string Problems(const JobSpec& spec) {
  Diagnostics d;
  ValidateJobSpec(spec, d);
  return d.ToString();
}

TEST(MixtureSpecChecks, BadWeightsSchedulesNamesAndPathsAreNamed) {
  JobSpec spec = MixtureJob(2, 8, {{10, 0}, {10, 0}});
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets: the weights are all 0"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, 0}});
  spec.mixture->datasets[0].schedule = {{50, 0}};
  EXPECT_THAT(Problems(spec), HasSubstr("the weights from step 50 on are all 0"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
  spec.mixture->datasets[1].schedule = {{50, 1}, {20, 2}};
  EXPECT_THAT(Problems(spec),
              HasSubstr("spec.mixture.datasets[1].schedule[1].step: 20 does not follow schedule[0].step 50"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, -1}});
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].weight"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
  spec.mixture->datasets[1].name = "set0";
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].name: 'set0' is also datasets[0]'s name"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
  spec.mixture->datasets[1].uri = "../elsewhere";
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].uri: '../elsewhere' has a '..' component"));
  spec = MixtureJob(2, 8, {{10, 1}});
  EXPECT_THAT(Problems(spec), HasSubstr("a mixture needs at least 2 datasets"));
  spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
  spec.dataset.samples = 20;
  EXPECT_THAT(Problems(spec), HasSubstr("spec.dataset.samples: is not used with spec.mixture"));
  // A local dataset outside the volume the sidecar mounts.
  spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
  spec.dataset.uri = "/data/corpora";
  spec.dataset.volume = DatasetVolume{"data", "/data"};
  spec.mixture->datasets[1].uri = "/elsewhere/code";
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].uri: '/elsewhere/code' is not under"));
  EXPECT_EQ(ResolveMixtureUri("s3://b/corpora/", "web"), "s3://b/corpora/web");
  EXPECT_EQ(ResolveMixtureUri("/data", "/other/x"), "/other/x");
  EXPECT_EQ(ResolveMixtureUri("/data", "s3://b/x"), "s3://b/x");
}

// NaN and the infinities satisfy no bound and mean no proportion: refused
// with the field's path from a YAML job (where `.nan` and `.inf` are
// numbers) and from a spec built in code; a refused weight is printed as
// given, never rounded to six decimals.
TEST(MixtureSpecChecks, NonFiniteWeightsAreRefusedAndNumbersArePrintedAsGiven) {
  for (double bad : std::vector<double>{std::nan(""), INFINITY, -INFINITY}) {
    JobSpec spec = MixtureJob(2, 8, {{10, 1}, {10, bad}});
    EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].weight: must be a finite number"));
    spec = MixtureJob(2, 8, {{10, 1}, {10, 1}});
    spec.mixture->datasets[0].schedule = {{50, bad}};
    EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[0].schedule[0].weight: must be a finite number"));
  }
  JobSpec spec = MixtureJob(2, 8, {{10, 1}, {10, -1e-7}});
  EXPECT_THAT(Problems(spec), HasSubstr("spec.mixture.datasets[1].weight: must be >= 0, got -1e-7"));

  std::string yaml = meshload::testing::MinimalJobYaml();
  const std::string mixture =
      "  mixture:\n    datasets:\n      - {name: a, uri: a, weight: 1}\n"
      "      - {name: b, uri: b, weight: .nan}\n"
      "      - {name: c, uri: c, weight: 1, schedule: [{step: 5, weight: .inf}]}\n";
  yaml += mixture;
  Diagnostics d;
  (void)ParseDataLoadJob(yaml, d);
  EXPECT_THAT(d.ToString(), HasSubstr("spec.mixture.datasets[1].weight: must be a finite number, got .nan"));
  EXPECT_THAT(d.ToString(),
              HasSubstr("spec.mixture.datasets[2].schedule[0].weight: must be a finite number, got .inf"));
}

TEST(FormatNumber, TheShortestTextThatReadsBack) {
  EXPECT_EQ(FormatNumber(-1e-7), "-1e-7");
  EXPECT_EQ(FormatNumber(0), "0");
  EXPECT_EQ(FormatNumber(0.02), "0.02");
  EXPECT_EQ(FormatNumber(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatNumber(1e300), "1e300");
  EXPECT_EQ(FormatNumber(std::nan("")), "nan");
  EXPECT_EQ(FormatNumber(-INFINITY), "-inf");
}

// Megatron datasets of different token types cannot be mixed.
TEST(MixtureIndex, DatasetsThatDisagreeOnTheirDtypeAreRefusedByName) {
  JobSpec spec = MixtureJob(1, 4, {{10, 1}, {10, 1}});
  spec.dataset.format = DatasetFormat::kMegatronIndexed;
  spec.dataset.record_bytes = 0;
  std::vector<DatasetIndex> parts;
  for (uint8_t code : {uint8_t{8}, uint8_t{4}}) {  // uint16, int32
    formats::MegatronIndex idx;
    ASSERT_TRUE(formats::MegatronDTypeOf(code, idx.dtype));
    for (int i = 0; i < 10; ++i) {
      idx.lengths.push_back(3);
      idx.pointers.push_back(i * 3 * static_cast<int64_t>(idx.dtype.bytes));
      idx.document_indices.push_back(i);
    }
    idx.document_indices.push_back(10);
    idx.data_bytes_needed = 30 * idx.dtype.bytes;
    DatasetIndex::FileFacts f;
    f.path = "p" + std::to_string(code) + ".bin";
    f.size = idx.data_bytes_needed;
    f.megatron = idx;
    Diagnostics d;
    std::vector<DatasetIndex::FileFacts> files;
    files.push_back(std::move(f));
    auto one = DatasetIndex::FromFiles(spec.dataset, std::move(files), d);
    ASSERT_OK(one);
    parts.push_back(std::move(*one));
  }
  Diagnostics d;
  auto combined = DatasetIndex::Combine(std::move(parts), {"web", "code"},
                                        {"spec.mixture.datasets[0]", "spec.mixture.datasets[1]"}, d);
  EXPECT_FALSE(combined.ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.mixture.datasets[1]: holds int32 elements, but spec.mixture.datasets[0] "
                                      "(web) holds uint16; the datasets of a mixture must agree"));
}

}  // namespace
}  // namespace meshload::planner
