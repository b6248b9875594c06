// A TCP socket listening on the loopback interface, for processes of one
// machine that a parent wires together (`meshload run --local` hands each
// local sidecar its peer socket open; the tests do the same).
#pragma once

#include <cstdint>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

namespace meshload {

/// A TCP socket listening on 127.0.0.1 at a port the kernel picks
/// (close-on-exec), and that port: handed to a sidecar open
/// (ExchangeOptions::listen_fd), so no port is ever raced for.
Result<std::pair<UniqueFd, uint16_t>> ListenLoopback();

}  // namespace meshload
