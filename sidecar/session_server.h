/// \file
/// SessionServer: the sidecar's trainer side, the server loop that
/// Sidecar::Run() runs on the caller's thread (see sidecar/sidecar.h):
///   - accepts trainers on the Unix socket and checks their peer
///     credentials (uid), one trainer at a time;
///   - the handshake: CLIENT_HELLO (in hello_timeout), SERVER_HELLO with the
///     pool's memory (memfd, CUDA VMM fds or IPC handles); a hello for a
///     step the pipeline does not start at makes the Sidecar re-plan
///     (Hooks::start_at);
///   - READY for consecutive staged steps, each a lease of a slot, at most
///     max_leases_ unanswered; sent by the server thread or straight from a
///     producer that has just staged a step (DeliverReady);
///   - RELEASE and BYE; a trainer that dies has its leases reclaimed, one
///     that leaves (BYE) or is dropped keeps those of the batches it still
///     holds until they are released on the old connection or it closes;
///   - refused and former connections drain before they are closed, so the
///     last ERROR is read, not lost to a reset;
///   - the end: on stop the pool stops staging, the socket goes, the trainer
///     is told, and connections being closed get a moment to read it.
/// Protocol: docs/protocol.md. Life of a batch: docs/life-of-a-batch.md.
///
/// The staging pipeline (producers, re-plans, the failure status) stays the
/// Sidecar's; the server reaches it through Hooks.
///
/// Why one server and not a class per trainer session: a trainer's state is
/// not its own. READYs go out from producer threads to whichever trainer is
/// connected, under a mutex shared with the server (client_mu_, with the
/// try_lock hand-off of DeliverReady), and one connection's leases move from
/// the connected trainer (Client) to the list of closing connections
/// (Closing) when it goes away, where RELEASEs are still taken.
///
/// Locking (which mutex guards what; the annotations let clang's
/// -Wthread-safety check it):
///   - client_mu_ guards client_ (the pointer) and the Client it points to
///     (leased, next_to_send). client_ is set and reset by the server thread
///     only, under client_mu_; the server thread reads it through
///     ServerClient() (under the lock) and then, without the lock, the
///     fields of the Client that only it writes (fd, pid, uid): the Client
///     stays until the server thread itself resets client_. The producers
///     read client_ (and send READY) under client_mu_, taken with TryLock
///     (DeliverReady); every other holder uses ClientLock.
///     Client::broken is atomic: a producer sets it, the server drops the
///     trainer.
///   - ready_pending_ is atomic: a READY may be due; whoever holds
///     client_mu_ sends it (ClientLock checks it after letting go).
///   - pending_, closing_, failure_reported_, fatal_message_ and
///     reported_blocked_: the server thread only, no lock (the watchdog reads
///     closing_ under ClientLock, on the server thread).
///   - listen_fd_ and max_leases_: set at start-up (Listen, ChooseMaxLeases)
///     before any producer starts; then listen_fd_ is the server thread's,
///     max_leases_ read-only.
///   - consumed_ (thread-safe itself) and delivered_step_ (atomic): read by
///     /progress from any thread.
///   - The producers' state (generation, target step, the failure status)
///     is the Sidecar's, under its producer_mu_: reached only through Hooks.
///   - The slot pool, the metrics and the progress watermark are
///     thread-safe themselves.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/thread_sched.h"
#include "common/unique_fd.h"
#include "planner/shard_planner.h"
#include "protocol/protocol.h"
#include "sidecar/progress.h"
#include "sidecar/sidecar_metrics.h"
#include "sidecar/staging/batch_layout.h"
#include "sidecar/staging/device_memory.h"
#include "sidecar/staging/host_memory.h"
#include "sidecar/staging/slot_pool.h"

