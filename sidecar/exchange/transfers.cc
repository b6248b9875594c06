// Credit flow and data on the I/O thread (PeerExchange::Impl; see
// peer_exchange_impl.h and the header's "Flow control"): a receiver's
// RESET, HAVE and CREDIT frames, the sender's dispatch of credited parts as
// DATA, the receiver's scatter read of DATA into the credited places, and
// the serving thread, which reads again the parts this process's pipeline
// has passed.

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
using internal::kSentMemory;

}  // namespace

// A (re)connected sender may stage steps this process already has from it
// (a restarted sender starts again at its trainer's step): it is told, so
// it does not wait for credits that will not come. Advisory: a step
// reported here and asked for later is served on demand.
void PeerExchange::Impl::SayWhatIsHad(Conn& c) {
  internal::StepTable::Had had;
  {
    MutexLock lock(mu_);
    had = table_.HadFrom(c.peer);
  }
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
  {
    MutexLock lock(mu_);
    ConnShared& s = Shared(c);
    if (t == Type::kCredit) {
      if (h.step() >= s.floor) {
        s.credited.insert(h.step());
        // Asked again for a step already delivered: it moved back.
        if (s.sent.erase(h.step())) s.again.insert(h.step());
      }
    } else if (t == Type::kReset) {
      s.floor = h.step();
      s.credited.erase(s.credited.begin(), s.credited.lower_bound(h.step()));
      // What the receiver had is what it had before it re-planned.
      s.have_through = INT64_MIN;
      s.have.clear();
    } else if (t == Type::kHaveThrough) {
      s.have_through = h.step();
    } else if (s.have.size() < kHaveMemory) {  // HAVE
      s.have.insert(h.step());
    }
  }
  Dispatch(c);
}

// Credits every registered incoming part whose sender is connected.
void PeerExchange::Impl::SendCredits() {
  std::vector<std::pair<Conn*, int64_t>> credits;
  {
    MutexLock lock(mu_);
    for (auto& [ticket, st] : table_) {
      for (PartState& p : st.in) {
        Conn& c = Sender(p.part.peer);
        if (p.status != PartStatus::kWaiting || p.credited) continue;
        const ConnShared& s = Shared(c);
        if (!s.failed.empty()) {
          p.status = PartStatus::kFailed;
          if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, s.failed);
          cv_.NotifyAll();
          continue;
        }
        if (!s.ready) continue;
        p.credited = true;
        credits.emplace_back(&c, st.step);
      }
    }
  }
  for (auto& [c, step] : credits) Queue(*c, {CreditFrame(step), {}, {}, nullptr});
}

