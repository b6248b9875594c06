#include "client/client.h"

#include "client/client_internal.h"

#include <cstdlib>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "protocol/seqpacket.h"

namespace meshload::client {

Lease::Lease(std::shared_ptr<Connection> conn, std::shared_ptr<Mapping> mapping, uint32_t slot, int64_t step,
             uint64_t wait_ns)
    : conn_(std::move(conn)), mapping_(std::move(mapping)), slot_(slot), step_(step), wait_ns_(wait_ns) {}

Lease::~Lease() {
  if (!conn_) return;
  // A GPU batch may still be read by work the trainer queued: the slot goes
  // back (from the connection's release thread, Connection::ReleaseAfter)
  // only once that work is done, never while a kernel may still read it.
  // With the streams it named in __dlpack__, a fence on each is recorded
  // now (the trainer does not wait); without any, the release thread waits
  // for the whole device.
  if (mapping_ && mapping_->on_gpu()) {
    Connection::Pending p;
    auto driver = cuda::Driver::Open();
    if (consumer_streams_.empty() || !driver.ok()) {
      p.sync_devices = mapping_->ordinals();
    } else {
      for (const auto& [ordinal, stream] : consumer_streams_) {
        auto f = (*driver)->RecordFence(ordinal, stream);
        if (f.ok()) {
          p.fences.push_back(std::move(*f));
        } else {
          p.unfenced.emplace_back(ordinal, stream);
        }
      }
      // A device of the batch whose tensor was read without naming a
      // stream (the raw pointer, stream=-1) may still be reading: wait for
      // the whole device, as for a batch with no stream at all.
      for (int ordinal : mapping_->ordinals()) {
        const bool fenced = std::any_of(consumer_streams_.begin(), consumer_streams_.end(),
                                        [&](const auto& s) { return s.first == ordinal; });
        if (!fenced && std::find(p.sync_devices.begin(), p.sync_devices.end(), ordinal) == p.sync_devices.end()) {
          p.sync_devices.push_back(ordinal);
        }
      }
    }
    p.slot = slot_;
    p.step = step_;
    p.wait_ns = wait_ns_;
    // Moved: the worker may hold the connection's last reference, and then
    // tears the mapping down off this thread.
    p.mapping = std::move(mapping_);
    conn_->ReleaseAfter(std::move(p));
    return;
  }
  conn_->SendRelease(slot_, step_, wait_ns_);
}

void Lease::AddConsumerStream(int ordinal, uintptr_t stream) {
  MutexLock lock(mu_);
  for (const auto& s : consumer_streams_) {
    if (s.first == ordinal && s.second == stream) return;
  }
  consumer_streams_.emplace_back(ordinal, stream);
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  rng_state_ = static_cast<uint64_t>(::getpid()) ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

Result<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.socket_path.empty()) {
    const char* env = std::getenv(kSocketEnv);
    if (env == nullptr || *env == '\0') {
      return Status(StatusCode::kInvalidArgument, std::string("no socket path: give one, or set ") + kSocketEnv +
                                                      " (the sidecar-injection webhook sets it in trainer containers)");
    }
    options.socket_path = env;
  }
  std::unique_ptr<Client> c(new Client(std::move(options)));
  c->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!c->wake_fd_.valid()) return IoErrorFromErrno("eventfd", c->options_.socket_path, errno);
  return c;
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  MESHLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Create(std::move(options)));
  MESHLOAD_RETURN_IF_ERROR(c->EnsureConnected());
  return c;
}

Client::~Client() { Close(); }

void Client::Close() {
  // Batches still held keep the connection (and their slots) until they
  // are released; without any, it closes now.
  if (conn_) conn_->Leave();
  conn_.reset();
  handshake_.reset();
}

void Client::Interrupt() {
  interrupted_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof one);
}

Status Client::Closed() const {
  return Status(StatusCode::kFailedPrecondition, "the client was closed", options_.socket_path);
}

