#include "sidecar/step_loader.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <iterator>

#include "common/logging.h"
#include "formats/fields.h"
#include "sidecar/source/record_values.h"
#include "protocol/protocol.h"

namespace meshload::sidecar {
namespace {

// The watchdog's clock for reads in flight: a stuck read is reported after
// seconds, so the coarse clock (a few ms; a memory read, no TSC read per
// sample) is precise enough.
int64_t CoarseNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string DescribeTransfers(const std::vector<planner::TransferUnit>& in,
                              const std::vector<planner::TransferUnit>& out) {
  std::string s;
  if (!in.empty()) s += "receives from process " + std::to_string(in.front().from);
  if (!out.empty()) s += std::string(s.empty() ? "" : " and ") + "sends to process " + std::to_string(out.front().to);
  return s;
}

// The address of `id` in a sorted (id, address) list; for an id listed
// twice, the later place.
uint8_t* Find(const std::vector<std::pair<uint64_t, uint8_t*>>& v, uint64_t id) {
  auto it = std::upper_bound(v.begin(), v.end(), id, [](uint64_t x, const auto& e) { return x < e.first; });
  return it == v.begin() || std::prev(it)->first != id ? nullptr : std::prev(it)->second;
}

// Writes token value `v` (`tb` bytes, little-endian as the data is) at `p`.
void StoreToken(uint8_t* p, uint64_t v, uint64_t tb) { std::memcpy(p, &v, static_cast<size_t>(tb)); }
uint64_t LoadToken(const uint8_t* p, uint64_t tb) {
  uint64_t v = 0;
  std::memcpy(&v, p, static_cast<size_t>(tb));
  return v;
}
void FillTokens(uint8_t* p, uint64_t v, uint64_t tb, uint64_t count) {
  if (tb == 1 || v == 0) {
    std::memset(p, static_cast<int>(v & 0xFF), static_cast<size_t>(count * tb));
    return;
  }
  for (uint64_t i = 0; i < count; ++i) StoreToken(p + i * tb, v, tb);
}

}  // namespace

uint64_t JobFingerprint(const planner::ShardPlanner& planner, const planner::Loading& loading) {
  const planner::ResolvedJob& job = planner.job();
  std::vector<uint64_t> v = {job.samples,
                             job.global_batch,
                             job.dataset.sample_bytes(),
                             job.dataset.LargestBytes(job.samples),  // variable-size: the dataset's bytes
                             static_cast<uint64_t>(job.mesh.processes()),
                             static_cast<uint64_t>(job.mesh.devices()),
                             static_cast<uint64_t>(loading.strategy),
                             static_cast<uint64_t>(loading.fanout)};
  // Rows of tokens: the same rows (pieces, end-of-document and pad tokens).
  if (const planner::TokenRows* rows = job.dataset.token_rows()) v.push_back(rows->fingerprint());
  for (int64_t step : {int64_t{0}, static_cast<int64_t>(job.steps_per_epoch)}) {
    const std::vector<uint64_t> batch = planner.GlobalBatch(step);
    v.push_back(protocol::SampleIdsChecksum(batch.data(), batch.size()));
  }
  return protocol::SampleIdsChecksum(v.data(), v.size());
}

Result<std::unique_ptr<StepLoader>> StepLoader::Create(const planner::ShardPlanner& planner, int64_t process,
                                                       const planner::Loading& loading, source::SourceRegistry& sources,
                                                       const staging::BatchLayout& layout, StepLoaderOptions options) {
  const planner::ResolvedJob& job = planner.job();
  if (process < 0 || process >= job.mesh.processes()) {
    return InvalidArgument("process " + std::to_string(process) + " is not in the job's 0.." +
                           std::to_string(job.mesh.processes() - 1));
  }
  if (job.dataset.sample_bytes() == 0 && !job.dataset.variable_size()) {
    return InvalidArgument("the sample size is unknown: the Npy files could not be read; make them reachable",
                           "spec.dataset.uri");
  }
  if (job.dataset.variable_size() && !job.dataset.indexed()) {
    return InvalidArgument("the samples' sizes are unknown: the dataset's index was not read; make it reachable",
                           "spec.dataset.uri");
  }
  if (std::string why = planner.Unsupported(loading); !why.empty()) return FailedPrecondition(why, "spec.strategy");
  const auto in = planner.TransfersTo(process, loading);
  const auto out = planner.TransfersFrom(process, loading);
  if ((!in.empty() || !out.empty()) && !options.peers) {
    return FailedPrecondition(
        "strategy " + std::string(ToString(loading.strategy)) + " with fanout " +
            std::string(ToString(loading.fanout)) + " moves samples between processes (process " +
            std::to_string(process) + " " + DescribeTransfers(in, out) +
            "), so the sidecar needs its peers' addresses: give --peers (or --assignments with --peer-port)",
        "spec.strategy");
  }
  if (options.reader_threads < 1) options.reader_threads = 1;
  if (options.callers < 1) options.callers = 1;
  std::unique_ptr<StepLoader> loader(new StepLoader(planner, process, loading, sources, layout, options));
  for (const auto& f : job.dataset.files()) {
    MESHLOAD_ASSIGN_OR_RETURN(auto src, sources.For(f.path));
    loader->files_.push_back(src);
    if (std::find(loader->distinct_sources_.begin(), loader->distinct_sources_.end(), src.first) ==
        loader->distinct_sources_.end()) {
      loader->distinct_sources_.push_back(src.first);
    }
  }
  loader->decoder_ = source::RecordDecoderOf(job.dataset);
  loader->file_names_ = source::RecordFileNames(job.dataset);
  // Every caller of Load() reads a share of its step itself: one inflight
  // record per caller, then one per reader thread (one fewer than
  // reader_threads, the caller being the first reader).
  for (int i = 0; i < options.callers; ++i) {
    loader->inflight_.push_back(std::make_unique<Inflight>());
    loader->callers_.push_back(std::make_unique<Caller>());
    loader->callers_.back()->index = static_cast<size_t>(i);
    loader->callers_.back()->inflight = loader->inflight_.back().get();
  }
  for (int i = 1; i < options.reader_threads; ++i) {
    loader->inflight_.push_back(std::make_unique<Inflight>());
    loader->threads_.emplace_back([l = loader.get(), slot = loader->inflight_.back().get()] { l->ReaderMain(*slot); });
  }
  if (!in.empty() || !out.empty()) {
    exchange::ExchangeOptions xo = *options.peers;
    xo.process = process;
    xo.fingerprint = JobFingerprint(planner, loading);
    xo.serve = [l = loader.get()](int64_t step, int64_t peer, std::vector<uint8_t>& buf, uint64_t& checksum) {
      return l->ServePart(step, peer, buf, checksum);
    };
    std::vector<int64_t> send_to, receive_from;
    for (const planner::TransferUnit& u : out) send_to.push_back(u.to);
    for (const planner::TransferUnit& u : in) receive_from.push_back(u.from);
    MESHLOAD_ASSIGN_OR_RETURN(
        loader->exchange_, exchange::PeerExchange::Create(std::move(xo), std::move(send_to), std::move(receive_from)));
  }
  return loader;
}

StepLoader::StepLoader(const planner::ShardPlanner& planner, int64_t process, const planner::Loading& loading,
                       source::SourceRegistry& sources, const staging::BatchLayout& layout, StepLoaderOptions options)
    : planner_(planner),
      process_(process),
      loading_(loading),
      sources_(sources),
      layout_(layout),
      options_(options),
      batches_(static_cast<size_t>(options.callers)) {}

StepLoader::~StepLoader() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  work_.NotifyAll();
  for (auto& t : threads_) t.join();
}