namespace meshload::sidecar {

class SessionServer {
 public:
  /// What the server asks of the Sidecar's staging pipeline.
  struct Hooks {
    /// A trainer starts at `step` (called on its hello, before it becomes
    /// the connected trainer): the pipeline must serve `step` next,
    /// re-planning unless it already starts there.
    std::function<void(int64_t step)> start_at;
    /// Staging failed for good: makes /healthz fail and returns the error
    /// every trainer is told (ERROR kDataError).
    std::function<std::string()> failure;
    /// Called from the server loop about every 500 ms.
    std::function<void()> watchdog;
  };
  /// The server's own settings (the sidecar's flags of the same names).
  struct Options {
    std::string socket_path;  // where the trainer connects
    mode_t socket_mode = 0660;
    /// The uids allowed to connect (the sidecar fills in its own when none
    /// is given).
    std::vector<uid_t> allowed_uids;
    /// How long a connected client has to send CLIENT_HELLO.
    std::chrono::milliseconds hello_timeout{5000};
    int64_t process = -1;  // this sidecar's process, in SERVER_HELLO
    ThreadSched thread_sched = ThreadSched::kBatch;
  };
  /// What the server works with; all of it outlives the server.
  struct Context {
    Options options;
    SidecarMetrics* metrics = nullptr;
    const planner::ResolvedJob* job = nullptr;
    std::string job_name;
    const staging::BatchLayout* layout = nullptr;
    const staging::HostSlotMemory* memory = nullptr;
    const staging::DeviceSlotMemory* device = nullptr;  // GPU staging; null: host staging
    staging::SlotPool* pool = nullptr;
    /// Per slot, written by the producer before MarkReady.
    const std::vector<std::vector<staging::StagedTensor>>* slot_staged = nullptr;
    int64_t start_step = 0;  // --start-step or spec.resume.step: what want_step -1 means
    int wake_fd = -1;        // eventfd: producer -> server wake-ups, and RequestStop()
    std::atomic<bool>* stop = nullptr;
    std::atomic<bool>* failed = nullptr;  // staging failed (or poll did): Run() reports it
    Hooks hooks;
    /// What the hello timeout, a refused connection's drain (1 s) and the
    /// watchdog (500 ms) are measured on; null: Clock::Real(). The loop
    /// looks at least every 250 ms of real time and on every wake-up.
    Clock* clock = nullptr;
  };

  explicit SessionServer(Context context);
  ~SessionServer();
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  /// Start-up: listens on options.socket_path.
  Status Listen();
  /// Start-up, before the producers: how many READYs a trainer may have
  /// unanswered (max_leases_); logged when fewer than the slots.
  void ChooseMaxLeases();

  /// The server loop, until *stop. Then no producer stages any more, the
  /// socket file is removed, the trainer gets ERROR kShuttingDown, and
  /// connections being closed get at most 300 ms to read what was sent.
  void Run() MESHLOAD_EXCLUDES(client_mu_);

  /// Sends the READYs now due without waiting for client_mu_: a producer
  /// calls it right after staging a step (no hop through the server
  /// thread). Any thread.
  void DeliverReady() MESHLOAD_EXCLUDES(client_mu_);

  /// The watchdog (server thread): while the producers have waited for a
  /// free slot longer than `limit` seconds with a trainer connected, says
  /// once that the trainer holds every slot.
  void CheckTrainerHoldsSlots(double blocked, double limit) MESHLOAD_EXCLUDES(client_mu_);

  /// Removes the socket file if the server still listens (the Sidecar's
  /// destructor, after a start-up that failed or without Run()).
  void RemoveSocketFile();

  /// Progress (GET /progress), any thread: the consumed watermark, moved by
  /// RELEASEs and reset where a trainer starts; the last step handed over.
  int64_t consumed_step() const { return consumed_.step(); }
  int64_t delivered_step() const { return delivered_step_.load(); }

 private:
  using LeaseList = std::vector<std::pair<uint32_t, int64_t>>;

  // A trainer's connection: the connected trainer (client_) or one not yet
  // through its hello (pending_).
  struct Client {
    UniqueFd fd;
    pid_t pid = 0;
    uid_t uid = 0;
    Clock::time_point connected_at;  // for the hello timeout
    int64_t next_to_send = 0;
    // The leases of this connection, (slot, step), in the order lent: a
    // RELEASE must name one of them (not a lease another connection keeps).
    std::vector<std::pair<uint32_t, int64_t>> leased;
    std::atomic<bool> broken{false};  // a send failed; the server thread drops it
  };

  // Connections being closed. Refused ones: their ERROR is sent, but
  // closing at once with the trainer's hello unread would reset the
  // connection and lose the ERROR; they are drained and closed on EOF or
  // after a second. A trainer's former connection may also hold leases
  // (batches it still uses after a BYE, or after the sidecar dropped it):
  // those stay lent until a RELEASE on it, a BYE on it that does not list
  // them, or its EOF, with no deadline while any is left.
  struct Closing {
    UniqueFd fd;
    Clock::time_point deadline;
    LeaseList leases;
    pid_t pid = 0;
  };

  // client_mu_, held; letting go delivers READYs left pending meanwhile.
  class MESHLOAD_SCOPED_CAPABILITY ClientLock {
   public:
    explicit ClientLock(SessionServer& s) MESHLOAD_ACQUIRE(s.client_mu_);
    ~ClientLock() MESHLOAD_RELEASE();
    ClientLock(const ClientLock&) = delete;
    ClientLock& operator=(const ClientLock&) = delete;
    void Unlock() MESHLOAD_RELEASE();

   private:
    SessionServer& s_;
    bool held_ = true;
  };

