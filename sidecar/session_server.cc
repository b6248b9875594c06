#include "sidecar/session_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "common/logging.h"
#include "common/thread_sched.h"
#include "protocol/seqpacket.h"

namespace meshload::sidecar {
namespace {

// Every send to a trainer is non-blocking: a trainer that stops reading must
// not stall the producer (which sends READY under client_mu_) or a shutdown.
Status SendTo(int fd, const std::string& bytes) { return protocol::SendMessage(fd, bytes, {}, /*nonblocking=*/true); }

// At most this many READYs unanswered by RELEASE, and at most half of what
// the trainer's socket queue holds (MeasureReadyQueue): a trainer following
// the protocol then never fills its queue, so a full queue means a trainer
// that does not read, and is dropped.
constexpr uint32_t kMaxLeasesPerTrainer = 128;
static_assert(protocol::kMaxByeLeases >= kMaxLeasesPerTrainer, "a BYE must be able to list every lease");

// How many copies of `message` a connected SOCK_SEQPACKET socket queues
// before a send would block: the kernel counts bytes with a per-message
// overhead (about 278 READYs of 132 bytes, 93 of 828 bytes with the default
// 208 KiB send buffer), so the count depends on the job's layout. Measured
// on a socket pair, which gets the same default buffer as an accepted
// connection; 0 if the pair cannot be made.
uint32_t MeasureReadyQueue(const std::string& message) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return 0;
  UniqueFd a(sv[0]), b(sv[1]);
  uint32_t n = 0;
  while (n < 4096 &&
         ::send(a.get(), message.data(), message.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(message.size())) {
    ++n;
  }
  return n;
}

}  // namespace

SessionServer::SessionServer(Context context)
    : options_(std::move(context.options)),
      clock_(context.clock != nullptr ? context.clock : Clock::Real()),
      metrics_(context.metrics),
      job_(*context.job),
      job_name_(std::move(context.job_name)),
      layout_(*context.layout),
      memory_(context.memory),
      device_(context.device),
      pool_(context.pool),
      slot_staged_(*context.slot_staged),
      start_step_(context.start_step),
      wake_fd_(context.wake_fd),
      stop_(*context.stop),
      failed_(*context.failed),
      hooks_(std::move(context.hooks)) {
  consumed_.Reset(start_step_);
  delivered_step_.store(start_step_ - 1);
}

SessionServer::~SessionServer() = default;

Status SessionServer::Listen() {
  MESHLOAD_ASSIGN_OR_RETURN(listen_fd_, protocol::ListenSeqpacket(options_.socket_path, options_.socket_mode));
  return Status::Ok();
}

void SessionServer::RemoveSocketFile() {
  if (listen_fd_.valid()) ::unlink(options_.socket_path.c_str());
}

void SessionServer::Notify() {
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;
}

void SessionServer::ChooseMaxLeases() {
  const uint32_t slots = pool_->size();
  // The largest READY of this layout (every field at its widest).
  protocol::Ready r;
  r.step = std::numeric_limits<int64_t>::max();
  r.slot = std::numeric_limits<uint32_t>::max();
  for (size_t i = 0; i < layout_.devices.size(); ++i) {
    for (size_t f = 0; f < layout_.fields.size(); ++f) {
      const formats::DLPackType dl = formats::ToDLPackType(layout_.fields[f].dtype);
      const staging::FieldTensor& t = layout_.devices[i].fields[f];
      r.tensors.push_back({TensorOffset(i, f), dl.code, dl.bits, t.shape, t.strides,
                           std::numeric_limits<uint64_t>::max(), Ragged(i, f, layout_.samples_per_device)});
    }
  }
  const uint32_t queue = MeasureReadyQueue(protocol::Encode(r));
  if (queue == 0) {
    // No socket pair (out of descriptors?): the fixed limit, as before.
    max_leases_ = kMaxLeasesPerTrainer;
    LogWarn("could not measure a trainer's socket queue; at most 128 READYs unanswered", {});
  } else {
    max_leases_ = std::clamp<uint32_t>(queue / 2, 1, kMaxLeasesPerTrainer);
  }
  if (max_leases_ < slots) {
    LogInfo(
        "a trainer is sent at most this many batches ahead: its socket queue holds no more (a trainer "
        "that keeps that many batches alive gets no more until it lets one go)",
        {{"max_leases", static_cast<uint64_t>(max_leases_)},
         {"slots", static_cast<uint64_t>(slots)},
         {"ready_queue", static_cast<uint64_t>(queue)}});
  }
}

void SessionServer::DeliverReady() {
  // Producers must not queue up behind each other (or the server) on
  // client_mu_ just to send a READY: a producer that finds the lock taken
  // leaves the sending to the holder, who checks ready_pending_ after
  // letting go (ClientLock).
  ready_pending_.store(true);
  while (ready_pending_.load()) {
    if (!client_mu_.TryLock()) return;
    ready_pending_.store(false);
    SendReadyBatchesLocked();
    client_mu_.Unlock();
  }
}

SessionServer::ClientLock::ClientLock(SessionServer& s) : s_(s) { s_.client_mu_.Lock(); }

SessionServer::ClientLock::~ClientLock() { Unlock(); }

void SessionServer::ClientLock::Unlock() {
  if (!held_) return;
  s_.client_mu_.Unlock();
  held_ = false;
  if (s_.ready_pending_.load()) s_.DeliverReady();
}

SessionServer::Client* SessionServer::ServerClient() {
  ClientLock lock(*this);
  return client_.get();
}

void SessionServer::AcceptClient() {
  auto fd = protocol::Accept(listen_fd_.get());
  if (!fd.ok()) return;
  auto creds = protocol::GetPeerCredentials(fd->get());
  auto refuse = [&](protocol::ErrorCode code, const std::string& msg, const char* outcome) {
    // Counted and logged before the trainer hears of it, so that what it
    // then sees in /metrics includes its own refusal.
    metrics_->connections.Add({{"outcome", outcome}}).Increment();
    LogWarn("refused a trainer connection", {{"reason", msg}});
    (void)SendTo(fd->get(), protocol::Encode(protocol::ErrorMessage{code, msg}));
    CloseLater(std::move(*fd));
  };
  if (!creds.ok()) {
    refuse(protocol::ErrorCode::kPermissionDenied, "cannot read peer credentials: " + creds.status().ToString(),
           "refused_uid");
    return;
  }
  if (std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), creds->uid) ==
      options_.allowed_uids.end()) {
    refuse(protocol::ErrorCode::kPermissionDenied,
           "uid " + std::to_string(creds->uid) + " is not allowed to connect (pid " + std::to_string(creds->pid) + ")",
           "refused_uid");
    return;
  }
  if (failure_reported_) {
    refuse(protocol::ErrorCode::kDataError, fatal_message_, "refused_failed");
    return;
  }
  if (const Client* client = ServerClient(); client || pending_) {
    refuse(protocol::ErrorCode::kBusy,
           "another trainer (pid " + std::to_string(client ? client->pid : pending_->pid) + ") is connected",
           "refused_busy");
    return;
  }
  pending_ = std::make_unique<Client>();
  pending_->connected_at = clock_->Now();
  pending_->fd = std::move(*fd);
  pending_->pid = creds->pid;
  pending_->uid = creds->uid;
}