int Client::Wait(int fd, std::optional<Clock::time_point> until) {
  while (true) {
    if (interrupted_.load()) return -2;
    int wait_ms = -1;
    if (until) {
      // Rounded up: a wait that ends early would poll again for nothing.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX));
    }
    pollfd p[2] = {{wake_fd_.get(), POLLIN, 0}, {fd, POLLIN, 0}};
    const int rc = ::poll(p, fd >= 0 ? 2 : 1, wait_ms);
    if (rc < 0) return errno == EINTR ? -1 : -2 - errno;
    if (interrupted_.load()) return -2;
    if (fd >= 0 && rc > 0 && p[1].revents != 0) return 1;
    if (until && Clock::now() >= *until) return 0;
    if (!until && rc == 0) continue;
  }
}

Status Client::ConnectOnce(int64_t want_step, std::optional<Clock::time_point> deadline) {
  if (handshake_ && handshake_->want_step != want_step) handshake_.reset();
  if (!handshake_) {
    MESHLOAD_ASSIGN_OR_RETURN(UniqueFd fd, protocol::ConnectSeqpacket(options_.socket_path));
    protocol::ClientHello hello;
    hello.pid = static_cast<uint32_t>(::getpid());
    hello.want_step = want_step;
    MESHLOAD_RETURN_IF_ERROR(protocol::SendMessage(fd.get(), protocol::Encode(hello)));
    handshake_ = Handshake{std::move(fd), want_step, Clock::now()};
  }
  // A listener that never answers must not hang the trainer: 5 s from the
  // hello, and within the caller's deadline.
  const auto limit = handshake_->sent + std::chrono::seconds(5);
  const bool deadline_first = deadline && *deadline < limit;
  const int w = Wait(handshake_->fd.get(), deadline_first ? *deadline : limit);
  if (w == -1) return Status(StatusCode::kCancelled, "interrupted by a signal while connecting", options_.socket_path);
  if (w == -2) return Closed();
  if (w < -2) return IoErrorFromErrno("poll", options_.socket_path, -2 - w);
  if (w == 0 && deadline_first) {
    return Status(StatusCode::kDeadlineExceeded, "no SERVER_HELLO before the deadline", options_.socket_path);
  }
  if (w == 0) {
    handshake_.reset();
    return Status(StatusCode::kUnavailable, "no SERVER_HELLO within 5 s", options_.socket_path);
  }
  UniqueFd fd = std::move(handshake_->fd);
  handshake_.reset();
  MESHLOAD_ASSIGN_OR_RETURN(protocol::Received got, protocol::ReceiveMessage(fd.get(), protocol::kMaxMessageBytes));
  MESHLOAD_ASSIGN_OR_RETURN(protocol::Message msg, protocol::Decode(got.bytes));
  if (const auto* err = std::get_if<protocol::ErrorMessage>(&msg)) {
    const StatusCode code =
        err->code == protocol::ErrorCode::kBusy ? StatusCode::kUnavailable : StatusCode::kFailedPrecondition;
    return Status(code, "the sidecar refused the connection: " + err->message, options_.socket_path);
  }
  const auto* sh = std::get_if<protocol::ServerHello>(&msg);
  if (!sh) return InvalidArgument("expected SERVER_HELLO from the sidecar", options_.socket_path);
  if (sh->version != protocol::kProtocolVersion) {
    return FailedPrecondition("the sidecar speaks protocol version " + std::to_string(sh->version) + ", this client " +
                                  std::to_string(protocol::kProtocolVersion),
                              options_.socket_path);
  }
  if (want_step >= 0 && sh->first_step != want_step) {
    return InvalidArgument("the sidecar starts at step " + std::to_string(sh->first_step) + ", step " +
                               std::to_string(want_step) + " was asked for",
                           options_.socket_path);
  }
  if (sh->first_step < 0) {
    return InvalidArgument("the sidecar starts at step " + std::to_string(sh->first_step), options_.socket_path);
  }
  const size_t want_fds = sh->memory == protocol::MemoryKind::kHostMemfd ? 1 : sh->fd_count;
  if (got.fds.size() != want_fds || sh->fd_count != want_fds) {
    return InvalidArgument(
        "SERVER_HELLO must carry " + std::to_string(want_fds) + " pool fds, got " + std::to_string(got.fds.size()),
        options_.socket_path);
  }
  for (const auto& t : sh->layout) {
    if (t.offset > sh->slot_bytes || t.nbytes > sh->slot_bytes - t.offset) {
      return InvalidArgument("a tensor of the layout lies outside its slot", options_.socket_path);
    }
    // The decoder checked that a ragged tensor's offsets end before its
    // values, so they lie inside the slot too.
  }
  auto mapped = sh->memory == protocol::MemoryKind::kHostMemfd ? Mapping::MapHost(got.fds[0].get(), sh->pool_bytes)
                                                               : Mapping::ImportCuda(*sh, got.fds);
  if (!mapped.ok()) return mapped.status().WithLocationPrefix(options_.socket_path);
  auto mapping = std::move(*mapped);
  // The descriptors are no longer needed once mapped; UniqueFd closes them.
  if (conn_) conn_->Leave();
  conn_ = std::make_shared<Connection>(std::move(fd));
  mapping_ = std::move(mapping);
  gpu_imports_ += mapping_->gpu_imports();
  hello_ = *sh;
  ++handshakes_;
  next_step_ = sh->first_step;
  return Status::Ok();
}

