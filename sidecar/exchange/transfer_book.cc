#include "sidecar/exchange/transfer_book.h"

#include "common/logging.h"

namespace meshload::sidecar::exchange::internal {

TransferBook::TransferBook(int64_t first_step, std::chrono::milliseconds stall_report_after, Clock* clock)
    : stall_report_after_(stall_report_after), clock_(clock), table_(first_step) {}

size_t TransferBook::AddLink(int64_t peer, bool outbound) {
  auto& links = outbound ? receivers_ : senders_;
  if (auto it = links.find(peer); it != links.end()) return it->second;
  MutexLock lock(mu_);
  Link l;
  l.peer = peer;
  l.outbound = outbound;
  links_.push_back(std::move(l));
  links[peer] = links_.size() - 1;
  return links_.size() - 1;
}

size_t TransferBook::LinkOf(const std::map<int64_t, size_t>& links, int64_t peer, const char* what) {
  auto it = links.find(peer);
  MESHLOAD_CHECK(it != links.end(), "process " + std::to_string(peer) + " is not " + what + " of this process");
  return it->second;
}

// ---- the staging threads ----

TransferBook::Ticket TransferBook::Begin(int64_t step) {
  MutexLock lock(mu_);
  const Ticket t = table_.Begin(step);
  table_.at(t).since = clock_->Now();
  return t;
}

void TransferBook::Expect(Ticket t, std::vector<Part> incoming) {
  MutexLock lock(mu_);
  StepState& st = table_.at(t);
  for (Part& p : incoming) {
    (void)SenderLink(p.peer);  // the plan's senders are this process's
    st.in.push_back({std::move(p), PartStatus::kWaiting, false});
  }
}

std::vector<size_t> TransferBook::Send(Ticket t, std::vector<Part> outgoing) {
  std::vector<size_t> links;
  MutexLock lock(mu_);
  StepState& st = table_.at(t);
  st.sent = true;
  for (Part& p : outgoing) {
    links.push_back(ReceiverLink(p.peer));  // the plan's receivers are this process's
    st.out.push_back({std::move(p), PartStatus::kWaiting, false});
  }
  return links;
}

Status TransferBook::Wait(Ticket t, const std::function<bool()>& cancelled) {
  MutexLock lock(mu_);
  StepState& st = table_.at(t);
  while (true) {
    if (!st.error.ok()) return st.error;
    std::string pending;
    for (const PartState& p : st.in) {
      if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
        pending += (pending.empty() ? "" : ", ") + name_(SenderLink(p.part.peer)) + " has not sent its part";
      }
    }
    for (const PartState& p : st.out) {
      if (p.status == PartStatus::kWaiting || p.status == PartStatus::kBusy) {
        pending += (pending.empty() ? "" : ", ") + name_(ReceiverLink(p.part.peer)) +
                   (p.status == PartStatus::kWaiting ? " has not asked for its part" : " is receiving its part");
      }
    }
    if (pending.empty()) {
      table_.Finish(t);
      return Status::Ok();
    }
    if (cancelled && cancelled()) {
      return Status(StatusCode::kCancelled, "step " + std::to_string(st.step) + " abandoned");
    }
    if (!st.reported && clock_->Now() - st.since > stall_report_after_) {
      st.reported = true;
      LogWarn("a step waits on its peers", {{"step", st.step}, {"waiting_for", pending}});
    }
    cv_.WaitFor(mu_, std::chrono::milliseconds(100));
  }
}

void TransferBook::Abandon(Ticket t) {
  MutexLock lock(mu_);
  StepState* found = table_.Find(t);
  if (found == nullptr) return;
  StepState& st = *found;
  StepTable::Skip(st);
  // A part being written or read finishes (or fails with its connection)
  // before the memory it touches is given back.
  auto none_busy = [&]() MESHLOAD_REQUIRES(mu_) {
    for (const auto* v : {&st.in, &st.out}) {
      for (const PartState& p : *v) {
        if (p.status == PartStatus::kBusy) return false;
      }
    }
    return true;
  };
  while (!none_busy()) cv_.Wait(mu_);
  table_.Erase(t);
}

void TransferBook::Restart(int64_t step) {
  MutexLock lock(mu_);
  table_.Restart(step);
  cv_.NotifyAll();
}

ExchangeCounters TransferBook::counters() const {
  MutexLock lock(mu_);
  ExchangeCounters c = counters_;
  c.peers_connected = 0;
  for (const Link& l : links_) c.peers_connected += l.ready ? 1 : 0;
  return c;
}

// ---- the I/O thread: links up and down ----

bool TransferBook::Ready(size_t link) const {
  MutexLock lock(mu_);
  return links_[link].ready;
}