void SessionServer::CloseLater(UniqueFd fd, LeaseList leases, pid_t pid) {
  // The sidecar sends nothing more: the trainer reads what is queued, then
  // end of file. It may still send (RELEASEs and a BYE, for kept leases).
  ::shutdown(fd.get(), SHUT_WR);
  // At most 64 connections without leases drain at once: beyond that the
  // oldest of them is closed now. Connections that keep leases are never
  // evicted (a flood of refused connections must not free a trainer's held
  // slots); there are at most as many as slots, each keeps at least one.
  if (std::count_if(closing_.begin(), closing_.end(), [](const Closing& c) { return c.leases.empty(); }) >= 64) {
    closing_.erase(std::find_if(closing_.begin(), closing_.end(), [](const Closing& c) { return c.leases.empty(); }));
  }
  closing_.push_back({std::move(fd), clock_->Now() + std::chrono::seconds(1), std::move(leases), pid});
}

void SessionServer::ReclaimClosing(Closing& c, const char* why, const LeaseList* only) {
  uint32_t reclaimed = 0;
  std::erase_if(c.leases, [&](const auto& l) {
    if (only != nullptr && std::find(only->begin(), only->end(), l) == only->end()) return false;
    reclaimed += pool_->Release(l.first, l.second) ? 1 : 0;
    return true;
  });
  if (reclaimed > 0) {
    metrics_->leases_reclaimed.Increment(reclaimed);
    LogInfo("leases of a former trainer connection reclaimed",
            {{"pid", static_cast<int64_t>(c.pid)},
             {"reason", why},
             {"leases_reclaimed", static_cast<uint64_t>(reclaimed)},
             {"leases_kept", static_cast<uint64_t>(c.leases.size())}});
  }
}

