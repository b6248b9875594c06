// `meshload plan`: preview and explain a DataLoadJob's plan.

#include "tools/plan_command.h"

#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "common/logging.h"
#include "planner/fetch_plan.h"
#include "sidecar/source/dataset_facts.h"
#include "planner/shard_planner.h"
#include "common/flags.h"

namespace meshload::tools {
namespace {

using nlohmann::ordered_json;

constexpr const char* kPlanUsage = R"(usage: meshload plan -f JOB.yaml [options]

Shows which device holds which samples at each step, who reads what from
storage, what moves between processes, and what it costs.

options:
  -f, --file PATH        the DataLoadJob manifest (multi-document YAML is fine)
  --samples N            dataset size, when the data is not reachable from here
  --steps A:B            steps A (inclusive) to B (exclusive); N means N:N+1
                         (default: spec.resume.step)
  --process P            only process P: its devices, reads and transfers
  --format table|json    output format (default table)
  --json                 the same as --format json
  --compare              cost of every strategy and fan-out for this mesh
  --full                 table: print every sample id (default: first 12)
  --log-level LEVEL      debug, info, warn, error, off (env MESHLOAD_LOG_LEVEL)

--samples overrides spec.dataset.samples and the dataset's files (which are
then not read).

exit codes: 0 ok; 1 the job file cannot be read, or the storage refuses
or cannot serve the dataset (denied, unreachable); 2 invalid arguments, an
invalid spec, a dataset URI that names nothing, or a dataset that does not
match the spec (every problem is listed)
)";

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  }
  return buf;
}

std::string Bytes(uint64_t b, bool known) { return known ? HumanBytes(static_cast<double>(b)) : "unknown"; }

std::string SampleList(const std::vector<uint64_t>& ids, bool full) {
  constexpr size_t kShown = 12;
  std::string s = "[";
  size_t n = full ? ids.size() : std::min(ids.size(), kShown);
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  if (n < ids.size()) s += " … +" + std::to_string(ids.size() - n);
  return s + "]";
}

// A mean that stays an integer when it is one.
ordered_json Mean(uint64_t sum, uint64_t n, bool known) {
  if (!known) return nullptr;
  if (n == 0) return 0;
  if (sum % n == 0) return sum / n;
  return static_cast<double>(sum) / static_cast<double>(n);
}

std::string MeshSummary(const planner::ResolvedJob& job) {
  std::ostringstream o;
  const planner::MeshSpec& m = job.spec.mesh;
  o << m.processes << " processes × " << m.devices_per_process << " devices = " << job.mesh.devices()
    << " devices, axes [";
  for (size_t i = 0; i < m.axes.size(); ++i) o << (i ? ", " : "") << m.axes[i].name << "=" << m.axes[i].size;
  o << "], batchAxes " << planner::FormatNameList(planner::EffectiveBatchAxes(m)) << " → " << job.mesh.shards()
    << " shards (replication " << ToString(ImpliedReplicationMode(m)) << ")";
  return o.str();
}

// Whether the plan's byte counts are known: fixed-size samples of a known
// size, or variable-size samples whose index was read.
bool BytesKnown(const planner::DatasetIndex& ds) {
  return ds.sample_bytes() != 0 || (ds.variable_size() && ds.indexed());
}

std::string DatasetSummary(const planner::ResolvedJob& job) {
  std::ostringstream o;
  const planner::DatasetIndex& ds = job.dataset;
  o << ToString(ds.format()) << ", " << job.samples << " samples";
  if (ds.variable_size() && ds.indexed()) {
    char mean[32];
    std::snprintf(mean, sizeof mean, "%.0f", ds.mean_sample_bytes());
    o << " of " << ds.min_sample_bytes() << " to " << ds.max_sample_bytes() << " B (mean " << mean << " B, ";
    if (ds.record_format()) {
      o << "records)";
    } else {
      o << formats::DTypeName(ds.dtype()) << ")";
    }
  } else {
    o << " × " << (ds.sample_bytes() ? std::to_string(ds.sample_bytes()) + " B" : std::string("? B"));
  }
  if (ds.indexed()) {
    o << " in " << ds.files().size() << " file" << (ds.files().size() == 1 ? "" : "s");
    if (ds.record_format()) {
      // The fields each sample delivers, as the index decodes them.
      o << "; fields";
      for (const formats::FieldDecoding& f : ds.fields()) {
        o << " " << f.name << " (" << (f.kind == formats::FieldDecoding::Kind::kBytes ? "bytes" : DTypeName(f.dtype));
        if (!f.shape.empty()) {
          o << " [";
          for (size_t i = 0; i < f.shape.size(); ++i) o << (i ? "," : "") << f.shape[i];
          o << "]";
        }
        o << (f.ragged() ? ", ragged)" : ")");
      }
    }
  } else {
    o << " (not read: size from spec.dataset.samples/--samples)";
  }
  o << "; global batch " << job.global_batch << ", " << job.steps_per_epoch << " steps/epoch; shuffle "
    << ToString(job.spec.shuffle.mode);
  if (job.spec.shuffle.mode != planner::ShuffleMode::kNone) o << " seed " << job.spec.shuffle.seed;
  if (job.spec.shuffle.mode == planner::ShuffleMode::kBlock) o << " blockSize " << job.spec.shuffle.block_size;
  return o.str();
}

// spec.batch.balance: what the job asks and whether the plan shows it.
std::string BalanceSummary(const planner::ShardPlanner& planner) {
  const planner::BalanceSpec& b = planner.job().spec.batch.balance;
  char tol[32];
  std::snprintf(tol, sizeof tol, "%g%%", b.tolerance * 100);
  switch (planner.BalanceState()) {
    case planner::ShardPlanner::Balancing::kOff: return "";
    case planner::ShardPlanner::Balancing::kApplied:
      return std::string("Tokens, tolerance ") + tol + " (shards dealt by tokens; before = the sampler's order)";
    case planner::ShardPlanner::Balancing::kSizesUnknown:
      return "Tokens, NOT shown: the dataset's index was not read (--samples or spec.dataset.samples), so the "
             "samples' sizes are unknown and the order below is the sampler's, not the one the sidecars deal";
  }
  return "";
}

