/// \file
/// The peer exchange's transfer bookkeeping: the step table (every staging
/// and the state of each of its parts), what each link to a peer knows of
/// the other side (credits, what was sent, what the receiver has, whether
/// the link is up or failed for good), the parts to serve again from
/// storage, and the counters. Internal to the exchange; the connections
/// (PeerExchange::Impl, peer_exchange_impl.h) do the I/O and tell the book
/// what happened, and the staging threads wait on it.
///
/// A link is one direction to one peer: an inbound one (the peer sends to
/// this process) or an outbound one (this process sends to it), numbered
/// by AddLink before any other thread runs.
///
/// Thread safety: thread-safe. One mutex (mu_) guards everything below it
/// and is never held while calling out, but for the namer, which takes the
/// connections' address locks (the order is mu_, then an address lock).
/// A PartState* handed out stays valid until its ticket is closed, which
/// Abandon and Wait do only once no part of it is kBusy.
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sidecar/exchange/parts.h"
#include "sidecar/exchange/step_table.h"
#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange::internal {

inline constexpr size_t kSentMemory = 1 << 16;  // steps remembered per receiver, to refuse a second credit

class TransferBook {
 public:
  using Ticket = exchange::Ticket;
  /// A link's name in messages: "process 3 (10.0.0.3:7441)".
  using Namer = std::function<std::string(size_t link)>;

  /// A step that waits on its peers longer than `stall_report_after` on
  /// `clock` is logged (once).
  TransferBook(int64_t first_step, std::chrono::milliseconds stall_report_after, Clock* clock);

  // ---- set-up, before any other thread runs ----

  /// The link to (outbound) or from `peer`; the same one when asked twice.
  size_t AddLink(int64_t peer, bool outbound) MESHLOAD_EXCLUDES(mu_);
  void SetNamer(Namer namer) { name_ = std::move(namer); }
  /// The inbound (sender) or outbound (receiver) link of `peer`. The plan's
  /// transfers are between this process's links: another peer is a bug (it
  /// aborts, naming it).
  size_t SenderLink(int64_t peer) const { return LinkOf(senders_, peer, "a sender"); }
  size_t ReceiverLink(int64_t peer) const { return LinkOf(receivers_, peer, "a receiver"); }

  // ---- the staging threads ----

