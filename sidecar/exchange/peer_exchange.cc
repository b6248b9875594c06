#include "sidecar/exchange/peer_exchange.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <boost/asio.hpp>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/flags.h"
#include "common/logging.h"

namespace meshload::sidecar::exchange {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Frames are a 32-byte little-endian header, then (DATA, ERROR) a payload.
constexpr uint32_t kMagic = 0x58504c4d;  // "MLPX"
constexpr uint16_t kVersion = 2;  // 2: HAVE and HAVE_THROUGH (connections survive a peer's restart)
constexpr uint64_t kMaxErrorText = 4096;
constexpr size_t kSentMemory = 1 << 16;  // steps remembered per receiver, to refuse a second credit
// Connections accepted that have not said HELLO (or authenticated) yet.
constexpr size_t kMaxPending = 64;
constexpr size_t kHaveMemory = 4096;     // steps a receiver reports as already had (HAVE), at most

enum class Type : uint16_t {
  kHello = 1,     // a = from, b = to, c = fingerprint
  kHelloOk = 2,
  kCredit = 3,    // a = step
  kReset = 4,     // a = first step the receiver still wants
  kData = 5,      // a = step, b = bytes, c = sample-id checksum; then b bytes
  kHeartbeat = 6,
  kError = 7,     // b = text bytes; then the text
  kBye = 8,       // the sender of it is stopping
  kHaveThrough = 9,  // a = step: the receiver has every step from its RESET step through a (on connection)
  kHave = 10,        // a = step: the receiver has step a (on connection)
  kChallenge = 11,   // b = 32; then the receiver's nonce (the receiver has a peer secret)
  kAuth = 12,        // b = 64; then HMAC(secret, "MLPX-auth", nonce, from, to, fingerprint) and the sender's nonce
};

// Peer authentication (ExchangeOptions::secret): HMAC-SHA256 over a label,
// the other side's nonce, both process indexes and the job's fingerprint.
using Mac = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

Mac PeerMac(const std::string& secret, std::string_view label, const uint8_t* nonce, int64_t from, int64_t to,
            uint64_t fingerprint) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(nonce), 32);
  msg.append(reinterpret_cast<const char*>(&from), sizeof from);
  msg.append(reinterpret_cast<const char*>(&to), sizeof to);
  msg.append(reinterpret_cast<const char*>(&fingerprint), sizeof fingerprint);
  Mac out{};
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out.data(), &n);
  return out;
}

bool SameMac(const uint8_t* a, const Mac& b) { return CRYPTO_memcmp(a, b.data(), b.size()) == 0; }

// nullopt when the system has no randomness to give: a predictable nonce
// would let a recorded handshake be replayed, so the handshake is refused.
std::optional<Nonce> MakeNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) return std::nullopt;
  return n;
}

struct Header {
  uint32_t magic = kMagic;
  uint16_t type = 0;
  uint16_t version = kVersion;
  int64_t a = 0;
  uint64_t b = 0;
  uint64_t c = 0;
};
static_assert(sizeof(Header) == 32);

Header Frame(Type t, int64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  Header h;
  h.type = static_cast<uint16_t>(t);
  h.a = a;
  h.b = b;
  h.c = c;
  return h;
}

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

std::string PeerAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<std::vector<PeerAddress>> ParsePeerList(std::string_view text) {
  std::vector<PeerAddress> out;
  size_t index = 0;
  std::vector<std::string> items;
  for (size_t pos = 0; pos <= text.size();) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    items.emplace_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  if (text.empty()) items.clear();
  for (const std::string& item : items) {
    const std::string where = "peer " + std::to_string(index++) + " ('" + item + "')";
    PeerAddress a;
    std::string port;
    if (!item.empty() && item.front() == '[') {
      const size_t close = item.find(']');
      if (close == std::string::npos || close + 1 >= item.size() || item[close + 1] != ':') {
        return InvalidArgument(where + ": expected [IPV6]:PORT");
      }
      a.host = item.substr(1, close - 1);
      port = item.substr(close + 2);
    } else {
      const size_t colon = item.rfind(':');
      if (colon == std::string::npos || item.find(':') != colon) {
        return InvalidArgument(where + ": expected HOST:PORT");
      }
      a.host = item.substr(0, colon);
      port = item.substr(colon + 1);
    }
    int64_t p = 0;
    if (a.host.empty() || !cli::ParseInt64(port, &p) || p < 1 || p > 65535) {
      return InvalidArgument(where + ": expected HOST:PORT with a port in 1..65535");
    }
    a.port = static_cast<uint16_t>(p);
    out.push_back(std::move(a));
  }
  if (out.empty()) return InvalidArgument("the peer list is empty");
  return out;
}

class PeerExchange::Impl {
 public:
  using Ticket = PeerExchange::Ticket;
  enum class PartStatus { kWaiting, kBusy, kDone, kFailed, kSkipped };
  struct PartState {
    Part part;
    PartStatus status = PartStatus::kWaiting;
    bool credited = false;  // incoming: CREDIT sent
  };
  struct StepState {
    int64_t step = 0;
    uint64_t generation = 0;  // restarts_ at Begin
    std::vector<PartState> in, out;
    Status error;
    Clock::time_point since = Clock::now();
    bool reported = false;
    bool sent = false;  // Send() ran: until then the step is being staged here (held)
  };
  struct WriteItem {
    Header h;
    std::vector<asio::const_buffer> payload;
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
  struct Pending {
    tcp::socket sock;
    Header rx;
    Header hello;
    Nonce nonce{};                   // sent in CHALLENGE
    std::array<uint8_t, 64> auth{};  // AUTH's payload
    Clock::time_point deadline;
    explicit Pending(tcp::socket s) : sock(std::move(s)) {}
  };

  explicit Impl(ExchangeOptions o) : opt_(std::move(o)), acceptor_(io_), heartbeat_(io_), accept_retry_(io_) {
    self_floor_ = opt_.first_step;
    begun_through_ = done_through_ = self_floor_ - 1;
  }