// A mixture's datasets: their names, sizes and the weights in force at `step`.
std::string MixtureSummary(const planner::ShardPlanner& planner, int64_t step) {
  const planner::MixtureSchedule* mix = planner.mixture();
  if (!mix) return "";
  const auto& parts = planner.job().dataset.parts();
  const std::vector<double> w = mix->WeightsAt(step);
  std::ostringstream o;
  for (size_t d = 0; d < parts.size(); ++d) {
    char weight[32];
    std::snprintf(weight, sizeof weight, "%.4g", w[d]);
    o << (d ? ", " : "") << parts[d].name << " " << weight << " of " << parts[d].samples << " samples";
  }
  return o.str();
}

// Step `t` of a mixture: each dataset's samples in the batch and its epoch.
std::string MixtureStepText(const planner::ShardPlanner& planner, int64_t t) {
  const planner::MixtureSchedule* mix = planner.mixture();
  const auto& parts = planner.job().dataset.parts();
  const std::vector<uint64_t> counts = mix->CountsAt(t);
  const std::vector<uint64_t> before = mix->ConsumedBefore(t);
  std::ostringstream o;
  for (size_t d = 0; d < parts.size(); ++d) {
    o << (d ? ", " : "") << parts[d].name << " " << counts[d] << " (epoch " << before[d] / parts[d].samples << ")";
  }
  return o.str();
}

ordered_json MixtureStepJson(const planner::ShardPlanner& planner, int64_t t) {
  const planner::MixtureSchedule* mix = planner.mixture();
  const auto& parts = planner.job().dataset.parts();
  const std::vector<uint64_t> counts = mix->CountsAt(t);
  const std::vector<uint64_t> before = mix->ConsumedBefore(t);
  ordered_json out = ordered_json::array();
  for (size_t d = 0; d < parts.size(); ++d) {
    out.push_back({{"name", parts[d].name},
                   {"samples", counts[d]},
                   {"consumedBefore", before[d]},
                   {"epoch", before[d] / parts[d].samples}});
  }
  return out;
}

// spec.tokens: the rows and what they hold, per dataset.
std::string TokensSummary(const planner::ResolvedJob& job) {
  const planner::TokenRows* rows = job.dataset.token_rows();
  if (!rows) return "";
  const planner::TokensSpec& t = *job.spec.tokens;
  std::ostringstream o;
  o << ToString(t.mode) << ", rows of " << rows->row_tokens() << " " << formats::DTypeName(job.dataset.dtype())
    << " tokens from " << job.dataset.documents() << " documents (window " << t.window;
  if (t.mode == planner::TokensMode::kPack) o << ", " << ToString(t.packing);
  o << ")";
  if (rows->has_eod()) {
    o << ", end-of-document " << rows->eod_token() << (rows->eod_in_data() ? " (in the data)" : " (appended)");
  }
  const auto& parts = job.dataset.parts();
  for (size_t d = 0; d < rows->datasets(); ++d) {
    const planner::TokenRows::Stats& st = rows->stats(d);
    o << "\n         " << (parts[d].name.empty() ? std::string("dataset") : parts[d].name) << ": " << st.rows
      << " rows, " << st.documents << " documents (" << st.split << " split over rows), " << st.tokens << " tokens";
    if (t.mode == planner::TokensMode::kPack) {
      char pct[32];
      const double all = static_cast<double>(st.rows * rows->row_tokens());
      std::snprintf(pct, sizeof pct, "%.2f%%", all > 0 ? 100.0 * static_cast<double>(st.padding) / all : 0.0);
      o << ", padding " << st.padding << " tokens (" << pct << ")";
    } else {
      o << ", " << st.dropped << " tokens after the last row (in no row)";
    }
  }
  return o.str();
}

// A row's pieces as text: `doc 12[0:512]+eod` (a mixture's: `code/12[...]`).
std::string RowText(const planner::ResolvedJob& job, uint64_t row, std::vector<planner::RowPiece>& pieces) {
  const planner::TokenRows& rows = *job.dataset.token_rows();
  pieces.clear();
  rows.AppendPieces(row, pieces);
  const auto& parts = job.dataset.document_parts();
  std::ostringstream o;
  o << "row " << row << ":";
  for (const planner::RowPiece& p : pieces) {
    size_t d = 0;
    while (d + 1 < parts.size() && p.doc >= parts[d + 1].first) ++d;
    o << " " << (parts[d].name.empty() ? "doc " : parts[d].name + "/") << p.doc - parts[d].first << "[" << p.offset
      << ":" << p.offset + p.tokens << "]" << (p.eod ? "+eod" : "");
  }
  const uint64_t used = rows.TokensOf(row);
  if (rows.mode() == planner::TokensMode::kPack && used < rows.row_tokens()) {
    o << " pad " << rows.row_tokens() - used;
  }
  return o.str();
}

ordered_json RowJson(const planner::ResolvedJob& job, uint64_t row, std::vector<planner::RowPiece>& pieces) {
  const planner::TokenRows& rows = *job.dataset.token_rows();
  pieces.clear();
  rows.AppendPieces(row, pieces);
  const auto& parts = job.dataset.document_parts();
  ordered_json jp = ordered_json::array();
  for (const planner::RowPiece& p : pieces) {
    size_t d = 0;
    while (d + 1 < parts.size() && p.doc >= parts[d + 1].first) ++d;
    ordered_json j = {{"document", p.doc - parts[d].first},
                      {"offset", p.offset},
                      {"tokens", p.tokens},
                      {"eod", static_cast<bool>(p.eod)}};
    if (job.spec.mixture) j["dataset"] = parts[d].name;
    jp.push_back(std::move(j));
  }
  const uint64_t used = rows.TokensOf(row);
  return {{"row", row}, {"pieces", std::move(jp)}, {"padding", rows.row_tokens() - std::min(used, rows.row_tokens())}};
}

