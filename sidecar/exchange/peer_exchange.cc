#include "sidecar/exchange/peer_exchange.h"

#include <pthread.h>

#include <algorithm>
#include <future>

#include "common/flags.h"
#include "common/logging.h"
#include "sidecar/exchange/peer_exchange_impl.h"

// The public interface and the staging threads' side of PeerExchange::Impl
// (peer_exchange_impl.h says where the rest is).

namespace meshload::sidecar::exchange {
namespace {

using internal::ByeFrame;
using internal::ResetFrame;

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
    if (a.host.empty() || !ParseInt64(port, &p) || p < 1 || p > 65535) {
      return InvalidArgument(where + ": expected HOST:PORT with a port in 1..65535");
    }
    a.port = static_cast<uint16_t>(p);
    out.push_back(std::move(a));
  }
  if (out.empty()) return InvalidArgument("the peer list is empty");
  return out;
}

PeerExchange::Impl::Impl(ExchangeOptions o)
    : opt_(std::move(o)),
      clock_(opt_.clock != nullptr ? opt_.clock : Clock::Real()),
      acceptor_(io_),
      heartbeat_(io_),
      accept_retry_(io_),
      book_(opt_.first_step, opt_.stall_report_after, clock_) {
  // Called under the book's lock; takes the connection's address lock.
  book_.SetNamer([this](size_t link) { return by_link_[link]->Name(); });
}

PeerExchange::Impl::~Impl() {
  book_.Stop();
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
          Queue(*c, {ByeFrame(), {}, {}, [said, left](bool) {
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

Status PeerExchange::Impl::Start(const std::vector<int64_t>& send_to, const std::vector<int64_t>& receive_from) {
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
    auto& conns = outbound ? out_ : in_;
    if (conns.count(p) != 0) return Status::Ok();  // listed twice: one connection serves both
    auto c = std::make_unique<Conn>();
    c->peer = p;
    c->outbound = outbound;
    {
      // No other thread runs yet: the locks are for the analysis.
      MutexLock lock(c->addr_mu);
      c->addr = opt_.peers[static_cast<size_t>(p)];
    }
    c->link = book_.AddLink(p, outbound);
    if (by_link_.size() <= c->link) by_link_.resize(c->link + 1);
    by_link_[c->link] = c.get();
    conns[p] = std::move(c);
    return Status::Ok();
  };
  for (int64_t p : send_to) MESHLOAD_RETURN_IF_ERROR(add(p, true));
  for (int64_t p : receive_from) MESHLOAD_RETURN_IF_ERROR(add(p, false));
  StartAccept();
  for (auto& [p, c] : out_) {
    c->deadline = clock_->Now() + opt_.connect_timeout;
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

Status PeerExchange::Impl::Expect(Ticket t, std::vector<Part> incoming) {
  book_.Expect(t, std::move(incoming));
  asio::post(io_, [this] { SendCredits(); });
  return Status::Ok();
}

Status PeerExchange::Impl::Send(Ticket t, std::vector<Part> outgoing) {
  std::vector<size_t> links = book_.Send(t, std::move(outgoing));
  asio::post(io_, [this, links] {
    for (size_t link : links) Dispatch(*by_link_[link]);
  });
  return Status::Ok();
}

void PeerExchange::Impl::Restart(int64_t step) {
  book_.Restart(step);
  asio::post(io_, [this, step] {
    for (auto& [p, c] : in_) {
      if (book_.Ready(c->link)) Queue(*c, {ResetFrame(step), {}, {}, nullptr});
    }
    // Credits held for steps this process will no longer stage are now
    // served on demand.
    for (auto& [p, c] : out_) Dispatch(*c);
  });
}

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
