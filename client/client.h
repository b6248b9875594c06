/// \file
/// The trainer-side client: connects to the sidecar's Unix socket, maps the
/// slot pool once, and turns each READY into a Batch of zero-copy tensors.
///
///   auto client = Client::Connect({.socket_path = "/run/meshload/sidecar.sock"});
///   while (true) {
///     Result<Batch> b = (*client)->Next();   // blocks until staged
///     ... use b->tensors[i].data ...         // one tensor per local device
///   }                                        // the slot goes back when the
///                                            // Batch (and every copy of its
///                                            // lease) is gone
///
/// A Batch owns a shared Lease; the slot is released (RELEASE sent) when the
/// last reference dies, from whatever thread that happens on (Python's
/// garbage collector, a framework's DLPack deleter). The mapping a tensor
/// points into stays mapped while its lease lives, even across reconnects,
/// so reading it never faults, and its bytes never change: when the client
/// leaves a connection (Close(), a reconnect, an error) it tells the sidecar
/// which batches it still holds (BYE), the sidecar keeps those slots lent,
/// and their RELEASEs still go on the old connection, which stays open
/// until the last of them. (A restarted sidecar has a new pool; nobody
/// writes the old one any more. With legacy CUDA IPC staging, batches held
/// across a sidecar restart point at memory the dead sidecar freed.) Held batches keep their slots, so holding
/// many across a reconnect leaves fewer to stage into, as it always does.
///
/// When the sidecar goes away (a crash, or a stop announced with ERROR
/// "shutting down"), Next() reconnects with bounded exponential backoff and
/// resumes at the next step it has not returned; the sidecar re-plans from
/// there, so the bytes are identical.
/// After the last attempt Next() returns kUnavailable naming the socket.
///
/// GPU staging: when the sidecar stages in GPU memory, each (device, slot)
/// allocation is imported once per connection (VMM file descriptors, or
/// legacy IPC handles) for this process's device with the same UUID, and
/// tensors are device addresses (device_type 2, device_id this process's
/// ordinal). A sidecar GPU this process cannot see is an error listing both
/// sides' UUIDs. The sidecar fences its copies before READY, so the data is
/// there when Next() returns.
///
/// Everything the sidecar sends is checked before it is trusted: a tensor
/// outside its slot, a slot outside the pool, a step out of order are
/// protocol errors, never out-of-bounds reads. After one, Next() leaves the
/// connection (the sidecar takes back the slots of batches not handed out)
/// and the next call reconnects at the step it has not returned.
///
/// Reconnecting keeps its schedule across calls: the first attempt is made
/// at once, later ones after a backoff counted from the previous failure,
/// and a call that returns early (its timeout, a signal) leaves the attempt
/// count, the next attempt's time and a handshake in progress to the next
/// call. So next(timeout=0) polling, or a profiler's signals every few
/// milliseconds, still reconnect, and still give up after the last attempt.
///
/// Signals: a signal with a handler interrupts Next() with kCancelled
/// wherever it waits (for a batch, between reconnect attempts, or for
/// SERVER_HELLO); calling it again goes on where it was.
///
/// Thread safety: Next() and Close() from one thread at a time; Interrupt()
/// and Lease release from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/driver.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"

namespace meshload::client {

/// The environment variable that names the sidecar's socket in a trainer
/// container (the sidecar-injection webhook sets it).
inline constexpr char kSocketEnv[] = "MESHLOAD_SOCKET";

struct ClientOptions {
  /// The sidecar's socket; empty: $MESHLOAD_SOCKET.
  std::string socket_path;
  /// The first step wanted; unset: the sidecar's start step.
  std::optional<int64_t> start_step;
  /// Retries after a failed connection attempt (the first attempt is
  /// made at once; 0: that one only).
  int max_reconnect_attempts = 8;
  std::chrono::milliseconds reconnect_backoff_initial{50};
  std::chrono::milliseconds reconnect_backoff_max{2000};
};

class Connection;
class Mapping;

/// A slot lent to the trainer. Destroying the last reference releases it.
class Lease {
 public:
  Lease(std::shared_ptr<Connection> conn, std::shared_ptr<Mapping> mapping, uint32_t slot, int64_t step,
        uint64_t wait_ns);
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  uint32_t slot() const { return slot_; }
  int64_t step() const { return step_; }
  /// GPU batches: a stream of the trainer's (a CUstream, or 1/2 for the
  /// legacy/per-thread default stream) that reads this batch. When the lease
  /// dies an event is recorded on each such stream, and the slot is released
  /// (by the connection's release thread) only once they have passed.
  void AddConsumerStream(int ordinal, uintptr_t stream) MESHLOAD_EXCLUDES(mu_);