// The rows the plan's devices hold, each once, in device order.
std::vector<uint64_t> RowsOfPlan(const planner::StepPlan& plan) {
  std::vector<uint64_t> out;
  std::set<int64_t> shards;
  for (const auto& d : plan.devices) {
    if (shards.insert(d.shard).second) out.insert(out.end(), d.samples.begin(), d.samples.end());
  }
  return out;
}

std::string LoadsText(const planner::ShardLoads& l) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%" PRIu64 "..%" PRIu64 " (spread %.1f%%)", l.min, l.max, l.Spread() * 100);
  return buf;
}

ordered_json LoadsJson(const planner::ShardLoads& l) {
  return {{"min", l.min}, {"max", l.max}, {"mean", l.mean}, {"spread", l.Spread()}};
}

struct PlanOptions {
  std::string file;
  std::optional<int64_t> samples;
  std::optional<std::pair<int64_t, int64_t>> steps;
  std::optional<int64_t> process;
  std::string format = "table";
  bool compare = false;
  bool full = false;
};

void PrintTable(const planner::ShardPlanner& planner, const PlanOptions& opt, int64_t a, int64_t b,
                const std::string& job_name) {
  const planner::ResolvedJob& job = planner.job();
  const planner::Loading loading = planner.DefaultLoading();
  const bool known = BytesKnown(job.dataset);
  std::cout << "DataLoadJob " << job_name << ": strategy " << ToString(loading.strategy) << ", fanout "
            << ToString(loading.fanout) << "\n"
            << "mesh:    " << MeshSummary(job) << "\n"
            << "dataset: " << DatasetSummary(job) << "\n";
  const std::string balance = BalanceSummary(planner);
  if (!balance.empty()) std::cout << "balance: " << balance << "\n";
  if (planner.mixture()) std::cout << "mixture: " << MixtureSummary(planner, a) << " (weights at step " << a << ")\n";
  const std::string tokens = TokensSummary(job);
  if (!tokens.empty()) std::cout << "rows:    " << tokens << "\n";
  std::vector<planner::RowPiece> pieces;
  const bool balanced = planner.BalanceState() == planner::ShardPlanner::Balancing::kApplied;
  uint64_t total_read = 0, total_xfer = 0;
  for (int64_t t = a; t < b; ++t) {
    planner::StepPlan plan = planner.PlanStep(t, loading, opt.process);
    if (planner.mixture()) {
      std::cout << "\nstep " << t << "\n";  // each dataset has its own epochs
    } else {
      std::cout << "\nstep " << t << " (epoch " << plan.epoch << ", step " << plan.step_in_epoch << " of the epoch)\n";
    }
    if (planner.mixture()) std::cout << "  datasets: " << MixtureStepText(planner, t) << "\n";
    if (balanced) {
      const planner::BalanceOutcome o = planner.Balance(t);
      std::cout << "  tokens per shard: " << LoadsText(o.before) << " in sampler order, " << LoadsText(o.after)
                << " dealt (" << o.swaps << " swaps)" << (o.within_tolerance ? "" : "; NOT within the tolerance")
                << "\n";
    }
    int64_t cur = -1;
    auto print_process_io = [&](int64_t p) {
      uint64_t bytes = 0, ranges = 0, samples = 0;
      for (const auto& r : plan.reads) {
        if (r.process != p) continue;
        bytes += r.bytes;
        ranges += r.ranges.size();
        samples += r.samples.size();
        if (r.device >= 0) {
          std::cout << "    read by device " << r.device << ": " << r.samples.size() << " samples in "
                    << r.ranges.size() << " ranges, " << Bytes(r.bytes, known) << "\n";
        }
      }
      std::cout << "    reads      " << samples << " samples in " << ranges << " ranges, " << Bytes(bytes, known)
                << "\n";
      for (const auto& x : plan.transfers) {
        if (x.from == p) {
          std::cout << "    sends → " << x.to << "  " << x.samples.size() << " samples "
                    << SampleList(x.samples, opt.full) << " " << Bytes(x.bytes, known) << "\n";
        }
        if (x.to == p) {
          std::cout << "    recv  ← " << x.from << "  " << x.samples.size() << " samples "
                    << SampleList(x.samples, opt.full) << " " << Bytes(x.bytes, known) << "\n";
        }
      }
    };
    for (const auto& d : plan.devices) {
      if (d.process != cur) {
        if (cur >= 0) print_process_io(cur);
        cur = d.process;
        std::cout << "  process " << cur << "\n";
      }
      std::cout << "    device " << d.device << "  shard " << d.shard << "  " << SampleList(d.samples, opt.full)
                << "\n";
    }
    if (cur >= 0) print_process_io(cur);
    if (job.dataset.token_rows()) {
      // The rows of the step (each shard's once) and their document pieces.
      const std::vector<uint64_t> rows = RowsOfPlan(plan);
      uint64_t used = 0;
      for (uint64_t r : rows) used += job.dataset.token_rows()->TokensOf(r);
      std::cout << "  rows (" << rows.size() << ", " << used << " tokens";
      if (job.spec.tokens->mode == planner::TokensMode::kPack) {
        std::cout << ", padding " << rows.size() * job.dataset.token_rows()->row_tokens() - used;
      }
      std::cout << "):\n";
      const size_t shown = opt.full ? rows.size() : std::min<size_t>(rows.size(), 12);
      for (size_t k = 0; k < shown; ++k) std::cout << "    " << RowText(job, rows[k], pieces) << "\n";
      if (shown < rows.size()) std::cout << "    … +" << rows.size() - shown << " rows (--full shows all)\n";
    }
    std::cout << "  step I/O: read " << Bytes(plan.bytes_read, known) << ", transferred "
              << Bytes(plan.bytes_transferred, known) << "\n";
    total_read += plan.bytes_read;
    total_xfer += plan.bytes_transferred;
  }
  const uint64_t n = static_cast<uint64_t>(b - a);
  std::cout << "\ncost per step" << (opt.process ? " (process " + std::to_string(*opt.process) + ")" : "") << ": read "
            << Bytes(total_read / n, known) << ", transferred " << Bytes(total_xfer / n, known) << "\n";
}