bool SessionServer::ServeClosingMessages(Closing& c) {
  if (c.leases.empty()) {
    char buf[256];
    while (true) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
      if (n < 0) return true;
    }
  }
  // The trainer may still release the batches it held: every message
  // queued is read now (a closing connection gets no ERROR back; anything
  // but a RELEASE of one of its leases, or a BYE, is ignored).
  for (int i = 0; i < 256; ++i) {
    pollfd p{c.fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    auto msg = protocol::ReceiveMessage(c.fd.get(), protocol::kMaxMessageBytes);
    if (!msg.ok()) {
      if (msg.status().code() == StatusCode::kUnavailable) return false;  // EOF or reset
      continue;
    }
    auto decoded = protocol::Decode(msg->bytes);
    if (!decoded.ok()) continue;
    if (const auto* rel = std::get_if<protocol::Release>(&*decoded)) {
      auto it = std::find(c.leases.begin(), c.leases.end(), std::make_pair(rel->slot, rel->step));
      if (it == c.leases.end()) continue;
      c.leases.erase(it);
      if (pool_->Release(rel->slot, rel->step)) Consumed(rel->step, rel->wait_ns);
    } else if (const auto* bye = std::get_if<protocol::Bye>(&*decoded)) {
      // After an ERROR: the trainer says which batches it still holds; the
      // others (READYs it never handed out) come back now.
      LeaseList unheld;
      for (const auto& l : c.leases) {
        if (std::find(bye->held.begin(), bye->held.end(), protocol::Bye::Held{l.first, l.second}) == bye->held.end()) {
          unheld.push_back(l);
        }
      }
      ReclaimClosing(c, "BYE: batches the trainer never received", &unheld);
    }
    if (c.leases.empty()) {
      c.deadline = clock_->Now() + std::chrono::seconds(1);
      return true;
    }
  }
  return true;
}

void SessionServer::ServeClosing(const pollfd* fds, size_t count) {
  // Matched by descriptor, not position: CloseLater may have changed the
  // list since the poll set was built.
  std::vector<int> done;
  for (size_t i = 0; i < count; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) continue;
    for (Closing& c : closing_) {
      if (c.fd.get() == fds[i].fd && !ServeClosingMessages(c)) done.push_back(fds[i].fd);
    }
  }
  const auto now = clock_->Now();
  std::erase_if(closing_, [&](Closing& c) {
    const bool closed = std::find(done.begin(), done.end(), c.fd.get()) != done.end();
    if (closed) ReclaimClosing(c, "the trainer closed it");
    return closed || (c.leases.empty() && now > c.deadline);
  });
}

void SessionServer::ServePending() {
  auto msg = protocol::ReceiveMessage(pending_->fd.get(), protocol::kMaxMessageBytes);
  Result<protocol::Message> decoded = msg.ok() ? protocol::Decode(msg->bytes) : Result<protocol::Message>(msg.status());
  const protocol::ClientHello* hello = decoded.ok() ? std::get_if<protocol::ClientHello>(&*decoded) : nullptr;
  if (!hello) {
    const std::string why = decoded.ok() ? "expected CLIENT_HELLO" : decoded.status().ToString();
    // A well-formed header of another protocol version deserves the
    // version error, so a newer or older client can say what is wrong.
    const bool other_version =
        msg.ok() && msg->bytes.size() >= 6 &&
        static_cast<uint8_t>(msg->bytes[4]) + 256 * static_cast<uint8_t>(msg->bytes[5]) != protocol::kProtocolVersion &&
        msg->bytes.compare(0, 4, "MLD1") == 0;
    metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
    LogWarn("dropped a trainer connection before its hello", {{"reason", why}});
    if (msg.ok()) {
      (void)SendTo(
          pending_->fd.get(),
          protocol::Encode(protocol::ErrorMessage{
              other_version ? protocol::ErrorCode::kVersionMismatch : protocol::ErrorCode::kBadRequest,
              other_version ? "this sidecar speaks protocol version " + std::to_string(protocol::kProtocolVersion)
                            : why}));
    }
    CloseLater(std::move(pending_->fd));
    pending_.reset();
  } else if (hello->version != protocol::kProtocolVersion) {
    metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
    LogWarn("dropped a trainer connection: protocol version mismatch",
            {{"version", static_cast<uint64_t>(hello->version)}});
    (void)SendTo(pending_->fd.get(),
                 protocol::Encode(protocol::ErrorMessage{
                     protocol::ErrorCode::kVersionMismatch,
                     "this sidecar speaks protocol version " + std::to_string(protocol::kProtocolVersion)}));
    CloseLater(std::move(pending_->fd));
    pending_.reset();
  } else {
    OnHello(*hello);
  }
}

