// `meshload demo-trainer`: a trainer stand-in that consumes batches through
// the C++ client and verifies each one against its own plan: the sample-id
// checksum of every device, and (for synthetic datasets) every byte.
//
// It prints JSON lines on stdout for `meshload run --local`:
//   {"type":"progress","process":0,"steps":12,"first_step":0,"samples":384,"bytes":...}
//   {"type":"final",...,"wait_hist":[...],"mismatches":0,"error":""}

#include "tools/demo_trainer.h"

#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "client/client.h"
#include "common/cuda/driver.h"
#include "common/flags.h"
#include "common/logging.h"
#include "sidecar/source/dataset_facts.h"
#include "sidecar/source/decoded_source.h"
#include "sidecar/source/parquet_source.h"
#include "sidecar/source/record_values.h"
#include "planner/shard_planner.h"
#include "protocol/protocol.h"
#include "tools/latency_histogram.h"
#include "tools/synthetic_dataset.h"

namespace meshload::tools {
namespace {

constexpr const char* kUsage = R"(usage: meshload demo-trainer --job JOB.yaml --process P --socket PATH [options]

Consumes batches from a sidecar like a trainer would, and verifies each one
against its own plan. Used by `meshload run --local`.

options:
  --steps N          batches to consume (default: until the sidecar is gone)
  --start-step T     first step (default: the sidecar's)
  --verify MODE      bytes (every byte of a synthetic dataset; default),
                     ids (the sample-id checksums only), none
  --delay-ms D       pretend each training step takes D ms
  --report-ms MS     progress line interval (default 200)
)";

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

double MonotonicSeconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// A tensor's bytes where this process can read them: its own memory
// (host staging), or a copy back from the GPU; a ragged tensor's offsets
// (n + 1 of them) go to `offsets`.
Result<const uint8_t*> CopyBack(const client::Tensor& t, size_t planned, std::vector<uint8_t>& on_host,
                                std::vector<int64_t>& offsets) {
  const size_t n = t.offsets != nullptr ? t.samples : planned;
  offsets.assign(n + 1, 0);
  if (t.device_type != 2) {
    if (t.offsets != nullptr) std::copy(t.offsets, t.offsets + n + 1, offsets.begin());
    return static_cast<const uint8_t*>(t.data);
  }
  MESHLOAD_ASSIGN_OR_RETURN(auto driver, cuda::Driver::Open());
  on_host.resize(t.nbytes);
  MESHLOAD_RETURN_IF_ERROR(
      driver->CopyToHost(on_host.data(), reinterpret_cast<uintptr_t>(t.data), t.nbytes, t.device_id));
  if (t.offsets != nullptr) {
    MESHLOAD_RETURN_IF_ERROR(driver->CopyToHost(offsets.data(), reinterpret_cast<uintptr_t>(t.offsets),
                                                offsets.size() * sizeof(int64_t), t.device_id));
  }
  return static_cast<const uint8_t*>(on_host.data());
}

// Record formats (WebDataset, MDS, TFRecord, Parquet): what each field of a sample must hold, from its
// record read here through the storage sources.
class RecordChecker {
 public:
  // Reads through the sources the sidecar's job uses (an s3:// dataset's
  // endpoint, region and credentials from its spec and the environment).
  static Result<std::unique_ptr<RecordChecker>> Create(const planner::ResolvedJob& job) {
    MESHLOAD_ASSIGN_OR_RETURN(sidecar::source::SourceOptions sopts, sidecar::source::SourceOptionsForJob(job.spec));
    std::unique_ptr<RecordChecker> checker(
        new RecordChecker(job.dataset, sidecar::source::SourceRegistry::WithBuiltins(std::move(sopts))));
    // Compressed shards decompressed here too, a few at a time (the
    // trainer's batches reach across them in any order).
    MESHLOAD_ASSIGN_OR_RETURN(checker->decoding_,
                              sidecar::source::InstallDecoding(job.dataset, *checker->sources_, 256ull << 20));
    // Parquet rows decoded here too, through Arrow C++ as the sidecar does
    // (the values are checked against the footers' columns, not a copy).
    MESHLOAD_ASSIGN_OR_RETURN(checker->parquet_rows_,
                              sidecar::source::InstallParquetRows(job.dataset, *checker->sources_, 256ull << 20));
    return checker;
  }

