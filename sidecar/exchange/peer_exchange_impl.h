/// \file
/// PeerExchange::Impl, the exchange's machinery behind peer_exchange.h.
/// Internal: included by the exchange's own files only, never installed.
///
/// Where things are:
///   - peer_exchange.cc: Start/stop, and the staging threads' calls (Begin,
///     Expect, Send, Wait, Abandon, Restart).
///   - connection.cc: connection life on the I/O thread: accept, HELLO and
///     authentication on both sides, admit, connect and retry, lose, fail,
///     close, heartbeats, reading frames and the write queue.
///   - transfers.cc: credit flow and data: CREDIT/RESET/HAVE, DATA in and
///     out, parts served again on demand (the serving thread).
///   - wire_format.h (frames), handshake.h (MACs, HELLO checks),
///     step_table.h (per-step bookkeeping).
///
/// Threads: the staging threads call the public methods; one I/O thread
/// (`ml-peers`) runs io_ and every handler; one serving thread
/// (`ml-peer-serve`) reads parts again on demand. mu_ guards the step table,
/// each connection's ConnShared, the serve queue and the counters (all
/// annotated for clang's -Wthread-safety); the rest of a Conn is the I/O
/// thread's, but for its address (addr_mu).
#pragma once

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sidecar/exchange/handshake.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/exchange/step_table.h"
#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange {

// For the exchange's own files, the only ones that include this header.
namespace asio = boost::asio;

namespace internal {
inline constexpr size_t kSentMemory = 1 << 16;  // steps remembered per receiver, to refuse a second credit
// Connections accepted that have not said HELLO (or authenticated) yet.
inline constexpr size_t kMaxPending = 64;
}  // namespace internal

class PeerExchange::Impl {
 public:
  using Ticket = PeerExchange::Ticket;
  using Clock = std::chrono::steady_clock;
  using tcp = asio::ip::tcp;
  using Header = internal::Header;
  using Type = internal::Type;
  using PartStatus = internal::PartStatus;
  using PartState = internal::PartState;
  using StepState = internal::StepState;

  struct WriteItem {
    Header h;
    std::vector<asio::const_buffer> payload;
    std::string text;
    std::function<void(bool)> done;
  };
  // One connection, to a receiver (outbound) or from a sender. What mu_
  // guards of it is in its ConnShared (shared_[index]): a member of Conn
  // could not name the Impl's mu_ in MESHLOAD_GUARDED_BY.
  struct Conn {
    int64_t peer = 0;
    bool outbound = false;  // this process sends data on it
    size_t index = 0;       // its ConnShared in shared_
    // peer, outbound and index are fixed in Start(), read anywhere.
    // Written under addr_mu by the I/O thread only (a peer found at a new
    // address; Start() sets it before the I/O thread runs), read through
    // Name() and Addr().
    mutable Mutex addr_mu;
    PeerAddress addr MESHLOAD_GUARDED_BY(addr_mu);
    // I/O thread only.
    // Bumped whenever the socket is replaced or dropped: a handler of an
    // older socket finds it changed and does nothing.
    uint64_t gen = 0;
    bool connected_once = false;
    bool lost = false;  // lost and waiting for the peer to come back (since lost_at)
    Clock::time_point lost_at;
    std::string lost_why;
    std::unique_ptr<tcp::socket> sock;
    std::unique_ptr<asio::steady_timer> retry;
    std::unique_ptr<tcp::resolver> resolver;
    Clock::time_point deadline;          // outbound: give up connecting (Retry fails past it)
    Clock::time_point attempt_deadline;  // outbound: give up this dial and handshake, and dial again
    Clock::time_point dead_at;           // when Fail() ran
    Clock::time_point last_rx;
    Header rx;
    std::vector<uint8_t> scratch;
    std::deque<WriteItem> wq;
    bool writing = false;
    bool dead = false;  // Fail() ran (for good); close once the queue is written
    std::string Name() const MESHLOAD_EXCLUDES(addr_mu) {
      MutexLock lock(addr_mu);
      return "process " + std::to_string(peer) + " (" + addr.ToString() + ")";
    }
    // A copy, under addr_mu (the I/O thread dials it: once per attempt).
    PeerAddress Addr() const MESHLOAD_EXCLUDES(addr_mu) {
      MutexLock lock(addr_mu);
      return addr;
    }
  };
  // What mu_ guards of a connection (Shared(c)), with the step table it is
  // read and changed with.
  struct ConnShared {
    bool ready = false;
    std::string failed;
    std::set<int64_t> credited;        // outbound
    int64_t floor = INT64_MIN;         // outbound: the receiver's RESET
    std::set<int64_t> sent;            // outbound: recently sent steps
    std::set<int64_t> again;           // outbound: credited again after being sent
    int64_t have_through = INT64_MIN;  // outbound: the receiver has every step in [floor, have_through]
    std::set<int64_t> have;            // outbound: and these
    std::deque<int64_t> sent_order;
  };
  // An accepted connection before its HELLO (and authentication) is through.
  struct Pending {
    tcp::socket sock;
    Header rx;
    Header hello;
    internal::Nonce nonce{};       // sent in CHALLENGE
    internal::AuthPayload auth{};  // AUTH's payload
    Clock::time_point deadline;
    explicit Pending(tcp::socket s) : sock(std::move(s)) {}
  };

  explicit Impl(ExchangeOptions o);
  ~Impl();

  Status Start(const std::vector<int64_t>& send_to, const std::vector<int64_t>& receive_from);
  uint16_t port() const { return port_; }

  // ---- called by staging threads (peer_exchange.cc) ----

