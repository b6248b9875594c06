/// \file
/// Unix SOCK_SEQPACKET sockets for the handoff: listening with a file mode,
/// connecting, one message per datagram with file descriptors attached
/// (SCM_RIGHTS), and the peer's credentials (SO_PEERCRED).
///
/// Thread safety: functions on distinct fds are thread-safe; one fd must not
/// be used for sending (or receiving) from two threads at once.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace meshload::protocol {

/// Creates, binds and listens on a SOCK_SEQPACKET socket at `path` with
/// permissions `mode` (default 0660: the sidecar's user and group). A stale
/// socket file at `path` (nobody listening) is replaced; any other existing
/// file is an error naming it. The directory must exist.
Result<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode = 0660);

/// Connects to the socket at `path`.
Result<UniqueFd> ConnectSeqpacket(const std::string& path);

/// Accepts one connection (close-on-exec); kUnavailable on EAGAIN.
Result<UniqueFd> Accept(int listen_fd);

/// Sends one message with `fds` attached (at most 64); MSG_NOSIGNAL, so a
/// dead peer is an error, not a SIGPIPE. With `nonblocking`, a full send
/// buffer (a peer that does not read) is kUnavailable instead of a wait.
Status SendMessage(int fd, const std::string& bytes, const std::vector<int>& fds = {}, bool nonblocking = false);

/// One received datagram and the descriptors that came with it.
struct Received {
  std::string bytes;
  std::vector<UniqueFd> fds;
};

/// Receives one message. kUnavailable "peer closed the connection" at EOF;
/// kInvalidArgument when the datagram (or its descriptors) were larger than
/// the limits and got truncated — the descriptors that did arrive are closed.
Result<Received> ReceiveMessage(int fd, size_t max_bytes);

/// ReceiveMessage without waiting: false when no message is queued, else
/// true with the message in `out` (one system call; a caller that usually
/// finds one there saves a poll).
Result<bool> TryReceiveMessage(int fd, size_t max_bytes, Received& out);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
Result<PeerCredentials> GetPeerCredentials(int fd);

}  // namespace meshload::protocol
