#include "client/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "sidecar/ipc/seqpacket.h"

namespace meshload::client {

using Clock = std::chrono::steady_clock;

/// One connection to the sidecar; shared by the client and its leases so a
/// lease outliving a reconnect releases nothing on the new connection.
class Connection {
 public:
  explicit Connection(UniqueFd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }

  void SendRelease(uint32_t slot, int64_t step, uint64_t wait_ns) {
    std::lock_guard lock(mu_);
    if (closed_) return;  // the sidecar reclaimed it when we went away
    (void)ipc::SendMessage(fd_.get(), ipc::Encode(ipc::Release{slot, step, wait_ns}));
  }
  // Says goodbye cleanly: EOF after the RELEASEs already sent, then reads
  // what the sidecar still had in flight until it closes (at most 200 ms).
  // Closing with unread messages would make the kernel reset the
  // connection, and the sidecar could lose the last RELEASEs.
  void Close() {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    ::shutdown(fd_.get(), SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::milliseconds(200);
    char buf[512];
    while (Clock::now() < deadline) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      if (::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT) <= 0) break;  // EOF or error: done
    }
    ::shutdown(fd_.get(), SHUT_RDWR);
  }

 private:
  std::mutex mu_;
  UniqueFd fd_;
  bool closed_ = false;
};

/// The slot pool mapped into this process.
class Mapping {
 public:
  static Result<std::shared_ptr<Mapping>> Map(int fd, uint64_t bytes) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return IoErrorFromErrno("fstat of the pool fd", "", errno);
    // A pool that could shrink under the mapping would turn reads into SIGBUS.
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
      return FailedPrecondition("the pool fd is not sealed against shrinking");
    }
    if (static_cast<uint64_t>(st.st_size) < bytes) {
      return InvalidArgument("the pool fd holds " + std::to_string(st.st_size) + " bytes, SERVER_HELLO says " +
                             std::to_string(bytes));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return IoErrorFromErrno("mmap of the slot pool", "", errno);
    auto m = std::shared_ptr<Mapping>(new Mapping());
    m->base_ = static_cast<uint8_t*>(p);
    m->bytes_ = bytes;
    return m;
  }
  ~Mapping() {
    if (base_) ::munmap(base_, bytes_);
  }
  uint8_t* base() const { return base_; }

 private:
  Mapping() = default;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
};

Lease::Lease(std::shared_ptr<Connection> conn, std::shared_ptr<Mapping> mapping, uint32_t slot, int64_t step,
             uint64_t wait_ns)
    : conn_(std::move(conn)), mapping_(std::move(mapping)), slot_(slot), step_(step), wait_ns_(wait_ns) {}

Lease::~Lease() {
  if (conn_) conn_->SendRelease(slot_, step_, wait_ns_);
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  std::unique_ptr<Client> c(new Client(std::move(options)));
  const int64_t want = c->options_.start_step.value_or(-1);
  Status st = c->ConnectOnce(want);
  if (!st.ok()) {
    if (st.code() != StatusCode::kUnavailable) return st;
    RETURN_IF_ERROR(c->Reconnect(st));
  }
  return c;
}

Client::~Client() { Close(); }

void Client::Close() {
  if (conn_) conn_->Close();
  conn_.reset();
}