  void Notify();
  void AcceptClient();
  // The pending connection's first message: CLIENT_HELLO, or it is refused.
  void ServePending() MESHLOAD_EXCLUDES(client_mu_);
  void OnHello(const protocol::ClientHello& hello) MESHLOAD_EXCLUDES(client_mu_);
  void ServeClientMessage() MESHLOAD_EXCLUDES(client_mu_);
  // Leases and sends READY for every staged step the trainer is due; the
  // producer calls it right after staging (through DeliverReady), the
  // server after RELEASE and hello.
  void SendReadyBatchesLocked() MESHLOAD_REQUIRES(client_mu_);
  // Ends the connection of the trainer. With `keep_leases` (the sidecar
  // drops a trainer that may still hold batches: after an ERROR, or a BYE
  // listing them), the connection's leases in `keep` (all of them when
  // null) stay lent until released on it or until it closes; the others are
  // taken back at once.
  void DropClient(const std::string& why, bool keep_leases = false, const LeaseList* keep = nullptr)
      MESHLOAD_EXCLUDES(client_mu_);
  void CloseLater(UniqueFd fd, LeaseList leases = {}, pid_t pid = 0);
  void ServeClosing(const ::pollfd* fds, size_t count);
  // Reads what a closing connection sent; false once it is closed (EOF or error).
  bool ServeClosingMessages(Closing& c);
  // Takes back the leases of a closing connection (those in `only`, when
  // given): it closed, or said (BYE) it does not hold them.
  void ReclaimClosing(Closing& c, const char* why, const LeaseList* only = nullptr);
  // A RELEASE of `step` after a wait of `wait_ns`: counted, and the watermark moves.
  void Consumed(int64_t step, uint64_t wait_ns);
  // Where local device i's tensor of field f starts: in the host slot, or
  // at the start of its own device allocation. A device allocation holds
  // the device's region (each field's tensor, a ragged one's offsets
  // first); the host pool the whole slot.
  uint64_t TensorOffset(size_t i, size_t f) const {
    return layout_.devices[i].fields[f].offset - (device_ ? layout_.devices[i].region_offset : 0);
  }
  // Device i's ragged offsets of field f as the protocol describes them
  // (none: dense), for `samples` samples.
  std::optional<protocol::RaggedInfo> Ragged(size_t i, size_t f, uint64_t samples) const {
    if (!layout_.fields[f].ragged) return std::nullopt;
    return protocol::RaggedInfo{
        layout_.devices[i].fields[f].offsets_offset - (device_ ? layout_.devices[i].region_offset : 0), samples};
  }
  // The connected trainer (null: none), for the server thread: client_ is
  // read under client_mu_ (a ClientLock held for the read: a few times per
  // wake-up of the server loop; a producer finding it held leaves its READY
  // to the holder). The Client stays valid until the server thread resets
  // client_; of it, the server thread reads without the lock only what no
  // other thread writes (fd, pid, uid; broken is atomic). leased and
  // next_to_send need client_mu_: use client_ under it.
  Client* ServerClient() MESHLOAD_EXCLUDES(client_mu_);

  // What the server works with (Context), fixed at construction.
  const Options options_;
  Clock* const clock_;
  SidecarMetrics* const metrics_;
  const planner::ResolvedJob& job_;
  const std::string job_name_;
  const staging::BatchLayout& layout_;
  const staging::HostSlotMemory* const memory_;
  const staging::DeviceSlotMemory* const device_;  // GPU staging; null: host staging
  staging::SlotPool* const pool_;
  const std::vector<std::vector<staging::StagedTensor>>& slot_staged_;
  const int64_t start_step_;
  const int wake_fd_;
  std::atomic<bool>& stop_;
  std::atomic<bool>& failed_;
  const Hooks hooks_;

  UniqueFd listen_fd_;
  uint32_t max_leases_ = 1;  // READYs a trainer may have unanswered (ChooseMaxLeases)

  // See the file comment for what each of these is guarded by.
  Mutex client_mu_;
  // Written under client_mu_ by the server thread only (see ServerClient()).
  std::unique_ptr<Client> client_ MESHLOAD_GUARDED_BY(client_mu_) MESHLOAD_PT_GUARDED_BY(client_mu_);
  std::unique_ptr<Client> pending_;         // connected, no CLIENT_HELLO yet; server thread only
  std::atomic<bool> ready_pending_{false};  // a READY may be due; whoever holds client_mu_ sends it
  std::vector<Closing> closing_;            // server thread only
  bool failure_reported_ = false;           // server thread only
  std::string fatal_message_;               // server thread only
  bool reported_blocked_ = false;           // server thread only (the watchdog)

  ConsumedWatermark consumed_;
  std::atomic<int64_t> delivered_step_{-1};
};

}  // namespace meshload::sidecar