std::string TransferBook::Failed(size_t link) const {
  MutexLock lock(mu_);
  return links_[link].failed;
}

int64_t TransferBook::Floor() const {
  MutexLock lock(mu_);
  return table_.floor();
}

void TransferBook::LinkUp(size_t link, bool again) {
  MutexLock lock(mu_);
  Link& l = links_[link];
  l.ready = true;
  if (again) counters_.reconnects += 1;
  if (again && l.outbound) {
    // Perhaps a new receiver, which has none of it: it says what it has
    // (RESET, HAVE) and credits what it lacks.
    l.sent.clear();
    l.again.clear();
    l.sent_order.clear();
    l.have_through = INT64_MIN;
    l.have.clear();
  }
}

void TransferBook::LinkLost(size_t link) {
  MutexLock lock(mu_);
  Link& l = links_[link];
  l.ready = false;
  l.credited.clear();
  for (auto& [ticket, st] : table_) {
    for (PartState& p : PartsOf(l, st)) {
      if (p.part.peer != l.peer) continue;
      if (p.status == PartStatus::kBusy) {
        p.status = PartStatus::kWaiting;
        if (l.outbound) l.sent.erase(st.step);  // not delivered: send it again when credited
      }
      p.credited = false;
    }
  }
  cv_.NotifyAll();
}

bool TransferBook::LinkFailed(size_t link, const std::string& why) {
  MutexLock lock(mu_);
  Link& l = links_[link];
  if (!l.failed.empty()) return false;
  l.failed = why;
  l.ready = false;
  for (auto& [ticket, st] : table_) {
    for (PartState& p : PartsOf(l, st)) {
      if (p.part.peer != l.peer || p.status != PartStatus::kWaiting) continue;
      p.status = PartStatus::kFailed;
      if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, why);
    }
    // A part in flight fails in its own handler; the step's error is the
    // link's.
    for (PartState& p : PartsOf(l, st)) {
      if (p.part.peer == l.peer && p.status == PartStatus::kBusy && st.error.ok()) {
        st.error = Status(StatusCode::kUnavailable, why);
      }
    }
  }
  cv_.NotifyAll();
  return true;
}

StepTable::Had TransferBook::HadFrom(int64_t peer) const {
  MutexLock lock(mu_);
  return table_.HadFrom(peer);
}

// ---- the I/O thread: credits and data ----

void TransferBook::OnCredit(size_t link, Type type, int64_t step) {
  MutexLock lock(mu_);
  Link& l = links_[link];
  if (type == Type::kCredit) {
    counters_.credits_received += 1;
    if (step >= l.floor) {
      l.credited.insert(step);
      // Asked again for a step already delivered: it moved back.
      if (l.sent.erase(step)) l.again.insert(step);
    }
  } else if (type == Type::kReset) {
    l.floor = step;
    l.credited.erase(l.credited.begin(), l.credited.lower_bound(step));
    // What the receiver had is what it had before it re-planned.
    l.have_through = INT64_MIN;
    l.have.clear();
  } else if (type == Type::kHaveThrough) {
    l.have_through = step;
  } else if (l.have.size() < kHaveMemory) {  // HAVE
    l.have.insert(step);
  }
}

std::vector<std::pair<size_t, int64_t>> TransferBook::TakeCredits() {
  std::vector<std::pair<size_t, int64_t>> credits;
  MutexLock lock(mu_);
  for (auto& [ticket, st] : table_) {
    for (PartState& p : st.in) {
      const size_t link = SenderLink(p.part.peer);
      if (p.status != PartStatus::kWaiting || p.credited) continue;
      const Link& l = links_[link];
      if (!l.failed.empty()) {
        p.status = PartStatus::kFailed;
        if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, l.failed);
        cv_.NotifyAll();
        continue;
      }
      if (!l.ready) continue;
      p.credited = true;
      credits.emplace_back(link, st.step);
    }
  }
  return credits;
}

TransferBook::Claim TransferBook::ClaimIncoming(size_t link, int64_t step, uint64_t bytes, uint64_t checksum) {
  Claim claim;
  MutexLock lock(mu_);
  const int64_t peer = links_[link].peer;
  for (auto it = table_.begin(); claim.part == nullptr && claim.mismatch.empty() && it != table_.end(); ++it) {
    if (it->second.step != step) continue;
    for (PartState& p : it->second.in) {
      if (p.part.peer != peer || p.status != PartStatus::kWaiting) continue;
      if (p.part.bytes != bytes || p.part.checksum != checksum) {
        claim.mismatch = name_(link) + " sent " + std::to_string(bytes) + " bytes for step " + std::to_string(step) +
                         " (sample-id checksum " + std::to_string(checksum) + ") but this process's plan expects " +
                         std::to_string(p.part.bytes) + " bytes (checksum " + std::to_string(p.part.checksum) +
                         "): the processes do not run the same plan";
        p.status = PartStatus::kFailed;
        if (it->second.error.ok()) it->second.error = DataLoss(claim.mismatch);
        cv_.NotifyAll();
      } else {
        p.status = PartStatus::kBusy;
        claim.part = &p;
      }
      break;
    }
  }
  return claim;
}

