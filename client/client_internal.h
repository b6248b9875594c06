// The pieces of a Client's connection that client.cc builds on: the socket
// and its release worker (Link), one handshake's state (Connection), and the
// pool mapped into this process (Mapping). Internal to client/: not part of
// the client's interface (client.h).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "client/client.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "protocol/seqpacket.h"

namespace meshload::client {

using Clock = std::chrono::steady_clock;

/// The socket of one connection and its release worker. Owned by a
/// Connection, and by the release worker while it runs: the worker (which
/// may wait for the GPU) outlives the Connection if it has to, so dropping
/// the last batch of a connection never waits for the GPU.
class Link : public std::enable_shared_from_this<Link> {
 public:
  explicit Link(UniqueFd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }

  // Nobody uses the connection any more: it closes now, or, while the
  // release worker still has RELEASEs to send (fences to wait for), the
  // worker closes it once it has sent them.
  void Retire() MESHLOAD_EXCLUDES(queue_mu_, mu_) {
    bool worker;
    {
      MutexLock lock(queue_mu_);
      stopping_ = true;
      worker = worker_started_;
    }
    queue_cv_.NotifyAll();
    if (!worker) Close();
  }

  // A batch handed to the trainer on this connection.
  void AddHeld(uint32_t slot, int64_t step) MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    held_.push_back({slot, step});
  }

