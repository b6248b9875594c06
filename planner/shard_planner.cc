#include "planner/shard_planner.h"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

#include "common/mutex.h"

namespace meshload::planner {
namespace {

// Appends [b, e) to `out`, merging with the last range when they touch.
void AppendRange(std::vector<PositionRange>& out, uint64_t b, uint64_t e) {
  if (b >= e) return;
  if (!out.empty() && out.back().end == b) {
    out.back().end = e;
  } else {
    out.push_back({b, e});
  }
}

uint64_t CountPositions(const std::vector<PositionRange>& ranges) {
  uint64_t n = 0;
  for (const auto& r : ranges) n += r.end - r.begin;
  return n;
}

// Groups (peer, range) pairs into one unit per peer, ranges in order.
std::vector<TransferUnit> Collate(std::map<int64_t, std::vector<PositionRange>>& by_peer, int64_t self,
                                  bool self_is_sender) {
  std::vector<TransferUnit> out;
  for (auto& [peer, ranges] : by_peer) {
    std::sort(ranges.begin(), ranges.end(),
              [](const PositionRange& a, const PositionRange& b) { return a.begin < b.begin; });
    std::vector<PositionRange> merged;
    for (const auto& r : ranges) AppendRange(merged, r.begin, r.end);
    TransferUnit u;
    u.from = self_is_sender ? self : peer;
    u.to = self_is_sender ? peer : self;
    u.positions = std::move(merged);
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace

Result<ResolvedJob> ResolveJob(const ValidJob& job, const ResolveOptions& options, Diagnostics& diags) {
  const JobSpec& spec = job.spec();
  const size_t before = diags.problems().size();

  MESHLOAD_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(spec.mesh));
  std::optional<DatasetIndex> index;
  if (options.index) {
    index = *options.index;
  } else if (spec.mixture) {
    // A mixture is planned without its files from each dataset's samples.
    if (options.samples) {
      diags.Add("--samples", "does not size a mixture; give each dataset's in spec.mixture.datasets[i].samples");
    }
    const std::vector<DatasetSpec> datasets = JobDatasets(spec);
    std::vector<DatasetIndex> parts;
    std::vector<std::string> names, paths;
    for (size_t d = 0; d < datasets.size(); ++d) {
      if (!datasets[d].samples) {
        diags.Add(DatasetPath(spec, d) + ".samples",
                  "required when the dataset (" + datasets[d].uri +
                      ") is not indexed (the planner reads no storage); give its number of samples");
        continue;
      }
      parts.push_back(DatasetIndex::Virtual(datasets[d], static_cast<uint64_t>(*datasets[d].samples)));
      names.push_back(spec.mixture->datasets[d].name);
      paths.push_back(DatasetPath(spec, d));
    }
    if (diags.problems().size() == before) {
      auto combined = DatasetIndex::Combine(std::move(parts), names, paths, diags);
      if (combined.ok()) index = std::move(*combined);
    }
  } else if (options.samples) {
    if (*options.samples < 1) {
      diags.Add("--samples", "must be >= 1, got " + std::to_string(*options.samples));
    } else {
      index = DatasetIndex::Virtual(spec.dataset, static_cast<uint64_t>(*options.samples));
    }
  } else if (spec.dataset.samples) {
    index = DatasetIndex::Virtual(spec.dataset, static_cast<uint64_t>(*spec.dataset.samples));
  } else {
    diags.Add("spec.dataset.samples",
              "required when the dataset (" + spec.dataset.uri +
                  ") is not indexed (the planner reads no storage: its facts come from the storage sources, "
                  "sidecar/source/dataset_facts.h); give the number of samples, or --samples");
  }
  if (diags.problems().size() != before) return diags.ToStatus();
  if (!index) return InvalidArgument("the dataset could not be indexed", "spec.dataset");
  if (spec.tokens && !index->token_rows()) {
    // The samples are rows of tokens, cut from the documents' lengths.
    if (!index->indexed()) {
      diags.Add("spec.tokens",
                "the rows are cut from the documents' lengths, which only the dataset's index gives: a plan "
                "without the data (spec.dataset.samples, --samples) cannot know them; make the data reachable");
      return diags.ToStatus();
    }
    auto rows = DatasetIndex::CutIntoRows(std::move(*index), spec, diags);
    if (!rows.ok() || diags.problems().size() != before) return diags.ok() ? rows.status() : diags.ToStatus();
    index = std::move(*rows);
  }

  const uint64_t B = static_cast<uint64_t>(spec.batch.global_batch_size);
  if (spec.mixture) {
    if (index->parts().size() != spec.mixture->datasets.size()) {
      return InvalidArgument("the index has " + std::to_string(index->parts().size()) + " datasets, the mixture " +
                                 std::to_string(spec.mixture->datasets.size()),
                             "spec.mixture.datasets");
    }
    uint64_t total = 0;
    for (const DatasetIndex::Part& p : index->parts()) total += p.samples;
    // A mixture's datasets repeat as their weights need: no sample count is
    // too small. K is nominal (the samples of all datasets once), for
    // reports only.
    ResolvedJob resolved{spec, std::move(mesh), std::move(*index), 0, B, 0};
    resolved.samples = total;
    resolved.steps_per_epoch = std::max<uint64_t>(1, total / B);
    return resolved;
  }
  if (index->num_samples() < B) {
    diags.Add(spec.tokens ? "spec.tokens" : "spec.dataset",
              "the dataset has " + std::to_string(index->num_samples()) + (spec.tokens ? " rows" : " samples") +
                  ", fewer than one global batch of " + std::to_string(B) + " (spec.batch.globalBatchSize)");
    return diags.ToStatus();
  }
  ResolvedJob resolved{spec, std::move(mesh), std::move(*index), 0, B, 0};
  resolved.samples = resolved.dataset.num_samples();
  resolved.steps_per_epoch = resolved.samples / B;
  return resolved;
}

struct ShardPlanner::BatchMemo {
  static constexpr size_t kKept = 8;
  Mutex mu;
  std::deque<std::pair<int64_t, std::shared_ptr<const std::vector<uint64_t>>>> kept MESHLOAD_GUARDED_BY(mu);
};

ShardPlanner::ShardPlanner(ResolvedJob job) : job_(std::move(job)), memo_(std::make_shared<BatchMemo>()) {
  if (job_.spec.mixture) mixture_ = std::make_shared<const MixtureSchedule>(*job_.spec.mixture, job_.global_batch);
  shard_size_ = job_.global_batch / static_cast<uint64_t>(job_.mesh.shards());
  balanced_ = BalanceState() == Balancing::kApplied;
  if (!job_.dataset.record_format()) token_bytes_ = std::max<uint64_t>(1, formats::DTypeSize(job_.dataset.dtype()));
}

ShardPlanner::Balancing ShardPlanner::BalanceState() const {
  if (job_.spec.batch.balance.mode == BalanceMode::kNone) return Balancing::kOff;
  // A virtual index knows no sample's size: there is nothing to balance by.
  if (!job_.dataset.variable_size() || !job_.dataset.indexed()) return Balancing::kSizesUnknown;
  return Balancing::kApplied;
}

std::string ShardPlanner::Unsupported(const Loading& loading) const {
  if (loading.strategy == Strategy::kLoadAndReshard &&
      job_.global_batch % static_cast<uint64_t>(job_.mesh.processes()) != 0) {
    return "LoadAndReshard needs globalBatchSize (" + std::to_string(job_.global_batch) + ") divisible by processes (" +
           std::to_string(job_.mesh.processes()) + ")";
  }
  return {};
}

PositionRange ShardPlanner::ShardRange(int64_t s) const {
  const uint64_t b = static_cast<uint64_t>(s) * shard_size_;
  return {b, b + shard_size_};
}

PositionRange ShardPlanner::BlockRange(int64_t p) const {
  const uint64_t block = job_.global_batch / static_cast<uint64_t>(job_.mesh.processes());
  const uint64_t b = static_cast<uint64_t>(p) * block;
  return {b, b + block};
}

std::vector<PositionRange> ShardPlanner::ShardRanges(const std::vector<int64_t>& shards) const {
  std::vector<PositionRange> out;
  for (int64_t s : shards) {  // ascending, so touching shards merge
    PositionRange r = ShardRange(s);
    AppendRange(out, r.begin, r.end);
  }
  return out;
}

std::vector<ReadUnit> ShardPlanner::ReadUnits(int64_t p, const Loading& loading) const {
  const DeviceMesh& mesh = job_.mesh;
  const bool broadcast = loading.fanout == Fanout::kBroadcast;
  std::vector<ReadUnit> units;
  switch (loading.strategy) {
    case Strategy::kGlobalLoad:
      if (!broadcast || p == 0) units.push_back({p, -1, {{0, job_.global_batch}}});
      break;
    case Strategy::kPerDevice: {
      const int64_t first = p * mesh.devices_per_process();
      for (int64_t d = first; d < first + mesh.devices_per_process(); ++d) {
        const int64_t s = mesh.ShardOf(d);
        if (broadcast && mesh.OwnerOf(s) != p) continue;
        units.push_back({p, d, {ShardRange(s)}});
      }
      break;
    }
    case Strategy::kPerProcess: {
      std::vector<int64_t> shards;
      for (int64_t s : mesh.ShardsOfProcess(p)) {
        if (!broadcast || mesh.OwnerOf(s) == p) shards.push_back(s);
      }
      if (!shards.empty()) units.push_back({p, -1, ShardRanges(shards)});
      break;
    }
    case Strategy::kLoadAndReshard: units.push_back({p, -1, {BlockRange(p)}}); break;
  }
  return units;
}

std::vector<TransferUnit> ShardPlanner::TransfersTo(int64_t q, const Loading& loading) const {
  const DeviceMesh& mesh = job_.mesh;
  std::map<int64_t, std::vector<PositionRange>> by_source;
  const bool broadcast = loading.fanout == Fanout::kBroadcast;
  switch (loading.strategy) {
    case Strategy::kGlobalLoad:
      if (broadcast && q != 0) by_source[0] = ShardRanges(mesh.ShardsOfProcess(q));
      break;
    case Strategy::kPerDevice:
    case Strategy::kPerProcess:
      if (broadcast) {
        for (int64_t s : mesh.ShardsOfProcess(q)) {
          if (mesh.OwnerOf(s) != q) AppendRange(by_source[mesh.OwnerOf(s)], ShardRange(s).begin, ShardRange(s).end);
        }
      }
      break;
    case Strategy::kLoadAndReshard: {
      const uint64_t block = job_.global_batch / static_cast<uint64_t>(mesh.processes());
      for (int64_t s : mesh.ShardsOfProcess(q)) {
        const PositionRange r = ShardRange(s);
        for (uint64_t pb = r.begin / block; pb * block < r.end; ++pb) {
          if (static_cast<int64_t>(pb) == q) continue;
          const uint64_t b = std::max(r.begin, pb * block);
          const uint64_t e = std::min(r.end, (pb + 1) * block);
          AppendRange(by_source[static_cast<int64_t>(pb)], b, e);
        }
      }
      break;
    }
  }
  return Collate(by_source, q, /*self_is_sender=*/false);
}

std::vector<TransferUnit> ShardPlanner::TransfersFrom(int64_t p, const Loading& loading) const {
  const DeviceMesh& mesh = job_.mesh;
  std::map<int64_t, std::vector<PositionRange>> by_target;
  const bool broadcast = loading.fanout == Fanout::kBroadcast;
  switch (loading.strategy) {
    case Strategy::kGlobalLoad:
      if (broadcast && p == 0) {
        for (int64_t q = 1; q < mesh.processes(); ++q) by_target[q] = ShardRanges(mesh.ShardsOfProcess(q));
      }
      break;
    case Strategy::kPerDevice:
    case Strategy::kPerProcess:
      if (broadcast) {
        for (int64_t s : mesh.ShardsOfProcess(p)) {
          if (mesh.OwnerOf(s) != p) continue;
          for (int64_t q : mesh.ProcessesOfShard(s)) {
            if (q != p) AppendRange(by_target[q], ShardRange(s).begin, ShardRange(s).end);
          }
        }
      }
      break;
    case Strategy::kLoadAndReshard: {
      const PositionRange blk = BlockRange(p);
      for (uint64_t s = blk.begin / shard_size_; s * shard_size_ < blk.end; ++s) {
        const PositionRange r = ShardRange(static_cast<int64_t>(s));
        const uint64_t b = std::max(r.begin, blk.begin);
        const uint64_t e = std::min(r.end, blk.end);
        for (int64_t q : mesh.ProcessesOfShard(static_cast<int64_t>(s))) {
          if (q != p) AppendRange(by_target[q], b, e);
        }
      }
      break;
    }
  }
  return Collate(by_target, p, /*self_is_sender=*/true);
}

std::vector<uint64_t> ShardPlanner::MixtureBatch(int64_t step) const {
  const std::vector<uint64_t> counts = mixture_->CountsAt(step);
  const std::vector<uint64_t> consumed = mixture_->ConsumedBefore(step);
  const auto& parts = job_.dataset.parts();
  const uint64_t B = job_.global_batch;
  // Each dataset's next samples of its own stream, dataset by dataset.
  std::vector<uint64_t> runs(B);
  size_t at = 0;
  for (size_t d = 0; d < parts.size(); ++d) {
    ShuffleSpec shuffle = job_.spec.shuffle;
    shuffle.seed = MixtureDatasetSeed(job_.spec.shuffle.seed, d);
    const uint64_t n = parts[d].samples;
    uint64_t i = consumed[d];
    uint64_t left = counts[d];
    while (left > 0) {
      const uint64_t pos = i % n;
      const uint64_t take = std::min(left, n - pos);
      EpochPermutation perm(shuffle, n, i / n);
      perm.AtRange(pos, static_cast<size_t>(take), runs.data() + at);
      for (uint64_t k = 0; k < take; ++k) runs[at + k] += parts[d].first;
      at += take;
      i += take;
      left -= take;
    }
  }
  MESHLOAD_CHECK(at == B, "a mixture's counts do not add up to the global batch");
  // Interleaved, so that every shard gets a mix.
  FeistelPermutation interleave(B, MixtureInterleaveKey(job_.spec.shuffle.seed, step));
  std::vector<uint64_t> from(B);
  interleave.ForwardRange(0, B, from.data());
  std::vector<uint64_t> out(B);
  for (uint64_t j = 0; j < B; ++j) out[j] = runs[from[j]];
  return out;
}

std::vector<uint64_t> ShardPlanner::SamplerBatch(int64_t step) const {
  if (mixture_) return MixtureBatch(step);
  const uint64_t epoch = EpochOf(step);
  const uint64_t j = static_cast<uint64_t>(step) % job_.steps_per_epoch;
  EpochPermutation perm(job_.spec.shuffle, job_.samples, epoch);
  std::vector<uint64_t> out(job_.global_batch);
  perm.AtRange(j * job_.global_batch, out.size(), out.data());
  return out;
}

std::vector<uint64_t> ShardPlanner::GlobalBatch(int64_t step) const {
  // Only a batch that costs more than the positions a process needs
  // (dealt by tokens, or drawn from a mixture) is kept.
  if (!balanced_ && !mixture_) return SamplerBatch(step);
  {
    MutexLock lock(memo_->mu);
    for (const auto& [s, batch] : memo_->kept) {
      if (s == step) return *batch;
    }
  }
  std::vector<uint64_t> batch = SamplerBatch(step);
  if (balanced_) {
    std::vector<uint64_t> tokens = TokensOf(batch);
    BalanceShards(batch, tokens, job_.mesh.shards(), job_.spec.batch.balance.tolerance);
  }
  MutexLock lock(memo_->mu);
  for (const auto& kept : memo_->kept) {
    if (kept.first == step) return batch;  // another thread made it meanwhile
  }
  if (memo_->kept.size() == BatchMemo::kKept) memo_->kept.pop_front();
  memo_->kept.emplace_back(step, std::make_shared<const std::vector<uint64_t>>(batch));
  return batch;
}

std::vector<uint64_t> ShardPlanner::TokensOf(const std::vector<uint64_t>& batch) const {
  std::vector<uint64_t> tokens(batch.size());
  if (const TokenRows* rows = job_.dataset.token_rows()) {
    for (size_t i = 0; i < batch.size(); ++i) tokens[i] = rows->TokensOf(batch[i]);
    return tokens;
  }
  for (size_t i = 0; i < batch.size(); ++i) tokens[i] = job_.dataset.SampleBytes(batch[i]) / token_bytes_;
  return tokens;
}

BalanceOutcome ShardPlanner::Balance(int64_t step) const {
  std::vector<uint64_t> batch = SamplerBatch(step);
  std::vector<uint64_t> tokens = TokensOf(batch);
  if (!balanced_) {
    BalanceOutcome out;
    out.before = out.after = LoadsOfShards(tokens, job_.mesh.shards());
    out.within_tolerance = false;
    return out;
  }
  return BalanceShards(batch, tokens, job_.mesh.shards(), job_.spec.batch.balance.tolerance);
}

StepPlan ShardPlanner::PlanStep(int64_t step, const Loading& loading, std::optional<int64_t> process,
                                Detail detail) const {
  const DeviceMesh& mesh = job_.mesh;
  StepPlan plan;
  plan.step = step;
  plan.epoch = EpochOf(step);
  plan.step_in_epoch = static_cast<uint64_t>(step) % job_.steps_per_epoch;
  EpochPermutation perm(job_.spec.shuffle, job_.samples, plan.epoch);
  const uint64_t base = plan.step_in_epoch * job_.global_batch;

  // With one process we evaluate only the positions it touches; for the whole
  // mesh, a balanced batch (its order needs every sample's size) or a mixture
  // (its order needs every dataset's run), the global batch is evaluated
  // once and indexed.
  const bool indexed = !process || balanced_ || mixture_;
  std::vector<uint64_t> batch;
  if (indexed) batch = GlobalBatch(step);
  auto samples_of = [&](const std::vector<PositionRange>& ranges) {
    std::vector<uint64_t> out(CountPositions(ranges));
    size_t at = 0;
    for (const auto& r : ranges) {
      const size_t len = static_cast<size_t>(r.end - r.begin);
      if (!indexed) {
        perm.AtRange(base + r.begin, len, out.data() + at);
      } else {
        std::copy(batch.begin() + static_cast<ptrdiff_t>(r.begin), batch.begin() + static_cast<ptrdiff_t>(r.end),
                  out.begin() + static_cast<ptrdiff_t>(at));
      }
      at += len;
    }
    return out;
  };

  const int64_t p_begin = process ? *process : 0;
  const int64_t p_end = process ? *process + 1 : mesh.processes();
  const int64_t L = mesh.devices_per_process();
  std::vector<uint64_t> ids;
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t d = p * L; d < (p + 1) * L; ++d) {
      const int64_t s = mesh.ShardOf(d);
      plan.devices.push_back({d, p, s, samples_of({ShardRange(s)})});
    }
    for (ReadUnit& u : ReadUnits(p, loading)) {
      ReadPlan r;
      r.process = u.process;
      r.device = u.device;
      r.samples = samples_of(u.positions);
      if (detail == Detail::kFull) {
        ids = r.samples;
        r.bytes = job_.dataset.CoalescedExtents(ids, r.ranges);
        plan.bytes_read += r.bytes;
      }
      plan.reads.push_back(std::move(r));
    }
    std::vector<TransferUnit> units = TransfersFrom(p, loading);
    if (process) {
      std::vector<TransferUnit> in = TransfersTo(p, loading);
      units.insert(units.end(), in.begin(), in.end());
    }
    for (TransferUnit& u : units) {
      TransferPlan t;
      t.from = u.from;
      t.to = u.to;
      t.samples = samples_of(u.positions);
      t.bytes = job_.dataset.BytesOf(t.samples.data(), t.samples.size());
      plan.bytes_transferred += t.bytes;
      plan.transfers.push_back(std::move(t));
    }
  }
  std::sort(plan.transfers.begin(), plan.transfers.end(), [](const TransferPlan& a, const TransferPlan& b) {
    return a.from != b.from ? a.from < b.from : a.to < b.to;
  });
  return plan;
}

StepCost ShardPlanner::ComputeCost(int64_t step, const Loading& loading) const {
  const DeviceMesh& mesh = job_.mesh;
  const std::vector<uint64_t> batch = GlobalBatch(step);
  const uint64_t sample_bytes = job_.dataset.sample_bytes();

  // Many read units share their positions (every process under GlobalLoad,
  // replicas under PerDevice): coalesce each distinct position set once.
  struct Coalesced {
    uint64_t bytes;
    uint64_t ranges;
  };
  struct RangesHash {
    size_t operator()(const std::vector<PositionRange>& v) const {
      uint64_t h = v.size();
      for (const auto& r : v) h = Mix64(h ^ Mix64(r.begin ^ (r.end << 32)));
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<std::vector<PositionRange>, Coalesced, RangesHash> memo;
  std::vector<Extent> extents;
  std::vector<uint64_t> ids;

  StepCost cost;
  cost.per_process.resize(static_cast<size_t>(mesh.processes()));
  for (int64_t p = 0; p < mesh.processes(); ++p) {
    ProcessCost& pc = cost.per_process[static_cast<size_t>(p)];
    for (const ReadUnit& u : ReadUnits(p, loading)) {
      auto it = memo.find(u.positions);
      if (it == memo.end()) {
        ids.clear();
        for (const auto& r : u.positions) {
          ids.insert(ids.end(), batch.begin() + static_cast<ptrdiff_t>(r.begin),
                     batch.begin() + static_cast<ptrdiff_t>(r.end));
        }
        const uint64_t bytes = job_.dataset.CoalescedExtents(ids, extents);
        it = memo.emplace(u.positions, Coalesced{bytes, extents.size()}).first;
      }
      pc.bytes_read += it->second.bytes;
      pc.read_ranges += it->second.ranges;
    }
    for (const TransferUnit& u : TransfersFrom(p, loading)) {
      uint64_t bytes = 0;
      if (job_.dataset.variable_size()) {
        for (const auto& r : u.positions) {
          bytes += job_.dataset.BytesOf(batch.data() + r.begin, static_cast<size_t>(r.end - r.begin));
        }
      } else {
        bytes = CountPositions(u.positions) * sample_bytes;
      }
      pc.bytes_sent += bytes;
      cost.per_process[static_cast<size_t>(u.to)].bytes_received += bytes;
      cost.bytes_transferred += bytes;
    }
    cost.bytes_read += pc.bytes_read;
    cost.read_ranges += pc.read_ranges;
  }
  return cost;
}

Result<std::pair<int64_t, int64_t>> ParseStepRange(std::string_view text) {
  auto parse = [](std::string_view s, int64_t& out) {
    if (s.empty() || s.size() > 18) return false;
    int64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    out = v;
    return true;
  };
  const size_t colon = text.find(':');
  int64_t a = 0, b = 0;
  if (colon == std::string_view::npos) {
    if (!parse(text, a))
      return InvalidArgument("expected a step N or a range A:B, got '" + std::string(text) + "'", "--steps");
    return std::make_pair(a, a + 1);
  }
  if (!parse(text.substr(0, colon), a) || !parse(text.substr(colon + 1), b)) {
    return InvalidArgument("expected A:B with non-negative integers, got '" + std::string(text) + "'", "--steps");
  }
  if (b <= a) return InvalidArgument("the range " + std::string(text) + " is empty; B must be > A", "--steps");
  return std::make_pair(a, b);
}

}  // namespace meshload::planner