void TransferBook::IncomingDone(PartState* part, bool ok) {
  MutexLock lock(mu_);
  // Failed half-way: the part is asked for again on the next connection.
  part->status = ok ? PartStatus::kDone : PartStatus::kWaiting;
  part->credited = false;
  if (ok) {
    counters_.bytes_received += part->part.bytes;
    counters_.parts_received += 1;
  }
  cv_.NotifyAll();
}

void TransferBook::MarkSent(Link& l, int64_t step) {
  l.sent.insert(step);
  l.sent_order.push_back(step);
  if (l.sent_order.size() > kSentMemory) {
    l.sent.erase(l.sent_order.front());
    l.sent_order.pop_front();
  }
}

std::vector<std::pair<int64_t, PartState*>> TransferBook::TakeOutgoing(size_t link) {
  std::vector<std::pair<int64_t, PartState*>> go;
  MutexLock lock(mu_);
  Link& l = links_[link];
  for (auto& [ticket, st] : table_) {
    for (PartState& p : st.out) {
      if (p.part.peer != l.peer || p.status != PartStatus::kWaiting) continue;
      if (!l.failed.empty()) {
        p.status = PartStatus::kFailed;
        if (st.error.ok()) st.error = Status(StatusCode::kUnavailable, l.failed);
        cv_.NotifyAll();
      } else if (st.step < l.floor || (l.sent.count(st.step) && !l.credited.count(st.step))) {
        p.status = PartStatus::kSkipped;
        counters_.parts_skipped += 1;
        cv_.NotifyAll();
      } else if (!l.credited.count(st.step) && (st.step <= l.have_through || l.have.count(st.step))) {
        // The receiver has it already (HAVE). Counted as sent, so that a
        // credit for it later is served on demand.
        p.status = PartStatus::kSkipped;
        counters_.parts_skipped += 1;
        MarkSent(l, st.step);
        cv_.NotifyAll();
      } else if (l.ready && l.credited.erase(st.step)) {
        p.status = PartStatus::kBusy;
        l.again.erase(st.step);
        MarkSent(l, st.step);
        go.emplace_back(st.step, &p);
      }
    }
  }
  if (l.ready && l.failed.empty()) {
    // Steps this process's pipeline is staging for this receiver now:
    // begun and not yet handed to Send (still being read here), or with a
    // part for it waiting or being written.
    const std::set<int64_t> held = table_.HeldFor(l.peer);
    for (auto it = l.credited.begin(); it != l.credited.end();) {
      const int64_t step = *it;
      // Passed: behind this process's re-plan point, or begun (with every
      // step before it) and sent or skipped already, or asked for again.
      if (table_.Passed(step, held) || l.again.count(step)) {
        it = l.credited.erase(it);
        l.again.erase(step);
        MarkSent(l, step);
        serve_queue_.emplace_back(link, step);
        serve_cv_.NotifyOne();
      } else {
        ++it;
      }
    }
  }
  return go;
}

void TransferBook::OutgoingDone(size_t link, PartState* part, int64_t step, bool ok) {
  MutexLock lock(mu_);
  if (ok) {
    part->status = PartStatus::kDone;
    counters_.bytes_sent += part->part.bytes;
    counters_.parts_sent += 1;
  } else if (part->status == PartStatus::kBusy) {
    // Not delivered. A lost link sends it again when the receiver,
    // connected again, credits it; a failed one fails it.
    Link& l = links_[link];
    part->status = l.failed.empty() ? PartStatus::kWaiting : PartStatus::kFailed;
    if (l.failed.empty()) l.sent.erase(step);
  }
  cv_.NotifyAll();
}

// ---- the serving thread ----

std::optional<std::pair<size_t, int64_t>> TransferBook::NextToServe() {
  MutexLock lock(mu_);
  while (!stopping_ && serve_queue_.empty()) serve_cv_.Wait(mu_);
  if (stopping_) return std::nullopt;
  auto next = serve_queue_.front();
  serve_queue_.pop_front();
  return next;
}

void TransferBook::Served(uint64_t bytes, bool ok) {
  MutexLock lock(mu_);
  if (!ok) {
    counters_.serves_unsent += 1;
    return;
  }
  counters_.bytes_sent += bytes;
  counters_.parts_served += 1;
}

void TransferBook::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  serve_cv_.NotifyAll();
}

}  // namespace meshload::sidecar::exchange::internal