  // The first difference between field `field` of the samples `ids` (less
  // those skipped for a missing field) and `t` (its bytes at `data`, a
  // ragged field's offsets at `offsets`): "" when there is none.
  Result<std::string> Check(const std::vector<uint64_t>& ids, size_t field, const client::Tensor& t,
                            const uint8_t* data, const int64_t* offsets, int64_t step) {
    const formats::FieldDecoding& fd = ds_.fields()[field];
    const uint64_t delivered = t.offsets != nullptr ? t.samples : static_cast<uint64_t>(t.shape[0]);
    uint64_t k = 0;
    for (uint64_t id : ids) {
      const auto place = sidecar::source::PlaceOfRecord(ds_, id, extents_, file_names_);
      record_.resize(place.bytes);
      MESHLOAD_ASSIGN_OR_RETURN(auto found, sources_->For(ds_.files()[place.file].path));
      MESHLOAD_RETURN_IF_ERROR(found.first->Read(found.second, place.offset, record_.data(), record_.size()));
      MESHLOAD_RETURN_IF_ERROR(sidecar::source::RecordValues(*decoder_, id, record_, place, values_, key_));
      bool complete = true;
      for (const auto& v : values_) complete = complete && v.has_value();
      if (!complete) {
        if (ds_.missing_field() != planner::MissingFieldPolicy::kSkip)
          return std::string("sample ") + std::to_string(id) + " lacks a field but was not refused";
        continue;
      }
      if (k >= delivered) return "sample " + std::to_string(id) + " is missing from the batch";
      const uint64_t room = fd.ragged() ? values_[field]->size() * fd.expansion() : fd.sample_bytes();
      want_.resize(std::max<uint64_t>(room, 1));
      uint64_t written = 0;
      MESHLOAD_RETURN_IF_ERROR(
          formats::DecodeFieldValue(fd, *values_[field], want_.data(), room, written, *place.file_name, place.offset));
      const uint64_t es = formats::DTypeSize(fd.dtype);
      const uint8_t* got = fd.ragged() ? data + static_cast<uint64_t>(offsets[k]) * es : data + k * fd.sample_bytes();
      const uint64_t got_bytes =
          fd.ragged() ? static_cast<uint64_t>(offsets[k + 1] - offsets[k]) * es : fd.sample_bytes();
      if (got_bytes != written || std::memcmp(got, want_.data(), written) != 0) {
        return "field '" + fd.name + "' of sample " + std::to_string(id) + " ('" + key_ + "') at step " +
               std::to_string(step);
      }
      ++k;
    }
    if (k != delivered)
      return "the batch holds " + std::to_string(delivered) + " samples, the dataset " + std::to_string(k);
    return std::string();
  }

 private:
  RecordChecker(const planner::DatasetIndex& ds, std::unique_ptr<sidecar::source::SourceRegistry> sources)
      : ds_(ds),
        sources_(std::move(sources)),
        decoder_(sidecar::source::RecordDecoderOf(ds)),
        file_names_(sidecar::source::RecordFileNames(ds)) {}

  const planner::DatasetIndex& ds_;
  std::unique_ptr<sidecar::source::SourceRegistry> sources_;
  std::vector<std::unique_ptr<sidecar::source::DecodingSource>> decoding_;        // interposed in sources_
  std::vector<std::unique_ptr<sidecar::source::ParquetRowSource>> parquet_rows_;  // likewise
  std::unique_ptr<const planner::RecordDecoder> decoder_;
  std::vector<std::string> file_names_;
  std::vector<planner::Extent> extents_;
  std::string record_, key_;
  std::vector<uint8_t> want_;
  formats::FieldValues values_;
};
// Rows of tokens (spec.tokens): what each row's tokens, segment ids and
// positions must be, from its documents read here through the storage
// sources and the rows' contract (planner/token_rows.h).
class RowChecker {
 public:
  static Result<std::unique_ptr<RowChecker>> Create(const planner::ResolvedJob& job) {
    MESHLOAD_ASSIGN_OR_RETURN(sidecar::source::SourceOptions sopts, sidecar::source::SourceOptionsForJob(job.spec));
    return std::unique_ptr<RowChecker>(
        new RowChecker(job.dataset, sidecar::source::SourceRegistry::WithBuiltins(std::move(sopts))));
  }