Status StepLoader::VerifyFiles() {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  if (!ds.indexed()) return Status::Ok();
  auto verify = [&](size_t i) -> Status {
    const planner::DatasetFile& f = ds.files()[i];
    auto [src, name] = files_[i];
    MESHLOAD_ASSIGN_OR_RETURN(source::ObjectInfo info, src->Stat(name));
    if (info.size != f.size) {
      return DataLoss("size is " + std::to_string(info.size) + " bytes but the dataset index says " +
                          std::to_string(f.size) + "; the file changed after the job was resolved",
                      source::RedactUri(f.path));
    }
    if (f.npy) {
      std::string head(f.npy->data_offset, '\0');
      MESHLOAD_RETURN_IF_ERROR(src->Read(name, 0, head.data(), head.size()));
      auto h = formats::ParseNpyHeader(head);
      if (!h.ok()) return h.status().WithLocationPrefix(source::RedactUri(f.path));
      if (h->descr != f.npy->descr || h->shape != f.npy->shape || h->data_offset != f.npy->data_offset) {
        return DataLoss("the npy header changed after the job was resolved", source::RedactUri(f.path));
      }
    }
    return Status::Ok();
  };
  // A request per file, 16 at a time: on a remote source their round trips
  // overlap (a dataset of a thousand objects would otherwise wait a
  // thousand round trips before its first fetch; through the block cache
  // the source says it is not latency-bound, its Stat still is). The first
  // failure in file order is the error, whatever order they finished in.
  std::vector<Status> results(ds.files().size());
  source::ForEach(results.size(), 16, [&](size_t i) { results[i] = verify(i); });
  for (Status& st : results) {
    if (!st.ok()) return std::move(st);
  }
  return Status::Ok();
}

StepLoader::ReadOp& StepLoader::Caller::NewOp() {
  if (used == ops.size()) ops.emplace_back();
  ReadOp& op = ops[used++];
  op.iov.clear();  // keeps its capacity for the next steps
  op.length = 0;
  op.has_scratch = false;
  return op;
}

void StepLoader::PlaceSamples(const planner::StepPlan& plan, uint8_t* slot, Caller& c) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  c.places.resize(plan.devices.size());
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const std::vector<uint64_t>& ids = plan.devices[i].samples;
    std::vector<uint64_t>& at = c.places[i];
    at.resize(ids.size() + 1);
    uint64_t bytes = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      at[k] = bytes;
      bytes += ds.SampleBytes(ids[k]);
    }
    at[ids.size()] = bytes;
    if (!layout_.extracts && layout_.fields[0].ragged) {
      // The sample offsets, in elements, before the values (WebDataset and
      // MDS fields get theirs when the records are decoded).
      const uint64_t es = formats::DTypeSize(layout_.fields[0].dtype);
      auto* offsets = reinterpret_cast<int64_t*>(slot + layout_.devices[i].fields[0].offsets_offset);
      for (size_t k = 0; k <= ids.size(); ++k) offsets[k] = static_cast<int64_t>(at[k] / es);
    }
  }
}