  Ticket Begin(int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// Registers the parts the step's senders will send.
  void Expect(Ticket t, std::vector<Part> incoming) MESHLOAD_EXCLUDES(mu_);
  /// Registers this process's parts; the outbound links to dispatch.
  std::vector<size_t> Send(Ticket t, std::vector<Part> outgoing) MESHLOAD_EXCLUDES(mu_);
  Status Wait(Ticket t, const std::function<bool()>& cancelled) MESHLOAD_EXCLUDES(mu_);
  void Abandon(Ticket t) MESHLOAD_EXCLUDES(mu_);
  void Restart(int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// The counters, and how many links are up.
  ExchangeCounters counters() const MESHLOAD_EXCLUDES(mu_);

  // ---- the I/O thread: links up and down ----

  bool Ready(size_t link) const MESHLOAD_EXCLUDES(mu_);
  /// "" while the link has not failed for good; else why.
  std::string Failed(size_t link) const MESHLOAD_EXCLUDES(mu_);
  /// The re-plan point: the step this process stages from.
  int64_t Floor() const MESHLOAD_EXCLUDES(mu_);
  /// The link said HELLO (again: a reconnect, counted; an outbound link
  /// then forgets what the receiver had: it may be a new one).
  void LinkUp(size_t link, bool again) MESHLOAD_EXCLUDES(mu_);
  /// The link dropped and the peer may come back: its credits go, and its
  /// parts under way wait again.
  void LinkLost(size_t link) MESHLOAD_EXCLUDES(mu_);
  /// The link is dead: every part waiting on it fails with `why`. False
  /// when it had failed already.
  bool LinkFailed(size_t link, const std::string& why) MESHLOAD_EXCLUDES(mu_);
  /// What this process has from sender `peer` (HAVE_THROUGH, HAVE).
  StepTable::Had HadFrom(int64_t peer) const MESHLOAD_EXCLUDES(mu_);

  // ---- the I/O thread: credits and data ----

  /// A receiver's CREDIT, RESET, HAVE_THROUGH or HAVE on outbound `link`.
  void OnCredit(size_t link, Type type, int64_t step) MESHLOAD_EXCLUDES(mu_);
  /// The (inbound link, step) pairs to CREDIT now: every registered
  /// incoming part whose sender is up and that was not credited yet (those
  /// whose sender failed fail).
  std::vector<std::pair<size_t, int64_t>> TakeCredits() MESHLOAD_EXCLUDES(mu_);
  /// DATA for `step` on inbound `link`: the part it fills (now kBusy), or
  /// none (a step this process abandoned; or `mismatch` says how the
  /// header differs from the plan, and the step failed).
  struct Claim {
    PartState* part = nullptr;
    std::string mismatch;
  };
  Claim ClaimIncoming(size_t link, int64_t step, uint64_t bytes, uint64_t checksum) MESHLOAD_EXCLUDES(mu_);
  /// A claimed part was read (`ok`), or its connection broke half-way (it
  /// is asked for again).
  void IncomingDone(PartState* part, bool ok) MESHLOAD_EXCLUDES(mu_);
  /// The parts to write on outbound `link` now (each kBusy, counted as
  /// sent); parts the receiver moved past or had are dropped, and credits
  /// this process's pipeline will not meet go to the serving queue.
  std::vector<std::pair<int64_t, PartState*>> TakeOutgoing(size_t link) MESHLOAD_EXCLUDES(mu_);
  /// A part from TakeOutgoing was written (`ok`), or not delivered: it
  /// waits for a credit again, or fails with its link.
  void OutgoingDone(size_t link, PartState* part, int64_t step, bool ok) MESHLOAD_EXCLUDES(mu_);

  // ---- the serving thread ----

  /// The next (outbound link, step) to read again and send; blocks; none
  /// once Stop() ran.
  std::optional<std::pair<size_t, int64_t>> NextToServe() MESHLOAD_EXCLUDES(mu_);
  /// A part served again was written (`ok`), or its receiver's connection
  /// dropped before it went out: counted either way.
  void Served(uint64_t bytes, bool ok) MESHLOAD_EXCLUDES(mu_);
  void Stop() MESHLOAD_EXCLUDES(mu_);

 private:
  // What the book knows of one link.
  struct Link {
    int64_t peer = 0;
    bool outbound = false;
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

  static size_t LinkOf(const std::map<int64_t, size_t>& links, int64_t peer, const char* what);
  // An outbound link's `step` counts as sent (its sent, sent_order).
  static void MarkSent(Link& l, int64_t step);
  // The parts of `l`'s peer and direction in step `st`.
  static std::vector<PartState>& PartsOf(const Link& l, StepState& st) { return l.outbound ? st.out : st.in; }

  const std::chrono::milliseconds stall_report_after_;
  Clock* const clock_;
  // Fixed after set-up (AddLink, SetNamer): read without the lock.
  std::map<int64_t, size_t> senders_, receivers_;
  Namer name_;

  mutable Mutex mu_;
  CondVar cv_;  // a part's state changed (and Restart)
  StepTable table_ MESHLOAD_GUARDED_BY(mu_);
  std::vector<Link> links_ MESHLOAD_GUARDED_BY(mu_);
  bool stopping_ MESHLOAD_GUARDED_BY(mu_) = false;
  CondVar serve_cv_;
  std::deque<std::pair<size_t, int64_t>> serve_queue_ MESHLOAD_GUARDED_BY(mu_);
  ExchangeCounters counters_ MESHLOAD_GUARDED_BY(mu_);
};

}  // namespace meshload::sidecar::exchange::internal