Status Client::Interrupted() const {
  return Status(StatusCode::kCancelled, "interrupted by a signal while reconnecting to the sidecar",
                options_.socket_path);
}

Status Client::EnsureConnected(std::optional<std::chrono::milliseconds> timeout) {
  if (conn_) return Status::Ok();
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + *timeout;
  return Reconnect(Status(StatusCode::kUnavailable, "not connected yet"), deadline);
}

Status Client::Reconnect(const Status& why, std::optional<Clock::time_point> deadline) {
  if (conn_) conn_->Leave();
  conn_.reset();
  if (!outage_) {
    // The first attempt at once; the schedule then lives until it ends.
    const auto now = Clock::now();
    outage_ = Outage{why, why, now, now, 0};
  }
  Outage& o = *outage_;
  auto still = [&] {
    return Status(StatusCode::kDeadlineExceeded,
                  "still reconnecting to the sidecar (" + o.why.message() + "); last error: " + o.last.message());
  };
  while (true) {
    // The first attempt, then max_reconnect_attempts more.
    if (o.attempts > options_.max_reconnect_attempts) {
      const double secs = std::chrono::duration<double>(Clock::now() - o.started).count();
      Status gone(StatusCode::kUnavailable,
                  "the sidecar is gone (" + o.why.message() + "); gave up after " + std::to_string(o.attempts) +
                      " connection attempts (max_reconnect_attempts " +
                      std::to_string(options_.max_reconnect_attempts) + ") over " +
                      std::to_string(static_cast<int>(secs * 1000)) + " ms; last error: " + o.last.message(),
                  options_.socket_path);
      outage_.reset();
      handshake_.reset();
      return gone;
    }
    if (deadline && o.next_try > *deadline) {
      const int w = Wait(-1, *deadline);
      if (w == -1) return Interrupted();
      if (w == -2) return Closed();
      return still();
    }
    const int w = Wait(-1, o.next_try);
    if (w == -1) return Interrupted();
    if (w == -2) return Closed();
    const bool was_connected = next_step_ >= 0;
    Status st = ConnectOnce(was_connected ? next_step_ : options_.start_step.value_or(-1), deadline);
    if (st.ok()) {
      if (was_connected) ++reconnects_;  // waiting for a sidecar to come up is not a reconnect
      outage_.reset();
      return Status::Ok();
    }
    // A signal or the caller's deadline: the handshake and the schedule
    // wait for the next call.
    if (st.code() == StatusCode::kCancelled) return st;
    if (st.code() == StatusCode::kFailedPrecondition && interrupted_.load()) return st;
    if (st.code() == StatusCode::kDeadlineExceeded) return still();
    o.last = st;
    // Before the first connection only "no sidecar yet" is worth waiting
    // for (a socket this trainer may not open is not); after it, a sidecar
    // being replaced may also look like a missing or broken socket.
    const bool retry = st.code() == StatusCode::kUnavailable ||
                       (was_connected && (st.code() == StatusCode::kNotFound || st.code() == StatusCode::kIoError));
    if (!retry) {
      outage_.reset();
      return st;
    }
    ++o.attempts;
    const auto cap = std::min(options_.reconnect_backoff_max,
                              options_.reconnect_backoff_initial * (int64_t{1} << std::min(o.attempts - 1, 20)));
    std::mt19937_64 rng(rng_state_);
    rng_state_ = rng();
    std::uniform_int_distribution<int64_t> jitter(cap.count() / 2, cap.count());
    o.next_try = Clock::now() + std::chrono::milliseconds(jitter(rng));
  }
}