uint8_t* StepLoader::SamplesBase(Caller& c, uint8_t* slot, size_t device) {
  if (!layout_.extracts) return slot + layout_.devices[device].fields[0].offset;
  const size_t need = layout_.devices.size() * layout_.record_room;
  if (c.records.size() < need) c.records.resize(need);
  return c.records.data() + device * layout_.record_room;
}

Status StepLoader::Extract(const planner::StepPlan& plan, uint8_t* slot, Caller& c,
                           std::vector<staging::StagedTensor>& staged, const std::vector<bool>& copied,
                           StepLoadStats& stats) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const std::vector<formats::FieldDecoding>& fields = ds.fields();
  const bool skip = ds.missing_field() == planner::MissingFieldPolicy::kSkip;
  formats::FieldValues values;
  std::string key;
  std::vector<uint64_t> used(fields.size());
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    if (copied[i]) continue;  // a replica: copied from its primary afterwards
    const std::vector<uint64_t>& ids = plan.devices[i].samples;
    const staging::DeviceTensor& dev = layout_.devices[i];
    const uint8_t* base = SamplesBase(c, slot, i);
    std::fill(used.begin(), used.end(), 0);
    uint64_t kept = 0;
    for (size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].ragged()) reinterpret_cast<int64_t*>(slot + dev.fields[f].offsets_offset)[0] = 0;
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::string_view record(reinterpret_cast<const char*>(base + c.places[i][k]),
                                    c.places[i][k + 1] - c.places[i][k]);
      const source::RecordPlace place = source::PlaceOfRecord(ds, ids[k], c.extents, file_names_);
      MESHLOAD_RETURN_IF_ERROR(source::RecordValues(*decoder_, ids[k], record, place, values, key));
      size_t missing = fields.size();
      for (size_t f = 0; f < fields.size() && missing == fields.size(); ++f) {
        if (!values[f]) missing = f;
      }
      if (missing != fields.size()) {
        if (skip) {
          stats.samples_skipped += 1;
          continue;
        }
        return source::MissingFieldError(ds, ids[k], place, key, missing, plan.step);
      }
      for (size_t f = 0; f < fields.size(); ++f) {
        const formats::FieldDecoding& fd = fields[f];
        const staging::FieldTensor& t = dev.fields[f];
        const uint64_t at = place.offset + static_cast<uint64_t>(values[f]->data() - record.data());
        // A ragged field's values go on after the samples before it; a
        // dense field's sample is row `kept`.
        uint8_t* dest = slot + t.offset + (fd.ragged() ? used[f] : kept * fd.sample_bytes());
        const uint64_t room = fd.ragged() ? t.nbytes - used[f] : fd.sample_bytes();
        uint64_t written = 0;
        MESHLOAD_RETURN_IF_ERROR(formats::DecodeFieldValue(fd, *values[f], dest, room, written, *place.file_name, at));
        used[f] += written;
        if (fd.ragged()) {
          reinterpret_cast<int64_t*>(slot + t.offsets_offset)[kept + 1] =
              static_cast<int64_t>(used[f] / formats::DTypeSize(fd.dtype));
        }
      }
      ++kept;
    }
    staged[i].samples = kept;
    staged[i].values_bytes = used;
  }
  return Status::Ok();
}

void StepLoader::AddRowPieces(uint64_t row, uint8_t* dest, Caller& c) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const planner::TokenRows& rows = *ds.token_rows();
  const uint64_t tb = ds.token_bytes();
  c.row_pieces.clear();
  rows.AppendPieces(row, c.row_pieces);
  uint64_t at = 0;  // tokens into the row
  for (const planner::RowPiece& rp : c.row_pieces) {
    if (rp.tokens > 0) {
      const planner::Extent e = ds.DocumentExtent(rp.doc, rp.offset, rp.tokens);
      c.pieces.push_back({e.file, e.offset, e.length, dest ? dest + at * tb : nullptr});
      // endOfDocument.append Never: the document's last token is checked
      // once it is read.
      if (dest && rows.eod_in_data() && rp.offset + rp.tokens == ds.DocumentTokens(rp.doc)) {
        c.eod_checks.push_back({dest + (at + rp.tokens - 1) * tb, rp.doc});
      }
    }
    at += rp.tokens;
    if (rp.eod) {
      if (dest) StoreToken(dest + at * tb, rows.eod_token(), tb);
      ++at;
    }
  }
  if (dest && at < rows.row_tokens()) FillTokens(dest + at * tb, rows.pad_token(), tb, rows.row_tokens() - at);
}

void StepLoader::WriteRowFields(const planner::StepPlan& plan, uint8_t* slot, Caller& c) {
  const planner::TokenRows& rows = *planner_.job().dataset.token_rows();
  const uint64_t T = rows.row_tokens();
  std::vector<bool> copy_target(plan.devices.size(), false);
  for (const auto& [from, to] : c.replica_copies) copy_target[to] = true;
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    if (copy_target[i]) continue;  // copied from its primary with the rest of its region
    const staging::DeviceTensor& dev = layout_.devices[i];
    auto* seg = reinterpret_cast<int32_t*>(slot + dev.fields[1].offset);
    auto* pos = reinterpret_cast<int32_t*>(slot + dev.fields[2].offset);
    for (uint64_t row : plan.devices[i].samples) {
      const std::span<const planner::RowPiece> pieces = rows.StoredPieces(row);  // a Pack row's, all of them
      planner::WritePackedFields(pieces.data(), pieces.size(), T, seg, pos);
      seg += T;
      pos += T;
    }
  }
}

