/// \file
/// PeerExchange: moves samples between the sidecars of a job over TCP
/// (Boost.Asio), for the plans whose transfers are not empty: the
/// `Broadcast` fan-out and `LoadAndReshard`. It is the transport a host
/// without GPUs uses (and `meshload run --local`); NCCL takes its place
/// between GPUs.
///
/// Connections: every sidecar listens on its peer port; a process that sends
/// to another (the planner's TransfersFrom) connects to it, so each
/// connection carries data one way, sender → receiver, and credits the
/// other way. HELLO names both processes and the job's fingerprint; a
/// receiver refuses a sender that runs another job (a clear error on both
/// sides).
///
/// Flow control is by credit, per step: a receiver that has a slot for step
/// t registers where each sender's samples go (Expect) and sends CREDIT(t);
/// a sender hands its part of step t over (Send) and the I/O thread writes
/// it once the receiver has credited t, straight from the sender's slot or
/// read buffer into the receiver's slot (a scatter read, no staging copy).
/// So a sender never runs more than a receiver's prefetch ahead, memory
/// stays bounded, and there is no cycle: a receiver's credit for t depends
/// only on its trainer having released t − prefetch.
///
/// Processes may move independently (a trainer that reconnects at another
/// step re-plans its sidecar from there). A receiver that re-plans from
/// step r sends RESET(r): senders drop what they still hold for earlier
/// steps. A credit for a step the sender's own pipeline will not stage (it
/// is behind the sender's re-plan point, or was already delivered and is
/// asked for again) is served on demand: the `serve` callback reads that
/// part again from storage on the exchange's own thread. Every part is a
/// pure function of the plan, so the bytes are the same either way.
///
/// A lost connection is not the end: a peer's sidecar may be restarted (the
/// kubelet restarts a crashed container; its trainer reconnects and it
/// re-plans from the trainer's step). When a connection breaks, goes silent
/// for `peer_timeout` (both sides send a heartbeat every `heartbeat`), or
/// the peer says goodbye, the parts under way on it go back to waiting, the
/// sender dials again, and the receiver accepts the sender's new HELLO (one
/// that arrives while the old connection still looks alive replaces it).
/// On the new connection the receiver sends RESET, says which steps it
/// already has from that sender (HAVE: a restarted sender starts again at
/// its trainer's step and must not wait for credits that will not come),
/// and credits again every part it still lacks; what the sender's pipeline
/// has passed is served on demand, so the bytes are the same as without the
/// restart.
///
/// Faults are reported, not hung on: a connection that cannot be made within
/// `connect_timeout`, a lost peer that is not back within
/// `reconnect_timeout`, a peer that refuses this one or breaks the protocol,
/// or a peer's data that does not match this process's plan (size or
/// sample-id checksum) fails the steps that involve that peer with an error
/// naming it and its address.
///
/// Thread safety: all public methods are thread-safe; Expect/Send/Wait/
/// Abandon of one step come from the one thread staging it.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "sidecar/exchange/parts.h"

namespace meshload::sidecar::exchange {

struct PeerAddress {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;
};

/// `HOST:PORT,HOST:PORT,...`, one per process in process order (IPv6 hosts
/// in brackets). Errors name the item.
Result<std::vector<PeerAddress>> ParsePeerList(std::string_view text);

struct ExchangeOptions {
  int64_t process = 0;
  /// Every process's peer address, by process index; this process's entry
  /// gives the port it listens on (unless listen_fd is set).
  std::vector<PeerAddress> peers;
  /// An already listening TCP socket to use (run --local passes one, so
  /// ports are never raced for); the exchange takes it over.
  int listen_fd = -1;
  std::string listen_address = "0.0.0.0";
  /// Both sides must agree (JobFingerprint).
  uint64_t fingerprint = 0;
  /// The job's shared peer secret (--peer-secret-file). Non-empty: a sender
  /// must prove it holds it before anything it sends counts (HMAC-SHA256
  /// over a fresh nonce of the receiver's), and the receiver proves it back
  /// before a sample goes out. Empty: connections are not authenticated.
  std::string secret;
  /// The first step this process stages (its first RESET).
  int64_t first_step = 0;
  std::chrono::milliseconds connect_timeout{120000};
  std::chrono::milliseconds peer_timeout{30000};
  /// How long a lost peer has to come back (0: a lost connection fails the
  /// steps that need it at once).
  std::chrono::milliseconds reconnect_timeout{120000};
  /// Where a process's sidecar is now (nullopt or an empty host: not known),
  /// asked on the I/O thread before each dial of a lost receiver: a pod
  /// that was replaced comes back with another IP (the sidecar reads the
  /// controller's assignments again). Unset: the address in `peers`.
  std::function<std::optional<PeerAddress>(int64_t process)> address_of;
  std::chrono::milliseconds heartbeat{1000};
  /// How long a step may wait on its peers before it is logged (once).
  std::chrono::milliseconds stall_report_after{5000};
  /// The clock the timeouts above are measured on (null: Clock::Real()).
  /// The I/O thread looks at them every `heartbeat` (and a dial every
  /// 200 ms) of real time; a test passes a SimulatedClock and advances it.
  Clock* clock = nullptr;
  /// Reads this process's part of `step` for `peer` into `out` (resized to
  /// its bytes) and sets its sample-id checksum: the on-demand path above.
  std::function<Status(int64_t step, int64_t peer, std::vector<uint8_t>& out, uint64_t& checksum)> serve;
};

class PeerExchange {
 public:
  /// Listens, then connects to every process in `send_to` in the background
  /// (retrying until connect_timeout). `receive_from` lists the processes
  /// allowed to connect.
  static Result<std::unique_ptr<PeerExchange>> Create(ExchangeOptions options, std::vector<int64_t> send_to,
                                                      std::vector<int64_t> receive_from);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  /// The port this process listens on.
  uint16_t port() const;

  /// One staging of one step; two may exist for a step across a re-plan.
  using Ticket = exchange::Ticket;
  Ticket Begin(int64_t step);
  /// Registers where the peers' parts of the step go (the memory must stay
  /// valid until Wait() or Abandon() returns) and credits them.
  Status Expect(Ticket t, std::vector<Part> incoming);
  /// Hands this process's parts of the step to the I/O thread; each is
  /// written when its receiver has credited the step (the memory must stay
  /// valid until Wait() or Abandon() returns).
  Status Send(Ticket t, std::vector<Part> outgoing);
  /// Waits until every part has arrived and been sent (or dropped because
  /// its receiver moved on). `cancelled` is polled: when it says so, Wait
  /// returns a kCancelled error. The ticket is closed on success; after an
  /// error call Abandon().
  Status Wait(Ticket t, const std::function<bool()>& cancelled);
  /// Closes the ticket: returns once no transfer touches its memory.
  void Abandon(Ticket t);
  /// This process now stages from `step` on (a re-plan): the stagings begun
  /// before no longer receive or send, and the senders are told. Call it
  /// before the new stagings begin.
  void Restart(int64_t step);

  ExchangeCounters counters() const;

 private:
  class Impl;
  explicit PeerExchange(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshload::sidecar::exchange
