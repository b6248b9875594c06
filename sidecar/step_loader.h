/// \file
/// StepLoader: reads one step's batch for one process straight into a slot.
///
/// For step t it takes the planner's reads for this process and turns each
/// coalesced byte range of a file into one scatter read (preadv-style) whose
/// iovecs point at the samples' final places in the slot, so local file
/// bytes land where the trainer sees them with no intermediate copy:
///
///   plan (samples, coalesced ranges) → pieces (file, offset, length, dest)
///   → sorted, grouped per range → iovecs (+ fix-ups) → reader threads
///
/// Two details keep "each file byte is read once":
///   - TokenStream neighbours overlap by one token: the shared token is read
///     into the first sample and copied into the second afterwards (a
///     fix-up of one token).
///   - GlobalLoad reads samples that no local device holds (its definition):
///     their bytes go to the reading thread's scratch buffer and are dropped.
/// Then local replicas (devices of this process holding the same shard) get
/// a copy of the shard (PerProcess, GlobalLoad), or read it themselves
/// (PerDevice: one loader per device).
///
/// Strategies whose plan moves samples between processes (Broadcast fan-out,
/// LoadAndReshard) go through a PeerExchange (StepLoaderOptions::peers):
///
///   Expect(the parts this process receives, into their slot places)
///   → read (samples no local device holds but a peer needs go to the
///     caller's outbox) → Send(the parts for each peer, from slot or
///     outbox) → Wait(all parts moved) → replica copies
///
/// so a received sample lands once in its primary device's place and is
/// copied to local replicas like a read one. Without peers, Create()
/// refuses such a plan with an error saying how to give them.
///
/// Thread safety: up to `callers` threads (StepLoaderOptions) may call Load()
/// at once, each with its own caller index, so several producers stage
/// consecutive steps in parallel; large steps are shared with the loader's
/// reader threads. Each caller's scratch (read ops, iovecs, pieces) is kept
/// between steps: a step allocates nothing once the first has been read.
/// VerifyFiles() is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/thread_sched.h"
#include "planner/format_driver.h"
#include "planner/shard_planner.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/source/source.h"
#include "sidecar/staging/batch_layout.h"

namespace meshload::sidecar {

struct StepLoaderOptions {
  /// Threads reading a step, the caller of Load() included.
  int reader_threads = 4;
  /// How many threads may call Load() concurrently (caller indices
  /// 0..callers-1).
  int callers = 1;
  /// The scheduling class the reader threads put themselves in.
  ThreadSched reader_sched = ThreadSched::kNormal;
  /// Coalesced ranges longer than this are split (at sample boundaries where
  /// possible) so that reader threads share a large contiguous read.
  uint64_t max_read_bytes = 8ull << 20;
  /// Steps smaller than this are read by the producer thread alone: waking
  /// reader threads costs more than the reads (local files only: a
  /// latency-bound source's reads always go to every reader thread).
  uint64_t inline_step_bytes = 512ull << 10;
  /// For a latency-bound (remote) source: ranges of one object whose gap
  /// costs less read (and dropped) than a second request, at the latency
  /// and bandwidth the source measured (Source::GapWorthReading), are read
  /// by one request; never across a gap longer than this. 0: only touching
  /// ranges are merged.
  uint64_t max_gap_bytes = 8ull << 20;
  /// Copy a shard to the local devices that replicate it inside the host
  /// slot. Off for GPU staging, where replicas get a device-to-device copy.
  bool host_replica_copies = true;
  /// The peer exchange for plans with transfers (its `process`,
  /// `fingerprint` and `serve` are filled in by Create()).
  std::optional<exchange::ExchangeOptions> peers;
};

/// What one Load() did, for metrics.
struct StepLoadStats {
  uint64_t samples_read = 0;
  uint64_t bytes_read = 0;
  uint64_t read_ranges = 0;
  uint64_t bytes_copied = 0;     // replica copies and token fix-ups
  uint64_t bytes_sent = 0;       // to other processes' sidecars
  uint64_t bytes_received = 0;   // from them
  double peer_wait_seconds = 0;  // waiting on peers after the reads were done
  uint64_t samples_skipped = 0;  // WebDataset, MDS: left out for a missing field (missingField: Skip)
};

/// Identifies a job's plan across processes: processes exchanging samples
/// must agree on it (the dataset's size and sample bytes, B, the mesh,
/// the strategy, and the global batches of two steps, which cover the seed).
uint64_t JobFingerprint(const planner::ShardPlanner& planner, const planner::Loading& loading);

/// Reports reads in flight for longer than a threshold (a stuck storage read
/// is visible within seconds, never silent).
struct InflightRead {
  std::string uri;
  uint64_t offset = 0;
  uint64_t length = 0;
  double seconds = 0;
};

class StepLoader {
 public:
  static Result<std::unique_ptr<StepLoader>> Create(const planner::ShardPlanner& planner, int64_t process,
                                                    const planner::Loading& loading, source::SourceRegistry& sources,
                                                    const staging::BatchLayout& layout, StepLoaderOptions options);
  ~StepLoader();
  StepLoader(const StepLoader&) = delete;
  StepLoader& operator=(const StepLoader&) = delete;

