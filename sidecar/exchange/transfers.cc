// Credit flow and data on the connections (PeerExchange::Impl; see
// peer_exchange_impl.h and the header's "Flow control"): a receiver's
// RESET, HAVE and CREDIT frames, the sender's dispatch of credited parts as
// DATA, the receiver's scatter read of DATA into the credited places, and
// the serving thread, which reads again the parts this process's pipeline
// has passed. What to credit, send or serve, and what arrived, is the
// transfer book's (transfer_book.h).

#include <pthread.h>

#include <algorithm>

#include "common/logging.h"
#include "sidecar/exchange/peer_exchange_impl.h"

namespace meshload::sidecar::exchange {
namespace {

using internal::CreditFrame;
using internal::DataFrame;
using internal::HaveFrame;
using internal::HaveThroughFrame;
using internal::kHaveMemory;
using internal::PartState;

}  // namespace

// A (re)connected sender may stage steps this process already has from it
// (a restarted sender starts again at its trainer's step): it is told, so
// it does not wait for credits that will not come. Advisory: a step
// reported here and asked for later is served on demand.
void PeerExchange::Impl::SayWhatIsHad(Conn& c) {
  const internal::StepTable::Had had = book_.HadFrom(c.peer);
  if (had.through >= had.floor) Queue(c, {HaveThroughFrame(had.through), {}, {}, nullptr});
  size_t n = 0;
  for (int64_t step : had.steps) {
    if (step <= had.through) continue;
    if (++n > kHaveMemory) break;
    Queue(c, {HaveFrame(step), {}, {}, nullptr});
  }
}

// A receiver's word on what it wants (outbound connections): CREDIT(t),
// RESET(r), HAVE_THROUGH(t), HAVE(t); then what is credited goes out.
void PeerExchange::Impl::OnCreditFrame(Conn& c, Type t, const Header& h) {
  book_.OnCredit(c.link, t, h.step());
  Dispatch(c);
}

// Credits every registered incoming part whose sender is connected.
void PeerExchange::Impl::SendCredits() {
  for (auto& [link, step] : book_.TakeCredits()) Queue(*by_link_[link], {CreditFrame(step), {}, {}, nullptr});
}

void PeerExchange::Impl::OnData(Conn& c, const Header& h) {
  const internal::TransferBook::Claim claim = book_.ClaimIncoming(c.link, h.step(), h.payload_bytes(), h.checksum());
  if (!claim.mismatch.empty()) LogError("peer data does not match the plan", {{"error", claim.mismatch}});
  PartState* const part = claim.part;
  if (part == nullptr) {
    // A step this process abandoned (or a mismatch): the bytes were sent
    // on credit and are read and dropped.
    Discard(c, h.payload_bytes());
    return;
  }
  std::vector<asio::mutable_buffer> bufs;
  bufs.reserve(part->part.iov.size());
  for (const iovec& v : part->part.iov) bufs.emplace_back(v.iov_base, v.iov_len);
  const uint64_t g = c.gen;
  // Bytes arriving count as word from the peer, so a part that takes
  // longer than --peer-timeout to arrive is not taken for silence.
  auto progress = [this, &c, g](const boost::system::error_code& ec, size_t) -> size_t {
    if (ec) return 0;
    if (g == c.gen) c.last_rx = clock_->Now();
    return 1 << 20;
  };
  asio::async_read(*c.sock, bufs, progress, [this, &c, g, part](boost::system::error_code ec, size_t) {
    // A dropped connection (Lose) has put the part back to waiting.
    if (g != c.gen) return;
    book_.IncomingDone(part, !ec);
    if (ec) {
      Lose(c, "lost the connection to " + c.Name() + " while receiving: " + ec.message());
      return;
    }
    c.last_rx = clock_->Now();
    ReadFrame(c);
  });
}

void PeerExchange::Impl::Discard(Conn& c, uint64_t remaining) {
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
    c.last_rx = clock_->Now();
    Discard(c, remaining - n);
  });
}

// Writes every part for this receiver that it has credited (the book
// drops those it has moved past or had already, and hands credits this
// process's pipeline will not meet to the serving thread).
void PeerExchange::Impl::Dispatch(Conn& c) {
  for (auto& [step, p] : book_.TakeOutgoing(c.link)) {
    WriteItem w{DataFrame(step, p->part.bytes, p->part.checksum), {}, {}, nullptr};
    w.payload.reserve(p->part.iov.size());
    for (const iovec& v : p->part.iov) w.payload.emplace_back(v.iov_base, v.iov_len);
    w.done = [this, link = c.link, p = p, step = step](bool ok) { book_.OutgoingDone(link, p, step, ok); };
    Queue(c, std::move(w));
  }
}

// The serving thread: reads parts again on demand (see the header).
void PeerExchange::Impl::ServeMain() {
  ::pthread_setname_np(::pthread_self(), "ml-peer-serve");
  while (std::optional<std::pair<size_t, int64_t>> next = book_.NextToServe()) {
    // Not a structured binding: the lambda below captures them, which
    // clang before 16 does not accept.
    Conn* const c = by_link_[next->first];
    const int64_t step = next->second;
    auto buf = std::make_shared<std::vector<uint8_t>>();
    uint64_t checksum = 0;
    Status st = opt_.serve ? opt_.serve(step, c->peer, *buf, checksum)
                           : Internal("no on-demand reader for step " + std::to_string(step));
    LogInfo("serving a peer's part again from storage",
            {{"step", step}, {"peer", c->Name()}, {"bytes", buf->size()}, {"ok", st.ok() ? "true" : "false"}});
    asio::post(io_, [this, c, step, buf, checksum, st] {
      // Lost meanwhile (perhaps reconnecting, not yet authenticated):
      // nothing goes out before the handshake; the receiver credits the
      // step again once it is back.
      if (!book_.Ready(c->link)) {
        book_.Served(buf->size(), /*ok=*/false);
        return;
      }
      if (!st.ok()) {
        const std::string why = "process " + std::to_string(opt_.process) + " cannot read its part of step " +
                                std::to_string(step) + " again: " + st.ToString();
        SendError(*c, why);
        Fail(*c, why);
        return;
      }
      WriteItem w{DataFrame(step, buf->size(), checksum), {asio::buffer(*buf)}, {}, nullptr};
      w.done = [this, buf](bool ok) { book_.Served(buf->size(), ok); };
      Queue(*c, std::move(w));
    });
  }
}

}  // namespace meshload::sidecar::exchange