Status StepLoader::CheckDocumentEnds(const Caller& c) const {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const planner::TokenRows& rows = *ds.token_rows();
  for (const auto& [at, doc] : c.eod_checks) {
    const uint64_t last = LoadToken(at, ds.token_bytes());
    if (last != rows.eod_token()) {
      return DataLoss("the document " + ds.DescribeDocument(doc) + " ends with token " + std::to_string(last) +
                          ", not the end-of-document token " + std::to_string(rows.eod_token()) +
                          " that spec.tokens.endOfDocument.append Never says every document ends with; use "
                          "append: Always to have meshload add it",
                      "spec.tokens.endOfDocument");
    }
  }
  return Status::Ok();
}

Status StepLoader::BuildOps(const planner::StepPlan& plan, uint8_t* slot, Caller& c, StepLoadStats& stats) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const planner::TokenRows* rows = ds.token_rows();
  const int64_t first_device = layout_.devices.front().device;
  c.eod_checks.clear();
  // Asked each step: a cached remote source waits on the network only
  // while its disk refuses blocks, and a source's gap follows what it
  // measured.
  c.latency_bound = false;
  c.max_gap = 0;
  for (source::Source* s : distinct_sources_) {
    if (!s->LatencyBound()) continue;
    c.latency_bound = true;
    c.max_gap = std::max(c.max_gap, std::min(options_.max_gap_bytes, s->GapWorthReading()));
  }
  PlaceSamples(plan, slot, c);

  // Where each sample goes: the first local device holding its shard (the
  // others are replicas, filled by a copy or by their own read).
  c.dest_of.clear();
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const planner::DevicePlan& d = plan.devices[i];
    size_t primary = i;
    for (size_t j = 0; j < i; ++j) {
      if (plan.devices[j].shard == d.shard) {
        primary = j;
        break;
      }
    }
    if (primary != i) {
      // PerDevice: a replica reads for itself, unless its process receives
      // the shard (Broadcast): then it is copied like any other replica.
      bool reads = false;
      if (loading_.strategy == planner::Strategy::kPerDevice) {
        for (const planner::ReadPlan& r : plan.reads) reads |= r.device == d.device;
      }
      if (!reads) c.replica_copies.emplace_back(primary, i);
      continue;
    }
    for (size_t k = 0; k < d.samples.size(); ++k) {
      c.dest_of.emplace_back(d.samples[k], SamplesBase(c, slot, i) + c.places[i][k]);
    }
  }
  // For an id listed twice, the later place wins (as a map's last
  // assignment would): places were added in slot order (device offsets grow
  // with the device, see ComputeBatchLayout), so sorting by (id, place) keeps
  // them in the order they were added, without stable_sort's buffer.
  std::sort(c.dest_of.begin(), c.dest_of.end());
  // The other places of an id listed twice get a copy of the last one
  // (Find's) when the step is complete.
  c.duplicates.clear();
  c.duplicate_ids.clear();
  for (size_t i = 0; i + 1 < c.dest_of.size();) {
    size_t last = i;
    while (last + 1 < c.dest_of.size() && c.dest_of[last + 1].first == c.dest_of[i].first) ++last;
    for (size_t k = i; k < last; ++k) {
      c.duplicates.push_back({c.dest_of[k].second, c.dest_of[last].second, ds.SampleBytes(c.dest_of[i].first)});
    }
    if (last > i) c.duplicate_ids.push_back(c.dest_of[i].first);  // ascending, as dest_of
    i = last + 1;
  }
  // One writer per place: a duplicated sample is read (or received) into
  // its last place once; the writers after the first go elsewhere.
  c.written.clear();

  // With peers, a sample read that no local device holds is a peer's: it is
  // read into the outbox (sized first: its addresses must not move).
  c.outbox_of.clear();
  if (exchange_) {
    uint64_t outside = 0;
    for (const planner::ReadPlan& r : plan.reads) {
      if (r.device >= 0) continue;
      for (uint64_t id : r.samples) outside += Find(c.dest_of, id) == nullptr ? ds.SampleBytes(id) : 0;
    }
    if (c.outbox.size() < outside) c.outbox.resize(outside);
  }
  uint8_t* outbox_next = c.outbox.data();

  for (const planner::ReadPlan& r : plan.reads) {
    // PerDevice: this read fills its own device, replicas included.
    const bool own_device = r.device >= 0;
    const size_t local = own_device ? static_cast<size_t>(r.device - first_device) : 0;
    std::vector<Piece>& pieces = c.pieces;
    pieces.clear();
    if (rows != nullptr) ds.PrefetchRows(r.samples.data(), r.samples.size());
    for (size_t k = 0; k < r.samples.size(); ++k) {
      const uint64_t id = r.samples[k];
      uint8_t* dest;
      if (own_device) {
        dest = SamplesBase(c, slot, local) + c.places[local][k];
      } else {
        dest = Find(c.dest_of, id);
        if (dest != nullptr && std::binary_search(c.duplicate_ids.begin(), c.duplicate_ids.end(), id)) {
          // Read once into its last place (a second read of it would write
          // the same bytes there at the same time).
          if (std::find(c.written.begin(), c.written.end(), id) != c.written.end()) continue;
          c.written.push_back(id);
        }
        if (dest == nullptr && exchange_) {
          dest = outbox_next;
          outbox_next += ds.SampleBytes(id);
          c.outbox_of.emplace_back(id, dest);
        }
      }
      if (rows != nullptr) {
        AddRowPieces(id, dest, c);
        continue;
      }
      c.extents.clear();
      ds.AppendExtents(id, c.extents);
      uint64_t done = 0;
      for (const planner::Extent& e : c.extents) {
        pieces.push_back({e.file, e.offset, e.length, dest ? dest + done : nullptr});
        done += e.length;
      }
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
    stats.samples_read += r.samples.size();

    // Walk the pieces in file order; each run of touching pieces is one
    // coalesced range (split at max_read_bytes) and becomes one ReadOp; for
    // a latency-bound source, so is a run whose gaps are at most
    // c.max_gap (the gaps are read into scratch and dropped).
    ReadOp* op = nullptr;
    uint64_t pos = 0;  // next file byte the current op will read
    uint64_t op_bytes = 0;
    const Piece* prev = nullptr;
    // Rows of tokens are runs of documents: pieces that share bytes (a
    // Concatenate row's last token) are read again, as variable-size ones.
    const bool variable = ds.variable_size() || rows != nullptr;
    for (const Piece& p : pieces) {
      if (p.length == 0) continue;  // an empty sample (a Megatron sequence of no tokens) reads nothing
      // Samples of a fixed-size format overlap only as TokenStream
      // neighbours (the shared token, handled below); variable-size
      // samples whose index points them at shared bytes are read again.
      const bool touches = op && prev && p.file == prev->file && (variable ? p.offset == pos : p.offset <= pos);
      const bool bridges =
          c.latency_bound && op && prev && p.file == prev->file && p.offset > pos && p.offset - pos <= c.max_gap;
      if ((!touches && !bridges) || op_bytes >= options_.max_read_bytes) {
        // A split of a long range goes on where the last read stopped, so a
        // shared token is read once (and copied); after a dropped piece it
        // is read again instead, since its first copy went to scratch.
        const uint64_t start = touches && prev->dest != nullptr ? pos : p.offset;
        op = &c.NewOp();
        op->uri = &files_[p.file].second;
        op->offset = start;
        op->source = files_[p.file].first;
        pos = start;
        op_bytes = 0;
        stats.read_ranges += 1;
      } else if (bridges) {
        const uint64_t gap = p.offset - pos;
        op->iov.push_back({nullptr, static_cast<size_t>(gap)});
        op->has_scratch = true;
        op->length += gap;
        pos += gap;
        op_bytes += gap;
        stats.bytes_read += gap;
      }
      uint64_t skip = 0;
      if (p.offset < pos) {
        // Overlap with the previous piece (TokenStream's shared token).
        const uint64_t overlap = pos - p.offset;
        if (prev->dest == nullptr && !op->iov.empty()) {
          // The bytes went to scratch: take them back for this piece.
          op->iov.back().iov_len -= overlap;
          if (op->iov.back().iov_len == 0) op->iov.pop_back();
          pos -= overlap;
          op_bytes -= overlap;
          op->length -= overlap;
        } else if (p.dest != nullptr) {
          c.fixups.push_back({p.dest, prev->dest + (p.offset - prev->offset), overlap});
          stats.bytes_copied += overlap;
          skip = overlap;
        } else {
          skip = overlap;
        }
      }
      const uint64_t len = p.length - skip;
      if (len > 0) {
        // A dropped piece (GlobalLoad) has no destination yet: the thread
        // that runs the read points it at its own scratch.
        op->iov.push_back({p.dest ? p.dest + skip : nullptr, static_cast<size_t>(len)});
        op->has_scratch |= p.dest == nullptr;
        op->length += len;
        pos += len;
        op_bytes += len;
        stats.bytes_read += len;
      }
      prev = &p;
    }
  }
  std::sort(c.outbox_of.begin(), c.outbox_of.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return Status::Ok();
}

Status StepLoader::BuildParts(const planner::StepPlan& plan, bool incoming, Caller& c,
                              std::vector<exchange::Part>& parts) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  parts.clear();
  if (incoming) {
    // A duplicated sample already read here, or received in another part,
    // is received into the sink and dropped: one writer per place.
    uint64_t sink = 0;
    std::vector<uint64_t> seen = c.written;
    for (const planner::TransferPlan& t : plan.transfers) {
      if (t.to != process_) continue;
      for (uint64_t id : t.samples) {
        if (!std::binary_search(c.duplicate_ids.begin(), c.duplicate_ids.end(), id)) continue;
        if (std::find(seen.begin(), seen.end(), id) != seen.end()) {
          sink += ds.SampleBytes(id);
        } else {
          seen.push_back(id);
        }
      }
    }
    if (c.sink.size() < sink) c.sink.resize(sink);
  }
  uint8_t* sink_next = c.sink.data();
  for (const planner::TransferPlan& t : plan.transfers) {
    if ((incoming ? t.to : t.from) != process_) continue;
    exchange::Part part;
    part.peer = incoming ? t.from : t.to;
    part.bytes = ds.BytesOf(t.samples.data(), t.samples.size());
    part.checksum = protocol::SampleIdsChecksum(t.samples.data(), t.samples.size());
    for (uint64_t id : t.samples) {
      uint8_t* p = Find(c.dest_of, id);
      if (p == nullptr && !incoming) p = Find(c.outbox_of, id);
      if (incoming && p != nullptr && std::binary_search(c.duplicate_ids.begin(), c.duplicate_ids.end(), id)) {
        if (std::find(c.written.begin(), c.written.end(), id) != c.written.end()) {
          p = sink_next;
          sink_next += ds.SampleBytes(id);
        } else {
          c.written.push_back(id);
        }
      }
      // The plan puts every sample a transfer moves in this process's slot
      // or outbox.
      MESHLOAD_CHECK(p != nullptr, "step " + std::to_string(plan.step) + ": sample " + std::to_string(id) +
                                       (incoming ? " from" : " for") + " process " + std::to_string(part.peer) +
                                       " has no place in this process");
      // Neighbours in the slot (a shard's samples) make one iovec.
      const uint64_t sb = ds.SampleBytes(id);
      if (!part.iov.empty() && static_cast<uint8_t*>(part.iov.back().iov_base) + part.iov.back().iov_len == p) {
        part.iov.back().iov_len += sb;
      } else {
        part.iov.push_back({p, static_cast<size_t>(sb)});
      }
    }
    parts.push_back(std::move(part));
  }
  return Status::Ok();
}