Status Client::ConnectOnce(int64_t want_step) {
  ASSIGN_OR_RETURN(UniqueFd fd, ipc::ConnectSeqpacket(options_.socket_path));
  ipc::ClientHello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.want_step = want_step;
  RETURN_IF_ERROR(ipc::SendMessage(fd.get(), ipc::Encode(hello)));
  // A listener that never answers must not hang the trainer.
  pollfd p{fd.get(), POLLIN, 0};
  int prc;
  do {
    prc = ::poll(&p, 1, 5000);
  } while (prc < 0 && errno == EINTR);
  if (prc == 0) return Status(StatusCode::kUnavailable, "no SERVER_HELLO within 5 s", options_.socket_path);
  ASSIGN_OR_RETURN(ipc::Received got, ipc::ReceiveMessage(fd.get(), ipc::kMaxMessageBytes));
  ASSIGN_OR_RETURN(ipc::Message msg, ipc::Decode(got.bytes));
  if (const auto* err = std::get_if<ipc::ErrorMessage>(&msg)) {
    const StatusCode code = err->code == ipc::ErrorCode::kBusy ? StatusCode::kUnavailable
                                                              : StatusCode::kFailedPrecondition;
    return Status(code, "the sidecar refused the connection: " + err->message, options_.socket_path);
  }
  const auto* sh = std::get_if<ipc::ServerHello>(&msg);
  if (!sh) return InvalidArgument("expected SERVER_HELLO from the sidecar", options_.socket_path);
  if (sh->version != ipc::kProtocolVersion) {
    return FailedPrecondition("the sidecar speaks protocol version " + std::to_string(sh->version) +
                                  ", this client " + std::to_string(ipc::kProtocolVersion),
                              options_.socket_path);
  }
  if (sh->memory != ipc::MemoryKind::kHostMemfd) {
    return FailedPrecondition("the sidecar stages in GPU memory, which this client build cannot import",
                              options_.socket_path);
  }
  if (got.fds.size() != 1 || sh->fd_count != 1) {
    return InvalidArgument("SERVER_HELLO must carry exactly one pool fd, got " + std::to_string(got.fds.size()),
                           options_.socket_path);
  }
  for (const auto& t : sh->layout) {
    if (t.offset > sh->slot_bytes || t.nbytes > sh->slot_bytes - t.offset) {
      return InvalidArgument("a tensor of the layout lies outside its slot", options_.socket_path);
    }
  }
  ASSIGN_OR_RETURN(auto mapping, Mapping::Map(got.fds[0].get(), sh->pool_bytes));
  // The descriptor is no longer needed once mapped; UniqueFd closes it.
  if (conn_) conn_->Close();
  conn_ = std::make_shared<Connection>(std::move(fd));
  mapping_ = std::move(mapping);
  hello_ = *sh;
  next_step_ = sh->first_step;
  return Status::Ok();
}

Status Client::Reconnect(const Status& why) {
  if (conn_) conn_->Close();
  conn_.reset();
  std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  Status last = why;
  const auto started = Clock::now();
  for (int attempt = 0; attempt < options_.max_reconnect_attempts; ++attempt) {
    const auto cap = std::min(options_.reconnect_backoff_max,
                              options_.reconnect_backoff_initial * (int64_t{1} << std::min(attempt, 20)));
    std::uniform_int_distribution<int64_t> jitter(cap.count() / 2, cap.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(jitter(rng)));
    const bool was_connected = next_step_ >= 0;
    last = ConnectOnce(was_connected ? next_step_ : options_.start_step.value_or(-1));
    if (last.ok()) {
      if (was_connected) ++reconnects_;  // waiting for a sidecar to come up is not a reconnect
      return Status::Ok();
    }
    if (last.code() != StatusCode::kUnavailable && last.code() != StatusCode::kNotFound &&
        last.code() != StatusCode::kIoError) {
      return last;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - started).count();
  return Status(StatusCode::kUnavailable,
                "the sidecar is gone (" + why.message() + "); gave up after " +
                    std::to_string(options_.max_reconnect_attempts) + " reconnect attempts over " +
                    std::to_string(static_cast<int>(secs * 1000)) + " ms; last error: " + last.message(),
                options_.socket_path);
}

Result<Batch> Client::MakeBatch(const ipc::Ready& r, uint64_t wait_ns) {
  if (r.step != next_step_) {
    return InvalidArgument("READY for step " + std::to_string(r.step) + " while step " + std::to_string(next_step_) +
                           " was expected");
  }
  if (r.slot >= hello_.slots) return InvalidArgument("READY names slot " + std::to_string(r.slot) + " of " + std::to_string(hello_.slots));
  if (r.tensors.size() != hello_.devices.size()) return InvalidArgument("READY has the wrong number of tensors");
  Batch b;
  b.step = r.step;
  b.wait_seconds = static_cast<double>(wait_ns) / 1e9;
  b.lease = std::make_shared<Lease>(conn_, mapping_, r.slot, r.step, wait_ns);
  uint8_t* slot_base = mapping_->base() + static_cast<uint64_t>(r.slot) * hello_.slot_bytes;
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const ipc::TensorReady& t = r.tensors[i];
    // The tensor must be a compact C-order array inside its slot: the
    // trainer's framework will index it with these shapes and strides.
    uint64_t elems = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && elems > UINT64_MAX / static_cast<uint64_t>(d))) return InvalidArgument("READY shape overflows");
      elems *= static_cast<uint64_t>(d);
    }
    const uint64_t item = t.dtype_bits / 8;
    if (item == 0 || elems > UINT64_MAX / item) return InvalidArgument("READY tensor size overflows");
    const uint64_t nbytes = elems * item;
    int64_t expect = 1;
    for (size_t k = t.shape.size(); k-- > 0;) {
      if (t.shape[k] > 1 && t.strides[k] != expect) {
        return InvalidArgument("READY tensor " + std::to_string(i) + " is not a compact C-order array");
      }
      expect *= t.shape[k] > 0 ? t.shape[k] : 1;
    }
    if (t.offset > hello_.slot_bytes || nbytes > hello_.slot_bytes - t.offset) {
      return InvalidArgument("READY tensor " + std::to_string(i) + " lies outside its slot");
    }
    Tensor out;
    out.data = slot_base + t.offset;
    out.dtype_code = t.dtype_code;
    out.dtype_bits = t.dtype_bits;
    out.shape = t.shape;
    out.strides = t.strides;
    out.nbytes = nbytes;
    out.device_type = 1;
    out.device_id = 0;
    out.global_device = hello_.devices[i].global_index;
    out.ids_checksum = t.ids_checksum;
    b.tensors.push_back(std::move(out));
  }
  ++next_step_;
  return b;
}

