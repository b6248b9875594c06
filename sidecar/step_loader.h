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
/// LoadAndReshard) need the inter-process transport, which the host-only
/// build does not have yet: Create() refuses them with an error saying so.
///
/// Thread safety: up to `callers` threads (StepLoaderOptions) may call Load()
/// at once, each with its own caller index, so several producers stage
/// consecutive steps in parallel; large steps are shared with the loader's
/// reader threads. Each caller's scratch (read ops, iovecs, pieces) is kept
/// between steps: a step allocates nothing once the first has been read.
/// VerifyFiles() is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "planner/shard_planner.h"
#include "sidecar/source/source.h"
#include "sidecar/staging/batch_layout.h"

namespace meshload::sidecar {

struct StepLoaderOptions {
  /// Threads reading a step, the caller of Load() included.
  int reader_threads = 4;
  /// How many threads may call Load() concurrently (caller indices
  /// 0..callers-1).
  int callers = 1;
  /// Coalesced ranges longer than this are split (at sample boundaries where
  /// possible) so that reader threads share a large contiguous read.
  uint64_t max_read_bytes = 8ull << 20;
  /// Steps smaller than this are read by the producer thread alone: waking
  /// reader threads costs more than the reads.
  uint64_t inline_step_bytes = 512ull << 10;
};

/// What one Load() did, for metrics.
struct StepLoadStats {
  uint64_t samples_read = 0;
  uint64_t bytes_read = 0;
  uint64_t read_ranges = 0;
  uint64_t bytes_copied = 0;  // replica copies and token fix-ups
};

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
  static Result<std::unique_ptr<StepLoader>> Create(const ShardPlanner& planner, int64_t process,
                                                    const Loading& loading,
                                                    source::SourceRegistry& sources,
                                                    const staging::BatchLayout& layout,
                                                    StepLoaderOptions options);
  ~StepLoader();
  StepLoader(const StepLoader&) = delete;
  StepLoader& operator=(const StepLoader&) = delete;

  /// Checks every dataset file against the index before the first batch:
  /// it exists, has the indexed size, and (Npy) the same header. A file that
  /// changed is an error naming it and what differs.
  Status VerifyFiles();

  /// Reads step `step` into `slot` (layout().slot_bytes bytes). On success,
  /// `checksums[i]` is SampleIdsChecksum of local device i's sample ids.
  /// Errors name the file and byte offset; the slot content is then
  /// undefined and must not be handed out.
  /// `caller` is this thread's index in 0..callers-1; two threads must not
  /// use the same index at once.
  Status Load(int64_t step, uint8_t* slot, std::vector<uint64_t>& checksums, StepLoadStats* stats,
              int caller = 0);

  /// The oldest storage read still in flight (none: seconds = 0).
  InflightRead OldestInflight() const;

  const staging::BatchLayout& layout() const { return layout_; }

 private:
  struct ReadOp {
    const std::string* uri = nullptr;  // into files_, stable for the loader's life
    uint64_t offset = 0;
    std::vector<iovec> iov;
    source::Source* source = nullptr;
    uint64_t length = 0;  // sum of the iovecs
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
  // `outstanding` chunks are done.
  struct Batch {
    size_t outstanding = 0;
    Status first_error;
  };
  struct Chunk {
    ReadOp* ops;
    size_t count;
    Batch* batch;
  };
  // What one caller of Load() keeps between steps.
  struct Caller {
    std::vector<ReadOp> ops;  // the first `used` are this step's; the rest keep their capacity
    size_t used = 0;
    std::vector<Fixup> fixups;
    std::vector<std::pair<size_t, size_t>> replica_copies;
    std::vector<Piece> pieces;
    std::vector<Extent> extents;
    std::vector<std::pair<uint64_t, uint8_t*>> dest_of;  // sample id -> slot address, sorted
    std::vector<Chunk> chunks;
    Inflight* inflight = nullptr;
    ReadOp& NewOp();
  };

  StepLoader(const ShardPlanner& planner, int64_t process, const Loading& loading,
             source::SourceRegistry& sources, const staging::BatchLayout& layout, StepLoaderOptions options);
  Status BuildOps(const StepPlan& plan, uint8_t* slot, Caller& c, StepLoadStats& stats);
  Status RunOps(Caller& c);
  Status RunChunk(ReadOp* ops, size_t count, Inflight& slot);
  void ReaderMain(Inflight& slot);

  const ShardPlanner& planner_;
  const int64_t process_;
  const Loading loading_;
  source::SourceRegistry& sources_;
  const staging::BatchLayout layout_;
  const StepLoaderOptions options_;
  std::vector<std::pair<source::Source*, std::string>> files_;  // per dataset file

  // Reader threads: a queue of chunks of the steps being read.
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::deque<Chunk> queue_;
  bool stop_ = false;
  // One per caller, then one per reader thread; fixed at Create().
  std::vector<std::unique_ptr<Inflight>> inflight_;
  std::vector<std::unique_ptr<Caller>> callers_;
  std::vector<std::thread> threads_;
};

}  // namespace meshload::sidecar
