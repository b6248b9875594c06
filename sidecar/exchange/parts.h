/// \file
/// What the peer exchange hands over and counts (Part, ExchangeCounters)
/// and how a staging of a step is named (Ticket): the vocabulary of
/// peer_exchange.h that its bookkeeping (step_table.h, transfer_book.h)
/// shares, so that neither needs the exchange's own header.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <vector>

namespace meshload::sidecar::exchange {

/// One staging of one step (PeerExchange::Begin); two may exist for a step
/// across a re-plan.
using Ticket = uint64_t;

/// One peer's share of a step: where its bytes come from or go, their size,
/// and the checksum of their sample ids (protocol::SampleIdsChecksum), which both
/// sides compute from their own plan.
struct Part {
  int64_t peer = 0;
  std::vector<iovec> iov;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

struct ExchangeCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t parts_sent = 0;
  uint64_t parts_received = 0;
  uint64_t parts_skipped = 0;     // dropped: the receiver moved past them, or had them already
  uint64_t parts_served = 0;      // read again on demand (see above)
  uint64_t serves_unsent = 0;     // read again, but the receiver's connection dropped first (it asks again)
  uint64_t credits_received = 0;  // CREDITs from receivers: parts asked for
  uint64_t reconnects = 0;        // connections re-established after a loss
  int peers_connected = 0;
};

}  // namespace meshload::sidecar::exchange
