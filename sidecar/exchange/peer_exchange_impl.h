/// \file
/// PeerExchange::Impl, the exchange's connections behind peer_exchange.h.
/// Internal: included by the exchange's own files only, never installed.
///
/// Where things are:
///   - peer_exchange.cc: Start/stop, and the staging threads' calls (Begin,
///     Expect, Send, Wait, Abandon, Restart), which the transfer book
///     answers and the connections act on.
///   - connection.cc: connection life on the I/O thread: accept, HELLO and
///     authentication on both sides, admit, connect and retry, lose, fail,
///     close, heartbeats, reading frames and the write queue.
///   - transfers.cc: credit flow and data on the connections: CREDIT/RESET/
///     HAVE frames, DATA in and out, parts served again on demand (the
///     serving thread).
///   - transfer_book.h: the bookkeeping those act on (the step table, what
///     each link knows of its peer, the serve queue, the counters), with
///     its own lock; wire_format.h (frames), handshake.h (MACs, HELLO
///     checks), step_table.h (per-step bookkeeping).
///
/// Threads: the staging threads call the public methods; one I/O thread
/// (`ml-peers`) runs io_ and every handler; one serving thread
/// (`ml-peer-serve`) reads parts again on demand. A Conn is the I/O
/// thread's, but for its address (addr_mu); what the staging threads and
/// the connections share is the TransferBook's, under its own mutex, never
/// held while a connection does I/O.
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

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sidecar/exchange/handshake.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/exchange/step_table.h"
#include "sidecar/exchange/transfer_book.h"
#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange {

// For the exchange's own files, the only ones that include this header.
namespace asio = boost::asio;

namespace internal {
// Connections accepted that have not said HELLO (or authenticated) yet.
inline constexpr size_t kMaxPending = 64;
}  // namespace internal

class PeerExchange::Impl {
 public:
  using Ticket = PeerExchange::Ticket;
  using Clock = meshload::Clock;
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
  // One connection, to a receiver (outbound) or from a sender; what the
  // book knows of it is its link (book_, by `link`).
  struct Conn {
    int64_t peer = 0;
    bool outbound = false;  // this process sends data on it
    size_t link = 0;        // its link in book_
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
    bool dialled = false;  // Connect() ran: a later dial (a lost peer's too) looks the address up again
    bool lost = false;     // lost and waiting for the peer to come back (since lost_at)
    Clock::time_point lost_at;
    std::string lost_why;
    // Set when Heartbeat() closes an attempt that took too long: the
    // attempt's handler then fails with an error of the closed socket, and
    // this says why instead. retry_why: the reason of the last attempt that
    // failed on its own (an answer, a refusal), kept for the final error.
    std::string closed_why;
    std::string retry_why;
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

  Ticket Begin(int64_t step) { return book_.Begin(step); }
  Status Expect(Ticket t, std::vector<Part> incoming);
  Status Send(Ticket t, std::vector<Part> outgoing);
  Status Wait(Ticket t, const std::function<bool()>& cancelled) { return book_.Wait(t, cancelled); }
  void Abandon(Ticket t) { book_.Abandon(t); }
  void Restart(int64_t step);
  ExchangeCounters counters() const { return book_.counters(); }

 private:
  // ---- the I/O thread: connection life (connection.cc) ----

  // Accepting, and the receiver's side of the handshake.
  void StartAccept();
  void Refuse(const std::shared_ptr<Pending>& p, const std::string& why);
  void Forget(const std::shared_ptr<Pending>& p);
  void OnHello(const std::shared_ptr<Pending>& p, boost::system::error_code ec);
  void Admit(const std::shared_ptr<Pending>& p);
  // Dialling, and the sender's side of the handshake.
  void Connect(Conn& c);
  void Authenticate(Conn& c, uint64_t g);
  void OnHelloOk(Conn& c, uint64_t g, std::shared_ptr<internal::Nonce> nonce);
  void Sending(Conn& c);
  void Retry(Conn& c, const std::string& why);
  // Up, down, and gone for good.
  void MarkConnected(Conn& c, const char* direction);
  // Runs the queued writes' callbacks, which tell the book.
  void DropSocket(Conn& c);
  void Lose(Conn& c, const std::string& why);
  void Fail(Conn& c, const std::string& why, bool quiet = false);
  void Close(Conn& c);
  void Heartbeat();
  // Frames in and out.
  void ReadFrame(Conn& c);
  void OnFrame(Conn& c);
  // May run `w.done`, which tells the book.
  void Queue(Conn& c, WriteItem w);
  void WriteNext(Conn& c);
  void SendError(Conn& c, const std::string& why);

  // ---- credit flow and data (transfers.cc) ----

  void SayWhatIsHad(Conn& c);
  void OnCreditFrame(Conn& c, Type t, const Header& h);
  void OnData(Conn& c, const Header& h);
  void Discard(Conn& c, uint64_t remaining);
  void SendCredits();
  void Dispatch(Conn& c);
  void ServeMain();

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

  const ExchangeOptions opt_;
  Clock* const clock_;  // opt_.clock, or the real one
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer heartbeat_;
  asio::steady_timer accept_retry_;  // accepting again after an error
  bool flood_logged_ = false;        // I/O thread: "too many peer connections" logged
  uint16_t port_ = 0;
  const Clock::time_point started_ = clock_->Now();
  std::map<int64_t, std::unique_ptr<Conn>> in_, out_;  // fixed after Start()
  std::vector<Conn*> by_link_;                         // Conn of each link of book_, fixed after Start()
  std::vector<std::shared_ptr<Pending>> pending_;      // I/O thread only
  std::vector<std::unique_ptr<tcp::socket>> closed_;   // I/O thread: dropped sockets, freed a tick later
  size_t closed_before_ = 0;
  bool closing_ = false;  // I/O thread: this exchange is stopping
  std::thread thread_;
  std::thread server_;

  // What the staging threads and the connections share (its own lock).
  internal::TransferBook book_;
};

}  // namespace meshload::sidecar::exchange
