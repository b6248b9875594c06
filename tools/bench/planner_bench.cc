// Planner benchmark: permutation throughput, one process's plan for one step
// of a 2,048-process × 8-device mesh, the whole-mesh --compare summary, and
// token-balanced shards (spec.batch.balance) and a mixture of datasets
// (spec.mixture) on the same mesh.
//
// Prints each figure next to its target and next to a ceiling measured in
// the same run (machines are noisy: compare ratios, not absolute numbers).
//
//   build/tools/bench/planner_bench [--quick]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "common/allocator.h"
#include "common/flags.h"
#include "planner/sampler.h"
#include "planner/shard_planner.h"

namespace meshload::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Keeps the optimiser from deleting a loop whose result is unused.
volatile uint64_t g_sink;

// Best-of-`reps` throughput of fn(i) over `n` positions, in positions/s.
template <typename F>
double Throughput(uint64_t n, int reps, F fn) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    uint64_t acc = 0;
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) acc += fn(i);
    auto t1 = Clock::now();
    g_sink = acc;
    best = std::max(best, static_cast<double>(n) / Seconds(t0, t1));
  }
  return best;
}

template <typename F>
double BestSeconds(int reps, F fn) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best;
}

planner::JobSpec BigMeshSpec() {
  planner::JobSpec spec;
  spec.mesh.processes = 2048;
  spec.mesh.devices_per_process = 8;
  spec.mesh.axes = {{"data", 512}, {"fsdp", 4}, {"tensor", 8}};
  spec.mesh.batch_axes = {"data", "fsdp"};
  spec.mesh.batch_axes_set = true;
  spec.strategy = planner::Strategy::kPerProcess;
  spec.dataset.uri = "/datasets/tokens";
  spec.dataset.format = planner::DatasetFormat::kTokenStream;
  spec.dataset.dtype = formats::DType::kUint16;
  spec.dataset.sequence_length = 2048;
  spec.dataset.samples = 10'000'000'000;  // 10^10 samples: nothing may be stored per sample
  spec.batch.global_batch_size = 65536;
  spec.shuffle.mode = planner::ShuffleMode::kGlobal;
  spec.shuffle.seed = 7;
  return spec;
}

// A MegatronIndexed corpus of `n` uint16 documents with a long tail of
// lengths (most 128 to 2,048 tokens, one in 16 up to 16,384), indexed as
// if its .idx had been read: the balancing's input at scale.
// BigMeshSpec over a MegatronIndexed dataset at `uri` (sizes from its index).
planner::JobSpec MegatronBigMeshSpec(const std::string& uri) {
  planner::JobSpec spec = BigMeshSpec();
  spec.dataset.format = planner::DatasetFormat::kMegatronIndexed;
  spec.dataset.uri = uri;
  spec.dataset.dtype.reset();
  spec.dataset.sequence_length = 0;
  spec.dataset.samples.reset();
  return spec;
}

Result<planner::DatasetIndex> CorpusIndex(const planner::DatasetSpec& spec, uint64_t n) {
  formats::MegatronIndex index;
  formats::MegatronDTypeOf(8, index.dtype);  // uint16
  std::mt19937_64 rng(5);
  int64_t at = 0;
  index.lengths.reserve(n);
  index.pointers.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    const bool long_one = rng() % 16 == 0;
    const int32_t len =
        long_one ? static_cast<int32_t>(2048 + rng() % 14336) : static_cast<int32_t>(128 + rng() % 1920);
    index.lengths.push_back(len);
    index.pointers.push_back(at);
    at += int64_t{len} * 2;
  }
  index.document_indices = {0, static_cast<int64_t>(n)};
  index.data_bytes_needed = static_cast<uint64_t>(at);
  planner::DatasetIndex::FileFacts facts;
  facts.path = "/datasets/corpus.bin";
  facts.size = static_cast<uint64_t>(at);
  facts.megatron = std::move(index);
  std::vector<planner::DatasetIndex::FileFacts> files;
  files.push_back(std::move(facts));
  Diagnostics d;
  auto out = planner::DatasetIndex::FromFiles(spec, std::move(files), d);
  if (out.ok() && !d.ok()) return InvalidArgument(d.ToString());
  return out;
}