void PeerExchange::Impl::OnData(Conn& c, const Header& h) {
  PartState* part = nullptr;
  std::string mismatch;
  {
    MutexLock lock(mu_);
    for (auto it = table_.begin(); part == nullptr && mismatch.empty() && it != table_.end(); ++it) {
      if (it->second.step != h.step()) continue;
      for (PartState& p : it->second.in) {
        if (p.part.peer != c.peer || p.status != PartStatus::kWaiting) continue;
        if (p.part.bytes != h.payload_bytes() || p.part.checksum != h.checksum()) {
          mismatch = c.Name() + " sent " + std::to_string(h.payload_bytes()) + " bytes for step " +
                     std::to_string(h.step()) + " (sample-id checksum " + std::to_string(h.checksum()) +
                     ") but this process's plan expects " + std::to_string(p.part.bytes) + " bytes (checksum " +
                     std::to_string(p.part.checksum) + "): the processes do not run the same plan";
          p.status = PartStatus::kFailed;
          if (it->second.error.ok()) it->second.error = DataLoss(mismatch);
          cv_.NotifyAll();
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
    Discard(c, h.payload_bytes());
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
  const uint64_t bytes = h.payload_bytes();
  asio::async_read(*c.sock, bufs, progress, [this, &c, g, part, bytes](boost::system::error_code ec, size_t) {
    // A dropped connection (Lose) has put the part back to waiting.
    if (g != c.gen) return;
    {
      MutexLock lock(mu_);
      // Failed half-way: the part is asked for again on the next connection.
      part->status = ec ? PartStatus::kWaiting : PartStatus::kDone;
      part->credited = false;
      if (!ec) {
        counters_.bytes_received += bytes;
        counters_.parts_received += 1;
      }
      cv_.NotifyAll();
    }
    if (ec) {
      Lose(c, "lost the connection to " + c.Name() + " while receiving: " + ec.message());
      return;
    }
    c.last_rx = Clock::now();
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
    c.last_rx = Clock::now();
    Discard(c, remaining - n);
  });
}

void PeerExchange::Impl::MarkSent(const Conn& c, int64_t step) {
  ConnShared& s = Shared(c);
  s.sent.insert(step);
  s.sent_order.push_back(step);
  if (s.sent_order.size() > kSentMemory) {
    s.sent.erase(s.sent_order.front());
    s.sent_order.pop_front();
  }
}

// Writes every part for this receiver that it has credited; drops those it
// has moved past or had already; hands credits this process's pipeline
// will not meet to the serving thread.
void PeerExchange::Impl::Dispatch(Conn& c) {
  std::vector<std::pair<int64_t, PartState*>> go;
  {
    MutexLock lock(mu_);
    ConnShared& s = Shared(c);
    for (auto& [ticket, st] : table_) {
      for (PartState& p : st.out) {
        if (p.part.peer != c.peer || p.status != PartStatus::kWaiting) continue;
        if (!s.failed.empty()) {
          p.status = PartStatus::kFailed;
          if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, s.failed);
          cv_.NotifyAll();
        } else if (st.step < s.floor || (s.sent.count(st.step) && !s.credited.count(st.step))) {
          p.status = PartStatus::kSkipped;
          counters_.parts_skipped += 1;
          cv_.NotifyAll();
        } else if (!s.credited.count(st.step) && (st.step <= s.have_through || s.have.count(st.step))) {
          // The receiver has it already (HAVE). Counted as sent, so that
          // a credit for it later is served on demand.
          p.status = PartStatus::kSkipped;
          counters_.parts_skipped += 1;
          MarkSent(c, st.step);
          cv_.NotifyAll();
        } else if (s.ready && s.credited.erase(st.step)) {
          p.status = PartStatus::kBusy;
          s.again.erase(st.step);
          MarkSent(c, st.step);
          go.emplace_back(st.step, &p);
        }
      }
    }
    if (s.ready && s.failed.empty()) {
      // Steps this process's pipeline is staging for this receiver now:
      // begun and not yet handed to Send (still being read here), or
      // with a part for it waiting or being written.
      const std::set<int64_t> held = table_.HeldFor(c.peer);
      for (auto it = s.credited.begin(); it != s.credited.end();) {
        const int64_t step = *it;
        // Passed: behind this process's re-plan point, or begun (with
        // every step before it) and sent or skipped already, or asked
        // for again.
        const bool passed = table_.Passed(step, held);
        if (passed || s.again.count(step)) {
          it = s.credited.erase(it);
          s.again.erase(step);
          MarkSent(c, step);
          serve_queue_.emplace_back(&c, step);
          serve_cv_.NotifyOne();
        } else {
          ++it;
        }
      }
    }
  }
  for (auto& [step, p] : go) {
    WriteItem w{DataFrame(step, p->part.bytes, p->part.checksum), {}, {}, nullptr};
    w.payload.reserve(p->part.iov.size());
    for (const iovec& v : p->part.iov) w.payload.emplace_back(v.iov_base, v.iov_len);
    w.done = [this, &c, p = p, step = step](bool ok) {
      MutexLock lock(mu_);
      if (ok) {
        p->status = PartStatus::kDone;
        counters_.bytes_sent += p->part.bytes;
        counters_.parts_sent += 1;
      } else if (p->status == PartStatus::kBusy) {
        // Not delivered. A lost connection sends it again when the
        // receiver, connected again, credits it; a failed one fails it.
        ConnShared& s = Shared(c);
        p->status = s.failed.empty() ? PartStatus::kWaiting : PartStatus::kFailed;
        if (s.failed.empty()) s.sent.erase(step);
      }
      cv_.NotifyAll();
    };
    Queue(c, std::move(w));
  }
}

// The serving thread: reads parts again on demand (see the header).
void PeerExchange::Impl::ServeMain() {
  ::pthread_setname_np(::pthread_self(), "ml-peer-serve");
  MutexLock lock(mu_);
  while (true) {
    while (!stopping_ && serve_queue_.empty()) serve_cv_.Wait(mu_);
    if (stopping_) return;
    // Not a structured binding: the lambda below captures them, which
    // clang before 16 does not accept.
    Conn* const c = serve_queue_.front().first;
    const int64_t step = serve_queue_.front().second;
    serve_queue_.pop_front();
    lock.Unlock();
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
        MutexLock lock(mu_);
        if (!Shared(*c).ready) return;
      }
      if (!st.ok()) {
        const std::string why = "process " + std::to_string(opt_.process) + " cannot read its part of step " +
                                std::to_string(step) + " again: " + st.ToString();
        SendError(*c, why);
        Fail(*c, why);
        return;
      }
      WriteItem w{DataFrame(step, buf->size(), checksum), {asio::buffer(*buf)}, {}, nullptr};
      w.done = [this, buf](bool ok) {
        MutexLock lock(mu_);
        if (ok) {
          counters_.bytes_sent += buf->size();
          counters_.parts_served += 1;
        }
      };
      Queue(*c, std::move(w));
    });
    lock.Lock();
  }
}

}  // namespace meshload::sidecar::exchange