void SessionServer::OnHello(const protocol::ClientHello& hello) {
  if (hello.want_step > (int64_t{1} << 62)) {
    // Counted before the trainer hears of it (as in AcceptClient).
    metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
    (void)SendTo(pending_->fd.get(), protocol::Encode(protocol::ErrorMessage{
                                         protocol::ErrorCode::kBadRequest,
                                         "want_step " + std::to_string(hello.want_step) + " is out of range"}));
    CloseLater(std::move(pending_->fd));
    pending_.reset();
    return;
  }
  const int64_t want = hello.want_step >= 0 ? hello.want_step : start_step_;
  // The pipeline serves `want` next (re-planned if need be: Sidecar::StageFrom).
  hooks_.start_at(want);
  ClientLock client_lock(*this);
  client_ = std::move(pending_);
  client_->next_to_send = want;
  // The trainer starts at `want`: what comes before it is done, from its side.
  consumed_.Reset(want);
  delivered_step_.store(want - 1);
  const planner::ResolvedJob& rj = job_;
  protocol::ServerHello sh;
  sh.job = job_name_;
  sh.process = static_cast<uint32_t>(options_.process);
  sh.fields.clear();
  for (const staging::FieldLayout& f : layout_.fields) sh.fields.push_back(f.name);
  for (size_t i = 0; i < layout_.devices.size(); ++i) {
    const auto& d = layout_.devices[i];
    sh.devices.push_back(
        {static_cast<uint32_t>(d.device), static_cast<uint8_t>(device_ ? 2 : 1), device_ ? device_->uuids()[i] : ""});
    for (size_t f = 0; f < layout_.fields.size(); ++f) {
      const formats::DLPackType dl = formats::ToDLPackType(layout_.fields[f].dtype);
      const staging::FieldTensor& t = d.fields[f];
      sh.layout.push_back({TensorOffset(i, f), dl.code, dl.bits, t.shape, t.strides, t.nbytes,
                           Ragged(i, f, layout_.samples_per_device)});
    }
  }
  sh.slots = memory_->slots();
  std::vector<int> fds;
  if (!device_) {
    sh.memory = protocol::MemoryKind::kHostMemfd;
    sh.slot_bytes = memory_->slot_bytes();
    sh.pool_bytes = memory_->pool_bytes();
    fds = {memory_->fd()};
  } else {
    sh.slot_bytes = device_->alloc_bytes();
    sh.pool_bytes = device_->alloc_bytes() * device_->slots();
    if (device_->share() == staging::DeviceShare::kCudaVmm) {
      sh.memory = protocol::MemoryKind::kCudaVmmFd;
      fds = device_->fds();
    } else {
      sh.memory = protocol::MemoryKind::kCudaIpc;
      for (const auto& h : device_->ipc_handles()) sh.ipc_handles.emplace_back(h.begin(), h.end());
    }
  }
  sh.fd_count = static_cast<uint32_t>(fds.size());
  sh.first_step = want;
  sh.steps_per_epoch = rj.steps_per_epoch;
  sh.global_batch = rj.global_batch;
  sh.mesh.processes = static_cast<uint32_t>(rj.mesh.processes());
  sh.mesh.devices_per_process = static_cast<uint32_t>(rj.mesh.devices_per_process());
  for (const planner::MeshAxis& a : rj.spec.mesh.axes) sh.mesh.axes.push_back({a.name, static_cast<uint64_t>(a.size)});
  sh.mesh.batch_axes = planner::EffectiveBatchAxes(rj.spec.mesh);
  Status st = protocol::SendMessage(client_->fd.get(), protocol::Encode(sh), fds, /*nonblocking=*/true);
  if (!st.ok()) {
    client_lock.Unlock();
    DropClient("sending SERVER_HELLO failed: " + st.ToString());
    return;
  }
  metrics_->connections.Add({{"outcome", "accepted"}}).Increment();
  metrics_->clients.Set(1);
  LogInfo("trainer connected",
          {{"pid", static_cast<int64_t>(client_->pid)}, {"uid", static_cast<uint64_t>(client_->uid)}, {"step", want}});
  SendReadyBatchesLocked();
}