// 4. Token-balanced shards: the cost a sidecar pays per step to deal its
// global batch by tokens, against the same step unbalanced, and how even
// the shards come out, on the 16,384-device mesh with S = 2,048 shards
// (32 documents each) and with every axis sharding the batch (S = 16,384, 4
// each: the hard case).
int BalanceSection(bool quick) {
  const uint64_t docs = quick ? 2'000'000 : 8'000'000;
  std::printf(
      "\ntoken-balanced shards (batch.balance Tokens, tolerance 1%%), same mesh, B = 65,536,\n"
      "MegatronIndexed corpus of %.0f M documents of 128..16,384 tokens (long tail)\n",
      static_cast<double>(docs) / 1e6);
  for (bool all_axes : {false, true}) {
    planner::JobSpec spec = MegatronBigMeshSpec("/datasets/corpus");
    if (all_axes) spec.mesh.batch_axes = {"data", "fsdp", "tensor"};
    spec.batch.balance.mode = planner::BalanceMode::kTokens;
    planner::JobSpec plain_spec = spec;
    plain_spec.batch.balance.mode = planner::BalanceMode::kNone;
    auto index = CorpusIndex(spec.dataset, docs);
    if (!index.ok()) {
      std::fprintf(stderr, "corpus index: %s\n", index.status().ToString().c_str());
      return 1;
    }
    Diagnostics d;
    auto resolve = [&](const planner::JobSpec& s) -> Result<planner::ShardPlanner> {
      MESHLOAD_ASSIGN_OR_RETURN(planner::ValidJob valid, planner::ValidateJob(s, d));
      planner::ResolveOptions o;
      o.index = *index;
      MESHLOAD_ASSIGN_OR_RETURN(planner::ResolvedJob job, planner::ResolveJob(valid, o, d));
      return planner::ShardPlanner(std::move(job));
    };
    auto balanced = resolve(spec);
    auto plain = resolve(plain_spec);
    if (!balanced.ok() || !plain.ok()) {
      std::fprintf(stderr, "spec did not resolve: %s\n", d.ToString().c_str());
      return 1;
    }
    const int reps = quick ? 10 : 40;
    double before = 0, after = 0, worst_after = 0;
    uint64_t swaps = 0, missed = 0;
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      planner::BalanceOutcome o = balanced->Balance(100 + r);
      before += o.before.Spread();
      after += o.after.Spread();
      worst_after = std::max(worst_after, o.after.Spread());
      swaps += o.swaps;
      missed += !o.within_tolerance;
    }
    const double balance_t = Seconds(t0, Clock::now()) / reps;
    // The heaviest shard (what every rank waits for) against the mean and
    // against the least any deal can give it: the mean, or the longest
    // sample with the B/S − 1 shortest beside it.
    double heavy_before = 0, heavy_after = 0, heavy_bound = 0;
    for (int r = 0; r < reps; ++r) {
      planner::BalanceOutcome o = balanced->Balance(100 + r);
      std::vector<uint64_t> tokens = balanced->TokensOf(balanced->SamplerBatch(100 + r));
      std::sort(tokens.begin(), tokens.end());
      const size_t per_shard = tokens.size() / static_cast<size_t>(balanced->job().mesh.shards());
      uint64_t bound = tokens.back();
      for (size_t i = 0; i + 1 < per_shard; ++i) bound += tokens[i];
      heavy_before += static_cast<double>(o.before.max) / o.before.mean;
      heavy_after += static_cast<double>(o.after.max) / o.after.mean;
      heavy_bound += std::max(1.0, static_cast<double>(bound) / o.after.mean);
    }
    auto time_plan = [&](const planner::ShardPlanner& p) {
      auto a = Clock::now();
      for (int r = 0; r < reps; ++r) {
        g_sink = p.PlanStep(100 + r, p.DefaultLoading(), (r * 797) % 2048, planner::ShardPlanner::Detail::kSamples)
                     .devices.size();
      }
      return Seconds(a, Clock::now()) / reps;
    };
    const double plan_plain = time_plan(*plain);
    const double plan_balanced = time_plan(*balanced);
    const double batch_t = BestSeconds(reps, [&] { g_sink = plain->GlobalBatch(12345).size(); });
    std::printf(
        "  S = %5lld shards of %lld: one process's step plan %.3f ms balanced vs %.3f ms unbalanced\n"
        "    (+%.3f ms a step, %.1fx the whole global batch's %.3f ms); dealing alone %.3f ms\n"
        "    shard tokens spread (max-min)/mean: %.1f%% in sampler order -> %.2f%% dealt (worst %.2f%%),\n"
        "    %.1f swaps a step, %llu of %d steps outside the tolerance;\n"
        "    heaviest shard %.3fx the mean in sampler order -> %.3fx dealt (no deal can go below %.3fx)\n",
        static_cast<long long>(balanced->job().mesh.shards()),
        static_cast<long long>(65536 / balanced->job().mesh.shards()), plan_balanced * 1e3, plan_plain * 1e3,
        (plan_balanced - plan_plain) * 1e3, plan_balanced / batch_t, batch_t * 1e3, balance_t * 1e3,
        before / reps * 100, after / reps * 100, worst_after * 100, static_cast<double>(swaps) / reps,
        static_cast<unsigned long long>(missed), reps, heavy_before / reps, heavy_after / reps, heavy_bound / reps);
  }
  return 0;
}

