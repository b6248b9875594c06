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
/// the Conn fields marked "under mu_", the serve queue and the counters.
#pragma once

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sidecar/exchange/handshake.h"
#include "sidecar/exchange/peer_exchange.h"
#include "sidecar/exchange/step_table.h"
#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange {

namespace internal {
inline constexpr size_t kSentMemory = 1 << 16;  // steps remembered per receiver, to refuse a second credit
// Connections accepted that have not said HELLO (or authenticated) yet.
inline constexpr size_t kMaxPending = 64;
}  // namespace internal

class PeerExchange::Impl {
 public:
  using Ticket = PeerExchange::Ticket;
  using Clock = std::chrono::steady_clock;
  using tcp = boost::asio::ip::tcp;
  using Header = internal::Header;
  using Type = internal::Type;
  using PartStatus = internal::PartStatus;
  using PartState = internal::PartState;
  using StepState = internal::StepState;

  struct WriteItem {
    Header h;
    std::vector<boost::asio::const_buffer> payload;
    std::string text;
    std::function<void(bool)> done;
  };
  struct Conn {
    int64_t peer = 0;
    bool outbound = false;  // this process sends data on it
    // Written by the I/O thread only (a peer found at a new address), read
    // anywhere through Name().
    mutable std::mutex addr_mu;
    PeerAddress addr;
    // I/O thread only.
    // Bumped whenever the socket is replaced or dropped: a handler of an
    // older socket finds it changed and does nothing.
    uint64_t gen = 0;
    bool connected_once = false;
    bool lost = false;  // lost and waiting for the peer to come back (since lost_at)
    Clock::time_point lost_at;
    std::string lost_why;
    std::unique_ptr<tcp::socket> sock;
    std::unique_ptr<boost::asio::steady_timer> retry;
    std::unique_ptr<tcp::resolver> resolver;
    Clock::time_point deadline;          // outbound: give up connecting (Retry fails past it)
    Clock::time_point attempt_deadline;  // outbound: give up this dial and handshake, and dial again
    Clock::time_point dead_at;           // when Fail() ran
    Clock::time_point last_rx;
    Header rx;
    std::vector<uint8_t> scratch;
    std::deque<WriteItem> wq;
    bool writing = false;
    // Under mu_.
    bool ready = false;
    std::string failed;
    bool dead = false;  // I/O thread: Fail() ran (for good); close once the queue is written
    std::set<int64_t> credited;  // outbound
    int64_t floor = INT64_MIN;   // outbound: the receiver's RESET
    std::set<int64_t> sent;      // outbound: recently sent steps
    std::set<int64_t> again;     // outbound: credited again after being sent
    int64_t have_through = INT64_MIN;  // outbound: the receiver has every step in [floor, have_through]
    std::set<int64_t> have;            // outbound: and these
    std::deque<int64_t> sent_order;
    std::string Name() const {
      std::lock_guard lock(addr_mu);
      return "process " + std::to_string(peer) + " (" + addr.ToString() + ")";
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

  Ticket Begin(int64_t step);
  Status Expect(Ticket t, std::vector<Part> incoming);
  Status Send(Ticket t, std::vector<Part> outgoing);
  Status Wait(Ticket t, const std::function<bool()>& cancelled);
  void Abandon(Ticket t);
  void Restart(int64_t step);
  ExchangeCounters counters() const;

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
  void DropSocket(Conn& c);
  void Lose(Conn& c, const std::string& why);
  void Fail(Conn& c, const std::string& why, bool quiet = false);
  void Close(Conn& c);
  void Heartbeat();
  // Frames in and out.
  void ReadFrame(Conn& c);
  void OnFrame(Conn& c);
  void Queue(Conn& c, WriteItem w);
  void WriteNext(Conn& c);
  void SendError(Conn& c, const std::string& why);

  // ---- credit flow and data (transfers.cc) ----

  void SayWhatIsHad(Conn& c);
  void OnCreditFrame(Conn& c, Type t, const Header& h);
  void OnData(Conn& c, const Header& h);
  void Discard(Conn& c, uint64_t remaining);
  void SendCredits();
  void MarkSent(Conn& c, int64_t step);
  void Dispatch(Conn& c);
  void ServeMain();

  const ExchangeOptions opt_;
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  boost::asio::steady_timer heartbeat_;
  boost::asio::steady_timer accept_retry_;  // accepting again after an error
  bool flood_logged_ = false;               // I/O thread: "too many peer connections" logged
  uint16_t port_ = 0;
  const Clock::time_point started_ = Clock::now();
  std::map<int64_t, std::unique_ptr<Conn>> in_, out_;  // fixed after Start()
  std::vector<std::shared_ptr<Pending>> pending_;      // I/O thread only
  std::vector<std::unique_ptr<tcp::socket>> closed_;   // I/O thread: dropped sockets, freed a tick later
  size_t closed_before_ = 0;
  bool closing_ = false;  // I/O thread: this exchange is stopping
  std::thread thread_;
  std::thread server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  internal::StepTable table_;  // under mu_
  bool stopping_ = false;
  std::condition_variable serve_cv_;
  std::deque<std::pair<Conn*, int64_t>> serve_queue_;
  ExchangeCounters counters_;
};

}  // namespace meshload::sidecar::exchange
