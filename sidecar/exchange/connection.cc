// Connection life on the I/O thread (PeerExchange::Impl; see
// peer_exchange_impl.h): accepting senders and their HELLO (and
// authentication), dialling receivers and retrying, losing a connection and
// waiting for the peer to come back, failing it for good, heartbeats, and
// the frames read and written on a connection. The frames are in
// wire_format.h, the handshake's checks and MACs in handshake.h.

#include <algorithm>
#include <cstdio>
#include <optional>

#include "common/logging.h"
#include "sidecar/exchange/peer_exchange_impl.h"

namespace meshload::sidecar::exchange {
namespace {

using internal::AuthFrame;
using internal::AuthPayload;
using internal::ChallengeFrame;
using internal::ErrorFrame;
using internal::HasMagic;
using internal::HeartbeatFrame;
using internal::HelloFrame;
using internal::HelloIds;
using internal::HelloOkFrame;
using internal::IsFrame;
using internal::kMaxErrorText;
using internal::kMaxPending;
using internal::MakeNonce;
using internal::Nonce;
using internal::ResetFrame;

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// One dial and handshake may not take the whole deadline: a dial to a
// replaced pod's old address can hang until the kernel gives up (minutes);
// the next attempt looks the address up again.
std::chrono::milliseconds AttemptTimeout(const ExchangeOptions& o) {
  return std::min<std::chrono::milliseconds>(o.peer_timeout, std::chrono::seconds(10));
}

}  // namespace

void PeerExchange::Impl::StartAccept() {
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
    p->deadline = clock_->Now() + opt_.peer_timeout;
    pending_.push_back(p);
    asio::async_read(p->sock, asio::buffer(&p->rx, sizeof p->rx),
                     [this, p](boost::system::error_code e, size_t) { OnHello(p, e); });
    StartAccept();
  });
}

void PeerExchange::Impl::Refuse(const std::shared_ptr<Pending>& p, const std::string& why) {
  LogWarn("refused a peer connection", {{"reason", why}});
  auto text = std::make_shared<std::string>(why);
  auto h = std::make_shared<Header>(ErrorFrame(text->size()));
  std::vector<asio::const_buffer> bufs{asio::buffer(h.get(), sizeof *h), asio::buffer(*text)};
  asio::async_write(p->sock, bufs, [this, p, h, text](boost::system::error_code, size_t) {
    boost::system::error_code ignored;
    p->sock.shutdown(tcp::socket::shutdown_both, ignored);
    p->sock.close(ignored);
    Forget(p);
  });
}

void PeerExchange::Impl::Forget(const std::shared_ptr<Pending>& p) {
  pending_.erase(std::remove(pending_.begin(), pending_.end(), p), pending_.end());
}

void PeerExchange::Impl::OnHello(const std::shared_ptr<Pending>& p, boost::system::error_code ec) {
  if (ec) {
    Forget(p);
    return;
  }
  const Header& h = p->rx;
  if (const std::string why = internal::HelloFrameProblem(h); !why.empty()) {
    Refuse(p, why);
    return;
  }
  if (const std::string why = internal::AddresseeProblem(h, opt_.process, in_.count(h.from_process()) > 0);
      !why.empty()) {
    Refuse(p, why);
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
  auto challenge = std::make_shared<Header>(ChallengeFrame());
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
      if (!IsFrame(p->rx, Type::kAuth) || p->rx.payload_bytes() != p->auth.size()) {
        Refuse(p, "this sidecar requires peer authentication: process " + std::to_string(p->hello.from_process()) +
                      " must run with the same --peer-secret-file");
        return;
      }
      asio::async_read(p->sock, asio::buffer(p->auth), [this, p](boost::system::error_code r, size_t) {
        if (r) {
          Forget(p);
          return;
        }
        if (!internal::CheckAuth(opt_.secret, p->nonce, HelloIds::Of(p->hello), p->auth)) {
          // Refused, and nothing else: an impostor must not cost the real
          // peer its connection.
          Refuse(p, "peer authentication failed for a connection claiming to be process " +
                        std::to_string(p->hello.from_process()) + ": its --peer-secret-file differs");
          return;
        }
        Admit(p);
      });
    });
  });
}