Status StepLoader::ServePart(int64_t step, int64_t peer, std::vector<uint8_t>& out, uint64_t& checksum) {
  const planner::DatasetIndex& ds = planner_.job().dataset;
  const planner::StepPlan plan = planner_.PlanStep(step, loading_, process_, planner::ShardPlanner::Detail::kSamples);
  for (const planner::TransferPlan& t : plan.transfers) {
    if (t.from != process_ || t.to != peer) continue;
    out.resize(ds.BytesOf(t.samples.data(), t.samples.size()));
    checksum = protocol::SampleIdsChecksum(t.samples.data(), t.samples.size());
    std::vector<planner::Extent> extents;
    uint8_t* dest = out.data();
    if (ds.token_rows()) return ServeRows(t.samples, out);
    for (uint64_t id : t.samples) {
      extents.clear();
      ds.AppendExtents(id, extents);
      for (const planner::Extent& e : extents) {
        MESHLOAD_RETURN_IF_ERROR(files_[e.file].first->Read(files_[e.file].second, e.offset, dest, e.length));
        dest += e.length;
      }
    }
    return Status::Ok();
  }
  return Internal("step " + std::to_string(step) + " sends nothing from process " + std::to_string(process_) +
                  " to process " + std::to_string(peer));
}

Status StepLoader::ServeRows(const std::vector<uint64_t>& ids, std::vector<uint8_t>& out) {
  // Each row as Load() assembles it: its pieces read, the end-of-document
  // and pad tokens written.
  const planner::DatasetIndex& ds = planner_.job().dataset;
  Caller scratch;
  uint8_t* dest = out.data();
  for (uint64_t id : ids) {
    scratch.pieces.clear();
    scratch.eod_checks.clear();
    AddRowPieces(id, dest, scratch);
    for (const Piece& p : scratch.pieces) {
      MESHLOAD_RETURN_IF_ERROR(files_[p.file].first->Read(files_[p.file].second, p.offset, p.dest, p.length));
    }
    if (!scratch.eod_checks.empty()) MESHLOAD_RETURN_IF_ERROR(CheckDocumentEnds(scratch));
    dest += ds.sample_bytes();
  }
  return Status::Ok();
}