void SessionServer::SendReadyBatchesLocked() {
  if (!client_ || client_->broken) return;
  while (client_->leased.size() < max_leases_) {
    auto slot = pool_->Lease(client_->next_to_send);
    if (!slot) break;
    protocol::Ready r;
    r.step = client_->next_to_send;
    r.slot = *slot;
    for (size_t i = 0; i < layout_.devices.size(); ++i) {
      const staging::StagedTensor& staged = slot_staged_[*slot][i];
      for (size_t f = 0; f < layout_.fields.size(); ++f) {
        const staging::FieldLayout& field = layout_.fields[f];
        const formats::DLPackType dl = formats::ToDLPackType(field.dtype);
        const staging::FieldTensor& t = layout_.devices[i].fields[f];
        // A ragged field's values: the elements this step's samples take;
        // a dense one's rows: the samples delivered (fewer when some were
        // skipped).
        std::vector<int64_t> shape = t.shape;
        const uint64_t used = f < staged.values_bytes.size() ? staged.values_bytes[f] : 0;
        if (field.ragged) {
          shape = {static_cast<int64_t>(used / formats::DTypeSize(field.dtype))};
        } else {
          shape[0] = static_cast<int64_t>(staged.samples);
        }
        r.tensors.push_back({TensorOffset(i, f), dl.code, dl.bits, std::move(shape), t.strides, staged.ids_checksum,
                             Ragged(i, f, staged.samples)});
      }
    }
    Status st = SendTo(client_->fd.get(), protocol::Encode(r));
    if (!st.ok()) {
      // Possibly on the producer thread: leave the dropping to the server.
      pool_->Release(*slot, r.step);
      client_->broken = true;
      Notify();
      return;
    }
    client_->leased.emplace_back(*slot, r.step);
    client_->next_to_send++;
    metrics_->Delivered();
    metrics_->current_step.Set(static_cast<double>(r.step));
    delivered_step_.store(r.step);
  }
}

void SessionServer::DropClient(const std::string& why, bool keep_leases, const LeaseList* keep) {
  ClientLock lock(*this);
  if (!client_) return;
  const LeaseList& mine = client_->leased;
  LeaseList kept;
  uint32_t reclaimed = 0;
  for (const auto& l : mine) {
    const bool held = keep_leases && (keep == nullptr || std::find(keep->begin(), keep->end(), l) != keep->end());
    if (held) {
      kept.push_back(l);
    } else {
      reclaimed += pool_->Release(l.first, l.second) ? 1 : 0;
    }
  }
  metrics_->leases_reclaimed.Increment(reclaimed);
  metrics_->clients.Set(0);
  LogInfo("trainer disconnected", {{"pid", static_cast<int64_t>(client_->pid)},
                                   {"reason", why},
                                   {"leases_reclaimed", static_cast<uint64_t>(reclaimed)},
                                   {"leases_kept", static_cast<uint64_t>(kept.size())},
                                   {"next_step", client_->next_to_send}});
  // Drained before closing, so an ERROR just sent is not lost to a reset;
  // batches the trainer still holds stay lent until it releases or closes.
  CloseLater(std::move(client_->fd), std::move(kept), client_->pid);
  client_.reset();
}