// A sender that passed the checks (and authenticated): the job's
// fingerprint, then the connection replaces any earlier one.
void PeerExchange::Impl::Admit(const std::shared_ptr<Pending>& p) {
  if (closing_) {
    // Stopping: the sender is told so (BYE), as the connections already
    // open are, and waits for this process or its replacement.
    auto bye = std::make_shared<Header>(internal::ByeFrame());
    asio::async_write(p->sock, asio::buffer(bye.get(), sizeof *bye), [this, p, bye](boost::system::error_code, size_t) {
      boost::system::error_code ignored;
      p->sock.shutdown(tcp::socket::shutdown_both, ignored);
      p->sock.close(ignored);
      Forget(p);
    });
    return;
  }
  const Header& h = p->hello;
  Conn& c = Sender(h.from_process());
  if (const std::string why = internal::JobProblem(h, opt_.fingerprint); !why.empty()) {
    Refuse(p, why);
    Fail(c, why);
    return;
  }
  const std::string failed = book_.Failed(c.link);
  const bool was_ready = book_.Ready(c.link);
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
  c.last_rx = clock_->Now();
  MarkConnected(c, "receive");
  if (opt_.secret.empty()) {
    Queue(c, {HelloOkFrame(), {}, {}, nullptr});
  } else {
    // Proves this side holds the secret too (over the sender's nonce).
    auto proof = std::make_shared<internal::Mac>(internal::HelloOkProof(opt_.secret, p->auth, HelloIds::Of(h)));
    WriteItem w{HelloOkFrame(proof->size()), {asio::buffer(*proof)}, {}, [proof](bool) {}};
    Queue(c, std::move(w));
  }
  const int64_t floor = book_.Floor();
  Queue(c, {ResetFrame(floor), {}, {}, nullptr});
  SayWhatIsHad(c);
  SendCredits();
  ReadFrame(c);
}