ordered_json PlanJson(const planner::ShardPlanner& planner, const PlanOptions& opt, int64_t a, int64_t b,
                      const std::string& job_name) {
  const planner::ResolvedJob& job = planner.job();
  const planner::Loading loading = planner.DefaultLoading();
  const bool known = BytesKnown(job.dataset);
  ordered_json out;
  out["job"] = job_name;
  out["strategy"] = ToString(loading.strategy);
  out["fanout"] = ToString(loading.fanout);
  out["processes"] = job.mesh.processes();
  out["devices"] = job.mesh.devices();
  out["shards"] = job.mesh.shards();
  out["globalBatch"] = job.global_batch;
  out["samples"] = job.samples;
  out["stepsPerEpoch"] = job.steps_per_epoch;
  out["sampleBytes"] =
      job.dataset.sample_bytes() != 0 ? ordered_json(job.dataset.sample_bytes()) : ordered_json(nullptr);
  if (job.dataset.variable_size() && job.dataset.indexed()) {
    // Variable-size samples: their range, and the most bytes one device's
    // batch can take (what a ragged slot holds).
    const uint64_t per_device = job.global_batch / static_cast<uint64_t>(job.mesh.shards());
    out["sampleBytesRange"] = {{"min", job.dataset.min_sample_bytes()},
                               {"mean", job.dataset.mean_sample_bytes()},
                               {"max", job.dataset.max_sample_bytes()},
                               {"largestDeviceBatch", job.dataset.LargestBytes(per_device)}};
  }
  if (job.dataset.record_format()) {
    // WebDataset, MDS: each field as the batch carries it.
    ordered_json fields = ordered_json::array();
    for (const formats::FieldDecoding& f : job.dataset.fields()) {
      fields.push_back({{"name", f.name},
                        {"dtype", formats::DTypeName(f.dtype)},
                        {"ragged", f.ragged()},
                        {"decoded", f.kind != formats::FieldDecoding::Kind::kBytes},
                        {"sampleShape", f.ragged() ? ordered_json(nullptr) : ordered_json(f.shape)}});
    }
    out["fields"] = std::move(fields);
  }
  ordered_json files = ordered_json::array();
  for (const auto& f : job.dataset.files()) {
    files.push_back({{"path", f.path},
                     {"bytes", job.dataset.indexed() || known ? ordered_json(f.size) : ordered_json(nullptr)},
                     {"dataOffset", f.data_offset}});
  }
  out["dataset"] = {{"format", ToString(job.dataset.format())}, {"indexed", job.dataset.indexed()}, {"files", files}};
  if (job.spec.batch.balance.mode != planner::BalanceMode::kNone) {
    out["balance"] = {{"mode", ToString(job.spec.batch.balance.mode)},
                      {"tolerance", job.spec.batch.balance.tolerance},
                      {"applied", planner.BalanceState() == planner::ShardPlanner::Balancing::kApplied}};
  }
  if (planner.mixture()) {
    ordered_json mixture = ordered_json::array();
    for (const auto& p : job.dataset.parts()) {
      mixture.push_back({{"name", p.name}, {"samples", p.samples}, {"firstSample", p.first}});
    }
    out["mixture"] = std::move(mixture);
  }
  if (const planner::TokenRows* rows = job.dataset.token_rows()) {
    ordered_json per = ordered_json::array();
    for (size_t d = 0; d < rows->datasets(); ++d) {
      const planner::TokenRows::Stats& st = rows->stats(d);
      per.push_back({{"name", job.dataset.parts()[d].name},
                     {"rows", st.rows},
                     {"documents", st.documents},
                     {"splitDocuments", st.split},
                     {"tokens", st.tokens},
                     {"paddingTokens", st.padding},
                     {"droppedTokens", st.dropped}});
    }
    out["tokens"] = {{"mode", ToString(job.spec.tokens->mode)},
                     {"sequenceLength", job.spec.tokens->sequence_length},
                     {"rowTokens", rows->row_tokens()},
                     {"documents", job.dataset.documents()},
                     {"datasets", std::move(per)}};
  }
  if (opt.process) out["process"] = *opt.process;
  std::vector<planner::RowPiece> pieces;

  std::vector<uint64_t> read_by(static_cast<size_t>(job.mesh.processes())), sent_by(read_by.size()),
      recv_by(read_by.size());
  uint64_t total_read = 0, total_xfer = 0;
  ordered_json steps = ordered_json::array();
  for (int64_t t = a; t < b; ++t) {
    planner::StepPlan plan = planner.PlanStep(t, loading, opt.process);
    ordered_json s;
    s["step"] = t;
    s["epoch"] = plan.epoch;
    if (planner.mixture()) s["datasets"] = MixtureStepJson(planner, t);
    if (planner.BalanceState() == planner::ShardPlanner::Balancing::kApplied) {
      const planner::BalanceOutcome o = planner.Balance(t);
      s["shardTokens"] = {{"before", LoadsJson(o.before)},
                          {"after", LoadsJson(o.after)},
                          {"swaps", o.swaps},
                          {"withinTolerance", o.within_tolerance}};
    }
    ordered_json devices = ordered_json::array();
    for (const auto& d : plan.devices) {
      devices.push_back({{"device", d.device}, {"process", d.process}, {"shard", d.shard}, {"samples", d.samples}});
    }
    ordered_json reads = ordered_json::array();
    for (const auto& r : plan.reads) {
      ordered_json jr;
      jr["process"] = r.process;
      if (r.device >= 0) jr["device"] = r.device;
      jr["samples"] = r.samples;
      // Without a sample size there are no byte ranges to speak of.
      ordered_json ranges = known ? ordered_json::array() : ordered_json(nullptr);
      if (known) {
        for (const auto& e : r.ranges) ranges.push_back({{"file", e.file}, {"offset", e.offset}, {"length", e.length}});
      }
      jr["ranges"] = ranges;
      jr["bytes"] = known ? ordered_json(r.bytes) : ordered_json(nullptr);
      reads.push_back(std::move(jr));
      read_by[static_cast<size_t>(r.process)] += r.bytes;
    }
    ordered_json transfers = ordered_json::array();
    for (const auto& x : plan.transfers) {
      transfers.push_back({{"from", x.from},
                           {"to", x.to},
                           {"samples", x.samples},
                           {"bytes", known ? ordered_json(x.bytes) : ordered_json(nullptr)}});
      sent_by[static_cast<size_t>(x.from)] += x.bytes;
      recv_by[static_cast<size_t>(x.to)] += x.bytes;
    }
    if (job.dataset.token_rows()) {
      ordered_json rows = ordered_json::array();
      for (uint64_t r : RowsOfPlan(plan)) rows.push_back(RowJson(job, r, pieces));
      s["rows"] = std::move(rows);
    }
    s["devices"] = std::move(devices);
    s["reads"] = std::move(reads);
    s["transfers"] = std::move(transfers);
    s["bytesRead"] = known ? ordered_json(plan.bytes_read) : ordered_json(nullptr);
    s["bytesTransferred"] = known ? ordered_json(plan.bytes_transferred) : ordered_json(nullptr);
    steps.push_back(std::move(s));
    total_read += plan.bytes_read;
    total_xfer += plan.bytes_transferred;
  }
  out["steps"] = std::move(steps);
  const uint64_t n = static_cast<uint64_t>(b - a);
  ordered_json per = ordered_json::array();
  for (int64_t p = 0; p < job.mesh.processes(); ++p) {
    if (opt.process && p != *opt.process) continue;
    const size_t i = static_cast<size_t>(p);
    per.push_back({{"process", p},
                   {"bytesReadPerStep", Mean(read_by[i], n, known)},
                   {"bytesSentPerStep", Mean(sent_by[i], n, known)},
                   {"bytesReceivedPerStep", Mean(recv_by[i], n, known)}});
  }
  out["cost"] = {{"bytesReadPerStep", Mean(total_read, n, known)},
                 {"bytesTransferredPerStep", Mean(total_xfer, n, known)},
                 {"perProcess", std::move(per)}};
  return out;
}