Status StepLoader::Load(int64_t step, uint8_t* slot, std::vector<staging::StagedTensor>& staged,
                        StepLoadStats* stats_out, int caller, const std::function<bool()>& cancelled) {
  if (caller < 0 || static_cast<size_t>(caller) >= callers_.size()) {
    return InvalidArgument("caller " + std::to_string(caller) + " is not in 0.." + std::to_string(callers_.size() - 1));
  }
  Caller& c = *callers_[static_cast<size_t>(caller)];
  // Every thread that reads for this step says so (the block cache keeps
  // a read's block for the step that needs it).
  c.step = step;
  source::SetReadingStep(step);
  planner::StepPlan plan = planner_.PlanStep(step, loading_, process_, planner::ShardPlanner::Detail::kSamples);
  StepLoadStats stats;
  c.used = 0;
  c.fixups.clear();
  c.replica_copies.clear();
  MESHLOAD_RETURN_IF_ERROR(BuildOps(plan, slot, c, stats));
  const planner::TokenRows* rows = planner_.job().dataset.token_rows();
  if (rows && rows->mode() == planner::TokensMode::kPack) WriteRowFields(plan, slot, c);
  if (exchange_) {
    // Credit first: a peer may send while this process still reads.
    exchange::PeerExchange::Ticket ticket = exchange_->Begin(step);
    Status st = BuildParts(plan, /*incoming=*/true, c, c.parts);
    if (st.ok()) {
      for (const auto& p : c.parts) stats.bytes_received += p.bytes;
      st = exchange_->Expect(ticket, std::move(c.parts));
    }
    if (st.ok()) st = RunOps(c);
    if (st.ok() && !c.eod_checks.empty()) st = CheckDocumentEnds(c);
    if (st.ok()) {
      for (const Fixup& f : c.fixups) std::memcpy(f.dst, f.src, f.len);
      st = BuildParts(plan, /*incoming=*/false, c, c.parts);
    }
    if (st.ok()) {
      for (const auto& p : c.parts) stats.bytes_sent += p.bytes;
      st = exchange_->Send(ticket, std::move(c.parts));
    }
    if (st.ok()) {
      const auto t0 = std::chrono::steady_clock::now();
      st = exchange_->Wait(ticket, cancelled);
      stats.peer_wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!st.ok()) {
      exchange_->Abandon(ticket);
      return st;
    }
    c.parts.clear();
  } else {
    MESHLOAD_RETURN_IF_ERROR(RunOps(c));
    if (!c.eod_checks.empty()) MESHLOAD_RETURN_IF_ERROR(CheckDocumentEnds(c));
    for (const Fixup& f : c.fixups) std::memcpy(f.dst, f.src, f.len);
  }
  for (const Fixup& f : c.duplicates) std::memcpy(f.dst, f.src, f.len);
  staged.resize(plan.devices.size());
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    const std::vector<uint64_t>& ids = plan.devices[i].samples;
    staged[i].ids_checksum = protocol::SampleIdsChecksum(ids.data(), ids.size());
    staged[i].samples = ids.size();
    staged[i].values_bytes.assign(layout_.fields.size(), 0);
    if (!layout_.extracts) {
      staged[i].values_bytes[0] = c.places[i].back();
      // Packed rows' segment ids and positions: dense, one row per sample.
      for (size_t f = 1; f < layout_.fields.size(); ++f) {
        staged[i].values_bytes[f] = ids.size() * layout_.fields[f].sample_bytes;
      }
    }
  }
  if (layout_.extracts) {
    c.copied.assign(plan.devices.size(), false);
    for (const auto& [from, to] : c.replica_copies) c.copied[to] = true;
    MESHLOAD_RETURN_IF_ERROR(Extract(plan, slot, c, staged, c.copied, stats));
  }
  for (const auto& [from, to] : c.replica_copies) {
    staged[to].samples = staged[from].samples;
    staged[to].values_bytes = staged[from].values_bytes;
    if (!options_.host_replica_copies) continue;
    const uint64_t bytes = staging::UsedRegionBytes(layout_, from, &staged[from]);
    std::memcpy(slot + layout_.devices[to].region_offset, slot + layout_.devices[from].region_offset, bytes);
    stats.bytes_copied += bytes;
  }
  if (stats_out) *stats_out = stats;
  return Status::Ok();
}