 private:
  // AddConsumerStream() may run on several threads at once (one per DLPack
  // export); the destructor, the last reference, reads the streams alone.
  Mutex mu_;
  std::vector<std::pair<int, uintptr_t>> consumer_streams_ MESHLOAD_GUARDED_BY(mu_);
  // Set by the constructor and read-only after (the destructor moves
  // mapping_ out).
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<Mapping> mapping_;
  uint32_t slot_;
  int64_t step_;
  uint64_t wait_ns_;
};

struct Tensor {
  void* data = nullptr;
  uint8_t dtype_code = 0;  // DLPack
  uint8_t dtype_bits = 0;
  std::vector<int64_t> shape;    // ragged: [elements of all samples]
  std::vector<int64_t> strides;  // in elements
  uint64_t nbytes = 0;
  /// A ragged tensor (variable-size samples): `data` holds the samples'
  /// elements back to back (the values), and `offsets` (in the same memory:
  /// a device address when device_type is CUDA) holds samples + 1 int64
  /// offsets in elements: sample k is values[offsets[k], offsets[k+1]).
  /// Null for a dense tensor.
  const int64_t* offsets = nullptr;
  uint64_t samples = 0;
  int32_t device_type = 1;  // DLPack: 1 = CPU, 2 = CUDA (data is then a device address)
  int32_t device_id = 0;
  int64_t global_device = 0;  // device number in the mesh
  uint64_t ids_checksum = 0;  // SampleIdsChecksum of its sample ids (planned: skipped samples included)
  std::string field;          // its field (hello().fields): "" for the formats whose sample is one tensor
};

struct Batch {
  int64_t step = 0;
  /// One per (local device, field), device-major: the job's device order,
  /// and within a device the fields in hello().fields order (one unnamed
  /// field except for WebDataset, MDS and TFRecord jobs).
  std::vector<Tensor> tensors;
  std::shared_ptr<Lease> lease;
  double wait_seconds = 0;  // how long Next() blocked for it
};

class Client {
 public:
  /// Connects and completes the handshake (retrying like a reconnect while
  /// the sidecar is not up yet). A signal returns kCancelled.
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);
  /// A client not connected yet: the first Next() (or EnsureConnected())
  /// connects, with the same schedule.
  static Result<std::unique_ptr<Client>> Create(ClientOptions options);
  /// Connects if not connected, retrying on the reconnect schedule, by
  /// `timeout` if given (kDeadlineExceeded: the next call goes on). A
  /// signal returns kCancelled; the next call goes on where it was.
  Status EnsureConnected(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  ~Client();

  /// The next step's batch. Blocks until it is staged, or until `timeout`
  /// (kDeadlineExceeded, also while reconnecting to a sidecar that is
  /// restarting: the next call goes on reconnecting), or a signal interrupts
  /// the wait (kCancelled; call again to go on). kUnavailable when the
  /// sidecar is gone for good; kDataLoss/kFailedPrecondition for errors the
  /// sidecar reported.
  Result<Batch> Next(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  /// Leaves the connection (BYE with the leases still alive, which keep
  /// their slots and bytes until they die and are released on it).
  void Close();

  /// From any thread: the Next() (or EnsureConnected()) waiting in another
  /// thread, and every later one, returns kFailedPrecondition ("closed") at
  /// once. For closing a client that another thread is reading: Interrupt(),
  /// then Close() once that thread has returned.
  void Interrupt();

  const protocol::ServerHello& hello() const { return hello_; }
  /// Handshakes completed so far (connections made): hello() changes only
  /// when this does.
  uint64_t handshakes() const { return handshakes_; }
  /// The step the next call of Next() returns.
  int64_t next_step() const { return next_step_; }
  /// Times the client had to reconnect.
  int reconnects() const { return reconnects_; }
  /// GPU slot allocations imported and mapped so far, over every connection
  /// (devices × slots at each connect; never per batch). 0 for host pools.
  int64_t gpu_imports() const { return gpu_imports_; }

 private:
  explicit Client(ClientOptions options);
  // One attempt: connect and send CLIENT_HELLO (unless a handshake for
  // `want_step` is already in progress), then wait for SERVER_HELLO until 5 s
  // after the hello was sent. kDeadlineExceeded when `deadline` comes first
  // and kCancelled on a signal: the handshake stays in progress for the next
  // attempt.
  Status ConnectOnce(int64_t want_step, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  // Waits until `fd` (if >= 0) is readable or `until` (if set) passes: 1
  // readable, 0 timed out, -1 interrupted by a signal, -2 Interrupt() was
  // called, or an errno-style error below -2 (-2 - errno).
  int Wait(int fd, std::optional<std::chrono::steady_clock::time_point> until);
  Status Closed() const;
  // kDeadlineExceeded once `deadline` passes (the connection stays closed;
  // the next Next() reconnects again).
  Status Reconnect(const Status& why, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  Result<Batch> MakeBatch(const protocol::Ready& ready, uint64_t wait_ns);
  // A message the client cannot accept: leaves the connection (BYE: the
  // sidecar takes back the slots of batches not handed out) and returns `st`.
  Status ProtocolError(const Status& st);
  Status Interrupted() const;

  ClientOptions options_;
  UniqueFd wake_fd_;  // eventfd: Interrupt() makes it readable
  std::atomic<bool> interrupted_{false};
  // A handshake sent and not answered yet (kept across calls).
  struct Handshake {
    UniqueFd fd;
    int64_t want_step = -1;
    std::chrono::steady_clock::time_point sent;
  };
  std::optional<Handshake> handshake_;
  // While not connected: the reconnect schedule (kept across calls).
  struct Outage {
    Status why;   // what ended the connection
    Status last;  // the last attempt's error
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point next_try;
    int attempts = 0;  // failed attempts so far
  };
  std::optional<Outage> outage_;
  uint64_t rng_state_ = 0;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<Mapping> mapping_;
  protocol::ServerHello hello_;
  int64_t next_step_ = -1;
  int reconnects_ = 0;
  uint64_t handshakes_ = 0;
  int64_t gpu_imports_ = 0;
};

}  // namespace meshload::client