  // The first difference between field `field` of rows `ids` and `data`
  // (the device's tensor): "" when there is none.
  Result<std::string> Check(const std::vector<uint64_t>& ids, size_t field, const uint8_t* data, int64_t step) {
    const planner::TokenRows& rows = *ds_.token_rows();
    const uint64_t T = rows.row_tokens();
    const uint64_t tb = ds_.token_bytes();
    for (size_t k = 0; k < ids.size(); ++k) {
      pieces_.clear();
      rows.AppendPieces(ids[k], pieces_);
      std::vector<uint8_t>& want = want_;
      want.assign(field == 0 ? T * tb : T * sizeof(int32_t), 0);
      uint64_t at = 0;
      int32_t segment = 0;
      for (const planner::RowPiece& p : pieces_) {
        if (field == 0 && p.tokens > 0) {
          const planner::Extent e = ds_.DocumentExtent(p.doc, p.offset, p.tokens);
          MESHLOAD_ASSIGN_OR_RETURN(auto found, sources_->For(ds_.files()[e.file].path));
          MESHLOAD_RETURN_IF_ERROR(found.first->Read(found.second, e.offset, want.data() + at * tb, e.length));
        }
        if (field == 0 && p.eod) std::memcpy(want.data() + (at + p.tokens) * tb, &eod_, tb);
        ++segment;
        for (uint32_t j = 0; j < p.row_tokens(); ++j) {
          const int32_t v = field == 1 ? segment : static_cast<int32_t>(j);
          if (field != 0) std::memcpy(want.data() + (at + j) * sizeof(int32_t), &v, sizeof v);
        }
        at += p.row_tokens();
      }
      if (field == 0) {
        for (uint64_t j = at; j < T; ++j) std::memcpy(want.data() + j * tb, &pad_, tb);
      }
      const uint8_t* got = data + k * want.size();
      if (std::memcmp(got, want.data(), want.size()) != 0) {
        static const char* kNames[] = {"tokens", "segment_ids", "positions"};
        return std::string(kNames[field]) + " of row " + std::to_string(ids[k]) + " at step " + std::to_string(step);
      }
    }
    return std::string();
  }

 private:
  RowChecker(const planner::DatasetIndex& ds, std::unique_ptr<sidecar::source::SourceRegistry> sources)
      : ds_(ds), sources_(std::move(sources)), eod_(ds.token_rows()->eod_token()), pad_(ds.token_rows()->pad_token()) {}