  ~Impl() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    serve_cv_.notify_all();
    if (server_.joinable()) server_.join();
    // Say goodbye, so that peers report a stop, not a lost connection
    // (bounded: a peer that does not read is not waited for).
    if (thread_.joinable()) {
      auto said = std::make_shared<std::promise<void>>();
      asio::post(io_, [this, said] {
        closing_ = true;
        auto left = std::make_shared<int>(0);
        for (auto* m : {&in_, &out_}) {
          for (auto& [p, c] : *m) {
            if (c->dead || !c->sock || !c->sock->is_open()) continue;
            ++*left;
            Queue(*c, {Frame(Type::kBye), {}, {}, [said, left](bool) {
                         if (--*left == 0) said->set_value();
                       }});
          }
        }
        if (*left == 0) said->set_value();
      });
      said->get_future().wait_for(std::chrono::milliseconds(200));
    }
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Start(const std::vector<int64_t>& send_to, const std::vector<int64_t>& receive_from) {
    const int64_t n = static_cast<int64_t>(opt_.peers.size());
    if (opt_.process < 0 || opt_.process >= n) {
      return InvalidArgument("process " + std::to_string(opt_.process) + " has no entry in the peer list of " +
                             std::to_string(n) + " addresses");
    }
    boost::system::error_code ec;
    if (opt_.listen_fd >= 0) {
      acceptor_.assign(tcp::v4(), opt_.listen_fd, ec);
      if (ec) {
        // The socket may be IPv6.
        ec.clear();
        acceptor_.assign(tcp::v6(), opt_.listen_fd, ec);
      }
      if (ec) return InvalidArgument("--peer-listen-fd " + std::to_string(opt_.listen_fd) + ": " + ec.message());
    } else {
      const auto addr = asio::ip::make_address(opt_.listen_address, ec);
      if (ec) return InvalidArgument("peer listen address '" + opt_.listen_address + "': " + ec.message());
      tcp::endpoint ep(addr, opt_.peers[static_cast<size_t>(opt_.process)].port);
      acceptor_.open(ep.protocol(), ec);
      if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acceptor_.bind(ep, ec);
      if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        return Status(StatusCode::kUnavailable, "cannot listen for peers on " + opt_.listen_address + ":" +
                                                    std::to_string(ep.port()) + ": " + ec.message());
      }
    }
    port_ = acceptor_.local_endpoint(ec).port();
    auto add = [&](int64_t p, bool outbound) -> Status {
      if (p < 0 || p >= n || p == opt_.process) {
        return InvalidArgument("peer process " + std::to_string(p) + " is not another process of the job's 0.." +
                               std::to_string(n - 1));
      }
      auto c = std::make_unique<Conn>();
      c->peer = p;
      c->outbound = outbound;
      c->addr = opt_.peers[static_cast<size_t>(p)];
      (outbound ? out_ : in_)[p] = std::move(c);
      return Status::Ok();
    };
    for (int64_t p : send_to) MESHLOAD_RETURN_IF_ERROR(add(p, true));
    for (int64_t p : receive_from) MESHLOAD_RETURN_IF_ERROR(add(p, false));
    StartAccept();
    for (auto& [p, c] : out_) {
      c->deadline = Clock::now() + opt_.connect_timeout;
      Connect(*c);
    }
    Heartbeat();
    server_ = std::thread([this] { ServeMain(); });
    thread_ = std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "ml-peers");
      io_.run();
    });
    LogInfo("peer exchange listening",
            {{"port", static_cast<int>(port_)}, {"sends_to", send_to.size()}, {"receives_from", receive_from.size()}});
    return Status::Ok();
  }

  uint16_t port() const { return port_; }

  // ---- called by staging threads ----

  Ticket Begin(int64_t step) {
    std::lock_guard lock(mu_);
    const Ticket t = ++last_ticket_;
    steps_[t].step = step;
    steps_[t].generation = restarts_;
    Mark(step, begun_through_, begun_above_);
    return t;
  }

  Status Expect(Ticket t, std::vector<Part> incoming) {
    {
      std::lock_guard lock(mu_);
      StepState& st = steps_.at(t);
      for (Part& p : incoming) {
        if (!in_.count(p.peer)) {
          return Internal("step " + std::to_string(st.step) + " expects data from process " + std::to_string(p.peer) +
                          ", which is not a sender of this process");
        }
        st.in.push_back({std::move(p), PartStatus::kWaiting, false});
      }
    }
    asio::post(io_, [this] { SendCredits(); });
    return Status::Ok();
  }

  Status Send(Ticket t, std::vector<Part> outgoing) {
    std::vector<Conn*> conns;
    {
      std::lock_guard lock(mu_);
      StepState& st = steps_.at(t);
      st.sent = true;
      for (Part& p : outgoing) {
        auto it = out_.find(p.peer);
        if (it == out_.end()) {
          return Internal("step " + std::to_string(st.step) + " sends to process " + std::to_string(p.peer) +
                          ", which is not a receiver of this process");
        }
        conns.push_back(it->second.get());
        st.out.push_back({std::move(p), PartStatus::kWaiting, false});
      }
    }
    asio::post(io_, [this, conns] {
      for (Conn* c : conns) Dispatch(*c);
    });
    return Status::Ok();
  }

  Status Wait(Ticket t, const std::function<bool()>& cancelled) {
    std::unique_lock lock(mu_);
    StepState& st = steps_.at(t);
    while (true) {
      if (!st.error.ok()) return st.error;
      std::string pending;
      for (const PartState& p : st.in) {
        if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
          pending += (pending.empty() ? "" : ", ") + in_.at(p.part.peer)->Name() + " has not sent its part";
        }
      }
      for (const PartState& p : st.out) {
        if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
          pending += (pending.empty() ? "" : ", ") + out_.at(p.part.peer)->Name() +
                     (p.status == PartStatus::kWaiting ? " has not asked for its part" : " is receiving its part");
        }
      }
      if (pending.empty()) {
        if (st.generation == restarts_) Mark(st.step, done_through_, done_above_);
        steps_.erase(t);
        return Status::Ok();
      }
      if (cancelled && cancelled()) {
        return Status(StatusCode::kCancelled, "step " + std::to_string(st.step) + " abandoned");
      }
      if (!st.reported && Clock::now() - st.since > opt_.stall_report_after) {
        st.reported = true;
        LogWarn("a step waits on its peers", {{"step", st.step}, {"waiting_for", pending}});
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  void Abandon(Ticket t) {
    std::unique_lock lock(mu_);
    auto it = steps_.find(t);
    if (it == steps_.end()) return;
    StepState& st = it->second;
    Skip(st);
    // A part being written or read finishes (or fails with its connection)
    // before the memory it touches is given back.
    cv_.wait(lock, [&] {
      for (const auto* v : {&st.in, &st.out}) {
        for (const PartState& p : *v) {
          if (p.status == PartStatus::kBusy) return false;
        }
      }
      return true;
    });
    steps_.erase(it);
  }

  void Restart(int64_t step) {
    {
      std::lock_guard lock(mu_);
      self_floor_ = step;
      ++restarts_;
      begun_through_ = done_through_ = step - 1;
      begun_above_.clear();
      done_above_.clear();
      for (auto& [t, st] : steps_) Skip(st);
      cv_.notify_all();
    }
    asio::post(io_, [this, step] {
      for (auto& [p, c] : in_) {
        bool ready;
        {
          std::lock_guard lock(mu_);
          ready = c->ready;
        }
        if (ready) Queue(*c, {Frame(Type::kReset, step), {}, {}, nullptr});
      }
      // Credits held for steps this process will no longer stage are now
      // served on demand.
      for (auto& [p, c] : out_) Dispatch(*c);
    });
  }

  // Adds `step` to a set of steps kept as "every step from the re-plan
  // point through `through`, and `above`" (begun, or done). Needs mu_.
  static void Mark(int64_t step, int64_t& through, std::set<int64_t>& above) {
    if (step <= through) return;
    above.insert(step);
    while (!above.empty() && *above.begin() == through + 1) {
      through += 1;
      above.erase(above.begin());
    }
    while (above.size() > kHaveMemory) above.erase(above.begin());  // a gap that never fills: forget it
  }

  // Parts not yet under way will not be: their staging is over. Needs mu_.
  static void Skip(StepState& st) {
    for (auto* v : {&st.in, &st.out}) {
      for (PartState& p : *v) {
        if (p.status == PartStatus::kWaiting) p.status = PartStatus::kSkipped;
      }
    }
  }

  ExchangeCounters counters() const {
    std::lock_guard lock(mu_);
    ExchangeCounters c = counters_;
    c.peers_connected = 0;
    for (const auto* m : {&in_, &out_}) {
      for (const auto& [p, conn] : *m) c.peers_connected += conn->ready ? 1 : 0;
    }
    return c;
  }

 private:
  // ---- the I/O thread ----

  void StartAccept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors (EMFILE) and the like: accepting again at once
        // would spin; try again in a moment.
        LogWarn("cannot accept a peer connection", {{"error", ec.message()}});
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](boost::system::error_code e) {
          if (!e) StartAccept();
        });
        return;
      }
      if (pending_.size() >= kMaxPending) {
        // Connections that have not said HELLO yet are bounded, so a flood
        // of them cannot take the sidecar's descriptors. The oldest goes:
        // a real peer connecting during a flood still gets its turn.
        if (!flood_logged_) {
          LogWarn("too many peer connections without a HELLO; closing the oldest", {{"pending", kMaxPending}});
          flood_logged_ = true;
        }
        const std::shared_ptr<Pending> oldest = pending_.front();
        boost::system::error_code ignored;
        oldest->sock.close(ignored);
        Forget(oldest);
      }
      s.set_option(tcp::no_delay(true), ec);
      auto p = std::make_shared<Pending>(std::move(s));
      p->deadline = Clock::now() + opt_.peer_timeout;
      pending_.push_back(p);
      asio::async_read(p->sock, asio::buffer(&p->rx, sizeof p->rx),
                       [this, p](boost::system::error_code e, size_t) { OnHello(p, e); });
      StartAccept();
    });
  }

  void Refuse(const std::shared_ptr<Pending>& p, const std::string& why) {
    LogWarn("refused a peer connection", {{"reason", why}});
    auto text = std::make_shared<std::string>(why);
    auto h = std::make_shared<Header>(Frame(Type::kError, 0, text->size()));
    std::vector<asio::const_buffer> bufs{asio::buffer(h.get(), sizeof *h), asio::buffer(*text)};
    asio::async_write(p->sock, bufs, [this, p, h, text](boost::system::error_code, size_t) {
      boost::system::error_code ignored;
      p->sock.shutdown(tcp::socket::shutdown_both, ignored);
      p->sock.close(ignored);
      Forget(p);
    });
  }

  void Forget(const std::shared_ptr<Pending>& p) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), p), pending_.end());
  }

  void OnHello(const std::shared_ptr<Pending>& p, boost::system::error_code ec) {
    if (ec) {
      Forget(p);
      return;
    }
    const Header& h = p->rx;
    if (h.magic != kMagic || h.type != static_cast<uint16_t>(Type::kHello)) {
      Refuse(p, "not a meshload peer HELLO");
      return;
    }
    if (h.version != kVersion) {
      Refuse(p, "peer protocol version " + std::to_string(h.version) + " is not " + std::to_string(kVersion));
      return;
    }
    auto it = in_.find(h.a);
    if (static_cast<int64_t>(h.b) != opt_.process || it == in_.end()) {
      Refuse(p, "process " + std::to_string(h.a) + " connected to send to process " + std::to_string(h.b) +
                    ", but this is process " + std::to_string(opt_.process) +
                    " and its plan receives nothing from it: the processes run different jobs or peer lists");
      return;
    }
    p->hello = h;
    if (opt_.secret.empty()) {
      Admit(p);
      return;
    }
    // Authenticate first: nothing a peer says counts before it proves it
    // holds the job's secret.
    std::optional<Nonce> nonce = MakeNonce();
    if (!nonce) {
      LogError("cannot authenticate a peer: no random bytes for the challenge", {});
      Forget(p);
      return;
    }
    p->nonce = *nonce;
    auto challenge = std::make_shared<Header>(Frame(Type::kChallenge, 0, p->nonce.size()));
    std::vector<asio::const_buffer> out{asio::buffer(challenge.get(), sizeof *challenge), asio::buffer(p->nonce)};
    asio::async_write(p->sock, out, [this, p, challenge](boost::system::error_code ec, size_t) {
      if (ec) {
        Forget(p);
        return;
      }
      asio::async_read(p->sock, asio::buffer(&p->rx, sizeof p->rx), [this, p](boost::system::error_code e, size_t) {
        if (e) {
          Forget(p);
          return;
        }
        if (p->rx.magic != kMagic || p->rx.type != static_cast<uint16_t>(Type::kAuth) || p->rx.b != p->auth.size()) {
          Refuse(p, "this sidecar requires peer authentication: process " + std::to_string(p->hello.a) +
                        " must run with the same --peer-secret-file");
          return;
        }
        asio::async_read(p->sock, asio::buffer(p->auth), [this, p](boost::system::error_code r, size_t) {
          if (r) {
            Forget(p);
            return;
          }
          const Mac want = PeerMac(opt_.secret, "MLPX-auth", p->nonce.data(), p->hello.a,
                                   static_cast<int64_t>(p->hello.b), p->hello.c);
          if (!SameMac(p->auth.data(), want)) {
            // Refused, and nothing else: an impostor must not cost the real
            // peer its connection.
            Refuse(p, "peer authentication failed for a connection claiming to be process " +
                          std::to_string(p->hello.a) + ": its --peer-secret-file differs");
            return;
          }
          Admit(p);
        });
      });
    });
  }

  // A sender that passed the checks (and authenticated): the job's
  // fingerprint, then the connection replaces any earlier one.
  void Admit(const std::shared_ptr<Pending>& p) {
    const Header& h = p->hello;
    Conn& c = *in_.at(h.a);
    if (h.c != opt_.fingerprint) {
      const std::string why = "process " + std::to_string(h.a) + " runs a different job (fingerprint " +
                              std::to_string(h.c) + ", this process " + std::to_string(opt_.fingerprint) +
                              "): every process must load the same DataLoadJob";
      Refuse(p, why);
      Fail(c, why);
      return;
    }
    std::string failed;
    bool was_ready;
    {
      std::lock_guard lock(mu_);
      failed = c.failed;
      was_ready = c.ready;
    }
    if (!failed.empty()) {
      Refuse(p, failed);
      return;
    }
    // The same process dialling again while its old connection still looks
    // alive: it was restarted (or the old connection is half-dead). The new
    // connection wins.
    if (was_ready) Lose(c, c.Name() + " connected again");
    Forget(p);
    DropSocket(c);
    c.sock = std::make_unique<tcp::socket>(std::move(p->sock));
    c.last_rx = Clock::now();
    MarkConnected(c, "receive");
    if (opt_.secret.empty()) {
      Queue(c, {Frame(Type::kHelloOk), {}, {}, nullptr});
    } else {
      // Proves this side holds the secret too (over the sender's nonce).
      auto proof = std::make_shared<Mac>(PeerMac(opt_.secret, "MLPX-ok", p->auth.data() + 32, h.a,
                                                 static_cast<int64_t>(h.b), h.c));
      WriteItem w{Frame(Type::kHelloOk, 0, proof->size()), {asio::buffer(*proof)}, {}, [proof](bool) {}};
      Queue(c, std::move(w));
    }
    int64_t floor;
    {
      std::lock_guard lock(mu_);
      floor = self_floor_;
    }
    Queue(c, {Frame(Type::kReset, floor), {}, {}, nullptr});
    SayWhatIsHad(c);
    SendCredits();
    ReadFrame(c);
  }

  // A (re)connected sender may stage steps this process already has from it
  // (a restarted sender starts again at its trainer's step): it is told, so
  // it does not wait for credits that will not come. Advisory: a step
  // reported here and asked for later is served on demand.
  void SayWhatIsHad(Conn& c) {
    int64_t through, floor;
    std::set<int64_t> had;
    {
      std::lock_guard lock(mu_);
      floor = self_floor_;
      std::set<int64_t> waiting;
      for (const auto& [ticket, st] : steps_) {
        for (const PartState& p : st.in) {
          if (p.part.peer != c.peer) continue;
          if (p.status == PartStatus::kDone) {
            had.insert(st.step);
          } else if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
            waiting.insert(st.step);
          }
        }
      }
      through = done_through_;
      if (!waiting.empty()) through = std::min(through, *waiting.begin() - 1);
      for (int64_t step : done_above_) {
        if (step > through) had.insert(step);
      }
      for (int64_t step : waiting) had.erase(step);
    }
    if (through >= floor) Queue(c, {Frame(Type::kHaveThrough, through), {}, {}, nullptr});
    size_t n = 0;
    for (int64_t step : had) {
      if (step <= through) continue;
      if (++n > kHaveMemory) break;
      Queue(c, {Frame(Type::kHave, step), {}, {}, nullptr});
    }
  }


  void Connect(Conn& c) {
    DropSocket(c);
    const uint64_t g = c.gen;
    // One attempt may not take the whole deadline: a dial to a replaced
    // pod's old address can hang until the kernel gives up (minutes); the
    // next attempt looks the address up again.
    c.attempt_deadline = Clock::now() + std::min<Clock::duration>(opt_.peer_timeout, std::chrono::seconds(10));
    if (c.lost && opt_.address_of) {
      // A peer whose pod was replaced comes back at another address.
      if (std::optional<PeerAddress> now = opt_.address_of(c.peer); now && !now->host.empty() && now->port != 0 &&
                                                                     (now->host != c.addr.host || now->port != c.addr.port)) {
        LogInfo("a lost peer has a new address", {{"peer", c.Name()}, {"address", now->ToString()}});
        std::lock_guard lock(c.addr_mu);
        c.addr = *now;
      }
    }
    c.resolver = std::make_unique<tcp::resolver>(io_);
    c.resolver->async_resolve(
        c.addr.host, std::to_string(c.addr.port),
        [this, &c, g](boost::system::error_code ec, tcp::resolver::results_type results) {
          if (g != c.gen) return;
          if (ec) {
            Retry(c, ec.message());
            return;
          }
          c.sock = std::make_unique<tcp::socket>(io_);
          asio::async_connect(*c.sock, results, [this, &c, g](boost::system::error_code e, const tcp::endpoint&) {
            if (g != c.gen) return;
            if (e) {
              Retry(c, e.message());
              return;
            }
            boost::system::error_code ignored;
            c.sock->set_option(tcp::no_delay(true), ignored);
            c.last_rx = Clock::now();
            auto h = std::make_shared<Header>(
                Frame(Type::kHello, opt_.process, static_cast<uint64_t>(c.peer), opt_.fingerprint));
            asio::async_write(*c.sock, asio::buffer(h.get(), sizeof *h), [this, &c, g, h](boost::system::error_code we, size_t) {
              if (g != c.gen) return;
              if (we) {
                Retry(c, we.message());
                return;
              }
              asio::async_read(*c.sock, asio::buffer(&c.rx, sizeof c.rx), [this, &c, g](boost::system::error_code re, size_t) {
                if (g != c.gen) return;
                if (re) {
                  Retry(c, re.message());
                  return;
                }
                if (c.rx.magic == kMagic && c.rx.type == static_cast<uint16_t>(Type::kChallenge)) {
                  Authenticate(c, g);
                  return;
                }
                OnHelloOk(c, g, nullptr);
              });
            });
          });
        });
  }

  // The receiver asked this sender to prove it holds the secret (CHALLENGE
  // just read): AUTH, then HELLO_OK with the receiver's proof.
  void Authenticate(Conn& c, uint64_t g) {
    if (opt_.secret.empty()) {
      Fail(c, c.Name() + " requires peer authentication (its sidecar has --peer-secret-file): give this "
                         "sidecar the same secret");
      return;
    }
    if (c.rx.b != 32) {
      Fail(c, c.Name() + " sent a CHALLENGE of " + std::to_string(c.rx.b) + " bytes (protocol error)");
      return;
    }
    c.scratch.resize(32);
    asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g](boost::system::error_code ec, size_t) {
      if (g != c.gen) return;
      if (ec) {
        Retry(c, ec.message());
        return;
      }
      std::optional<Nonce> nonce = MakeNonce();
      if (!nonce) {
        Fail(c, "cannot authenticate to " + c.Name() + ": no random bytes for the nonce");
        return;
      }
      auto mine = std::make_shared<Nonce>(*nonce);
      auto auth = std::make_shared<std::array<uint8_t, 64>>();
      const Mac mac = PeerMac(opt_.secret, "MLPX-auth", c.scratch.data(), opt_.process, c.peer, opt_.fingerprint);
      std::memcpy(auth->data(), mac.data(), mac.size());
      std::memcpy(auth->data() + 32, mine->data(), mine->size());
      auto h = std::make_shared<Header>(Frame(Type::kAuth, 0, auth->size()));
      std::vector<asio::const_buffer> out{asio::buffer(h.get(), sizeof *h), asio::buffer(*auth)};
      asio::async_write(*c.sock, out, [this, &c, g, h, auth, mine](boost::system::error_code we, size_t) {
        if (g != c.gen) return;
        if (we) {
          Retry(c, we.message());
          return;
        }
        asio::async_read(*c.sock, asio::buffer(&c.rx, sizeof c.rx), [this, &c, g, mine](boost::system::error_code re, size_t) {
          if (g != c.gen) return;
          if (re) {
            Retry(c, re.message());
            return;
          }
          OnHelloOk(c, g, mine);
        });
      });
    });
  }

  // The receiver's answer to HELLO (or AUTH) is in c.rx: HELLO_OK or ERROR.
  // With a secret, HELLO_OK must carry the receiver's proof over `nonce`.
  void OnHelloOk(Conn& c, uint64_t g, std::shared_ptr<Nonce> nonce) {
    if (c.rx.magic == kMagic && c.rx.type == static_cast<uint16_t>(Type::kError)) {
      OnFrame(c);  // reads the text and fails the connection
      return;
    }
    if (c.rx.magic != kMagic || c.rx.type != static_cast<uint16_t>(Type::kHelloOk)) {
      Fail(c, c.Name() + " answered HELLO with something else than HELLO_OK");
      return;
    }
    if (opt_.secret.empty()) {
      if (c.rx.b != 0) {
        Fail(c, c.Name() + " answered HELLO with a HELLO_OK of " + std::to_string(c.rx.b) + " bytes (protocol error)");
        return;
      }
      Sending(c);
      return;
    }
    if (!nonce || c.rx.b != 32) {
      Fail(c, c.Name() + " does not authenticate (its sidecar runs without --peer-secret-file): this sidecar "
                         "sends samples only to peers that hold the job's secret");
      return;
    }
    c.scratch.resize(32);
    asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g, nonce](boost::system::error_code ec, size_t) {
      if (g != c.gen) return;
      if (ec) {
        Retry(c, ec.message());
        return;
      }
      const Mac want = PeerMac(opt_.secret, "MLPX-ok", nonce->data(), opt_.process, c.peer, opt_.fingerprint);
      if (!SameMac(c.scratch.data(), want)) {
        Fail(c, c.Name() + " failed peer authentication: its --peer-secret-file differs");
        return;
      }
      Sending(c);
    });
  }

  // An outbound connection is up: read the receiver's frames, send what it
  // has credited.
  void Sending(Conn& c) {
    MarkConnected(c, "send");
    ReadFrame(c);
    Dispatch(c);
  }

  void Retry(Conn& c, const std::string& why) {
    DropSocket(c);
    if (Clock::now() >= c.deadline) {
      Fail(c, c.lost ? c.lost_why + ", and it could not be reached again within " +
                           Seconds(opt_.reconnect_timeout) + ": " + why
                     : "cannot connect to " + c.Name() + " for " + Seconds(opt_.connect_timeout) + ": " + why);
      return;
    }
    c.retry = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(200));
    c.retry->async_wait([this, &c](boost::system::error_code ec) {
      if (!ec && !c.dead) Connect(c);
    });
  }

  // A connection (the first, or one after a loss) has said HELLO / HELLO_OK.
  void MarkConnected(Conn& c, const char* direction) {
    const bool again = c.connected_once;
    const double down = c.lost ? std::chrono::duration<double>(Clock::now() - c.lost_at).count() : 0.0;
    c.connected_once = true;
    c.lost = false;
    {
      std::lock_guard lock(mu_);
      c.ready = true;
      if (again) counters_.reconnects += 1;
      if (again && c.outbound) {
        // Perhaps a new receiver, which has none of it: it says what it
        // has (RESET, HAVE) and credits what it lacks.
        c.sent.clear();
        c.again.clear();
        c.sent_order.clear();
        c.have_through = INT64_MIN;
        c.have.clear();
      }
    }
    if (again) {
      LogInfo("peer reconnected", {{"peer", c.Name()}, {"direction", direction}, {"seconds_lost", down}});
    } else {
      LogInfo("peer connected", {{"peer", c.Name()}, {"direction", direction}});
    }
  }

  // Closes the connection's socket (its pending operations end without
  // touching a buffer again, and their handlers find the generation changed)
  // and drops what was queued on it.
  void DropSocket(Conn& c) {
    ++c.gen;
    if (c.sock) {
      Close(c);
      closed_.push_back(std::move(c.sock));  // freed once its aborted handlers have run (Heartbeat)
    }
    c.writing = false;
    std::deque<WriteItem> queued = std::move(c.wq);
    c.wq.clear();
    for (WriteItem& w : queued) {
      if (w.done) w.done(false);
    }
  }

  // The connection broke, went silent, or the peer said goodbye: the peer
  // may come back (see the header). Parts under way on it wait again, and an
  // outbound connection is dialled again; after reconnect_timeout without
  // the peer, Fail().
  void Lose(Conn& c, const std::string& why) {
    if (c.dead) {
      DropSocket(c);
      return;
    }
    if (closing_ || opt_.reconnect_timeout.count() <= 0) {
      Fail(c, why, closing_);
      return;
    }
    DropSocket(c);
    {
      std::lock_guard lock(mu_);
      c.ready = false;
      c.credited.clear();
      for (auto& [ticket, st] : steps_) {
        for (PartState& p : c.outbound ? st.out : st.in) {
          if (p.part.peer != c.peer) continue;
          if (p.status == PartStatus::kBusy) {
            p.status = PartStatus::kWaiting;
            if (c.outbound) c.sent.erase(st.step);  // not delivered: send it again when credited
          }
          p.credited = false;
        }
      }
      cv_.notify_all();
    }
    if (!c.lost) {
      c.lost = true;
      c.lost_at = Clock::now();
      c.lost_why = why;
      LogWarn("lost a peer; waiting for it to come back",
              {{"peer", c.Name()}, {"reason", why}, {"seconds", Seconds(opt_.reconnect_timeout)}});
    }
    if (c.outbound) {
      c.deadline = c.lost_at + opt_.reconnect_timeout;
      c.retry = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(200));
      c.retry->async_wait([this, &c](boost::system::error_code ec) {
        if (!ec && !c.dead) Connect(c);
      });
    }
  }

  void ReadFrame(Conn& c) {
    const uint64_t g = c.gen;
    asio::async_read(*c.sock, asio::buffer(&c.rx, sizeof c.rx), [this, &c, g](boost::system::error_code ec, size_t) {
      if (g != c.gen) return;
      if (ec) {
        Lose(c, "lost the connection to " + c.Name() + ": " + ec.message());
        return;
      }
      OnFrame(c);
    });
  }

  void OnFrame(Conn& c) {
    c.last_rx = Clock::now();
    const Header h = c.rx;
    if (h.magic != kMagic) {
      Fail(c, c.Name() + " sent a frame without the meshload peer magic (protocol error)");
      return;
    }
    const Type t = static_cast<Type>(h.type);
    if (t == Type::kHeartbeat) {
      ReadFrame(c);
    } else if (t == Type::kBye) {
      Lose(c, c.Name() + " stopped");
    } else if (t == Type::kError) {
      if (h.b > kMaxErrorText) {
        Fail(c, c.Name() + " sent an error of " + std::to_string(h.b) + " bytes (protocol error)");
        return;
      }
      c.scratch.resize(h.b);
      const uint64_t g = c.gen;
      asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g](boost::system::error_code ec, size_t) {
        if (g != c.gen) return;
        if (ec) {
          Lose(c, "lost the connection to " + c.Name() + ": " + ec.message());
        } else {
          Fail(c, c.Name() + " reported: " + std::string(c.scratch.begin(), c.scratch.end()));
        }
      });
    } else if (c.outbound && t == Type::kCredit) {
      {
        std::lock_guard lock(mu_);
        if (h.a >= c.floor) {
          c.credited.insert(h.a);
          // Asked again for a step already delivered: it moved back.
          if (c.sent.erase(h.a)) c.again.insert(h.a);
        }
      }
      Dispatch(c);
      ReadFrame(c);
    } else if (c.outbound && t == Type::kReset) {
      {
        std::lock_guard lock(mu_);
        c.floor = h.a;
        c.credited.erase(c.credited.begin(), c.credited.lower_bound(h.a));
        // What the receiver had is what it had before it re-planned.
        c.have_through = INT64_MIN;
        c.have.clear();
      }
      Dispatch(c);
      ReadFrame(c);
    } else if (c.outbound && (t == Type::kHaveThrough || t == Type::kHave)) {
      {
        std::lock_guard lock(mu_);
        if (t == Type::kHaveThrough) {
          c.have_through = h.a;
        } else if (c.have.size() < kHaveMemory) {
          c.have.insert(h.a);
        }
      }
      Dispatch(c);
      ReadFrame(c);
    } else if (!c.outbound && t == Type::kData) {
      OnData(c, h);
    } else {
      Fail(c, c.Name() + " sent an unexpected frame of type " + std::to_string(h.type) + " (protocol error)");
    }
  }

  void OnData(Conn& c, const Header& h) {
    PartState* part = nullptr;
    std::string mismatch;
    {
      std::lock_guard lock(mu_);
      for (auto it = steps_.begin(); part == nullptr && mismatch.empty() && it != steps_.end(); ++it) {
        if (it->second.step != h.a) continue;
        for (PartState& p : it->second.in) {
          if (p.part.peer != c.peer || p.status != PartStatus::kWaiting) continue;
          if (p.part.bytes != h.b || p.part.checksum != h.c) {
            mismatch = c.Name() + " sent " + std::to_string(h.b) + " bytes for step " + std::to_string(h.a) +
                       " (sample-id checksum " + std::to_string(h.c) + ") but this process's plan expects " +
                       std::to_string(p.part.bytes) + " bytes (checksum " + std::to_string(p.part.checksum) +
                       "): the processes do not run the same plan";
            p.status = PartStatus::kFailed;
            if (it->second.error.ok()) it->second.error = DataLoss(mismatch);
            cv_.notify_all();
          } else {
            p.status = PartStatus::kBusy;
            part = &p;
          }
          break;
        }
      }
    }
    if (!mismatch.empty()) LogError("peer data does not match the plan", {{"error", mismatch}});
    if (part == nullptr) {
      // A step this process abandoned (or a mismatch): the bytes were sent
      // on credit and are read and dropped.
      Discard(c, h.b);
      return;
    }
    std::vector<asio::mutable_buffer> bufs;
    bufs.reserve(part->part.iov.size());
    for (const iovec& v : part->part.iov) bufs.emplace_back(v.iov_base, v.iov_len);
    const uint64_t g = c.gen;
    // Bytes arriving count as word from the peer, so a part that takes
    // longer than --peer-timeout to arrive is not taken for silence.
    auto progress = [&c, g](const boost::system::error_code& ec, size_t) -> size_t {
      if (ec) return 0;
      if (g == c.gen) c.last_rx = Clock::now();
      return 1 << 20;
    };
    asio::async_read(*c.sock, bufs, progress, [this, &c, g, part, bytes = h.b](boost::system::error_code ec, size_t) {
      // A dropped connection (Lose) has put the part back to waiting.
      if (g != c.gen) return;
      {
        std::lock_guard lock(mu_);
        // Failed half-way: the part is asked for again on the next connection.
        part->status = ec ? PartStatus::kWaiting : PartStatus::kDone;
        part->credited = false;
        if (!ec) {
          counters_.bytes_received += bytes;
          counters_.parts_received += 1;
        }
        cv_.notify_all();
      }
      if (ec) {
        Lose(c, "lost the connection to " + c.Name() + " while receiving: " + ec.message());
        return;
      }
      c.last_rx = Clock::now();
      ReadFrame(c);
    });
  }

  void Discard(Conn& c, uint64_t remaining) {
    if (remaining == 0) {
      ReadFrame(c);
      return;
    }
    c.scratch.resize(std::min<uint64_t>(remaining, 1 << 20));
    const uint64_t g = c.gen;
    asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g, remaining](boost::system::error_code ec, size_t n) {
      if (g != c.gen) return;
      if (ec) {
        Lose(c, "lost the connection to " + c.Name() + ": " + ec.message());
        return;
      }
      c.last_rx = Clock::now();
      Discard(c, remaining - n);
    });
  }

  // Credits every registered incoming part whose sender is connected.
  void SendCredits() {
    std::vector<std::pair<Conn*, int64_t>> credits;
    {
      std::lock_guard lock(mu_);
      for (auto& [ticket, st] : steps_) {
        for (PartState& p : st.in) {
          Conn& c = *in_.at(p.part.peer);
          if (p.status != PartStatus::kWaiting || p.credited) continue;
          if (!c.failed.empty()) {
            p.status = PartStatus::kFailed;
            if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, c.failed);
            cv_.notify_all();
            continue;
          }
          if (!c.ready) continue;
          p.credited = true;
          credits.emplace_back(&c, st.step);
        }
      }
    }
    for (auto& [c, step] : credits) Queue(*c, {Frame(Type::kCredit, step), {}, {}, nullptr});
  }

  // Needs mu_.
  void MarkSent(Conn& c, int64_t step) {
    c.sent.insert(step);
    c.sent_order.push_back(step);
    if (c.sent_order.size() > kSentMemory) {
      c.sent.erase(c.sent_order.front());
      c.sent_order.pop_front();
    }
  }

  // Writes every part for this receiver that it has credited; drops those it
  // has moved past or had already; hands credits this process's pipeline
  // will not meet to the serving thread.
  void Dispatch(Conn& c) {
    std::vector<std::pair<int64_t, PartState*>> go;
    {
      std::lock_guard lock(mu_);
      for (auto& [ticket, st] : steps_) {
        for (PartState& p : st.out) {
          if (p.part.peer != c.peer || p.status != PartStatus::kWaiting) continue;
          if (!c.failed.empty()) {
            p.status = PartStatus::kFailed;
            if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, c.failed);
            cv_.notify_all();
          } else if (st.step < c.floor || (c.sent.count(st.step) && !c.credited.count(st.step))) {
            p.status = PartStatus::kSkipped;
            counters_.parts_skipped += 1;
            cv_.notify_all();
          } else if (!c.credited.count(st.step) && (st.step <= c.have_through || c.have.count(st.step))) {
            // The receiver has it already (HAVE). Counted as sent, so that
            // a credit for it later is served on demand.
            p.status = PartStatus::kSkipped;
            counters_.parts_skipped += 1;
            MarkSent(c, st.step);
            cv_.notify_all();
          } else if (c.ready && c.credited.erase(st.step)) {
            p.status = PartStatus::kBusy;
            c.again.erase(st.step);
            MarkSent(c, st.step);
            go.emplace_back(st.step, &p);
          }
        }
      }
      if (c.ready && c.failed.empty()) {
        // Steps this process's pipeline is staging for this receiver now:
        // begun and not yet handed to Send (still being read here), or
        // with a part for it waiting or being written.
        std::set<int64_t> held;
        for (const auto& [ticket, st] : steps_) {
          if (!st.sent && st.generation == restarts_) held.insert(st.step);
          for (const PartState& p : st.out) {
            if (p.part.peer == c.peer && (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy)) {
              held.insert(st.step);
            }
          }
        }
        for (auto it = c.credited.begin(); it != c.credited.end();) {
          const int64_t step = *it;
          // Passed: behind this process's re-plan point, or begun (with
          // every step before it) and sent or skipped already, or asked
          // for again.
          const bool passed = step < self_floor_ || (step <= begun_through_ && !held.count(step));
          if (passed || c.again.count(step)) {
            it = c.credited.erase(it);
            c.again.erase(step);
            MarkSent(c, step);
            serve_queue_.emplace_back(&c, step);
            serve_cv_.notify_one();
          } else {
            ++it;
          }
        }
      }
    }
    for (auto& [step, p] : go) {
      WriteItem w{Frame(Type::kData, step, p->part.bytes, p->part.checksum), {}, {}, nullptr};
      w.payload.reserve(p->part.iov.size());
      for (const iovec& v : p->part.iov) w.payload.emplace_back(v.iov_base, v.iov_len);
      w.done = [this, &c, p = p, step = step](bool ok) {
        std::lock_guard lock(mu_);
        if (ok) {
          p->status = PartStatus::kDone;
          counters_.bytes_sent += p->part.bytes;
          counters_.parts_sent += 1;
        } else if (p->status == PartStatus::kBusy) {
          // Not delivered. A lost connection sends it again when the
          // receiver, connected again, credits it; a failed one fails it.
          p->status = c.failed.empty() ? PartStatus::kWaiting : PartStatus::kFailed;
          if (c.failed.empty()) c.sent.erase(step);
        }
        cv_.notify_all();
      };
      Queue(c, std::move(w));
    }
  }

  // The serving thread: reads parts again on demand (see the header).
  void ServeMain() {
    ::pthread_setname_np(::pthread_self(), "ml-peer-serve");
    std::unique_lock lock(mu_);
    while (true) {
      serve_cv_.wait(lock, [&] { return stopping_ || !serve_queue_.empty(); });
      if (stopping_) return;
      auto [c, step] = serve_queue_.front();
      serve_queue_.pop_front();
      lock.unlock();
      auto buf = std::make_shared<std::vector<uint8_t>>();
      uint64_t checksum = 0;
      Status st = opt_.serve ? opt_.serve(step, c->peer, *buf, checksum)
                             : Internal("no on-demand reader for step " + std::to_string(step));
      LogInfo("serving a peer's part again from storage",
              {{"step", step}, {"peer", c->Name()}, {"bytes", buf->size()}, {"ok", st.ok() ? "true" : "false"}});
      asio::post(io_, [this, c, step, buf, checksum, st] {
        {
          // Lost meanwhile (perhaps reconnecting, not yet authenticated):
          // nothing goes out before the handshake; the receiver credits the
          // step again once it is back.
          std::lock_guard lock(mu_);
          if (!c->ready) return;
        }
        if (!st.ok()) {
          const std::string why = "process " + std::to_string(opt_.process) + " cannot read its part of step " +
                                  std::to_string(step) + " again: " + st.ToString();
          SendError(*c, why);
          Fail(*c, why);
          return;
        }
        WriteItem w{Frame(Type::kData, step, buf->size(), checksum), {asio::buffer(*buf)}, {}, nullptr};
        w.done = [this, buf](bool ok) {
          std::lock_guard lock(mu_);
          if (ok) {
            counters_.bytes_sent += buf->size();
            counters_.parts_served += 1;
          }
        };
        Queue(*c, std::move(w));
      });
      lock.lock();
    }
  }

  void Queue(Conn& c, WriteItem w) {
    if (!c.sock || !c.sock->is_open() || (c.dead && w.h.type != static_cast<uint16_t>(Type::kError))) {
      if (w.done) w.done(false);
      return;
    }
    c.wq.push_back(std::move(w));
    if (!c.writing) WriteNext(c);
  }

  void WriteNext(Conn& c) {
    if (c.wq.empty()) {
      c.writing = false;
      if (c.dead) Close(c);
      return;
    }
    c.writing = true;
    const uint64_t g = c.gen;
    WriteItem& w = c.wq.front();
    std::vector<asio::const_buffer> bufs;
    bufs.reserve(w.payload.size() + 2);
    bufs.emplace_back(&w.h, sizeof w.h);
    for (const auto& b : w.payload) bufs.push_back(b);
    if (!w.text.empty()) bufs.emplace_back(w.text.data(), w.text.size());
    asio::async_write(*c.sock, bufs, [this, &c, g](boost::system::error_code ec, size_t) {
      if (g != c.gen) return;  // the connection was dropped; its queue with it
      WriteItem done = std::move(c.wq.front());
      c.wq.pop_front();
      if (done.done) done.done(!ec);
      if (ec) {
        Lose(c, "lost the connection to " + c.Name() + " while sending: " + ec.message());
        return;
      }
      WriteNext(c);
    });
  }

  void SendError(Conn& c, const std::string& why) {
    WriteItem w{Frame(Type::kError, 0, std::min<uint64_t>(why.size(), kMaxErrorText)), {}, why.substr(0, kMaxErrorText),
                nullptr};
    Queue(c, std::move(w));
  }

  // The connection is dead: every part that needs it fails, with `why`.
  void Fail(Conn& c, const std::string& why, bool quiet = false) {
    {
      std::lock_guard lock(mu_);
      if (!c.failed.empty()) return;
      c.failed = why;
      c.ready = false;
      for (auto& [ticket, st] : steps_) {
        for (PartState& p : c.outbound ? st.out : st.in) {
          if (p.part.peer != c.peer || p.status != PartStatus::kWaiting) continue;
          p.status = PartStatus::kFailed;
          if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, why);
        }
        // A part in flight fails in its own handler; the step's error is
        // the connection's.
        for (PartState& p : c.outbound ? st.out : st.in) {
          if (p.part.peer == c.peer && p.status == PartStatus::kBusy && st.error.ok()) {
            st.error = Status(StatusCode::kUnavailable, why);
          }
        }
      }
      cv_.notify_all();
    }
    if (quiet || closing_) {
      LogInfo("peer connection closed", {{"peer", c.Name()}, {"reason", why}});
    } else {
      LogError("peer connection failed", {{"peer", c.Name()}, {"error", why}});
    }
    c.dead = true;
    c.dead_at = Clock::now();
    if (c.retry) c.retry->cancel();
    // Writes still queued (an ERROR for the peer) go out first; the socket
    // closes when the queue is done (WriteNext), and at once when idle.
    if (!c.writing) Close(c);
  }

  void Close(Conn& c) {
    if (!c.sock) return;
    boost::system::error_code ignored;
    c.sock->shutdown(tcp::socket::shutdown_both, ignored);
    c.sock->close(ignored);
  }

  void Heartbeat() {
    heartbeat_.expires_after(opt_.heartbeat);
    heartbeat_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      const auto now = Clock::now();
      for (auto* m : {&in_, &out_}) {
        for (auto& [p, c] : *m) {
          bool ready;
          {
            std::lock_guard lock(mu_);
            ready = c->ready;
          }
          if (!ready) {
            if (c->dead) {
              // Its last writes (an ERROR, a part under way) may not finish
              // against a peer that stopped reading: close it anyway, so the
              // parts fail and nothing waits on them for ever.
              if (c->writing && c->sock && c->sock->is_open() && now - c->dead_at > opt_.peer_timeout) Close(*c);
              continue;
            }
            if (c->outbound) {
              // A peer that accepts but never answers HELLO: give up on
              // this attempt (its handler then retries, or fails the
              // connection past its deadline).
              if (c->sock && (now > c->deadline || now > c->attempt_deadline)) Close(*c);
            } else if (c->lost && now - c->lost_at > opt_.reconnect_timeout) {
              // Senders time out on their side too.
              Fail(*c, c->lost_why + ", and it did not connect again within " + Seconds(opt_.reconnect_timeout) +
                           ": is its sidecar running?");
            } else if (!c->connected_once && now > started_ + opt_.connect_timeout) {
              // A sender that never shows up is reported like one that
              // cannot be reached.
              Fail(*c, c->Name() + " has not connected for " + Seconds(opt_.connect_timeout) +
                           ": is its sidecar running, with the same peer list?");
            }
            continue;
          }
          if (now - c->last_rx > opt_.peer_timeout) {
            Lose(*c, "no word from " + c->Name() + " for " + Seconds(opt_.peer_timeout) +
                         ": it is stopped, dead or unreachable");
            continue;
          }
          if (c->wq.empty()) Queue(*c, {Frame(Type::kHeartbeat), {}, {}, nullptr});
        }
      }
      if (pending_.size() < kMaxPending / 2) flood_logged_ = false;
      // Connections that never said HELLO.
      std::vector<std::shared_ptr<Pending>> late;
      for (const auto& p : pending_) {
        if (now > p->deadline) late.push_back(p);
      }
      for (const auto& p : late) {
        boost::system::error_code ignored;
        p->sock.close(ignored);
        Forget(p);
      }
      // Sockets closed before the last tick: their aborted handlers have run.
      closed_.erase(closed_.begin(), closed_.begin() + static_cast<std::ptrdiff_t>(closed_before_));
      closed_before_ = closed_.size();
      Heartbeat();
    });
  }

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
  bool closing_ = false;                               // I/O thread: this exchange is stopping
  std::thread thread_;
  std::thread server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Ticket, StepState> steps_;
  Ticket last_ticket_ = 0;
  bool stopping_ = false;
  std::condition_variable serve_cv_;
  std::deque<std::pair<Conn*, int64_t>> serve_queue_;
  int64_t self_floor_ = 0;
  uint64_t restarts_ = 0;                // Restart() calls
  int64_t begun_through_ = -1;           // every step from self_floor_ through this was begun
  std::set<int64_t> begun_above_;        // and these
  int64_t done_through_ = -1;            // every step from self_floor_ through this has all its parts
  std::set<int64_t> done_above_;         // and these
  ExchangeCounters counters_;
};

