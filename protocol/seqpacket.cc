#include "protocol/seqpacket.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>
#include <vector>

#include "protocol/protocol.h"

namespace meshload::protocol {
namespace {

Result<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path must be 1 to " + std::to_string(sizeof(addr.sun_path) - 1) +
                               " bytes long, got " + std::to_string(path.size()),
                           path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Result<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode) {
  MESHLOAD_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPrecondition("exists and is not a socket; refusing to replace it", path);
    }
    // A socket file left by a previous run: replace it unless someone listens.
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (probe.valid() && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return FailedPrecondition("another process is already listening on this socket", path);
    }
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return IoErrorFromErrno("socket", path, errno);
  // Bind under a restrictive umask so the socket never exists with wider
  // permissions than `mode`, even briefly.
  const mode_t old_umask = ::umask(0177);
  const int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  ::umask(old_umask);
  if (rc != 0) return IoErrorFromErrno("bind", path, bind_errno);
  if (::chmod(path.c_str(), mode) != 0) return IoErrorFromErrno("chmod", path, errno);
  if (::listen(fd.get(), 8) != 0) return IoErrorFromErrno("listen", path, errno);
  return fd;
}

Result<UniqueFd> ConnectSeqpacket(const std::string& path) {
  MESHLOAD_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  // Non-blocking for the connect only: a listener whose queue is full (a
  // sidecar that is stopping, or too busy to accept) makes connect() fail
  // with EAGAIN instead of blocking the trainer, ignoring its timeout and
  // its signals, until the queue drains.
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return IoErrorFromErrno("socket", path, errno);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    Status s = IoErrorFromErrno("connect", path, err);
    if (err == ENOENT || err == ECONNREFUSED) {
      return Status(StatusCode::kUnavailable, s.message() + " (is the sidecar running?)", path);
    }
    if (err == EAGAIN || err == EINPROGRESS) {
      return Status(StatusCode::kUnavailable, s.message() + " (the sidecar's listen queue is full)", path);
    }
    return s;
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return IoErrorFromErrno("fcntl", path, errno);
  }
  return fd;
}

Result<UniqueFd> Accept(int listen_fd) {
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      return Status(StatusCode::kUnavailable, "no pending connection");
    }
    return IoErrorFromErrno("accept", "", errno);
  }
  return UniqueFd(fd);
}

Status SendMessage(int fd, const std::string& bytes, const std::vector<int>& fds, bool nonblocking) {
  if (fds.size() > kMaxFds) return InvalidArgument("too many file descriptors: " + std::to_string(fds.size()));
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
    if (n >= 0) return Status::Ok();
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status(StatusCode::kUnavailable, "the peer is not reading (its queue is full)");
    }
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
      return Status(StatusCode::kUnavailable, std::string("peer closed the connection: ") + std::strerror(errno));
    }
    return IoErrorFromErrno("sendmsg", "", errno);
  }
}

namespace {

// One recvmsg into `out`; with `nonblocking`, false when nothing is queued.
Result<bool> Receive(int fd, size_t max_bytes, bool nonblocking, Received& out) {
  out.fds.clear();
  // One buffer per thread, reused: messages are small and frequent, and a
  // fresh 64 KiB buffer per message would be zero-filled every time. One
  // spare byte tells an oversized datagram.
  thread_local std::vector<char> buffer;
  if (buffer.size() < max_bytes + 1) buffer.resize(max_bytes + 1);
  iovec iov{buffer.data(), max_bytes + 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && nonblocking && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n < 0) {
    if (errno == ECONNRESET) return Status(StatusCode::kUnavailable, "peer reset the connection");
    return IoErrorFromErrno("recvmsg", "", errno);
  }
  // Collect descriptors first so they are closed on every error path.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        out.fds.emplace_back(received);
      }
    }
  }
  if (n == 0) return Status(StatusCode::kUnavailable, "peer closed the connection");
  if (msg.msg_flags & MSG_CTRUNC) return InvalidArgument("too many file descriptors attached; they were truncated");
  if (static_cast<size_t>(n) > max_bytes || (msg.msg_flags & MSG_TRUNC)) {
    return InvalidArgument("message larger than the " + std::to_string(max_bytes) + "-byte limit");
  }
  out.bytes.assign(buffer.data(), static_cast<size_t>(n));
  return true;
}

}  // namespace

Result<Received> ReceiveMessage(int fd, size_t max_bytes) {
  Received out;
  MESHLOAD_RETURN_IF_ERROR(Receive(fd, max_bytes, /*nonblocking=*/false, out).status());
  return out;
}

Result<bool> TryReceiveMessage(int fd, size_t max_bytes, Received& out) {
  return Receive(fd, max_bytes, /*nonblocking=*/true, out);
}

Result<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return IoErrorFromErrno("getsockopt(SO_PEERCRED)", "", errno);
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

}  // namespace meshload::protocol