  /// Checks every dataset file against the index before the first batch:
  /// it exists, has the indexed size, and (Npy) the same header. A file that
  /// changed is an error naming it and what differs.
  Status VerifyFiles();

  /// Reads step `step` into `slot` (layout().slot_bytes bytes). On success,
  /// `staged[i]` holds SampleIdsChecksum of local device i's sample ids and
  /// the bytes of its samples (for a ragged layout, what its values take;
  /// the sample offsets are in the slot).
  /// Errors name the file and byte offset; the slot content is then
  /// undefined and must not be handed out.
  /// `caller` is this thread's index in 0..callers-1; two threads must not
  /// use the same index at once.
  /// `cancelled` is polled while waiting on peers: when it says so, Load
  /// returns a kCancelled error (the step was abandoned by a re-plan).
  Status Load(int64_t step, uint8_t* slot, std::vector<staging::StagedTensor>& staged, StepLoadStats* stats,
              int caller = 0, const std::function<bool()>& cancelled = {});

  /// Reads this process's part of `step` for `peer` alone (the exchange's
  /// on-demand path: a peer asks again for a step this process has passed).
  Status ServePart(int64_t step, int64_t peer, std::vector<uint8_t>& out, uint64_t& checksum);

  /// The peer exchange, or null when the plan moves nothing between processes.
  exchange::PeerExchange* peers() const { return exchange_.get(); }

  /// The oldest storage read still in flight (none: seconds = 0).
  InflightRead OldestInflight() const;

  const staging::BatchLayout& layout() const { return layout_; }

 private:
  struct ReadOp {
    const std::string* uri = nullptr;  // into files_, stable for the loader's life
    uint64_t offset = 0;
    std::vector<iovec> iov;
    source::Source* source = nullptr;
    uint64_t length = 0;       // sum of the iovecs
    bool has_scratch = false;  // some iovecs are dropped bytes (iov_base null until read)
  };
  // What each reading thread is doing, for OldestInflight(): written with
  // relaxed atomics by the reader (no lock per read), read by the watchdog.
  // Only stable data is published (no pointer into a step's scratch).
  struct Inflight {
    std::atomic<const std::string*> uri{nullptr};  // null: idle
    std::atomic<uint64_t> offset{0};
    std::atomic<uint64_t> length{0};
    std::atomic<int64_t> start_ns{0};
  };
  struct Fixup {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t len;
  };
  // One sample's bytes in one file, and where they go in the slot (nullptr:
  // dropped, a GlobalLoad sample no local device holds).
  struct Piece {
    uint32_t file;
    uint64_t offset;
    uint64_t length;
    uint8_t* dest;
  };
  // A step's reads shared with the reader threads: the caller waits until
  // `outstanding` chunks are done. One per caller, in batches_ (under mu_).
  struct Batch {
    size_t outstanding = 0;
    Status first_error;
  };
  struct Chunk {
    ReadOp* ops;
    size_t count;
    size_t caller;  // whose Batch it counts in (batches_)
    int64_t step;   // the step it reads for (source::SetReadingStep)
  };
  // What one caller of Load() keeps between steps, on that caller's thread
  // (the reader threads read its ops only through the Chunks of a step).
  struct Caller {
    size_t index = 0;         // in callers_ (and its Batch in batches_)
    int64_t step = -1;        // the step being loaded
    std::vector<ReadOp> ops;  // the first `used` are this step's; the rest keep their capacity
    size_t used = 0;
    std::vector<Fixup> fixups;
    // A sample a step holds at more than one place of this process (a
    // mixture's small dataset whose epoch ends inside the batch): read (or
    // received) into its last place, copied to the others once the step's
    // bytes are all there.
    std::vector<Fixup> duplicates;
    std::vector<uint64_t> duplicate_ids;  // the ids held at more than one place, ascending
    std::vector<uint64_t> written;        // duplicated ids given a writer (a read or a receive) this step
    std::vector<uint8_t> sink;            // receives of duplicated ids that have a writer already
    std::vector<std::pair<size_t, size_t>> replica_copies;
    std::vector<Piece> pieces;
    std::vector<planner::Extent> extents;
    std::vector<std::pair<uint64_t, uint8_t*>> dest_of;  // sample id -> slot address, sorted
    // Per local device: the byte offset of each of its samples in its
    // tensor (k × sample bytes, or the running sum of variable sizes), and
    // the total last.
    std::vector<std::vector<uint64_t>> places;
    std::vector<Chunk> chunks;
    // Samples read for peers only (no local device holds them).
    std::vector<uint8_t> outbox;
    std::vector<std::pair<uint64_t, uint8_t*>> outbox_of;  // sample id -> outbox address, sorted
    std::vector<exchange::Part> parts;
    // WebDataset, MDS: the samples' records, read whole before they are
    // decoded into the slot (layout record_room bytes per local device).
    std::vector<uint8_t> records;
    std::vector<bool> copied;  // per local device: a replica copied from its primary
    // Rows of tokens: one row's pieces, and where a document's last token
    // lands that must be the end-of-document token (append: Never).
    std::vector<planner::RowPiece> row_pieces;
    std::vector<std::pair<const uint8_t*, uint64_t>> eod_checks;
    Inflight* inflight = nullptr;
    // This step's: whether a source waits on the network (its reads then
    // go to every reader thread), and the longest gap a read bridges.
    bool latency_bound = false;
    uint64_t max_gap = 0;
    ReadOp& NewOp();
  };