void PeerExchange::Impl::Connect(Conn& c) {
  DropSocket(c);
  c.closed_why.clear();
  const uint64_t g = c.gen;
  c.attempt_deadline = clock_->Now() + AttemptTimeout(opt_);
  PeerAddress addr = c.Addr();
  if (c.dialled && opt_.address_of) {
    // A peer whose pod was replaced comes back at another address (or was
    // replaced before the first connection: its first address is stale).
    if (std::optional<PeerAddress> now = opt_.address_of(c.peer);
        now && !now->host.empty() && now->port != 0 && (now->host != addr.host || now->port != addr.port)) {
      LogInfo(c.lost ? "a lost peer has a new address" : "a peer not reached yet has a new address",
              {{"peer", c.Name()}, {"address", now->ToString()}});
      addr = *now;
      MutexLock lock(c.addr_mu);
      c.addr = addr;
    }
  }
  c.dialled = true;
  c.resolver = std::make_unique<tcp::resolver>(io_);
  c.resolver->async_resolve(
      addr.host, std::to_string(addr.port),
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
          c.last_rx = clock_->Now();
          auto h = std::make_shared<Header>(HelloFrame(opt_.process, c.peer, opt_.fingerprint));
          asio::async_write(*c.sock, asio::buffer(h.get(), sizeof *h),
                            [this, &c, g, h](boost::system::error_code we, size_t) {
                              if (g != c.gen) return;
                              if (we) {
                                Retry(c, we.message());
                                return;
                              }
                              asio::async_read(*c.sock, asio::buffer(&c.rx, sizeof c.rx),
                                               [this, &c, g](boost::system::error_code re, size_t) {
                                                 if (g != c.gen) return;
                                                 if (re) {
                                                   Retry(c, re.message());
                                                   return;
                                                 }
                                                 if (IsFrame(c.rx, Type::kChallenge)) {
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
void PeerExchange::Impl::Authenticate(Conn& c, uint64_t g) {
  if (opt_.secret.empty()) {
    Fail(c, c.Name() +
                " requires peer authentication (its sidecar has --peer-secret-file): give this "
                "sidecar the same secret");
    return;
  }
  if (c.rx.payload_bytes() != internal::kNonceBytes) {
    Fail(c, c.Name() + " sent a CHALLENGE of " + std::to_string(c.rx.payload_bytes()) + " bytes (protocol error)");
    return;
  }
  c.scratch.resize(internal::kNonceBytes);
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
    auto auth = std::make_shared<AuthPayload>(
        internal::MakeAuth(opt_.secret, c.scratch.data(), *mine, HelloIds{opt_.process, c.peer, opt_.fingerprint}));
    auto h = std::make_shared<Header>(AuthFrame());
    std::vector<asio::const_buffer> out{asio::buffer(h.get(), sizeof *h), asio::buffer(*auth)};
    asio::async_write(*c.sock, out, [this, &c, g, h, auth, mine](boost::system::error_code we, size_t) {
      if (g != c.gen) return;
      if (we) {
        Retry(c, we.message());
        return;
      }
      asio::async_read(*c.sock, asio::buffer(&c.rx, sizeof c.rx),
                       [this, &c, g, mine](boost::system::error_code re, size_t) {
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
void PeerExchange::Impl::OnHelloOk(Conn& c, uint64_t g, std::shared_ptr<Nonce> nonce) {
  if (IsFrame(c.rx, Type::kError)) {
    OnFrame(c);  // reads the text and fails the connection
    return;
  }
  if (IsFrame(c.rx, Type::kBye)) {
    // A peer that is stopping (its pod being deleted) answers BYE: it, or
    // its replacement, may come back; dialled again until the deadline.
    Retry(c, c.Name() + " is stopping");
    return;
  }
  if (!HasMagic(c.rx)) {
    // Not a sidecar at all: the address (a pod IP the controller
    // published) is someone else's for now, or not yet routed to the pod;
    // a pod replaced or still starting comes up there, or the controller
    // publishes its new address. Dialled again until the deadline.
    Retry(c, c.Name() + " answered HELLO with bytes that are not meshload's peer protocol (another program at " +
                 "that address?)");
    return;
  }
  if (!IsFrame(c.rx, Type::kHelloOk)) {
    Fail(c, c.Name() + " answered HELLO with something else than HELLO_OK");
    return;
  }
  if (opt_.secret.empty()) {
    if (c.rx.payload_bytes() != 0) {
      Fail(c, c.Name() + " answered HELLO with a HELLO_OK of " + std::to_string(c.rx.payload_bytes()) +
                  " bytes (protocol error)");
      return;
    }
    Sending(c);
    return;
  }
  if (!nonce || c.rx.payload_bytes() != internal::kMacBytes) {
    Fail(c, c.Name() +
                " does not authenticate (its sidecar runs without --peer-secret-file): this sidecar "
                "sends samples only to peers that hold the job's secret");
    return;
  }
  c.scratch.resize(internal::kMacBytes);
  asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g, nonce](boost::system::error_code ec, size_t) {
    if (g != c.gen) return;
    if (ec) {
      Retry(c, ec.message());
      return;
    }
    if (!internal::CheckHelloOkProof(opt_.secret, *nonce, HelloIds{opt_.process, c.peer, opt_.fingerprint},
                                     c.scratch.data())) {
      Fail(c, c.Name() + " failed peer authentication: its --peer-secret-file differs");
      return;
    }
    Sending(c);
  });
}

// An outbound connection is up: read the receiver's frames, send what it
// has credited.
void PeerExchange::Impl::Sending(Conn& c) {
  MarkConnected(c, "send");
  ReadFrame(c);
  Dispatch(c);
}

void PeerExchange::Impl::Retry(Conn& c, const std::string& error) {
  DropSocket(c);
  // An attempt this side gave up on (closed at its deadline) fails with the
  // closed socket's error: say why it was closed, and keep what the
  // attempts before it ran into, which says more.
  std::string why = error;
  if (!c.closed_why.empty()) {
    why = c.retry_why.empty() ? c.closed_why : c.retry_why + " (the last attempt: " + c.closed_why + ")";
    c.closed_why.clear();
  } else {
    c.retry_why = error;
  }
  if (clock_->Now() >= c.deadline) {
    Fail(c, c.lost ? c.lost_why + ", and it could not be reached again within " + Seconds(opt_.reconnect_timeout) +
                         ": " + why
                   : "cannot connect to " + c.Name() + " for " + Seconds(opt_.connect_timeout) + ": " + why);
    return;
  }
  c.retry = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(200));
  c.retry->async_wait([this, &c](boost::system::error_code ec) {
    if (!ec && !c.dead) Connect(c);
  });
}

// A connection (the first, or one after a loss) has said HELLO / HELLO_OK.
void PeerExchange::Impl::MarkConnected(Conn& c, const char* direction) {
  const bool again = c.connected_once;
  const double down = c.lost ? std::chrono::duration<double>(clock_->Now() - c.lost_at).count() : 0.0;
  c.connected_once = true;
  c.lost = false;
  c.retry_why.clear();
  book_.LinkUp(c.link, again);
  if (again) {
    LogInfo("peer reconnected", {{"peer", c.Name()}, {"direction", direction}, {"seconds_lost", down}});
  } else {
    LogInfo("peer connected", {{"peer", c.Name()}, {"direction", direction}});
  }
}

// Closes the connection's socket (its pending operations end without
// touching a buffer again, and their handlers find the generation changed)
// and drops what was queued on it.
void PeerExchange::Impl::DropSocket(Conn& c) {
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
void PeerExchange::Impl::Lose(Conn& c, const std::string& why) {
  if (c.dead) {
    DropSocket(c);
    return;
  }
  if (closing_ || opt_.reconnect_timeout.count() <= 0) {
    Fail(c, why, closing_);
    return;
  }
  DropSocket(c);
  if (!c.lost) {
    c.lost = true;
    c.lost_at = clock_->Now();
    c.lost_why = why;
    LogWarn("lost a peer; waiting for it to come back",
            {{"peer", c.Name()}, {"reason", why}, {"seconds", Seconds(opt_.reconnect_timeout)}});
  }
  // The link goes down after lost_at is set: whoever sees it down (the
  // counters' peers_connected) knows the reconnect timeout has begun.
  book_.LinkLost(c.link);
  if (c.outbound) {
    c.deadline = c.lost_at + opt_.reconnect_timeout;
    c.retry = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(200));
    c.retry->async_wait([this, &c](boost::system::error_code ec) {
      if (!ec && !c.dead) Connect(c);
    });
  }
}

// The connection is dead: every part that needs it fails, with `why`.
void PeerExchange::Impl::Fail(Conn& c, const std::string& why, bool quiet) {
  if (!book_.LinkFailed(c.link, why)) return;
  if (quiet || closing_) {
    LogInfo("peer connection closed", {{"peer", c.Name()}, {"reason", why}});
  } else {
    LogError("peer connection failed", {{"peer", c.Name()}, {"error", why}});
  }
  c.dead = true;
  c.dead_at = clock_->Now();
  if (c.retry) c.retry->cancel();
  // Writes still queued (an ERROR for the peer) go out first; the socket
  // closes when the queue is done (WriteNext), and at once when idle.
  if (!c.writing) Close(c);
}

void PeerExchange::Impl::Close(Conn& c) {
  if (!c.sock) return;
  boost::system::error_code ignored;
  c.sock->shutdown(tcp::socket::shutdown_both, ignored);
  c.sock->close(ignored);
}

void PeerExchange::Impl::Heartbeat() {
  heartbeat_.expires_after(opt_.heartbeat);
  heartbeat_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    const auto now = clock_->Now();
    for (auto* m : {&in_, &out_}) {
      for (auto& [p, c] : *m) {
        if (!book_.Ready(c->link)) {
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
            if (c->sock && (now > c->deadline || now > c->attempt_deadline)) {
              c->closed_why = now > c->attempt_deadline ? "no answer within " + Seconds(AttemptTimeout(opt_))
                                                        : "no answer before the deadline";
              Close(*c);
            }
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
        if (c->wq.empty()) Queue(*c, {HeartbeatFrame(), {}, {}, nullptr});
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

void PeerExchange::Impl::ReadFrame(Conn& c) {
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

void PeerExchange::Impl::OnFrame(Conn& c) {
  c.last_rx = clock_->Now();
  const Header h = c.rx;
  if (!HasMagic(h)) {
    Fail(c, c.Name() + " sent a frame without the meshload peer magic (protocol error)");
    return;
  }
  const Type t = internal::TypeOf(h);
  if (t == Type::kHeartbeat) {
    ReadFrame(c);
  } else if (t == Type::kBye) {
    Lose(c, c.Name() + " stopped");
  } else if (t == Type::kError) {
    if (h.payload_bytes() > kMaxErrorText) {
      Fail(c, c.Name() + " sent an error of " + std::to_string(h.payload_bytes()) + " bytes (protocol error)");
      return;
    }
    c.scratch.resize(h.payload_bytes());
    const uint64_t g = c.gen;
    asio::async_read(*c.sock, asio::buffer(c.scratch), [this, &c, g](boost::system::error_code ec, size_t) {
      if (g != c.gen) return;
      if (ec) {
        Lose(c, "lost the connection to " + c.Name() + ": " + ec.message());
      } else {
        Fail(c, c.Name() + " reported: " + std::string(c.scratch.begin(), c.scratch.end()));
      }
    });
  } else if (c.outbound && (t == Type::kCredit || t == Type::kReset || t == Type::kHaveThrough || t == Type::kHave)) {
    OnCreditFrame(c, t, h);
    ReadFrame(c);
  } else if (!c.outbound && t == Type::kData) {
    OnData(c, h);
  } else {
    Fail(c, c.Name() + " sent an unexpected frame of type " + std::to_string(h.type) + " (protocol error)");
  }
}

void PeerExchange::Impl::Queue(Conn& c, WriteItem w) {
  if (!c.sock || !c.sock->is_open() || (c.dead && internal::TypeOf(w.h) != Type::kError)) {
    if (w.done) w.done(false);
    return;
  }
  c.wq.push_back(std::move(w));
  if (!c.writing) WriteNext(c);
}

void PeerExchange::Impl::WriteNext(Conn& c) {
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

void PeerExchange::Impl::SendError(Conn& c, const std::string& why) {
  WriteItem w{ErrorFrame(std::min<uint64_t>(why.size(), kMaxErrorText)), {}, why.substr(0, kMaxErrorText), nullptr};
  Queue(c, std::move(w));
}

}  // namespace meshload::sidecar::exchange