  Ticket Begin(int64_t step) MESHLOAD_EXCLUDES(mu_);
  Status Expect(Ticket t, std::vector<Part> incoming) MESHLOAD_EXCLUDES(mu_);
  Status Send(Ticket t, std::vector<Part> outgoing) MESHLOAD_EXCLUDES(mu_);
  Status Wait(Ticket t, const std::function<bool()>& cancelled) MESHLOAD_EXCLUDES(mu_);
  void Abandon(Ticket t) MESHLOAD_EXCLUDES(mu_);
  void Restart(int64_t step) MESHLOAD_EXCLUDES(mu_);
  ExchangeCounters counters() const MESHLOAD_EXCLUDES(mu_);

 private:
  // ---- the I/O thread: connection life (connection.cc) ----

  // Accepting, and the receiver's side of the handshake.
  void StartAccept();
  void Refuse(const std::shared_ptr<Pending>& p, const std::string& why);
  void Forget(const std::shared_ptr<Pending>& p);
  void OnHello(const std::shared_ptr<Pending>& p, boost::system::error_code ec);
  void Admit(const std::shared_ptr<Pending>& p) MESHLOAD_EXCLUDES(mu_);
  // Dialling, and the sender's side of the handshake.
  void Connect(Conn& c);
  void Authenticate(Conn& c, uint64_t g);
  void OnHelloOk(Conn& c, uint64_t g, std::shared_ptr<internal::Nonce> nonce);
  void Sending(Conn& c);
  void Retry(Conn& c, const std::string& why);
  // Up, down, and gone for good.
  void MarkConnected(Conn& c, const char* direction) MESHLOAD_EXCLUDES(mu_);
  // Runs the queued writes' callbacks, which may take mu_.
  void DropSocket(Conn& c) MESHLOAD_EXCLUDES(mu_);
  void Lose(Conn& c, const std::string& why) MESHLOAD_EXCLUDES(mu_);
  void Fail(Conn& c, const std::string& why, bool quiet = false) MESHLOAD_EXCLUDES(mu_);
  void Close(Conn& c);
  void Heartbeat();
  // Frames in and out.
  void ReadFrame(Conn& c);
  void OnFrame(Conn& c);
  // May run `w.done`, which may take mu_.
  void Queue(Conn& c, WriteItem w) MESHLOAD_EXCLUDES(mu_);
  void WriteNext(Conn& c);
  void SendError(Conn& c, const std::string& why);

  // ---- credit flow and data (transfers.cc) ----

  void SayWhatIsHad(Conn& c) MESHLOAD_EXCLUDES(mu_);
  void OnCreditFrame(Conn& c, Type t, const Header& h) MESHLOAD_EXCLUDES(mu_);
  void OnData(Conn& c, const Header& h) MESHLOAD_EXCLUDES(mu_);
  void Discard(Conn& c, uint64_t remaining);
  void SendCredits() MESHLOAD_EXCLUDES(mu_);
  // An outbound connection's `step` counts as sent (its sent, sent_order).
  void MarkSent(const Conn& c, int64_t step) MESHLOAD_REQUIRES(mu_);
  void Dispatch(Conn& c) MESHLOAD_EXCLUDES(mu_);
  void ServeMain() MESHLOAD_EXCLUDES(mu_);

  // The connection to a sender (in_) or receiver (out_) of this process.
  // The peer comes from the plan, whose transfers are between these
  // processes: another peer is a bug (it aborts, naming it).
  Conn& Sender(int64_t peer) const { return Peer(in_, peer, "a sender"); }
  Conn& Receiver(int64_t peer) const { return Peer(out_, peer, "a receiver"); }
  static Conn& Peer(const std::map<int64_t, std::unique_ptr<Conn>>& conns, int64_t peer, const char* what) {
    auto it = conns.find(peer);
    MESHLOAD_CHECK(it != conns.end(), "process " + std::to_string(peer) + " is not " + what + " of this process");
    return *it->second;
  }

  // c's ConnShared; the reference is for the scope that holds mu_.
  ConnShared& Shared(const Conn& c) MESHLOAD_REQUIRES(mu_) { return shared_[c.index]; }
  const ConnShared& Shared(const Conn& c) const MESHLOAD_REQUIRES(mu_) { return shared_[c.index]; }

  const ExchangeOptions opt_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer heartbeat_;
  asio::steady_timer accept_retry_;  // accepting again after an error
  bool flood_logged_ = false;        // I/O thread: "too many peer connections" logged
  uint16_t port_ = 0;
  const Clock::time_point started_ = Clock::now();
  std::map<int64_t, std::unique_ptr<Conn>> in_, out_;  // fixed after Start()
  std::vector<std::shared_ptr<Pending>> pending_;      // I/O thread only
  std::vector<std::unique_ptr<tcp::socket>> closed_;   // I/O thread: dropped sockets, freed a tick later
  size_t closed_before_ = 0;
  bool closing_ = false;  // I/O thread: this exchange is stopping
  std::thread thread_;
  std::thread server_;

  mutable Mutex mu_;
  CondVar cv_;  // a part's state changed (and Restart)
  internal::StepTable table_ MESHLOAD_GUARDED_BY(mu_);
  std::vector<ConnShared> shared_ MESHLOAD_GUARDED_BY(mu_);  // by Conn::index, one per Conn made in Start()
  bool stopping_ MESHLOAD_GUARDED_BY(mu_) = false;
  CondVar serve_cv_;
  std::deque<std::pair<Conn*, int64_t>> serve_queue_ MESHLOAD_GUARDED_BY(mu_);
  ExchangeCounters counters_ MESHLOAD_GUARDED_BY(mu_);
};

}  // namespace meshload::sidecar::exchange