void SessionServer::ServeClientMessage() {
  auto msg = protocol::ReceiveMessage(ServerClient()->fd.get(), protocol::kMaxMessageBytes);
  if (!msg.ok()) {
    // End of file or a reset: the trainer is gone, its leases come back.
    // Anything else (an oversized datagram) leaves a trainer that may
    // still hold batches: they stay lent until it closes.
    const bool gone = msg.status().code() == StatusCode::kUnavailable;
    if (!gone) metrics_->Error("protocol");
    DropClient(msg.status().ToString(), /*keep_leases=*/!gone);
    return;
  }
  auto decoded = protocol::Decode(msg->bytes);
  if (!decoded.ok()) {
    metrics_->Error("protocol");
    (void)SendTo(ServerClient()->fd.get(), protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kBadRequest,
                                                                                   decoded.status().ToString()}));
    DropClient("malformed message: " + decoded.status().ToString(), /*keep_leases=*/true);
    return;
  }
  if (const auto* bye = std::get_if<protocol::Bye>(&*decoded)) {
    LeaseList keep;
    for (const auto& h : bye->held) keep.emplace_back(h.slot, h.step);
    DropClient("the trainer left the connection (BYE)", /*keep_leases=*/true, &keep);
    return;
  }
  if (const auto* rel = std::get_if<protocol::Release>(&*decoded)) {
    bool ours = false;
    {
      ClientLock lock(*this);
      auto& leased = client_->leased;
      auto it = std::find(leased.begin(), leased.end(), std::make_pair(rel->slot, rel->step));
      ours = it != leased.end() && pool_->Release(rel->slot, rel->step);
      if (ours) {
        leased.erase(it);
        Consumed(rel->step, rel->wait_ns);
        SendReadyBatchesLocked();
      }
    }
    if (!ours) {
      metrics_->Error("protocol");
      (void)SendTo(ServerClient()->fd.get(),
                   protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kBadRequest,
                                                           "RELEASE of slot " + std::to_string(rel->slot) + " step " +
                                                               std::to_string(rel->step) +
                                                               ", which this connection does not lease"}));
      DropClient("bad RELEASE", /*keep_leases=*/true);
    }
    return;
  }
  metrics_->Error("protocol");
  DropClient("unexpected message after the handshake", /*keep_leases=*/true);
}

void SessionServer::Consumed(int64_t step, uint64_t wait_ns) {
  metrics_->batches_consumed.Increment();
  metrics_->trainer_wait.Observe(static_cast<double>(wait_ns) / 1e9);
  consumed_.Consumed(step);
}

void SessionServer::CheckTrainerHoldsSlots(double blocked, double limit) {
  if (blocked > limit && ServerClient()) {
    if (!reported_blocked_) {
      ClientLock lock(*this);
      uint64_t kept = 0;  // batches the trainer still holds from connections it left
      for (const Closing& c : closing_) kept += c.leases.size();
      LogWarn("trainer holds every slot; staging is paused", {{"seconds", blocked},
                                                              {"leased", static_cast<uint64_t>(client_->leased.size())},
                                                              {"kept", kept},
                                                              {"next_step", client_->next_to_send}});
      reported_blocked_ = true;
    }
  } else {
    reported_blocked_ = false;
  }
}