struct CompareRow {
  planner::Loading loading;
  std::string unsupported;
  // Sums over the step range (means are taken when printing) and maxima.
  uint64_t read = 0, max_read = 0, ranges = 0, xfer = 0, max_sent = 0, max_recv = 0;
};

std::vector<CompareRow> Compare(const planner::ShardPlanner& planner, int64_t a, int64_t b) {
  std::vector<CompareRow> rows;
  for (planner::Strategy s : planner::kAllStrategies) {
    for (planner::Fanout f : planner::kAllFanouts) {
      CompareRow row;
      row.loading = {s, f};
      row.unsupported = planner.Unsupported(row.loading);
      if (row.unsupported.empty()) {
        for (int64_t t = a; t < b; ++t) {
          planner::StepCost c = planner.ComputeCost(t, row.loading);
          row.read += c.bytes_read;
          row.ranges += c.read_ranges;
          row.xfer += c.bytes_transferred;
          for (const auto& pc : c.per_process) {
            row.max_read = std::max(row.max_read, pc.bytes_read);
            row.max_sent = std::max(row.max_sent, pc.bytes_sent);
            row.max_recv = std::max(row.max_recv, pc.bytes_received);
          }
        }
      }
      rows.push_back(row);
    }
  }
  return rows;
}

// A remote dataset's reads under each shuffle mode, for process 0 and the
// job's strategy, over one epoch: what it reads, what it fetches through
// the block cache, and the cache that needs (planner/fetch_plan.h).
struct FetchRow {
  planner::ShuffleSpec shuffle;
  bool selected = false;
  planner::FetchEstimate est;
};

// A dataset (or a mixture's) on storage registered as remote.
bool RemoteDataset(const planner::ResolvedJob& job) {
  return sidecar::source::ReadsOverNetwork(job.spec, *sidecar::source::SourceRegistry::WithBuiltins({}));
}

// Files stored compressed are decompressed into the block cache whatever
// their storage.
bool CompressedFiles(const planner::ResolvedJob& job) {
  for (const planner::DatasetFile& f : job.dataset.files()) {
    if (f.stored) return true;
  }
  return false;
}

// Parquet files are read as their rows, a row group decoded at a time
// (sidecar/source/parquet_source.h), not through the block cache.
bool ParquetRows(const planner::ResolvedJob& job) {
  for (const planner::DatasetFile& f : job.dataset.files()) {
    if (f.parquet && !f.parquet->row_groups.empty()) return true;
  }
  return false;
}

uint64_t RowGroups(const planner::ResolvedJob& job) {
  uint64_t n = 0;
  for (const planner::DatasetFile& f : job.dataset.files()) n += f.parquet ? f.parquet->row_groups.size() : 0;
  return n;
}