Result<std::unique_ptr<PeerExchange>> PeerExchange::Create(ExchangeOptions options, std::vector<int64_t> send_to,
                                                           std::vector<int64_t> receive_from) {
  auto impl = std::make_unique<Impl>(std::move(options));
  MESHLOAD_RETURN_IF_ERROR(impl->Start(send_to, receive_from));
  return std::unique_ptr<PeerExchange>(new PeerExchange(std::move(impl)));
}

PeerExchange::PeerExchange(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerExchange::~PeerExchange() = default;
uint16_t PeerExchange::port() const { return impl_->port(); }
PeerExchange::Ticket PeerExchange::Begin(int64_t step) { return impl_->Begin(step); }
Status PeerExchange::Expect(Ticket t, std::vector<Part> incoming) { return impl_->Expect(t, std::move(incoming)); }
Status PeerExchange::Send(Ticket t, std::vector<Part> outgoing) { return impl_->Send(t, std::move(outgoing)); }
Status PeerExchange::Wait(Ticket t, const std::function<bool()>& cancelled) { return impl_->Wait(t, cancelled); }
void PeerExchange::Abandon(Ticket t) { impl_->Abandon(t); }
void PeerExchange::Restart(int64_t step) { impl_->Restart(step); }
ExchangeCounters PeerExchange::counters() const { return impl_->counters(); }

}  // namespace meshload::sidecar::exchange