Status StepLoader::RunOps(Caller& c) {
  // Dispatch costs a wake-up per thread, which is more than a few small
  // reads of local files cost: a small step is read inline; a larger one,
  // or any step of a latency-bound (remote) source, whose reads are round
  // trips, is cut into one contiguous chunk of ops per thread, and this
  // thread reads a chunk too.
  ReadOp* ops = c.ops.data();
  const size_t count = c.used;
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += ops[i].length;
  const size_t threads = threads_.size() + 1;
  if ((total < options_.inline_step_bytes && !c.latency_bound) || count < 2 || threads == 1) {
    return RunChunk(ops, count, *c.inflight);
  }
  const uint64_t per_chunk = (total + threads - 1) / threads;
  c.chunks.clear();
  size_t begin = 0;
  uint64_t acc = 0;
  for (size_t i = 0; i < count; ++i) {
    acc += ops[i].length;
    if (acc >= per_chunk || i + 1 == count) {
      c.chunks.push_back({ops + begin, i + 1 - begin, c.index, c.step});
      begin = i + 1;
      acc = 0;
    }
  }
  {
    MutexLock lock(mu_);
    batches_[c.index] = {c.chunks.size() - 1, Status::Ok()};
    for (size_t k = 1; k < c.chunks.size(); ++k) queue_.push_back(c.chunks[k]);
  }
  work_.NotifyAll();
  Status mine = RunChunk(c.chunks[0].ops, c.chunks[0].count, *c.inflight);
  MutexLock lock(mu_);
  while (batches_[c.index].outstanding != 0) {
    // This step's chunks no reader thread took yet are read here: a step
    // never waits for reader threads busy with another step's reads, which
    // may themselves wait for this step to pass (a block cache with no room
    // for a later step's blocks until then).
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Chunk& k) { return k.caller == c.index; });
    if (it == queue_.end()) {
      done_.Wait(mu_);
      continue;
    }
    const Chunk chunk = *it;
    queue_.erase(it);
    lock.Unlock();
    Status st = RunChunk(chunk.ops, chunk.count, *c.inflight);
    lock.Lock();
    Batch& batch = batches_[c.index];
    if (!st.ok() && batch.first_error.ok()) batch.first_error = st;
    --batch.outstanding;
  }
  if (!mine.ok()) return mine;
  return batches_[c.index].first_error;
}

