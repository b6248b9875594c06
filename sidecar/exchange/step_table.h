/// \file
/// The peer exchange's per-step bookkeeping: one StepState per ticket (a
/// staging of a step, PeerExchange::Begin) with the state of each of its
/// parts, and which steps this process has begun and finished since its
/// last re-plan (Restart). Internal to the exchange.
///
/// The sets "begun" and "done" are kept as every step from the re-plan
/// point (floor()) through a `through` step, and the steps above it: a
/// sender uses "begun" to tell which credits its pipeline has passed
/// (Passed: served on demand), a receiver uses "done" to tell a reconnected
/// sender which steps it has (HAVE_THROUGH, HAVE).
///
/// Thread safety: none of its own. The TransferBook (transfer_book.h) owns
/// the table and uses it only under its mutex (TransferBook::table_ is
/// MESHLOAD_GUARDED_BY(mu_)), which also guards the part states that the
/// I/O thread changes and the staging threads wait on; a reference to a
/// StepState stays valid until its ticket is erased.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "common/status.h"
#include "sidecar/exchange/parts.h"

namespace meshload::sidecar::exchange::internal {

enum class PartStatus { kWaiting, kBusy, kDone, kFailed, kSkipped };

struct PartState {
  Part part;
  PartStatus status = PartStatus::kWaiting;
  bool credited = false;  // incoming: CREDIT sent
};

struct StepState {
  int64_t step = 0;
  uint64_t generation = 0;  // restarts() at Begin
  std::vector<PartState> in, out;
  Status error;
  std::chrono::steady_clock::time_point since;  // Begin's time (the transfer book's clock)
  bool reported = false;
  bool sent = false;  // Send() ran: until then the step is being staged here (held)
};

class StepTable {
 public:
  using Ticket = exchange::Ticket;
  using Steps = std::map<Ticket, StepState>;

  /// This process stages from `first_step` on (its first RESET).
  explicit StepTable(int64_t first_step);

  /// A new staging of `step`: its ticket. The step counts as begun.
  Ticket Begin(int64_t step);
  /// The staging of ticket `t`, which must be open (a closed one is a bug:
  /// it aborts).
  StepState& at(Ticket t);
  /// nullptr when ticket `t` is closed.
  StepState* Find(Ticket t);
  /// Closes a ticket whose every part has arrived or been sent: its step
  /// counts as done, unless the staging was begun before the last Restart.
  void Finish(Ticket t);
  /// Closes a ticket without counting its step as done.
  void Erase(Ticket t) { steps_.erase(t); }

  /// This process now stages from `step` on (a re-plan): nothing is begun
  /// or done from there, and the stagings begun before no longer receive or
  /// send (Skip).
  void Restart(int64_t step);
  /// Parts not yet under way will not be: their staging is over.
  static void Skip(StepState& st);

  /// The re-plan point: the step this process stages from.
  int64_t floor() const { return floor_; }
  /// Restart() calls so far (a StepState's generation).
  uint64_t restarts() const { return restarts_; }

  Steps::iterator begin() { return steps_.begin(); }
  Steps::iterator end() { return steps_.end(); }
  Steps::const_iterator begin() const { return steps_.begin(); }
  Steps::const_iterator end() const { return steps_.end(); }

  /// What a receiver has from sender `peer` (for HAVE_THROUGH, HAVE): every
  /// step from `floor` through `through`, and `steps` (which may hold steps
  /// at or below `through` too: HAVE_THROUGH covers those). A step whose
  /// part from `peer` is still awaited is not had.
  struct Had {
    int64_t floor = 0;
    int64_t through = 0;
    std::set<int64_t> steps;
  };
  Had HadFrom(int64_t peer) const;

  /// The steps this process's pipeline is staging for receiver `peer` now:
  /// begun (since the last Restart) and not yet handed to Send (still being
  /// read here), or with a part for `peer` waiting or being written.
  std::set<int64_t> HeldFor(int64_t peer) const;
  /// Whether this process's pipeline has passed `step`: it is behind the
  /// re-plan point, or was begun (with every step before it) and is not
  /// `held` (HeldFor) any more: sent or skipped already.
  bool Passed(int64_t step, const std::set<int64_t>& held) const {
    return step < floor_ || (step <= begun_through_ && !held.count(step));
  }

 private:
  // Adds `step` to a set of steps kept as "every step from the re-plan
  // point through `through`, and `above`" (begun, or done).
  static void Mark(int64_t step, int64_t& through, std::set<int64_t>& above);

  Steps steps_;
  Ticket last_ticket_ = 0;
  int64_t floor_ = 0;
  uint64_t restarts_ = 0;          // Restart() calls
  int64_t begun_through_ = -1;     // every step from floor_ through this was begun
  std::set<int64_t> begun_above_;  // and these
  int64_t done_through_ = -1;      // every step from floor_ through this has all its parts
  std::set<int64_t> done_above_;   // and these
};

}  // namespace meshload::sidecar::exchange::internal