Result<Batch> Client::MakeBatch(const protocol::Ready& r, uint64_t wait_ns) {
  if (r.step != next_step_) {
    return InvalidArgument("READY for step " + std::to_string(r.step) + " while step " + std::to_string(next_step_) +
                           " was expected");
  }
  if (r.slot >= hello_.slots)
    return InvalidArgument("READY names slot " + std::to_string(r.slot) + " of " + std::to_string(hello_.slots));
  if (conn_->Holds(r.slot)) {
    return InvalidArgument("READY names slot " + std::to_string(r.slot) + ", which a live batch still holds");
  }
  const size_t nfields = hello_.fields.size();
  if (r.tensors.size() != hello_.devices.size() * nfields) {
    return InvalidArgument("READY has " + std::to_string(r.tensors.size()) + " tensors; SERVER_HELLO described " +
                           std::to_string(hello_.devices.size() * nfields));
  }
  Batch b;
  b.step = r.step;
  b.wait_seconds = static_cast<double>(wait_ns) / 1e9;
  b.lease = std::make_shared<Lease>(conn_, mapping_, r.slot, r.step, wait_ns);
  conn_->AddHeld(r.slot, r.step);
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const protocol::TensorReady& t = r.tensors[i];
    // The tensor must be a compact C-order array inside its slot: the
    // trainer's framework will index it with these shapes and strides.
    uint64_t elems = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && elems > UINT64_MAX / static_cast<uint64_t>(d)))
        return InvalidArgument("READY shape overflows");
      elems *= static_cast<uint64_t>(d);
    }
    const uint64_t item = t.dtype_bits / 8;
    if (item == 0 || elems > UINT64_MAX / item) return InvalidArgument("READY tensor size overflows");
    const uint64_t nbytes = elems * item;
    // In uint64_t: the element count above did not overflow, so neither
    // does this running product of the same dimensions.
    uint64_t expect = 1;
    for (size_t k = t.shape.size(); k-- > 0;) {
      if (t.shape[k] > 1 && (t.strides[k] < 0 || static_cast<uint64_t>(t.strides[k]) != expect)) {
        return InvalidArgument("READY tensor " + std::to_string(i) + " is not a compact C-order array");
      }
      expect *= t.shape[k] > 0 ? static_cast<uint64_t>(t.shape[k]) : 1;
    }
    if (t.offset > hello_.slot_bytes || nbytes > hello_.slot_bytes - t.offset) {
      return InvalidArgument("READY tensor " + std::to_string(i) + " lies outside its slot");
    }
    // The tensor is the one SERVER_HELLO's layout described: at the same
    // place, of the same dtype and kind; a ragged one's offsets at the same
    // place, at most as many samples, its values within the room; a dense
    // one's rows at most the layout's (fewer when samples were skipped).
    const protocol::TensorLayout& planned = hello_.layout[i];
    bool same = t.ragged.has_value() == planned.ragged.has_value() && t.offset == planned.offset &&
                t.dtype_code == planned.dtype_code && t.dtype_bits == planned.dtype_bits && nbytes <= planned.nbytes;
    if (same && t.ragged) {
      same = t.ragged->offsets_offset == planned.ragged->offsets_offset && t.ragged->samples <= planned.ragged->samples;
    } else if (same) {
      same = t.shape.size() == planned.shape.size() && !t.shape.empty() && t.shape[0] <= planned.shape[0] &&
             std::equal(t.shape.begin() + 1, t.shape.end(), planned.shape.begin() + 1);
    }
    if (!same) {
      return InvalidArgument("READY tensor " + std::to_string(i) + " is not the " +
                             (planned.ragged ? "ragged" : "dense") + " tensor SERVER_HELLO described");
    }
    const size_t device = i / nfields;
    Tensor out;
    out.field = hello_.fields[i % nfields];
    uint8_t* base = mapping_->Base(device, r.slot, hello_.slot_bytes);
    out.data = base + t.offset;
    if (t.ragged) {
      out.offsets = reinterpret_cast<const int64_t*>(base + t.ragged->offsets_offset);
      out.samples = t.ragged->samples;
    }
    out.dtype_code = t.dtype_code;
    out.dtype_bits = t.dtype_bits;
    out.shape = t.shape;
    out.strides = t.strides;
    out.nbytes = nbytes;
    out.device_type = mapping_->on_gpu() ? 2 : 1;  // DLPack kDLCUDA : kDLCPU
    out.device_id = mapping_->ordinal(device);
    out.global_device = hello_.devices[device].global_index;
    out.ids_checksum = t.ids_checksum;
    b.tensors.push_back(std::move(out));
  }
  ++next_step_;
  return b;
}