Result<Batch> Client::Next(std::optional<std::chrono::milliseconds> timeout) {
  const auto t0 = Clock::now();
  while (true) {
    if (!conn_) RETURN_IF_ERROR(Reconnect(Status(StatusCode::kUnavailable, "not connected")));
    int wait_ms = -1;
    if (timeout) {
      const auto left = *timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));  // 0 still looks once
    }
    pollfd p{conn_->fd(), POLLIN, 0};
    const int rc = ::poll(&p, 1, wait_ms);
    if (rc < 0 && errno == EINTR) {
      // Let the caller see its signal (Ctrl-C in Python, SIGTERM in a
      // trainer); calling Next() again resumes where it was.
      return Status(StatusCode::kCancelled, "interrupted by a signal while waiting for step " +
                                                std::to_string(next_step_), options_.socket_path);
    }
    if (rc < 0) return IoErrorFromErrno("poll", options_.socket_path, errno);
    if (rc == 0 && timeout && Clock::now() - t0 >= *timeout) {
      return Status(StatusCode::kDeadlineExceeded,
                    "no batch for step " + std::to_string(next_step_) + " within " + std::to_string(timeout->count()) + " ms",
                    options_.socket_path);
    }
    if (rc <= 0) continue;
    auto got = ipc::ReceiveMessage(conn_->fd(), ipc::kMaxMessageBytes);
    if (!got.ok()) {
      if (got.status().code() != StatusCode::kUnavailable) return got.status().WithLocationPrefix(options_.socket_path);
      RETURN_IF_ERROR(Reconnect(got.status()));
      continue;
    }
    ASSIGN_OR_RETURN(ipc::Message msg, ipc::Decode(got->bytes));
    if (const auto* err = std::get_if<ipc::ErrorMessage>(&msg)) {
      if (err->code == ipc::ErrorCode::kShuttingDown) {
        // A sidecar being restarted says goodbye: reconnect, as if it had vanished.
        RETURN_IF_ERROR(Reconnect(Status(StatusCode::kUnavailable, "the sidecar is stopping: " + err->message)));
        continue;
      }
      const StatusCode code = err->code == ipc::ErrorCode::kDataError ? StatusCode::kDataLoss
                                                                     : StatusCode::kFailedPrecondition;
      Close();
      return Status(code, "the sidecar reported: " + err->message, options_.socket_path);
    }
    const auto* ready = std::get_if<ipc::Ready>(&msg);
    if (!ready) return InvalidArgument("unexpected message from the sidecar", options_.socket_path);
    const uint64_t wait_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    return MakeBatch(*ready, wait_ns);
  }
}

}  // namespace meshload::client