  StepLoader(const planner::ShardPlanner& planner, int64_t process, const planner::Loading& loading,
             source::SourceRegistry& sources, const staging::BatchLayout& layout, StepLoaderOptions options);
  // Fills c.places for `plan`, and a ragged layout's sample offsets in `slot`.
  void PlaceSamples(const planner::StepPlan& plan, uint8_t* slot, Caller& c);
  // Where local device `device`'s samples are read to: its tensor in the
  // slot, or (WebDataset, MDS) its part of the caller's records.
  uint8_t* SamplesBase(Caller& c, uint8_t* slot, size_t device);
  // WebDataset, MDS: decodes each device's records into its fields in the
  // slot (the devices not `copied`), filling `staged`.
  Status Extract(const planner::StepPlan& plan, uint8_t* slot, Caller& c, std::vector<staging::StagedTensor>& staged,
                 const std::vector<bool>& copied, StepLoadStats& stats);
  Status BuildOps(const planner::StepPlan& plan, uint8_t* slot, Caller& c, StepLoadStats& stats);
  // Rows of tokens: the pieces of row `row` into c.pieces, its bytes going
  // to `dest` (null: dropped), and its end-of-document and pad tokens
  // written there now (they are no file's bytes).
  void AddRowPieces(uint64_t row, uint8_t* dest, Caller& c);
  // Packed rows: every local device's segment ids and positions (but the
  // replicas copied from their primary), from the plan alone.
  void WriteRowFields(const planner::StepPlan& plan, uint8_t* slot, Caller& c);
  // append: Never: every document end read this step is the token.
  Status CheckDocumentEnds(const Caller& c) const;
  // ServePart for rows of tokens.
  Status ServeRows(const std::vector<uint64_t>& ids, std::vector<uint8_t>& out);
  // The transfers of `plan` to or from this process as exchange parts whose
  // iovecs point at the samples' places (slot or outbox).
  Status BuildParts(const planner::StepPlan& plan, bool incoming, Caller& c, std::vector<exchange::Part>& parts);
  Status RunOps(Caller& c) MESHLOAD_EXCLUDES(mu_);
  Status RunChunk(ReadOp* ops, size_t count, Inflight& slot);
  void ReaderMain(Inflight& slot) MESHLOAD_EXCLUDES(mu_);

  const planner::ShardPlanner& planner_;
  const int64_t process_;
  const planner::Loading loading_;
  source::SourceRegistry& sources_;
  const staging::BatchLayout layout_;
  const StepLoaderOptions options_;
  std::vector<std::pair<source::Source*, std::string>> files_;  // per dataset file
  std::vector<source::Source*> distinct_sources_;               // of files_, each once
  std::unique_ptr<const planner::RecordDecoder> decoder_;       // record formats: their samples' decoder
  std::vector<std::string> file_names_;  // WebDataset, MDS: the files as messages name them  // a file's source is
                                         // (Source::LatencyBound): no inline steps

  // Reader threads: a queue of chunks of the steps being read.
  mutable Mutex mu_;
  CondVar work_;
  CondVar done_;
  std::deque<Chunk> queue_ MESHLOAD_GUARDED_BY(mu_);
  // One per caller (Caller::index): the step it shares with the reader
  // threads. Sized at construction.
  std::vector<Batch> batches_ MESHLOAD_GUARDED_BY(mu_);
  bool stop_ MESHLOAD_GUARDED_BY(mu_) = false;
  // One per caller, then one per reader thread; filled in Create() (the
  // reader threads started there never read these vectors, only their own
  // Inflight), read-only after: no lock.
  std::vector<std::unique_ptr<Inflight>> inflight_;
  std::vector<std::unique_ptr<Caller>> callers_;
  std::vector<std::thread> threads_;
  // Last: destroyed first, since its serving thread calls ServePart().
  std::unique_ptr<exchange::PeerExchange> exchange_;
};

}  // namespace meshload::sidecar