namespace {

// Publishes the read about to start to this thread's watchdog slot.
template <typename Op, typename Slot>
void NoteInflight(const Op& op, Slot& slot) {
  slot.start_ns.store(CoarseNowNs(), std::memory_order_relaxed);
  slot.offset.store(op.offset, std::memory_order_relaxed);
  slot.length.store(op.length, std::memory_order_relaxed);
  slot.uri.store(op.uri, std::memory_order_release);
}

}  // namespace

Status StepLoader::RunChunk(ReadOp* ops, size_t count, Inflight& slot) {
  // Reads are hinted to their sources 16 to 32 ahead (topped up every 16,
  // which keeps the calls into the source few): small samples copied from
  // a mapping then wait for memory about once per window, not once each.
  // Runs of up to 16 reads of one object go to the source in one call
  // (Source::ReadMany), which shares the lookups and metric updates that
  // would otherwise cost more than copying a small sample.
  constexpr size_t kPrefetchWindow = 32;
  constexpr size_t kMaxBatch = kPrefetchWindow / 2;
  thread_local std::vector<source::Source::Range> hints;        // kept between steps
  thread_local std::vector<source::Source::ReadRequest> batch;  // kept between steps
  size_t hinted = 0;                                            // ops [0, hinted) were hinted
  size_t i = 0;
  while (i < count) {
    if (hinted < count && hinted - i <= kPrefetchWindow / 2) {
      const size_t end = std::min(count, i + kPrefetchWindow);
      size_t j = hinted;
      hinted = end;
      while (j < end) {  // one call per run of ops on the same object
        size_t k = j;
        hints.clear();
        while (k < end && ops[k].uri == ops[j].uri && ops[k].source == ops[j].source) {
          hints.push_back({ops[k].offset, ops[k].length});
          ++k;
        }
        ops[j].source->Prefetch(*ops[j].uri, hints.data(), hints.size());
        j = k;
      }
    }
    ReadOp* op = &ops[i];
    Status st;
    if (op->has_scratch) {
      // Every dropped piece of this read lands in this thread's scratch.
      // Sized first, then pointed at: a resize after pointing would free
      // the memory earlier iovecs point into.
      thread_local std::vector<uint8_t> scratch;
      std::vector<iovec> iov = op->iov;
      size_t largest = 0;
      for (const iovec& v : iov) {
        if (v.iov_base == nullptr) largest = std::max(largest, v.iov_len);
      }
      if (scratch.size() < largest) scratch.resize(largest);
      for (iovec& v : iov) {
        if (v.iov_base == nullptr) v.iov_base = scratch.data();
      }
      NoteInflight(*op, slot);
      st = op->source->ReadV(*op->uri, op->offset, iov);
      ++i;
    } else {
      // The run: following reads of the same object, as far as every one
      // of them still has more than half a window hinted ahead of it (what
      // topping up before each read would keep).
      const size_t limit = std::min(i + kMaxBatch, hinted == count ? count : hinted - kPrefetchWindow / 2);
      size_t end = i + 1;
      while (end < limit && !ops[end].has_scratch && ops[end].uri == op->uri && ops[end].source == op->source) {
        ++end;
      }
      batch.clear();
      for (size_t k = i; k < end; ++k) batch.push_back({ops[k].offset, &ops[k].iov});
      struct Progress {
        const ReadOp* ops;
        Inflight* slot;
      } progress{op, &slot};
      st = op->source->ReadMany(
          *op->uri, batch.data(), batch.size(),
          [](void* context, size_t k) {
            auto* p = static_cast<Progress*>(context);
            NoteInflight(p->ops[k], *p->slot);
          },
          &progress);
      i = end;
    }
    slot.uri.store(nullptr, std::memory_order_release);
    if (!st.ok()) return st;  // the step is abandoned: skip the rest of the chunk
  }
  return Status::Ok();
}

void StepLoader::ReaderMain(Inflight& slot) {
  ApplyThreadSched(options_.reader_sched, "ml-read");  // before the name, which tests wait for
  ::pthread_setname_np(::pthread_self(), "ml-read");
  MutexLock lock(mu_);
  while (true) {
    while (!stop_ && queue_.empty()) work_.Wait(mu_);
    if (stop_) return;
    const Chunk chunk = queue_.front();
    queue_.pop_front();
    lock.Unlock();
    source::SetReadingStep(chunk.step);
    Status st = RunChunk(chunk.ops, chunk.count, slot);
    lock.Lock();
    Batch& batch = batches_[chunk.caller];
    if (!st.ok() && batch.first_error.ok()) batch.first_error = st;
    if (--batch.outstanding == 0) done_.NotifyAll();
  }
}

InflightRead StepLoader::OldestInflight() const {
  // A reader may move on between these loads; at worst the report mixes
  // two consecutive reads of one thread, which is fine for a watchdog.
  InflightRead out;
  const int64_t now = CoarseNowNs();
  for (const auto& slot : inflight_) {
    const std::string* uri = slot->uri.load(std::memory_order_acquire);
    if (!uri) continue;
    const double s = static_cast<double>(now - slot->start_ns.load(std::memory_order_relaxed)) / 1e9;
    if (s > out.seconds) {
      out = {*uri, slot->offset.load(std::memory_order_relaxed), slot->length.load(std::memory_order_relaxed), s};
    }
  }
  return out;
}

}  // namespace meshload::sidecar