// 5. Mixtures: one process's step plan of a job mixing three corpora (with
// a schedule) against the same job over one corpus, and the tokens a core
// plans per second (the target: 10 M tokens/s).
int MixtureSection(bool quick) {
  const uint64_t docs = quick ? 600'000 : 3'000'000;
  planner::JobSpec spec = MegatronBigMeshSpec("/datasets/corpora");
  planner::JobSpec single = spec;
  planner::MixtureSpec mix;
  const char* names[] = {"web", "code", "books"};
  const double weights[] = {0.7, 0.2, 0.1};
  for (int d = 0; d < 3; ++d) {
    planner::MixtureDataset m;
    m.name = names[d];
    m.uri = names[d];
    m.weight = weights[d];
    if (d > 0) m.schedule = {{50'000, d == 1 ? 0.3 : 0.2}};
    mix.datasets.push_back(m);
  }
  spec.mixture = mix;
  std::vector<planner::DatasetIndex> parts;
  for (int d = 0; d < 3; ++d) {
    auto part = CorpusIndex(spec.dataset, docs / 3);
    if (!part.ok()) return 1;
    parts.push_back(std::move(*part));
  }
  Diagnostics d;
  auto combined = planner::DatasetIndex::Combine(std::move(parts), {"web", "code", "books"},
                                                 {"datasets[0]", "datasets[1]", "datasets[2]"}, d);
  auto one = CorpusIndex(single.dataset, docs);
  if (!combined.ok() || !one.ok()) {
    std::fprintf(stderr, "corpus index: %s\n", d.ToString().c_str());
    return 1;
  }
  auto resolve = [&](const planner::JobSpec& s, const planner::DatasetIndex& index) -> Result<planner::ShardPlanner> {
    MESHLOAD_ASSIGN_OR_RETURN(planner::ValidJob valid, planner::ValidateJob(s, d));
    planner::ResolveOptions o;
    o.index = index;
    MESHLOAD_ASSIGN_OR_RETURN(planner::ResolvedJob job, planner::ResolveJob(valid, o, d));
    return planner::ShardPlanner(std::move(job));
  };
  auto mixed = resolve(spec, *combined);
  auto plain = resolve(single, *one);
  if (!mixed.ok() || !plain.ok()) {
    std::fprintf(stderr, "spec did not resolve: %s\n", d.ToString().c_str());
    return 1;
  }
  const int reps = quick ? 10 : 40;
  auto time_plan = [&](const planner::ShardPlanner& p) {
    auto a = Clock::now();
    for (int r = 0; r < reps; ++r) {
      g_sink = p.PlanStep(49'990 + r, p.DefaultLoading(), (r * 797) % 2048, planner::ShardPlanner::Detail::kSamples)
                   .devices.size();
    }
    return Seconds(a, Clock::now()) / reps;
  };
  const double t_plain = time_plan(*plain);
  const double t_mixed = time_plan(*mixed);
  const double tokens_per_step = 65536.0 * mixed->job().dataset.mean_sample_bytes() / 2;
  std::printf(
      "\nmixture of 3 MegatronIndexed corpora (0.7/0.2/0.1, changing at step 50,000), same mesh, B = 65,536,\n"
      "%.1f M documents (mean %.0f tokens)\n"
      "  one process's step plan %.3f ms mixed vs %.3f ms over one corpus (%.1fx; the whole mixed global\n"
      "  batch, each step's first plan: later plans of the step reuse it)\n"
      "  %.0f M tokens planned per second on one core (target >= 10 M: %.1fx)\n",
      static_cast<double>(docs) / 1e6, mixed->job().dataset.mean_sample_bytes() / 2, t_mixed * 1e3, t_plain * 1e3,
      t_mixed / t_plain, tokens_per_step / t_mixed / 1e6, tokens_per_step / t_mixed / 10e6);
  return 0;
}

// 6. Rows of tokens (spec.tokens): building the rows of a corpus (what a
// start or a resume of a job costs before its first plan), in tokens per
// second on one core (the target: 10 M tokens/s), and one process's
// step plan at step 0 and at step 10^6 (a resume far into the job costs no
// more than a fresh start: the rows are not walked up to the step).
int RowsSection(bool quick) {
  const uint64_t docs = quick ? 600'000 : 3'000'000;
  planner::JobSpec base = MegatronBigMeshSpec("/datasets/corpus");
  auto corpus = CorpusIndex(base.dataset, docs);
  if (!corpus.ok()) return 1;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < corpus->num_samples(); ++i) tokens += corpus->SampleBytes(i) / 2;
  std::printf(
      "\nrows of tokens from %.1f M MegatronIndexed documents (%.2f G tokens, mean %.0f), rows of 2,048 tokens,\n"
      "window 1,024 documents, same mesh, B = 65,536 rows\n",
      static_cast<double>(docs) / 1e6, static_cast<double>(tokens) / 1e9,
      static_cast<double>(tokens) / static_cast<double>(docs));
  for (planner::TokensMode mode : {planner::TokensMode::kPack, planner::TokensMode::kConcatenate}) {
    planner::JobSpec spec = base;
    planner::TokensSpec t;
    t.mode = mode;
    t.sequence_length = 2048;
    t.end_of_document = planner::EndOfDocument{0, planner::EodAppend::kAlways};
    spec.tokens = t;
    Diagnostics d;
    auto valid = planner::ValidateJob(spec, d);
    if (!valid.ok()) {
      std::fprintf(stderr, "spec: %s\n", d.ToString().c_str());
      return 1;
    }
    std::optional<planner::ShardPlanner> planner;
    const double build = BestSeconds(quick ? 1 : 3, [&] {
      planner::ResolveOptions o;
      o.index = *corpus;
      auto job = planner::ResolveJob(*valid, o, d);
      if (job.ok()) planner.emplace(std::move(*job));
    });
    if (!planner) {
      std::fprintf(stderr, "rows did not resolve: %s\n", d.ToString().c_str());
      return 1;
    }
    const int reps = quick ? 10 : 40;
    auto plan_at = [&](int64_t first) {
      return BestSeconds(3,
                         [&] {
                           for (int r = 0; r < reps; ++r) {
                             g_sink = planner
                                          ->PlanStep(first + r, planner->DefaultLoading(), (r * 797) % 2048,
                                                     planner::ShardPlanner::Detail::kSamples)
                                          .devices.size();
                           }
                         }) /
             reps;
    };
    const double at0 = plan_at(0), at_million = plan_at(1'000'000);
    std::printf("  %-11s %.2f M rows built in %.2f s on one core: %.0f M tokens/s (target >= 10 M: %.1fx)\n",
                mode == planner::TokensMode::kPack ? "Pack" : "Concatenate",
                static_cast<double>(planner->job().samples) / 1e6, build, static_cast<double>(tokens) / build / 1e6,
                static_cast<double>(tokens) / build / 10e6);
    std::printf(
        "              one process's step plan: %.3f ms at step 0, %.3f ms at step 1,000,000 (%.2fx;\n"
        "              a resume costs the build and one plan, whatever the step)\n",
        at0 * 1e3, at_million * 1e3, at_million / at0);
  }
  return 0;
}

int Main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  FlagParser flags("", "usage: planner_bench [--quick] [--only rows]\n", "planner_bench");
  flags.Bool({"--quick"}, &quick);
  flags.String({"--only"}, &only);
  if (int rc = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); rc >= 0) return rc;
  if (only == "rows") return RowsSection(quick);
  if (!only.empty()) return UsageError("--only: no section named " + only + " (rows)", "planner_bench");
  const uint64_t n_eval = quick ? 2'000'000 : 20'000'000;
  const int reps = quick ? 1 : 3;

  std::printf("meshload planner benchmark%s\n\n", quick ? " (quick)" : "");

  // 1. Permutation evaluation on one core. Ceiling: one SplitMix64 per
  // position (the cheapest keyed hash; a permutation cannot be cheaper than
  // one pass of mixing).
  const uint64_t N = 10'000'000'000ull;
  planner::ShuffleSpec global{planner::ShuffleMode::kGlobal, 7, 1024};
  planner::ShuffleSpec block{planner::ShuffleMode::kBlock, 7, 4096};
  planner::EpochPermutation pg(global, N, 3), pb(block, N, 3);
  // Positions spread over the whole domain, as a real step sees them.
  const uint64_t stride = N / n_eval;
  double mix = Throughput(n_eval, reps, [&](uint64_t i) { return planner::Mix64(i * stride); });
  double glob = Throughput(n_eval, reps, [&](uint64_t i) { return pg.At(i * stride); });
  double blk = Throughput(n_eval, reps, [&](uint64_t i) { return pb.At(i * stride); });
  std::printf("permutation, N = 10^10, one core (target >= 50 M positions/s)\n");
  std::printf("  ceiling: one Mix64 per position   %8.1f M/s\n", mix / 1e6);
  std::printf("  Global (Feistel, cycle walking)   %8.1f M/s  = %.2f of ceiling, %.2fx target\n", glob / 1e6,
              glob / mix, glob / 50e6);
  std::printf("  Block (blockSize 4096)            %8.1f M/s  = %.2f of ceiling, %.2fx target\n", blk / 1e6, blk / mix,
              blk / 50e6);
  // What a step does: a contiguous range of B positions (AtRange).
  const size_t range = 65536;
  std::vector<uint64_t> buf(range);
  auto ranged = [&](const planner::EpochPermutation& p) {
    double best = 0;
    for (int r = 0; r < reps * 5; ++r) {
      auto t0 = Clock::now();
      for (uint64_t k = 0; k < 16; ++k) p.AtRange((k * 7919 + r) * range, range, buf.data());
      best = std::max(best, 16.0 * range / Seconds(t0, Clock::now()));
      g_sink = buf[range / 2];
    }
    return best;
  };
  const double glob_r = ranged(pg), blk_r = ranged(pb);
  std::printf("  Global, ranges of 65,536 (AtRange) %7.1f M/s  = %.2fx target\n", glob_r / 1e6, glob_r / 50e6);
  std::printf("  Block, ranges of 65,536 (AtRange)  %7.1f M/s  = %.2fx target\n\n", blk_r / 1e6, blk_r / 50e6);

  // 2. One process's plan for one step of a 2048 x 8 mesh, B = 65,536.
  // First with glibc's defaults (a short-lived process), then as the
  // sidecar runs it (KeepHeapForReuse: the heap is kept between steps).
  Diagnostics d;
  auto valid = planner::ValidateJob(BigMeshSpec(), d);
  if (!valid.ok()) {
    std::fprintf(stderr, "spec is invalid: %s\n", valid.status().ToString().c_str());
    return 1;
  }
  auto job = planner::ResolveJob(*valid, {}, d);
  if (!job.ok()) {
    std::fprintf(stderr, "spec did not resolve: %s\n", job.status().ToString().c_str());
    return 1;
  }
  planner::ShardPlanner shard_planner(std::move(*job));
  std::printf(
      "one process's plan, 2048 processes x 8 devices, axes [data=512, fsdp=4, tensor=8],\n"
      "batchAxes [data, fsdp], B = 65,536, TokenStream T = 2048, N = 10^10 (target < 1 ms)\n");
  const int plan_reps = quick ? 20 : 200;
  auto time_plan = [&](const planner::Loading& l) {
    int64_t p = 0;
    // Mean over reps (not best-of): a sidecar pays every step.
    auto t0 = Clock::now();
    for (int r = 0; r < plan_reps; ++r) {
      planner::StepPlan plan = shard_planner.PlanStep(12345 + r, l, (p++ * 797) % 2048);
      g_sink = plan.bytes_read;
    }
    return Seconds(t0, Clock::now()) / plan_reps;
  };
  const double global_cold = time_plan({planner::Strategy::kGlobalLoad, planner::Fanout::kLoad});
  KeepHeapForReuse();
  for (planner::Strategy s : planner::kAllStrategies) {
    for (planner::Fanout f : planner::kAllFanouts) {
      const double t = time_plan({s, f});
      std::printf("  %-15s %-9s  %8.3f ms  (%.2fx the 1 ms budget)\n", std::string(ToString(s)).c_str(),
                  std::string(ToString(f)).c_str(), t * 1e3, t / 1e-3);
    }
  }
  std::printf("  GlobalLoad/Load with glibc's default heap trimming: %.3f ms\n", global_cold * 1e3);
  // Ceiling for the plan: evaluating the B positions of the global batch,
  // which GlobalLoad must do and no strategy can beat.
  double batch_t = BestSeconds(quick ? 5 : 20, [&] { g_sink = shard_planner.GlobalBatch(12345).size(); });
  std::printf("  ceiling: whole global batch (65,536 positions)  %8.3f ms\n\n", batch_t * 1e3);

  // 3. The whole-mesh --compare summary: all 4 strategies x 2 fan-outs.
  double cmp = BestSeconds(quick ? 1 : 3, [&] {
    for (planner::Strategy s : planner::kAllStrategies) {
      for (planner::Fanout f : planner::kAllFanouts) {
        planner::StepCost c = shard_planner.ComputeCost(12345, {s, f});
        g_sink = c.bytes_read;
      }
    }
  });
  std::printf("whole-mesh --compare summary (8 strategy/fan-out costs over 2048 processes)\n");
  std::printf("  %8.1f ms  (%.3fx the 1 s budget)\n", cmp * 1e3, cmp);
  if (int rc = BalanceSection(quick); rc != 0) return rc;
  if (int rc = MixtureSection(quick); rc != 0) return rc;
  return RowsSection(quick);
}

}  // namespace
}  // namespace meshload::tools::bench

int main(int argc, char** argv) { return meshload::tools::bench::Main(argc, argv); }