Status Client::ProtocolError(const Status& st) {
  // The connection cannot go on in step: leave it (BYE), so the sidecar
  // takes back the slots of batches not handed out; the next Next()
  // connects again at the step it has not returned.
  LogWarn("dropping the connection to the sidecar after a protocol error", {{"error", st.ToString()}});
  Close();
  return st.WithLocationPrefix(options_.socket_path);
}

Result<Batch> Client::Next(std::optional<std::chrono::milliseconds> timeout) {
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = t0 + *timeout;
  // Reconnects within the caller's timeout.
  auto reconnect = [&](const Status& why) -> Status {
    Status st = Reconnect(why, deadline);
    if (st.code() != StatusCode::kDeadlineExceeded) return st;
    return Status(StatusCode::kDeadlineExceeded,
                  "no batch for step " + std::to_string(next_step_) + " within " + std::to_string(timeout->count()) +
                      " ms: " + st.message(),
                  options_.socket_path);
  };
  while (true) {
    if (interrupted_.load()) return Closed();
    if (!conn_) MESHLOAD_RETURN_IF_ERROR(reconnect(Status(StatusCode::kUnavailable, "not connected")));
    // A batch already staged is taken without a poll: one system call a
    // step when the sidecar is ahead, which is the usual case. Otherwise
    // wait until the socket is readable and take it on the next pass.
    protocol::Received received;
    Result<bool> got = protocol::TryReceiveMessage(conn_->fd(), protocol::kMaxMessageBytes, received);
    if (got.ok() && !*got) {
      const int w = Wait(conn_->fd(), deadline);  // a past deadline still looked once
      if (w == -1) {
        // Let the caller see its signal (Ctrl-C in Python, SIGTERM in a
        // trainer); calling Next() again resumes where it was.
        return Status(StatusCode::kCancelled,
                      "interrupted by a signal while waiting for step " + std::to_string(next_step_),
                      options_.socket_path);
      }
      if (w == -2) return Closed();
      if (w < -2) return IoErrorFromErrno("poll", options_.socket_path, -2 - w);
      if (w == 0) {
        return Status(
            StatusCode::kDeadlineExceeded,
            "no batch for step " + std::to_string(next_step_) + " within " + std::to_string(timeout->count()) + " ms",
            options_.socket_path);
      }
      continue;
    }
    if (!got.ok()) {
      if (got.status().code() != StatusCode::kUnavailable) return ProtocolError(got.status());
      MESHLOAD_RETURN_IF_ERROR(reconnect(got.status()));
      continue;
    }
    auto decoded = protocol::Decode(received.bytes);
    if (!decoded.ok()) return ProtocolError(decoded.status());
    protocol::Message& msg = *decoded;
    if (const auto* err = std::get_if<protocol::ErrorMessage>(&msg)) {
      if (err->code == protocol::ErrorCode::kShuttingDown) {
        // A sidecar being restarted says goodbye: reconnect, as if it had vanished.
        MESHLOAD_RETURN_IF_ERROR(
            reconnect(Status(StatusCode::kUnavailable, "the sidecar is stopping: " + err->message)));
        continue;
      }
      const StatusCode code =
          err->code == protocol::ErrorCode::kDataError ? StatusCode::kDataLoss : StatusCode::kFailedPrecondition;
      Close();
      return Status(code, "the sidecar reported: " + err->message, options_.socket_path);
    }
    const auto* ready = std::get_if<protocol::Ready>(&msg);
    if (!ready) return ProtocolError(InvalidArgument("unexpected message from the sidecar"));
    const uint64_t wait_ns =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    auto batch = MakeBatch(*ready, wait_ns);
    if (!batch.ok()) return ProtocolError(batch.status());
    return batch;
  }
}

}  // namespace meshload::client