  // A slot of a batch handed out and not released yet.
  bool Holds(uint32_t slot) MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return std::any_of(held_.begin(), held_.end(), [&](const protocol::Bye::Held& h) { return h.slot == slot; });
  }

  // The client leaves this connection but not the batches it holds: BYE
  // lists them (the sidecar takes the other slots back, READYs never handed
  // out included). Their RELEASEs still come here. Idempotent.
  void Leave() MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (left_ || closed_) return;
    left_ = true;
    protocol::Bye bye;
    for (const auto& h : held_) {
      if (bye.held.size() < protocol::kMaxByeLeases) bye.held.push_back(h);
    }
    // Never waits (a sidecar that is gone, or one that stopped reading,
    // needs none).
    (void)protocol::SendMessage(fd_.get(), protocol::Encode(bye), {}, /*nonblocking=*/true);
  }

  // A GPU batch whose trainer streams may still read it: the slot goes back
  // (RELEASE) once the fences have passed, from the releaser thread, so the
  // thread dropping the batch does not wait for the GPU. The mapping stays
  // until then too.
  struct Pending {
    std::vector<std::unique_ptr<cuda::Fence>> fences;
    // Streams whose fence could not be recorded yet (another thread is
    // capturing a CUDA graph): retried from the release thread.
    std::vector<std::pair<int, uintptr_t>> unfenced;
    // No stream known (stream=-1, or the raw pointer used): the whole
    // device is waited for before the slot goes back.
    std::vector<int> sync_devices;
    uint32_t slot = 0;
    int64_t step = 0;
    uint64_t wait_ns = 0;
    std::shared_ptr<Mapping> mapping;
  };
  void ReleaseAfter(Pending p) MESHLOAD_EXCLUDES(queue_mu_) {
    MutexLock lock(queue_mu_);
    if (!worker_started_) {
      // Detached, owning the link: it ends after Retire(), once its queue is
      // empty, and nothing ever waits for it.
      worker_started_ = true;
      std::thread([self = shared_from_this()] { self->ReleaserMain(); }).detach();
    }
    queue_.push_back(std::move(p));
    queue_cv_.NotifyOne();
  }

  void SendRelease(uint32_t slot, int64_t step, uint64_t wait_ns) MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = std::find(held_.begin(), held_.end(), protocol::Bye::Held{slot, step});
    if (it != held_.end()) held_.erase(it);
    if (closed_) return;  // the sidecar reclaimed it when we went away
    (void)protocol::SendMessage(fd_.get(), protocol::Encode(protocol::Release{slot, step, wait_ns}));
  }
  void ReleaserMain() MESHLOAD_EXCLUDES(queue_mu_, mu_) {
    ::pthread_setname_np(::pthread_self(), "ml-release");
    MutexLock lock(queue_mu_);
    while (true) {
      while (!stopping_ && queue_.empty()) queue_cv_.Wait(queue_mu_);
      if (queue_.empty()) {  // retired, nothing left: the connection closes here
        lock.Unlock();
        Close();
        return;
      }
      Pending p = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      WaitForTrainer(p);
      SendRelease(p.slot, p.step, p.wait_ns);
      p = Pending{};  // fences and the mapping go here, not under the lock
      lock.Lock();
    }
  }

  static void WaitForTrainer(Pending& p) {
    auto driver = cuda::Driver::Open();
    if (!driver.ok()) return;  // a GPU lease cannot exist then
    for (const auto& [ordinal, stream] : p.unfenced) {
      Status st;
      for (int attempt = 0; attempt < 10000; ++attempt) {  // up to 10 s
        auto f = (*driver)->RecordFence(ordinal, stream);
        st = f.ok() ? Status::Ok() : f.status();
        if (f.ok()) {
          p.fences.push_back(std::move(*f));
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!st.ok()) {
        LogWarn("cannot fence the trainer's stream; releasing the slot after a device synchronization",
                {{"step", p.step}, {"error", st.ToString()}});
        p.sync_devices.push_back(ordinal);
      }
    }
    for (auto& f : p.fences) {
      if (Status st = f->Wait(); !st.ok()) {
        LogWarn("cannot wait for the trainer's stream before releasing a slot",
                {{"step", p.step}, {"error", st.ToString()}});
      }
    }
    for (int ordinal : p.sync_devices) {
      if (Status st = (*driver)->SynchronizeDevice(ordinal); !st.ok()) {
        LogWarn("cannot wait for the device before releasing a slot", {{"step", p.step}, {"error", st.ToString()}});
      }
    }
  }

  // Says goodbye cleanly, once no lease needs the connection: EOF after the
  // RELEASEs already sent, then reads what the sidecar sent that is still
  // unread. Closing with unread messages would make the kernel reset the
  // connection, and the sidecar could lose the last RELEASEs. After a BYE
  // the sidecar sends nothing more, so what is queued is all there is; a
  // connection that did not say BYE waits up to 200 ms for the sidecar's
  // end of file.
  void Close() MESHLOAD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    ::shutdown(fd_.get(), SHUT_WR);
    char buf[512];
    if (left_) {
      while (::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT) > 0) {
      }
    } else {
      const auto deadline = Clock::now() + std::chrono::milliseconds(200);
      while (Clock::now() < deadline) {
        pollfd p{fd_.get(), POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        if (::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT) <= 0) break;  // EOF or error: done
      }
    }
    ::shutdown(fd_.get(), SHUT_RDWR);
  }

 private:
  // Set by the constructor and never reset (Close() shuts the socket down;
  // the descriptor stays open until the Link dies), so fd() reads it without
  // a lock. mu_ keeps what is sent on it (BYE, RELEASE) in order with
  // closing.
  UniqueFd fd_;
  Mutex mu_;
  bool closed_ MESHLOAD_GUARDED_BY(mu_) = false;
  bool left_ MESHLOAD_GUARDED_BY(mu_) = false;                      // BYE sent
  std::vector<protocol::Bye::Held> held_ MESHLOAD_GUARDED_BY(mu_);  // leases handed out and not released
  // The release worker's queue; never held with mu_.
  Mutex queue_mu_;
  CondVar queue_cv_;  // queue_ grew, or stopping_ was set
  std::deque<Pending> queue_ MESHLOAD_GUARDED_BY(queue_mu_);
  bool stopping_ MESHLOAD_GUARDED_BY(queue_mu_) = false;
  bool worker_started_ MESHLOAD_GUARDED_BY(queue_mu_) = false;
};