bool ThroughTheCache(const planner::ResolvedJob& job) {
  return !ParquetRows(job) && (RemoteDataset(job) || CompressedFiles(job));
}

std::vector<FetchRow> FetchRows(const planner::ShardPlanner& planner) {
  const planner::ResolvedJob& job = planner.job();
  const planner::DatasetCache& c = job.spec.dataset.cache;
  const planner::BlockGeometry g{static_cast<uint64_t>(c.block_bytes), static_cast<uint64_t>(c.whole_object_bytes)};
  // Block and Window rows use the job's blockSize, else about one cache
  // block's samples.
  const planner::ShuffleSpec& own = job.spec.shuffle;
  const double mean = std::max(1.0, job.dataset.variable_size() ? job.dataset.mean_sample_bytes()
                                                                : static_cast<double>(job.dataset.sample_bytes()));
  // (Parquet: a row group's rows, on average.)
  const uint64_t groups = RowGroups(job);
  const int64_t block = own.block_size_set ? own.block_size
                        : groups > 0
                            ? std::max<int64_t>(1, static_cast<int64_t>(job.dataset.num_samples() / groups))
                            : std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(g.block_bytes) / mean));
  std::vector<FetchRow> rows;
  for (planner::ShuffleMode m : {planner::ShuffleMode::kNone, planner::ShuffleMode::kGlobal,
                                 planner::ShuffleMode::kBlock, planner::ShuffleMode::kWindow}) {
    FetchRow r;
    r.shuffle = own;
    r.shuffle.mode = m;
    if (m != own.mode) {
      r.shuffle.block_size = block;
      r.shuffle.block_size_set = m == planner::ShuffleMode::kBlock || m == planner::ShuffleMode::kWindow;
      r.shuffle.window_blocks_set = m == planner::ShuffleMode::kWindow;
    }
    r.selected = m == own.mode;
    planner::ResolvedJob variant = job;
    variant.spec.shuffle = r.shuffle;
    const planner::ShardPlanner p(std::move(variant));
    // Parquet: what its decoded row groups, kept within the capacity, fetch.
    r.est = planner::EstimateFetch(p, p.DefaultLoading(), 0, g, 0, 1ull << 20,
                                   groups > 0 ? static_cast<uint64_t>(c.capacity_bytes) : 0);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string ShuffleText(const planner::ShuffleSpec& s) {
  std::string out(ToString(s.mode));
  if (s.mode == planner::ShuffleMode::kBlock || s.mode == planner::ShuffleMode::kWindow) {
    out += " (" + std::to_string(s.block_size);
    if (s.mode == planner::ShuffleMode::kWindow) out += " x " + std::to_string(s.window_blocks);
    out += ")";
  }
  return out;
}

// The fields every row of a shuffle comparison has.
ordered_json ShuffleRowJson(const FetchRow& r) {
  return {{"shuffle", ToString(r.shuffle.mode)},     {"blockSize", r.shuffle.block_size},
          {"windowBlocks", r.shuffle.window_blocks}, {"selected", r.selected},
          {"epochComplete", r.est.complete},         {"steps", r.est.steps}};
}

// Parquet: the row groups' fetches at the capacity per fetch of each once.
double Refetch(const planner::FetchEstimate& e) {
  return e.fetched_bytes ? static_cast<double>(e.capacity_fetched_bytes) / static_cast<double>(e.fetched_bytes) : 0.0;
}

int RunCompare(const planner::ShardPlanner& planner, const PlanOptions& opt, int64_t a, int64_t b,
               const std::string& job_name) {
  const planner::ResolvedJob& job = planner.job();
  const bool known = BytesKnown(job.dataset);
  const double batch_bytes = job.dataset.variable_size()
                                 ? static_cast<double>(job.global_batch) * job.dataset.mean_sample_bytes()
                                 : static_cast<double>(job.global_batch * job.dataset.sample_bytes());
  const planner::Loading mine = planner.DefaultLoading();
  std::vector<CompareRow> rows = Compare(planner, a, b);
  const uint64_t n = static_cast<uint64_t>(b - a);
  if (opt.format == "json") {
    ordered_json out;
    out["job"] = job_name;
    out["processes"] = job.mesh.processes();
    out["devices"] = job.mesh.devices();
    out["shards"] = job.mesh.shards();
    out["globalBatch"] = job.global_batch;
    out["sampleBytes"] =
        job.dataset.sample_bytes() != 0 ? ordered_json(job.dataset.sample_bytes()) : ordered_json(nullptr);
    out["stepRange"] = {a, b};
    ordered_json arr = ordered_json::array();
    for (const auto& r : rows) {
      ordered_json j;
      j["strategy"] = ToString(r.loading.strategy);
      j["fanout"] = ToString(r.loading.fanout);
      j["selected"] = r.loading.strategy == mine.strategy && r.loading.fanout == mine.fanout;
      if (!r.unsupported.empty()) {
        j["unsupported"] = r.unsupported;
      } else {
        auto val = [&](uint64_t v) { return known ? ordered_json(v) : ordered_json(nullptr); };
        j["bytesReadPerStep"] = Mean(r.read, n, known);
        j["maxBytesReadPerProcess"] = val(r.max_read);
        j["readRangesPerStep"] = Mean(r.ranges, n, known);
        j["bytesTransferredPerStep"] = Mean(r.xfer, n, known);
        j["maxBytesSentPerProcess"] = val(r.max_sent);
        j["maxBytesReceivedPerProcess"] = val(r.max_recv);
        j["readAmplification"] = known && batch_bytes > 0
                                     ? ordered_json(static_cast<double>(r.read) / static_cast<double>(n) / batch_bytes)
                                     : ordered_json(nullptr);
      }
      arr.push_back(std::move(j));
    }
    out["compare"] = std::move(arr);
    if (ThroughTheCache(job) && known) {
      const planner::DatasetCache& c = job.spec.dataset.cache;
      ordered_json remote = {{"process", 0},
                             {"compressedFiles", CompressedFiles(job)},
                             {"blockBytes", c.block_bytes},
                             {"wholeObjectBytes", c.whole_object_bytes},
                             {"capacityBytes", c.capacity_bytes}};
      ordered_json shuffles = ordered_json::array();
      for (const FetchRow& r : FetchRows(planner)) {
        const bool fits = r.est.working_set_bytes <= static_cast<uint64_t>(c.capacity_bytes);
        ordered_json row = ShuffleRowJson(r);
        row["readBytesPerEpoch"] = r.est.read_bytes;
        row["fetchedBytesPerEpoch"] = r.est.fetched_bytes;
        row["cacheNeededBytes"] = r.est.working_set_bytes;
        row["amplification"] = r.est.Amplification();
        row["autoMode"] = fits ? "Blocks" : "Direct";
        shuffles.push_back(std::move(row));
      }
      remote["shuffles"] = std::move(shuffles);
      out["remote"] = std::move(remote);
    }
    if (ParquetRows(job) && known) {
      const uint64_t capacity = static_cast<uint64_t>(job.spec.dataset.cache.capacity_bytes);
      ordered_json parquet = {{"process", 0}, {"rowGroups", RowGroups(job)}, {"capacityBytes", capacity}};
      ordered_json shuffles = ordered_json::array();
      for (const FetchRow& r : FetchRows(planner)) {
        ordered_json row = ShuffleRowJson(r);
        row["rowGroupsRead"] = r.est.blocks;
        row["fetchedBytesPerEpoch"] = r.est.fetched_bytes;
        row["decodedBytesNeeded"] = r.est.working_set_bytes;
        row["fits"] = r.est.working_set_bytes <= capacity;
        row["fetchedBytesPerEpochAtCapacity"] = r.est.capacity_fetched_bytes;
        row["refetch"] = Refetch(r.est);
        shuffles.push_back(std::move(row));
      }
      parquet["shuffles"] = std::move(shuffles);
      out["parquet"] = std::move(parquet);
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "DataLoadJob " << job_name << "\n"
            << "mesh:    " << MeshSummary(job) << "\n"
            << "dataset: " << DatasetSummary(job) << "\n"
            << "per step, averaged over steps " << a << ":" << b
            << "; amplification = bytes read / bytes of the global batch\n\n";
  std::printf("  %-16s %-9s %12s %10s %13s %12s %12s %12s %10s\n", "strategy", "fanout", "read/step", "amplif.",
              "max read/proc", "read ranges", "moved/step", "max sent", "max recv");
  for (const auto& r : rows) {
    const bool selected = r.loading.strategy == mine.strategy && r.loading.fanout == mine.fanout;
    std::printf("%s %-16s %-9s ", selected ? "*" : " ", std::string(ToString(r.loading.strategy)).c_str(),
                std::string(ToString(r.loading.fanout)).c_str());
    if (!r.unsupported.empty()) {
      std::printf("n/a: %s\n", r.unsupported.c_str());
      continue;
    }
    char amp[32] = "?";
    const double read_mean = static_cast<double>(r.read) / static_cast<double>(n);
    if (known && batch_bytes > 0) std::snprintf(amp, sizeof amp, "%.2f×", read_mean / batch_bytes);
    std::printf("%12s %10s %13s %12.0f %12s %12s %12s\n", known ? HumanBytes(read_mean).c_str() : "unknown", amp,
                Bytes(r.max_read, known).c_str(), static_cast<double>(r.ranges) / static_cast<double>(n),
                known ? HumanBytes(static_cast<double>(r.xfer) / static_cast<double>(n)).c_str() : "unknown",
                Bytes(r.max_sent, known).c_str(), Bytes(r.max_recv, known).c_str());
  }
  std::cout << "\n* the job's strategy. LoadAndReshard reads each position once, so its fan-out changes nothing.\n";
  if (ThroughTheCache(job) && known) {
    const planner::DatasetCache& c = job.spec.dataset.cache;
    std::cout << "\n"
              << (RemoteDataset(job) ? "remote dataset" : "compressed files")
              << ": one epoch of process 0 under each shuffle, through the block cache (blocks of "
              << HumanBytes(static_cast<double>(c.block_bytes)) << ", objects up to "
              << HumanBytes(static_cast<double>(c.whole_object_bytes)) << " whole"
              << (CompressedFiles(job) ? ", a compressed file one block of its decompressed bytes" : "")
              << "; capacity " << HumanBytes(static_cast<double>(c.capacity_bytes)) << ")\n";
    std::printf("  %-24s %14s %16s %14s %10s %8s\n", "shuffle", "read/epoch", "fetched/epoch", "cache needed",
                "amplif.", "Auto");
    for (const FetchRow& r : FetchRows(planner)) {
      const bool fits = r.est.working_set_bytes <= static_cast<uint64_t>(c.capacity_bytes);
      std::printf("%s %-24s %14s %16s %14s %9.2fx %8s%s\n", r.selected ? "*" : " ", ShuffleText(r.shuffle).c_str(),
                  HumanBytes(static_cast<double>(r.est.read_bytes)).c_str(),
                  HumanBytes(static_cast<double>(r.est.fetched_bytes)).c_str(),
                  HumanBytes(static_cast<double>(r.est.working_set_bytes)).c_str(), r.est.Amplification(),
                  fits ? "Blocks" : "Direct",
                  r.est.complete ? "" : (" (first " + std::to_string(r.est.steps) + " steps)").c_str());
    }
    std::cout << "\n* the job's shuffle. fetched/epoch: whole blocks (a compressed file's stored bytes), with a "
                 "cache of at least `cache needed` (each block held from its first to its last read in the epoch; a "
                 "cache that holds the dataset fetches nothing in later epochs). Auto: Blocks when the capacity holds "
                 "it, else Direct (each read's own bytes, every epoch).\n";
  }
  if (ParquetRows(job) && known) {
    const uint64_t capacity = static_cast<uint64_t>(job.spec.dataset.cache.capacity_bytes);
    std::cout << "\n"
              << planner::ToString(job.spec.dataset.format)
              << ": one epoch of process 0 under each shuffle; a row's read decodes its whole row group ("
              << RowGroups(job) << " in all), fetching the fields' column chunks, and keeps it decoded within "
              << HumanBytes(static_cast<double>(capacity)) << " (spec.dataset.cache.capacityBytes)\n";
    std::printf("  %-24s %11s %14s %16s %6s %17s %8s\n", "shuffle", "row groups", "fetched/epoch", "decoded needed",
                "fits", "fetched at capac.", "refetch");
    for (const FetchRow& r : FetchRows(planner)) {
      const bool fits = r.est.working_set_bytes <= capacity;
      const double refetch = Refetch(r.est);
      std::printf("%s %-24s %11llu %14s %16s %6s %17s %7.2fx%s\n", r.selected ? "*" : " ",
                  ShuffleText(r.shuffle).c_str(), static_cast<unsigned long long>(r.est.blocks),
                  HumanBytes(static_cast<double>(r.est.fetched_bytes)).c_str(),
                  HumanBytes(static_cast<double>(r.est.working_set_bytes)).c_str(), fits ? "yes" : "no",
                  HumanBytes(static_cast<double>(r.est.capacity_fetched_bytes)).c_str(), refetch,
                  r.est.complete ? "" : (" (first " + std::to_string(r.est.steps) + " steps)").c_str());
    }
    std::cout << "\n* the job's shuffle. fetched/epoch: each row group read fetched and decoded once, which needs "
                 "`decoded needed` kept (each group from its first to its last read in the epoch). fetched at capac.: "
                 "with the groups kept within the capacity (least recently used out), a group evicted before its "
                 "rows come back is fetched and decoded again, `refetch` times fetched/epoch in all. Block and "
                 "Window shuffles of about a row group's rows keep a group's rows together.\n";
  }
  return 0;
}

}  // namespace

int RunPlan(const std::vector<std::string>& args) {
  PlanOptions opt;
  FlagParser flags("plan", kPlanUsage);
  flags.String({"-f", "--file"}, &opt.file);
  std::optional<std::string> steps_text;
  flags.OptionalString({"--steps"}, &steps_text);
  flags.OptionalInt({"--samples"}, &opt.samples);
  flags.OptionalInt({"--process"}, &opt.process);
  std::optional<std::string> format_flag;
  flags.OptionalString({"--format"}, &format_flag);
  bool json_flag = false;
  flags.Bool({"--json"}, &json_flag);
  flags.Bool({"--compare"}, &opt.compare);
  flags.Bool({"--full"}, &opt.full);
  std::string log_level;
  flags.String({"--log-level"}, &log_level);
  if (int rc = flags.Parse(args); rc >= 0) return rc;
  if (Status st = ConfigureLoggingFromFlags(log_level, log_level.empty() ? "" : "json"); !st.ok()) {
    return UsageError(st.message());
  }
  if (opt.file.empty()) return UsageError("-f JOB.yaml is required\n\n" + std::string(kPlanUsage));
  if (opt.compare && opt.process) {
    return UsageError("--compare covers the whole mesh; it cannot be combined with --process");
  }
  if (format_flag) opt.format = *format_flag;
  if (opt.format != "table" && opt.format != "json") {
    return UsageError("--format: expected table or json, got '" + opt.format + "'");
  }
  if (json_flag) {
    if (opt.format != "json" && format_flag) return UsageError("--json contradicts --format " + opt.format);
    opt.format = "json";
  }

  // The job, loaded and validated once (every problem in the spec at once);
  // then the dataset's problems, when the spec has none.
  Diagnostics diags;
  auto job = planner::LoadJobFile(opt.file, diags);
  if (!job.ok() && diags.ok()) {
    std::cerr << "meshload plan: " << job.status().ToString() << "\n";
    return job.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (job.ok()) {
    planner::ResolveOptions ropts;
    ropts.samples = opt.samples;
    auto resolved =
        sidecar::source::ResolveReadingDataset(*job, ropts, sidecar::source::Unreachable::kUseDeclaredSamples, diags);
    if (resolved.ok() && diags.ok()) {
      planner::ShardPlanner planner(std::move(*resolved));
      int64_t a = job->spec().resume.step, b = a + 1;
      if (steps_text) {
        auto r = planner::ParseStepRange(*steps_text);
        if (!r.ok()) return UsageError(r.status().ToString());
        a = r->first;
        b = r->second;
      }
      if (opt.process && (*opt.process < 0 || *opt.process >= planner.job().mesh.processes())) {
        return UsageError("--process: " + std::to_string(*opt.process) + " is not a process of this job (0.." +
                          std::to_string(planner.job().mesh.processes() - 1) + ")");
      }
      const std::string name = job->name();
      if (opt.compare) return RunCompare(planner, opt, a, b, name);
      if (opt.format == "json") {
        std::cout << PlanJson(planner, opt, a, b, name).dump() << "\n";
      } else {
        PrintTable(planner, opt, a, b, name);
      }
      return 0;
    }
    if (!resolved.ok() && diags.ok()) diags.Add(resolved.status());
    if (!resolved.ok() && resolved.status().code() != StatusCode::kInvalidArgument) {
      std::cerr << diags.Report(opt.file + ": the dataset cannot be read");
      return 1;
    }
  }
  std::cerr << diags.Report(opt.file + ": invalid DataLoadJob");
  return 2;
}

}  // namespace meshload::tools