  const planner::DatasetIndex& ds_;
  std::unique_ptr<sidecar::source::SourceRegistry> sources_;
  uint64_t eod_, pad_;
  std::vector<planner::RowPiece> pieces_;
  std::vector<uint8_t> want_;
};

}  // namespace

int RunDemoTrainer(const std::vector<std::string>& args) {
  std::string job_path, socket, verify = "bytes";
  int64_t process = -1, steps = -1, delay_ms = 0, report_ms = 200;
  std::optional<int64_t> start_step;
  FlagParser flags("demo-trainer", kUsage);
  flags.String({"--job"}, &job_path);
  flags.Int({"--process"}, &process);
  flags.String({"--socket"}, &socket);
  flags.Int({"--steps"}, &steps);
  flags.OptionalInt({"--start-step"}, &start_step);
  flags.String({"--verify"}, &verify);
  flags.Int({"--delay-ms"}, &delay_ms);
  flags.Int({"--report-ms"}, &report_ms);
  if (int rc = flags.Parse(args); rc >= 0) return rc;
  if (job_path.empty() || socket.empty() || process < 0)
    return UsageError("demo-trainer: --job, --process and --socket are required");
  if (verify != "bytes" && verify != "ids" && verify != "none")
    return UsageError("--verify: expected bytes, ids or none");

  nlohmann::json final_line = {{"type", "final"}, {"process", process}};
  auto fail = [&](const std::string& error) {
    final_line["error"] = error;
    std::cout << final_line.dump() << std::endl;
    LogError("demo trainer failed", {{"process", process}, {"error", error}});
    return 1;
  };

  Diagnostics diags;
  auto job = planner::LoadJobFile(job_path, diags);
  if (!job.ok()) return fail(diags.ok() ? job.status().ToString() : diags.Report(job_path + ": invalid DataLoadJob"));
  std::unique_ptr<planner::ShardPlanner> planner;
  if (verify != "none") {
    auto resolved = sidecar::source::ResolveReadingDataset(*job, {}, sidecar::source::Unreachable::kFail, diags);
    if (!resolved.ok()) return fail("cannot plan for verification: " + diags.ToString() + resolved.status().ToString());
    planner = std::make_unique<planner::ShardPlanner>(std::move(*resolved));
  }

  const double t_start = MonotonicSeconds();
  client::ClientOptions copts;
  copts.socket_path = socket;
  copts.start_step = start_step;
  auto client = client::Client::Connect(copts);
  if (!client.ok()) return fail(client.status().ToString());

  // SIGTERM/SIGINT (meshload run --local stopping) end the loop with a report.
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  LatencyHistogram waits;
  std::vector<uint8_t> on_host;       // GPU tensors copied back for --verify bytes
  std::vector<int64_t> offsets_host;  // a ragged tensor's offsets (copied back from a GPU)
  std::unique_ptr<RecordChecker> record_checker;
  std::unique_ptr<RowChecker> row_checker;
  if (planner && planner->job().dataset.token_rows() && verify == "bytes") {
    auto checker = RowChecker::Create(planner->job());
    if (!checker.ok()) return fail(checker.status().ToString());
    row_checker = std::move(*checker);
  }
  if (planner && planner->job().dataset.record_format() && verify == "bytes") {
    auto checker = RecordChecker::Create(planner->job());
    if (!checker.ok()) return fail(checker.status().ToString());
    record_checker = std::move(*checker);
  }
  uint64_t gpu_tensors_checked = 0;
  uint64_t done = 0, samples = 0, bytes = 0, mismatches = 0;
  double first_batch = -1;
  int64_t first_step = -1;  // the step of the first batch received
  auto last_report = Clock::now();
  while ((steps < 0 || static_cast<int64_t>(done) < steps) && !g_stop) {
    auto batch = (*client)->Next();
    if (!batch.ok()) {
      if (batch.status().code() == StatusCode::kCancelled) continue;  // g_stop decides
      // Without --steps, the run ends when the sidecar is gone for good.
      if (steps < 0 && batch.status().code() == StatusCode::kUnavailable) break;
      return fail(batch.status().ToString());
    }
    if (first_batch < 0) {
      first_batch = MonotonicSeconds();
      first_step = batch->step;
    }
    waits.Record(batch->wait_seconds);
    if (planner) {
      planner::StepPlan plan = planner->PlanStep(batch->step, planner->DefaultLoading(), process);
      const planner::DatasetIndex& ds = planner->job().dataset;
      const size_t nfields = (*client)->hello().fields.size();
      for (size_t i = 0; i < batch->tensors.size(); ++i) {
        const auto& t = batch->tensors[i];
        const auto& ids = plan.devices[i / nfields].samples;
        if (t.ids_checksum != protocol::SampleIdsChecksum(ids.data(), ids.size())) {
          ++mismatches;
          LogError("sample ids differ from the plan", {{"step", batch->step}, {"device", t.global_device}});
          continue;
        }
        if (verify != "bytes") continue;
        // GPU staging: the bytes are checked on a copy back from the device
        // (a trainer would hand t.data to its framework instead).
        auto copied = CopyBack(t, ids.size(), on_host, offsets_host);
        if (!copied.ok()) return fail(copied.status().ToString());
        const uint8_t* data = *copied;
        if (t.device_type == 2) gpu_tensors_checked++;
        if (row_checker) {
          // Rows of tokens: each row's fields, from its documents.
          auto mismatch = row_checker->Check(ids, i % nfields, data, batch->step);
          if (!mismatch.ok()) return fail(mismatch.status().ToString());
          if (!mismatch->empty()) {
            ++mismatches;
            LogError("a row differs from its documents",
                     {{"step", batch->step}, {"device", t.global_device}, {"what", *mismatch}});
          }
          continue;
        }
        if (ds.record_format()) {
          // WebDataset, MDS: each field of each sample the device holds,
          // decoded from its record as read from storage here.
          auto mismatch = record_checker->Check(ids, i % nfields, t, data, offsets_host.data(), batch->step);
          if (!mismatch.ok()) return fail(mismatch.status().ToString());
          if (!mismatch->empty()) {
            ++mismatches;
            LogError("a field differs from the dataset",
                     {{"step", batch->step}, {"device", t.global_device}, {"what", *mismatch}});
          }
          continue;
        }
        // Where each sample starts: k × the sample size, or (ragged) its
        // offset, which must be where the plan's sizes put it.
        const uint64_t es = t.dtype_bits / 8;
        uint64_t at_byte = 0;
        for (size_t k = 0; k < ids.size(); ++k) {
          if (t.offsets != nullptr && static_cast<uint64_t>(offsets_host[k]) * es != at_byte) {
            ++mismatches;
            LogError("ragged offsets differ from the samples' sizes",
                     {{"step", batch->step}, {"device", t.global_device}, {"sample", ids[k]}});
            break;
          }
          const int64_t at = tools::FirstMismatch(ds, ids[k], data + at_byte);
          at_byte += ds.SampleBytes(ids[k]);
          if (at >= 0) {
            ++mismatches;
            LogError("bytes differ from the dataset",
                     {{"step", batch->step}, {"device", t.global_device}, {"sample", ids[k]}, {"byte", at}});
            break;
          }
        }
      }
    }
    for (const auto& t : batch->tensors) bytes += t.nbytes;
    // Samples: each device's first field's (all its fields hold as many).
    const size_t nfields = (*client)->hello().fields.size();
    for (size_t i = 0; i < batch->tensors.size(); i += nfields) {
      const auto& t = batch->tensors[i];
      samples += t.offsets != nullptr ? t.samples : static_cast<uint64_t>(t.shape[0]);
    }
    ++done;
    // The batch is "trained on" for delay_ms, then released when it goes
    // out of scope at the end of the iteration.
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (Clock::now() - last_report > std::chrono::milliseconds(report_ms)) {
      last_report = Clock::now();
      nlohmann::json p = {{"type", "progress"},
                          {"process", process},
                          {"steps", done},
                          {"first_step", first_step},
                          {"samples", samples},
                          {"bytes", bytes},
                          {"wait_p99", waits.Quantile(0.99)},
                          {"mismatches", mismatches},
                          {"first_batch_at", first_batch}};
      std::cout << p.dump() << std::endl;
    }
  }
  final_line.update({{"steps", done},
                     {"samples", samples},
                     {"bytes", bytes},
                     {"mismatches", mismatches},
                     {"started_at", t_start},
                     {"first_batch_at", first_batch},
                     {"first_step", first_step},
                     {"finished_at", MonotonicSeconds()},
                     {"reconnects", (*client)->reconnects()},
                     {"staging", (*client)->hello().memory == protocol::MemoryKind::kHostMemfd   ? "host"
                                 : (*client)->hello().memory == protocol::MemoryKind::kCudaVmmFd ? "cuda"
                                                                                                 : "cuda-ipc"},
                     {"gpu_tensors_checked", gpu_tensors_checked},
                     {"wait_hist", waits.counts()},
                     {"error", ""}});
  std::cout << final_line.dump() << std::endl;
  return mismatches == 0 ? 0 : 3;
}

}  // namespace meshload::tools