void SessionServer::Run() {
  auto last_watchdog = clock_->Now();
  // The server loop too: a RELEASE it handles a little later costs nothing
  // (the trainer has `prefetch` batches), preempting a producer does.
  ApplyThreadSched(options_.thread_sched, "server");
  while (!stop_) {
    // Connections closing: at most 64 without leases, and at most one per
    // slot with them.
    thread_local std::vector<pollfd> fd_storage;
    fd_storage.resize(4 + closing_.size());
    pollfd* fds = fd_storage.data();
    nfds_t n = 0;
    fds[n++] = {wake_fd_, POLLIN, 0};
    fds[n++] = {listen_fd_.get(), POLLIN, 0};
    const int client_i = ServerClient() ? static_cast<int>(n) : -1;
    if (ServerClient()) fds[n++] = {ServerClient()->fd.get(), POLLIN, 0};
    const int pending_i = pending_ ? static_cast<int>(n) : -1;
    if (pending_) fds[n++] = {pending_->fd.get(), POLLIN, 0};
    const nfds_t closing_i = n;
    for (const auto& c : closing_) fds[n++] = {c.fd.get(), POLLIN, 0};
    int rc = ::poll(fds, n, 250);
    if (rc < 0 && errno != EINTR) {
      LogError("poll failed", {{"error", std::strerror(errno)}});
      failed_ = true;
      break;
    }
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      while (::read(wake_fd_, &v, sizeof v) > 0) {
      }
    }
    if (stop_) break;
    if (failed_ && !failure_reported_) {
      // Staging cannot go on. Stay up so the failure is visible (/healthz
      // answers 503 with the reason; every trainer that connects gets it as
      // an ERROR) until stopped, then exit 1.
      // /healthz first (the hook): a trainer told of the failure may look
      // there at once.
      fatal_message_ = hooks_.failure();
      if (ServerClient()) {
        (void)SendTo(ServerClient()->fd.get(),
                     protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kDataError, fatal_message_}));
        DropClient("staging failed", /*keep_leases=*/true);
      }
      if (pending_) {  // accepted before the failure, hello not yet read
        (void)SendTo(pending_->fd.get(),
                     protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kDataError, fatal_message_}));
        CloseLater(std::move(pending_->fd));
        pending_.reset();
      }
      failure_reported_ = true;
    }
    if (!closing_.empty()) ServeClosing(fds + closing_i, n - closing_i);
    // The trainer's messages before new connections: a BYE and the same
    // trainer's next connection may arrive in one wake-up.
    if (client_i >= 0 && ServerClient() && (fds[client_i].revents & (POLLIN | POLLHUP | POLLERR))) {
      // Every message already queued is served in this wake-up (RELEASEs
      // pile up while the producers keep the cores busy).
      ServeClientMessage();
      for (int more = 0; more < 64 && ServerClient(); ++more) {
        pollfd again{ServerClient()->fd.get(), POLLIN, 0};
        if (::poll(&again, 1, 0) <= 0) break;
        ServeClientMessage();
      }
    }
    if (rc > 0 && (fds[1].revents & POLLIN)) AcceptClient();
    if (ready_pending_.load()) DeliverReady();
    if (pending_i >= 0 && pending_ && (fds[pending_i].revents & (POLLIN | POLLHUP | POLLERR))) ServePending();
    if (pending_ && clock_->Now() - pending_->connected_at > options_.hello_timeout) {
      metrics_->connections.Add({{"outcome", "bad_hello"}}).Increment();
      LogWarn("dropped a trainer connection: no CLIENT_HELLO in time", {{"pid", static_cast<int64_t>(pending_->pid)}});
      pending_.reset();
    }
    if (ServerClient() && ServerClient()->broken) DropClient("sending READY failed", /*keep_leases=*/true);
    if (clock_->Now() - last_watchdog > std::chrono::milliseconds(500)) {
      hooks_.watchdog();
      last_watchdog = clock_->Now();
    }
  }
  // From here on no producer stages into any slot: the trainer keeps the
  // batches it holds (it reconnects to the next sidecar and releases them
  // on this connection, or not at all), and their bytes must not change.
  // Nor is a connection queued where nobody will accept it: a trainer
  // reconnecting finds no socket and backs off instead of waiting 5 s for a
  // SERVER_HELLO that never comes.
  pool_->Shutdown();
  if (listen_fd_.valid()) {
    listen_fd_.Reset();
    ::unlink(options_.socket_path.c_str());
  }
  if (ServerClient()) {
    (void)SendTo(ServerClient()->fd.get(), protocol::Encode(protocol::ErrorMessage{protocol::ErrorCode::kShuttingDown,
                                                                                   "the sidecar is stopping"}));
    DropClient("the sidecar is stopping", /*keep_leases=*/true);
  }
  // Give the connections being closed a moment (at most 300 ms) to read what
  // was sent to them, so the last ERROR is not lost to a reset at exit.
  // Those that keep leases are not waited for: the slots go with the process.
  std::erase_if(closing_, [](const Closing& c) { return !c.leases.empty(); });
  // Real time: the simulated clock of a test stands still while it stops.
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (!closing_.empty() && std::chrono::steady_clock::now() < drain_until) {
    std::vector<pollfd> cfds;
    for (const auto& c : closing_) cfds.push_back({c.fd.get(), POLLIN, 0});
    ::poll(cfds.data(), cfds.size(), 20);
    ServeClosing(cfds.data(), cfds.size());
  }
}

}  // namespace meshload::sidecar