/// One connection to the sidecar; shared by the client and its leases. When
/// the client leaves it (a reconnect, Close(), an error), it says BYE with
/// the leases still held: the sidecar keeps those slots lent, so the bytes of
/// batches the trainer still holds never change, and their RELEASEs still go
/// on this connection, which stays open until its last lease is gone.
class Connection {
 public:
  using Pending = Link::Pending;
  explicit Connection(UniqueFd fd) : link_(std::make_shared<Link>(std::move(fd))) {}
  ~Connection() { link_->Retire(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  int fd() const { return link_->fd(); }
  void AddHeld(uint32_t slot, int64_t step) { link_->AddHeld(slot, step); }
  bool Holds(uint32_t slot) { return link_->Holds(slot); }
  void Leave() { link_->Leave(); }
  void ReleaseAfter(Pending p) { link_->ReleaseAfter(std::move(p)); }
  void SendRelease(uint32_t slot, int64_t step, uint64_t wait_ns) { link_->SendRelease(slot, step, wait_ns); }

 private:
  std::shared_ptr<Link> link_;
};

/// The slot pool in this process: the host memfd mapped once, or every
/// (device, slot) allocation of a GPU pool imported and mapped once (per
/// connection) for the trainer's own device with that UUID.
class Mapping {
 public:
  static Result<std::shared_ptr<Mapping>> MapHost(int fd, uint64_t bytes) {
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
    m->slot_bytes_ = 0;
    return m;
  }

  // The trainer's ordinal for each of the sidecar's GPUs, by UUID.
  static Result<std::vector<int>> MapDevices(const cuda::Driver& driver, const protocol::ServerHello& sh) {
    std::vector<int> ordinals;
    for (const auto& d : sh.devices) {
      const int o = driver.OrdinalOf(d.uuid);
      if (o < 0) {
        std::string theirs, ours;
        for (const auto& x : sh.devices) theirs += (theirs.empty() ? "" : ", ") + x.uuid;
        for (const auto& x : driver.devices()) {
          ours += (ours.empty() ? "" : ", ") + std::to_string(x.ordinal) + "=" + x.uuid;
        }
        return FailedPrecondition("the sidecar stages batches on " + d.uuid + " (device " +
                                  std::to_string(d.global_index) +
                                  " of the mesh), which this process cannot see. "
                                  "Sidecar's GPUs: [" +
                                  theirs + "]; this process's GPUs: [" + ours +
                                  "]. Give the trainer container the same GPUs (resources, CUDA_VISIBLE_DEVICES)");
      }
      ordinals.push_back(o);
    }
    return ordinals;
  }

  static Result<std::shared_ptr<Mapping>> ImportCuda(const protocol::ServerHello& sh,
                                                     const std::vector<UniqueFd>& fds) {
    auto driver = cuda::Driver::Open();
    if (!driver.ok()) {
      return FailedPrecondition("the sidecar stages batches in GPU memory, but this process cannot use CUDA: " +
                                driver.status().message());
    }
    MESHLOAD_ASSIGN_OR_RETURN(std::vector<int> ordinals, MapDevices(**driver, sh));
    auto m = std::shared_ptr<Mapping>(new Mapping());
    m->ordinals_ = ordinals;
    m->slots_ = sh.slots;
    m->slot_bytes_ = sh.slot_bytes;
    // Once per (device, slot), here and never per batch.
    for (size_t i = 0; i < sh.devices.size(); ++i) {
      for (uint32_t s = 0; s < sh.slots; ++s) {
        const size_t k = i * sh.slots + s;
        auto imported = sh.memory == protocol::MemoryKind::kCudaVmmFd
                            ? (*driver)->Import(ordinals[i], fds[k].get(), sh.slot_bytes)
                            : (*driver)->OpenIpc(ordinals[i], ToHandle(sh.ipc_handles[k]), sh.slot_bytes);
        if (!imported.ok()) {
          return imported.status().WithLocationPrefix("importing slot " + std::to_string(s) + " of " +
                                                      sh.devices[i].uuid);
        }
        m->imports_.push_back(std::move(*imported));
      }
    }
    return m;
  }

  ~Mapping() {
    if (base_) ::munmap(base_, bytes_);
  }
  bool on_gpu() const { return !imports_.empty(); }
  int64_t gpu_imports() const { return static_cast<int64_t>(imports_.size()); }
  const std::vector<int>& ordinals() const { return ordinals_; }
  int ordinal(size_t device) const { return on_gpu() ? ordinals_[device] : 0; }
  /// Where (local device, slot)'s memory starts; tensor offsets are from here.
  uint8_t* Base(size_t device, uint32_t slot, uint64_t host_slot_bytes) const {
    if (on_gpu()) return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(imports_[device * slots_ + slot]->ptr()));
    return base_ + static_cast<uint64_t>(slot) * host_slot_bytes;
  }

 private:
  Mapping() = default;
  static cuda::IpcHandle ToHandle(const std::string& s) {
    cuda::IpcHandle h{};
    std::memcpy(h.data(), s.data(), std::min(s.size(), h.size()));
    return h;
  }
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0;
  std::vector<int> ordinals_;
  std::vector<std::unique_ptr<cuda::ImportedAllocation>> imports_;
};

}  // namespace meshload::client
