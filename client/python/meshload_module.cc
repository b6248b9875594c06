/// \file
/// meshload._meshload: the Python face of client::Client (client/client.h).
///
///   with meshload.Client("/run/meshload/sidecar.sock") as client:
///     for batch in client:                       # blocks until staged
///       x = torch.from_dlpack(batch.tensors[0])  # zero-copy view of the slot
///
/// Ownership is the whole contract. A Batch, each of its Tensors, and every
/// DLPack export of a Tensor hold one reference to the batch's
/// client::Lease; the slot goes back to the sidecar (RELEASE) when the last
/// of them dies, so a framework tensor made by from_dlpack keeps its memory
/// staged and mapped for as long as it lives, and a trainer that keeps
/// `prefetch` batches alive stalls the sidecar (by design: memory stays
/// bounded). Nothing is ever copied.
///
/// DLPack: __dlpack__ follows the Python array API (2023.12): a consumer that
/// passes max_version >= (1, 0) gets a "dltensor_versioned" capsule holding a
/// DLManagedTensorVersioned (DLPack 1.0 ABI, dlpack_versioned.h); any other
/// gets a legacy "dltensor" capsule. The capsule destructor frees the managed
/// tensor only while the capsule is unconsumed; a consumer renames it
/// "used_dltensor[_versioned]" and owns the deleter from then on. The
/// deleter touches no Python object and needs no GIL: consumers call it from
/// any thread (a framework's allocator, a garbage collector).
///
/// Errors: the sidecar gone for good (kUnavailable after the reconnect
/// attempts) raises meshload.SidecarGone (a ConnectionError); a timeout
/// raises TimeoutError; everything else meshload.MeshloadError (a
/// RuntimeError). Both meshload exceptions carry `.code`, the C++ status
/// code name ("data_loss", "failed_precondition", ...).
///
/// Thread safety: every object may be shared between Python threads.
/// Client.next() releases the GIL while it blocks; calls of next() and
/// close() on one Client are serialized (a second caller waits, without the
/// GIL, for the first). Lease release never needs the GIL and never waits on
/// Python, so dropping a batch from any thread cannot deadlock.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "client/client.h"
#include "client/python/dlpack_versioned.h"
#include "common/cuda/driver.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

#ifndef MESHLOAD_VERSION
#define MESHLOAD_VERSION "unknown"
#endif

namespace meshload::client::python {
namespace {

namespace py = pybind11;

// The module's exception types; created once at import and never freed (the
// module dict holds them too), so a raise never races module teardown.
PyObject* g_meshload_error = nullptr;
PyObject* g_sidecar_gone = nullptr;

/// Raises `type(message)` with `.code = code` and unwinds to pybind11.
[[noreturn]] void RaiseWithCode(PyObject* type, const std::string& message, std::string_view code) {
  py::object exc = py::reinterpret_borrow<py::object>(type)(message);
  exc.attr("code") = py::str(code.data(), code.size());
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

/// A std::timed_mutex the thread-safety analysis understands, for the lock
/// next() waits for by a deadline (meshload::Mutex has no timed lock).
class MESHLOAD_CAPABILITY("mutex") TimedMutex {
 public:
  void Lock() MESHLOAD_ACQUIRE() { mu_.lock(); }
  void Unlock() MESHLOAD_RELEASE() { mu_.unlock(); }
  bool TryLock() MESHLOAD_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  bool TryLockUntil(std::chrono::steady_clock::time_point until) MESHLOAD_TRY_ACQUIRE(true) {
    return mu_.try_lock_until(until);
  }

 private:
  std::timed_mutex mu_;
};

/// Holds a TimedMutex for its scope: takes it, or adopts it from a caller
/// that took it (TryLockUntil); Unlock() releases it early.
class MESHLOAD_SCOPED_CAPABILITY TimedMutexLock {
 public:
  explicit TimedMutexLock(TimedMutex& mu) MESHLOAD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  TimedMutexLock(TimedMutex& mu, std::adopt_lock_t) MESHLOAD_REQUIRES(mu) : mu_(mu) {}
  ~TimedMutexLock() MESHLOAD_RELEASE() {
    if (held_) mu_.Unlock();
  }
  TimedMutexLock(const TimedMutexLock&) = delete;
  TimedMutexLock& operator=(const TimedMutexLock&) = delete;
  void Unlock() MESHLOAD_RELEASE() {
    mu_.Unlock();
    held_ = false;
  }

 private:
  TimedMutex& mu_;
  bool held_ = true;
};

/// Maps a client Status onto the Python exception the API promises.
[[noreturn]] void RaiseStatus(const Status& st) {
  const std::string message = st.ToString();
  switch (st.code()) {
    case StatusCode::kDeadlineExceeded:
      PyErr_SetString(PyExc_TimeoutError, message.c_str());
      throw py::error_already_set();
    case StatusCode::kUnavailable: RaiseWithCode(g_sidecar_gone, message, StatusCodeName(st.code()));
    default: RaiseWithCode(g_meshload_error, message, StatusCodeName(st.code()));
  }
}

/// numpy's spelling of a DLPack (code, bits) pair with one lane.
std::string DTypeName(uint8_t code, uint8_t bits) {
  struct Name {
    uint8_t code, bits;
    const char* name;
  };
  static constexpr Name kNames[] = {
      {kDLInt, 8, "int8"},       {kDLUInt, 8, "uint8"},     {kDLInt, 16, "int16"},     {kDLUInt, 16, "uint16"},
      {kDLInt, 32, "int32"},     {kDLUInt, 32, "uint32"},   {kDLInt, 64, "int64"},     {kDLUInt, 64, "uint64"},
      {kDLFloat, 16, "float16"}, {kDLFloat, 32, "float32"}, {kDLFloat, 64, "float64"}, {kDLBfloat, 16, "bfloat16"},
      {kDLBoolCode, 8, "bool"},
  };
  for (const Name& n : kNames) {
    if (n.code == code && n.bits == bits) return n.name;
  }
  // A newer sidecar may stage a type this build does not know; say what it
  // is rather than fail, since the bytes are still usable through DLPack.
  return "dlpack(code=" + std::to_string(code) + ",bits=" + std::to_string(bits) + ")";
}

py::tuple ToTuple(const std::vector<int64_t>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}

/// One DLPack export: the managed tensor a consumer holds, plus everything
/// it points at. The Lease keeps the slot leased and the pool mapped; the
/// shape and strides are copies so the export outlives the Tensor object.
template <typename Managed>
struct Export {
  Managed managed{};
  std::shared_ptr<client::Lease> lease;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  /// The DLPack deleter. Runs in the consumer, on any thread, with or
  /// without the GIL: it may only drop C++ state (the last Lease reference
  /// sends RELEASE on the socket, which needs no Python).
  static void Delete(Managed* self) noexcept {
    if (self == nullptr) return;
    delete static_cast<Export*>(self->manager_ctx);
  }
};

/// The capsule names of the Python DLPack protocol, before and after a
/// consumer takes ownership.
template <typename Managed>
struct CapsuleNames;
template <>
struct CapsuleNames<DLManagedTensor> {
  static constexpr const char* kFresh = "dltensor";
  static constexpr const char* kUsed = "used_dltensor";
};
template <>
struct CapsuleNames<DLManagedTensorVersioned> {
  static constexpr const char* kFresh = "dltensor_versioned";
  static constexpr const char* kUsed = "used_dltensor_versioned";
};

/// Frees an export nobody consumed. A consumer renames the capsule to the
/// "used_" name when it takes the managed tensor, and from then on it alone
/// calls the deleter; calling it here too would be a double free.
template <typename Managed>
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, CapsuleNames<Managed>::kUsed)) return;
  // A destructor may run while an exception is propagating; keep it intact.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, CapsuleNames<Managed>::kFresh));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

/// One local device's tensor of a batch: a view into the leased slot.
class Tensor {
 public:
  Tensor(client::Tensor t, std::shared_ptr<client::Lease> lease, int64_t step)
      : t_(std::move(t)), lease_(std::move(lease)), step_(step) {}

  py::tuple shape() const { return ToTuple(t_.shape); }
  std::string dtype() const { return DTypeName(t_.dtype_code, t_.dtype_bits); }
  uint64_t nbytes() const { return t_.nbytes; }
  int64_t ndim() const { return static_cast<int64_t>(t_.shape.size()); }
  int64_t global_device() const { return t_.global_device; }
  uint64_t ids_checksum() const { return t_.ids_checksum; }
  int64_t step() const { return step_; }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(t_.data); }
  py::tuple device() const { return py::make_tuple(t_.device_type, t_.device_id); }

  std::string Repr() const {
    std::string shape;
    for (size_t i = 0; i < t_.shape.size(); ++i) {
      shape += (i ? ", " : "") + std::to_string(t_.shape[i]);
    }
    if (t_.shape.size() == 1) shape += ",";
    return "<meshload.Tensor step=" + std::to_string(step_) + " global_device=" + std::to_string(t_.global_device) +
           " shape=(" + shape + ") dtype=" + dtype() + ">";
  }

  /// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
  py::object DLPack(const py::object& stream, const py::object& max_version, const py::object& dl_device,
                    const py::object& copy) const {
    if (t_.device_type == kDLCPU) {
      // Host memory has no stream to order against. -1 ("do not
      // synchronize") asks for nothing either, so it is accepted too.
      if (!stream.is_none() && !(py::isinstance<py::int_>(stream) && stream.equal(py::int_(-1)))) {
        throw py::buffer_error("meshload tensors are in host memory: __dlpack__ takes stream=None, got " +
                               py::repr(stream).cast<std::string>());
      }
    } else {
      // CUDA: the sidecar fenced its copies before READY, so the consumer's
      // stream needs to wait on nothing. The stream is remembered instead:
      // the slot is released only after the work queued on it is done.
      // None means the legacy default stream (1); -1: the consumer
      // synchronizes itself; 0 is ambiguous and refused (the DLPack rules).
      int64_t handle = 1;
      if (!stream.is_none()) {
        if (!py::isinstance<py::int_>(stream)) {
          throw py::type_error("stream must be None or an int, got " + py::repr(stream).cast<std::string>());
        }
        handle = stream.cast<int64_t>();
        if (handle == 0) throw py::value_error("stream=0 is ambiguous for CUDA; pass 1 for the legacy default stream");
        if (handle < -1) throw py::value_error("stream must be -1, 1, 2 or a CUDA stream handle");
      }
      if (handle > 0) lease_->AddConsumerStream(t_.device_id, static_cast<uintptr_t>(handle));
    }
    if (!dl_device.is_none()) {
      const py::tuple mine = device();
      if (!dl_device.equal(mine)) {
        throw py::buffer_error("meshload tensors live on DLPack device " + py::repr(mine).cast<std::string>() +
                               " and are never copied; cannot export to " + py::repr(dl_device).cast<std::string>());
      }
    }
    if (!copy.is_none()) {
      const int truth = PyObject_IsTrue(copy.ptr());
      if (truth < 0) throw py::error_already_set();
      if (truth) {
        throw py::buffer_error("meshload tensors are zero-copy views; copy in your framework");
      }
    }
    bool versioned = false;
    if (!max_version.is_none()) {
      const bool ok = py::isinstance<py::sequence>(max_version) && py::len(max_version) == 2 &&
                      py::isinstance<py::int_>(max_version[py::int_(0)]);
      if (!ok) {
        throw py::type_error("max_version must be None or a (major, minor) tuple, got " +
                             py::repr(max_version).cast<std::string>());
      }
      // Compared as Python ints: a consumer from the future may send any size.
      const py::object major = max_version[py::int_(0)];
      const int ge = PyObject_RichCompareBool(major.ptr(), py::int_(kDLPackMajor).ptr(), Py_GE);
      if (ge < 0) throw py::error_already_set();
      versioned = ge == 1;
    }
    return versioned ? MakeCapsule<DLManagedTensorVersioned>() : MakeCapsule<DLManagedTensor>();
  }

 private:
  template <typename Managed>
  py::object MakeCapsule() const {
    auto ex = std::make_unique<Export<Managed>>();
    ex->lease = lease_;
    ex->shape = t_.shape;
    ex->strides = t_.strides;
    DLTensor& dl = ex->managed.dl_tensor;
    dl.data = t_.data;
    dl.device = DLDevice{static_cast<DLDeviceType>(t_.device_type), t_.device_id};
    dl.ndim = static_cast<int>(ex->shape.size());
    dl.dtype = DLDataType{t_.dtype_code, t_.dtype_bits, 1};
    dl.shape = ex->shape.data();
    // Explicit element strides (the sidecar's, C order) rather than NULL:
    // consumers then never have to guess compactness.
    dl.strides = ex->strides.size() == ex->shape.size() ? ex->strides.data() : nullptr;
    dl.byte_offset = 0;
    ex->managed.manager_ctx = ex.get();
    ex->managed.deleter = &Export<Managed>::Delete;
    if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
      ex->managed.version = DLPackVersion{kDLPackMajor, kDLPackMinor};
      // Writable: the slot is the trainer's until released, and the pool is
      // mapped read-write.
      ex->managed.flags = 0;
    }
    PyObject* capsule = PyCapsule_New(&ex->managed, CapsuleNames<Managed>::kFresh, &CapsuleDestructor<Managed>);
    if (capsule == nullptr) throw py::error_already_set();  // `ex` still owns the export
    ex.release();                                           // the capsule (or its consumer) owns it now
    return py::reinterpret_steal<py::object>(capsule);
  }

  client::Tensor t_;
  std::shared_ptr<client::Lease> lease_;
  int64_t step_;
};

/// One local device's batch of variable-size samples: the samples' elements
/// back to back (`values`) and their int64 offsets into them (`offsets`,
/// n + 1 of them, in elements), both zero-copy Tensors in the leased slot.
/// to_list() and padded() are added in Python (meshload/ragged.py).
class Ragged {
 public:
  Ragged(const client::Tensor& t, const std::shared_ptr<client::Lease>& lease, int64_t step)
      : samples_(t.samples), global_device_(t.global_device), ids_checksum_(t.ids_checksum), step_(step) {
    values_ = std::make_shared<Tensor>(t, lease, step);
    client::Tensor o;
    o.data = const_cast<int64_t*>(t.offsets);  // DLPack views are writable; so is the slot
    o.dtype_code = 0;                          // kDLInt
    o.dtype_bits = 64;
    o.shape = {static_cast<int64_t>(t.samples + 1)};
    o.strides = {1};
    o.nbytes = (t.samples + 1) * sizeof(int64_t);
    o.device_type = t.device_type;
    o.device_id = t.device_id;
    o.global_device = t.global_device;
    o.ids_checksum = t.ids_checksum;
    offsets_ = std::make_shared<Tensor>(std::move(o), lease, step);
  }
  const std::shared_ptr<Tensor>& values() const { return values_; }
  const std::shared_ptr<Tensor>& offsets() const { return offsets_; }
  uint64_t samples() const { return samples_; }
  int64_t global_device() const { return global_device_; }
  uint64_t ids_checksum() const { return ids_checksum_; }
  int64_t step() const { return step_; }
  std::string dtype() const { return values_->dtype(); }
  py::tuple device() const { return values_->device(); }
  std::string Repr() const {
    return "<meshload.Ragged step=" + std::to_string(step_) + " global_device=" + std::to_string(global_device_) +
           " samples=" + std::to_string(samples_) + " values=" + py::str(values_->shape()).cast<std::string>() +
           " dtype=" + dtype() + ">";
  }

 private:
  std::shared_ptr<Tensor> values_;
  std::shared_ptr<Tensor> offsets_;
  uint64_t samples_;
  int64_t global_device_;
  uint64_t ids_checksum_;
  int64_t step_;
};

using DeviceBatch = std::variant<std::shared_ptr<Tensor>, std::shared_ptr<Ragged>>;

/// The job's device mesh from the sidecar's hello (protocol::MeshInfo).
class JobMesh {
 public:
  explicit JobMesh(protocol::MeshInfo m) : m_(std::move(m)) {}
  uint32_t processes() const { return m_.processes; }
  uint32_t devices_per_process() const { return m_.devices_per_process; }
  py::tuple axes() const {
    py::tuple t(m_.axes.size());
    for (size_t i = 0; i < m_.axes.size(); ++i) t[i] = py::make_tuple(m_.axes[i].name, m_.axes[i].size);
    return t;
  }
  py::tuple batch_axes() const {
    py::tuple t(m_.batch_axes.size());
    for (size_t i = 0; i < m_.batch_axes.size(); ++i) t[i] = py::str(m_.batch_axes[i]);
    return t;
  }
  bool Equals(const JobMesh& o) const { return m_ == o.m_; }
  const protocol::MeshInfo& info() const { return m_; }
  std::string Repr() const {
    std::string axes, batch;
    for (const auto& a : m_.axes) axes += (axes.empty() ? "" : ", ") + a.name + "=" + std::to_string(a.size);
    for (const auto& b : m_.batch_axes) batch += (batch.empty() ? "" : ", ") + b;
    return "<meshload.JobMesh processes=" + std::to_string(m_.processes) +
           " devices_per_process=" + std::to_string(m_.devices_per_process) + " axes=(" + axes + ") batch_axes=(" +
           batch + ")>";
  }

 private:
  protocol::MeshInfo m_;
};

/// One step's batch: a Tensor (or Ragged) per local device and field, all
/// sharing the lease.
class Batch {
 public:
  Batch(client::Batch b, std::shared_ptr<JobMesh> mesh, std::string job, uint32_t process,
        std::vector<std::string> fields)
      : fields_(std::move(fields)),
        step_(b.step),
        wait_seconds_(b.wait_seconds),
        lease_(std::move(b.lease)),
        mesh_(std::move(mesh)),
        job_(std::move(job)),
        process_(process) {
    tensors_.reserve(b.tensors.size());
    for (client::Tensor& t : b.tensors) {
      if (t.offsets != nullptr) {
        tensors_.emplace_back(std::make_shared<Ragged>(t, lease_, step_));
      } else {
        tensors_.emplace_back(std::make_shared<Tensor>(std::move(t), lease_, step_));
      }
    }
  }
  int64_t step() const { return step_; }
  double wait_seconds() const { return wait_seconds_; }
  uint32_t slot() const { return lease_->slot(); }
  /// The same Tensor (or Ragged) objects on every call (pybind11 maps a held
  /// pointer back to its existing Python object), so
  /// `b.tensors[0] is b.tensors[0]`.
  /// A job of named fields (WebDataset, MDS, TFRecord): per device, a dict from
  /// field name to its Tensor or Ragged.
  py::object tensors() const {
    if (fields_.size() == 1 && fields_[0].empty()) return py::cast(tensors_);
    py::list out;
    for (size_t i = 0; i < tensors_.size(); i += fields_.size()) {
      py::dict d;
      for (size_t f = 0; f < fields_.size(); ++f) d[py::str(fields_[f])] = py::cast(tensors_[i + f]);
      out.append(std::move(d));
    }
    return out;
  }
  /// The batch's field names ("" alone for the formats of one tensor).
  py::tuple fields() const { return py::cast(fields_); }
  /// One field's Tensor (or Ragged) per local device.
  std::vector<DeviceBatch> field(const std::string& name) const {
    const auto it = std::find(fields_.begin(), fields_.end(), name);
    if (it == fields_.end()) {
      std::string names;
      for (const auto& f : fields_) names += (names.empty() ? "'" : ", '") + f + "'";
      throw py::key_error("no field '" + name + "' in this batch (its fields: " + names + ")");
    }
    const size_t f = static_cast<size_t>(it - fields_.begin());
    std::vector<DeviceBatch> out;
    for (size_t i = f; i < tensors_.size(); i += fields_.size()) out.push_back(tensors_[i]);
    return out;
  }
  const std::shared_ptr<JobMesh>& mesh() const { return mesh_; }
  const std::string& job() const { return job_; }
  uint32_t process() const { return process_; }
  std::string Repr() const {
    return "<meshload.Batch step=" + std::to_string(step_) + " tensors=" + std::to_string(tensors_.size()) +
           (fields_.size() > 1 || !fields_[0].empty() ? " fields=" + std::to_string(fields_.size()) : "") +
           " slot=" + std::to_string(lease_->slot()) + ">";
  }

 private:
  std::vector<std::string> fields_;
  int64_t step_;
  double wait_seconds_;
  std::shared_ptr<client::Lease> lease_;
  std::shared_ptr<JobMesh> mesh_;
  std::string job_;
  uint32_t process_;
  std::vector<DeviceBatch> tensors_;
};

/// What the properties report; copied out of the client after every call
/// that may reconnect, so reading a property never waits for a blocked next().
struct Snapshot {
  protocol::ServerHello hello;
  std::shared_ptr<JobMesh> mesh;  // hello.mesh, shared by the batches
  uint64_t handshakes = 0;        // client::Client::handshakes() when hello was copied
  int64_t next_step = 0;
  int reconnects = 0;
  bool closed = false;
};

class Client {
 public:
  Client(std::string socket_path, std::optional<int64_t> start_step, int max_reconnect_attempts)
      : socket_path_(socket_path.empty() && std::getenv(client::kSocketEnv) ? std::getenv(client::kSocketEnv)
                                                                            : socket_path) {
    if (start_step && *start_step < 0) throw py::value_error("start_step must be >= 0 or None");
    if (max_reconnect_attempts < 0) throw py::value_error("max_reconnect_attempts must be >= 0");
    if (socket_path_.empty()) {
      throw py::value_error(std::string("no socket path: give one, or set ") + client::kSocketEnv +
                            " (the sidecar-injection webhook sets it in trainer containers)");
    }
    client::ClientOptions opt;
    opt.socket_path = socket_path_;
    opt.start_step = start_step;
    opt.max_reconnect_attempts = max_reconnect_attempts;
    Result<std::unique_ptr<client::Client>> c = client::Client::Create(std::move(opt));
    if (!c.ok()) RaiseStatus(c.status());
    client_ = std::move(*c);
    raw_ = client_.get();
    // Connects, retrying with backoff while the sidecar is not up yet. A
    // signal runs Python's handlers (Ctrl-C raises KeyboardInterrupt), then
    // the wait goes on where it was.
    while (true) {
      Status st;
      {
        py::gil_scoped_release nogil;
        st = client_->EnsureConnected();
      }
      if (st.ok()) break;
      if (st.code() != StatusCode::kCancelled) RaiseStatus(st);
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    TakeSnapshot();
  }

  std::shared_ptr<Batch> Next(std::optional<double> timeout_seconds) MESHLOAD_EXCLUDES(mu_, snap_mu_) {
    std::optional<std::chrono::milliseconds> timeout;
    if (timeout_seconds && !std::isinf(*timeout_seconds)) {
      if (std::isnan(*timeout_seconds) || *timeout_seconds < 0) {
        throw py::value_error("timeout must be None or a number of seconds >= 0");
      }
      // Round up, and to at least 1 ms: the client gives up before polling
      // once the deadline has passed, so 0 would never see a staged batch.
      // poll() takes an int of milliseconds.
      const double ms = std::min(std::ceil(*timeout_seconds * 1000.0), static_cast<double>(INT_MAX));
      timeout = std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(ms)));
    }
    // The whole call's deadline, when there is a timeout.
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (timeout) deadline = std::chrono::steady_clock::now() + *timeout;
    Result<client::Batch> got = Status(StatusCode::kFailedPrecondition, "the client is closed", socket_path_);
    // A signal interrupts the wait: Python's handlers run (Ctrl-C raises
    // KeyboardInterrupt here), and the wait goes on if none raised, for
    // what is left of the timeout (signals that come often must not
    // stretch it).
    while (true) {
      if (!LockBy(deadline)) {
        got = Status(StatusCode::kDeadlineExceeded,
                     "no batch within " + std::to_string(timeout->count()) +
                         " ms: another thread's next() was using the client all that time",
                     socket_path_);
        break;
      }
      TimedMutexLock lock(mu_, std::adopt_lock);
      if (!client_) break;
      std::optional<std::chrono::milliseconds> left;
      if (deadline) {
        left = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          *deadline - std::chrono::steady_clock::now()));
      }
      {
        py::gil_scoped_release nogil;
        got = client_->Next(left);
        TakeSnapshot();
      }
      if (got.ok() || got.status().code() != StatusCode::kCancelled) break;
      lock.Unlock();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!got.ok()) RaiseStatus(got.status());
    std::shared_ptr<JobMesh> mesh;
    std::string job;
    uint32_t process;
    std::vector<std::string> fields;
    {
      // What the batch names, without copying the whole hello each step.
      MutexLock lock(snap_mu_);
      mesh = snap_.mesh;
      job = snap_.hello.job;
      process = snap_.hello.process;
      fields = snap_.hello.fields;
    }
    return std::make_shared<Batch>(std::move(*got), std::move(mesh), std::move(job), process, std::move(fields));
  }

  void Close() MESHLOAD_EXCLUDES(mu_, raw_mu_, snap_mu_) {
    {
      // Wakes a next() waiting in another thread (it raises "closed"), so
      // closing never waits for a batch that may never come.
      MutexLock lock(raw_mu_);
      if (raw_) raw_->Interrupt();
    }
    py::gil_scoped_release nogil;
    TimedMutexLock lock(mu_);
    if (!client_) return;
    {
      MutexLock raw(raw_mu_);
      raw_ = nullptr;
    }
    // Live leases keep their memory mapped and their slots (BYE lists them).
    client_->Close();
    client_.reset();
    MutexLock snap(snap_mu_);
    snap_.closed = true;
  }

  Snapshot snapshot() const MESHLOAD_EXCLUDES(snap_mu_) {
    MutexLock lock(snap_mu_);
    return snap_;
  }
  const std::string& socket_path() const { return socket_path_; }

 private:
  // Takes mu_ with the GIL released (lock order: nobody waits for mu_ while
  // holding the GIL), by `deadline` if given (false when it passes first).
  // Between tries Python's signal handlers run, so Ctrl-C reaches a thread
  // that waits for another thread's next(). (The analysis trusts the
  // annotation here: it does not check a try-lock function's own body.)
  bool LockBy(std::optional<std::chrono::steady_clock::time_point> deadline) MESHLOAD_TRY_ACQUIRE(true, mu_) {
    // Free (the usual case): taken with the GIL held, which a try never
    // waits with.
    if (mu_.TryLock()) return true;
    while (true) {
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      if (deadline && *deadline < until) until = *deadline;
      bool locked;
      {
        py::gil_scoped_release nogil;
        locked = mu_.TryLockUntil(until);
      }
      if (locked) return true;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
    }
  }

  // Called by the constructor too, before the object is shared (the
  // analysis does not check constructors).
  void TakeSnapshot() MESHLOAD_REQUIRES(mu_) MESHLOAD_EXCLUDES(snap_mu_) {
    MutexLock lock(snap_mu_);
    // The hello changes only with a new connection: copied then, not each
    // step (its strings and vectors are a dozen allocations).
    if (snap_.handshakes != client_->handshakes()) {
      snap_.handshakes = client_->handshakes();
      snap_.hello = client_->hello();
      // A reconnect may bring another job's mesh (a resized job): the
      // batches from then on carry the new one.
      if (!snap_.mesh || !(snap_.mesh->info() == snap_.hello.mesh)) {
        snap_.mesh = std::make_shared<JobMesh>(snap_.hello.mesh);
      }
    }
    snap_.next_step = client_->next_step();
    snap_.reconnects = client_->reconnects();
  }

  const std::string socket_path_;
  // Serializes next() and close() (client::Client is used by one thread at
  // a time). Lock order: mu_ before raw_mu_ and snap_mu_.
  TimedMutex mu_;
  std::unique_ptr<client::Client> client_ MESHLOAD_GUARDED_BY(mu_);  // null once closed
  // Held only to call Interrupt(), which may come while next() holds mu_.
  Mutex raw_mu_ MESHLOAD_ACQUIRED_AFTER(mu_);
  client::Client* raw_ MESHLOAD_GUARDED_BY(raw_mu_) = nullptr;  // client_ for Interrupt() (null once closed)
  // Held briefly, never while waiting for anything.
  mutable Mutex snap_mu_ MESHLOAD_ACQUIRED_AFTER(mu_);
  Snapshot snap_ MESHLOAD_GUARDED_BY(snap_mu_);
};

py::list Devices(const protocol::ServerHello& hello) {
  py::list out;
  for (const protocol::DeviceInfo& d : hello.devices) {
    py::dict e;
    e["global_index"] = d.global_index;
    e["kind"] = d.kind;
    e["uuid"] = d.uuid;
    out.append(e);
  }
  return out;
}

}  // namespace
}  // namespace meshload::client::python

PYBIND11_MODULE(_meshload, m) {
  namespace py = pybind11;
  using namespace meshload::client::python;  // NOLINT(build/namespaces): the bindings name every class

  m.doc() = "meshload trainer client (C++ extension); see the meshload package docstring.";
  m.attr("__version__") = MESHLOAD_VERSION;
  {
    py::dict info;
    info["version"] = MESHLOAD_VERSION;
    info["gpu_import"] = meshload::cuda::BuildDescription();
    info["protocol_version"] = meshload::protocol::kProtocolVersion;
    m.attr("build_info") = info;
  }

  g_meshload_error = PyErr_NewExceptionWithDoc(
      "meshload.MeshloadError", "An error from the meshload client or the sidecar; `.code` names its kind.",
      PyExc_RuntimeError, nullptr);
  if (g_meshload_error == nullptr) throw py::error_already_set();
  m.attr("MeshloadError") = py::reinterpret_borrow<py::object>(g_meshload_error);
  g_sidecar_gone = PyErr_NewExceptionWithDoc(
      "meshload.SidecarGone", "The sidecar went away and did not come back within the reconnect attempts.",
      PyExc_ConnectionError, nullptr);
  if (g_sidecar_gone == nullptr) throw py::error_already_set();
  m.attr("SidecarGone") = py::reinterpret_borrow<py::object>(g_sidecar_gone);

  py::class_<Tensor, std::shared_ptr<Tensor>>(m, "Tensor",
                                              "One local device's part of a batch: a zero-copy view of the "
                                              "leased slot, exported through DLPack.")
      .def_property_readonly("shape", &Tensor::shape)
      .def_property_readonly("dtype", &Tensor::dtype, "numpy-style dtype name, e.g. 'uint8', 'bfloat16'")
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("ndim", &Tensor::ndim)
      .def_property_readonly("global_device", &Tensor::global_device, "the device's number in the mesh")
      .def_property_readonly("ids_checksum", &Tensor::ids_checksum,
                             "SampleIdsChecksum of the sample ids staged for this device")
      .def_property_readonly("step", &Tensor::step)
      .def_property_readonly("data_ptr", &Tensor::data_ptr, "address of the first element (debugging)")
      .def_property_readonly("device", &Tensor::device, "(DLPack device type, device id); (1, 0) is host memory")
      .def("__dlpack_device__", &Tensor::device)
      .def("__dlpack__", &Tensor::DLPack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "A DLPack capsule viewing this tensor; 'dltensor_versioned' (DLPack 1.0) when "
           "max_version >= "
           "(1, 0), else 'dltensor'. The export keeps the slot leased until its consumer frees it.")
      .def("__repr__", &Tensor::Repr);

  py::class_<Ragged, std::shared_ptr<Ragged>>(
      m, "Ragged",
      "One local device's batch of variable-size samples: .values (their elements back to back) and .offsets "
      "(int64, samples + 1, in elements: sample k is values[offsets[k]:offsets[k+1]]), both zero-copy Tensors.")
      .def_property_readonly("values", &Ragged::values, "the samples' elements back to back, a 1-D Tensor")
      .def_property_readonly("offsets", &Ragged::offsets, "samples + 1 int64 offsets into values, a 1-D Tensor")
      .def_property_readonly("samples", &Ragged::samples, "how many samples")
      .def_property_readonly("dtype", &Ragged::dtype, "the values' numpy-style dtype name")
      .def_property_readonly("global_device", &Ragged::global_device, "the device's number in the mesh")
      .def_property_readonly("ids_checksum", &Ragged::ids_checksum, "checksum of the device's sample ids")
      .def_property_readonly("step", &Ragged::step)
      .def_property_readonly("device", &Ragged::device, "(DLPack device type, device id); (1, 0) is host memory")
      .def("__len__", &Ragged::samples)
      .def("__repr__", &Ragged::Repr);

  py::class_<JobMesh, std::shared_ptr<JobMesh>>(
      m, "JobMesh",
      "The job's device mesh (spec.mesh) as the sidecar resolved it. Global device g belongs to "
      "process g // devices_per_process; the axes are row-major over the global device numbers "
      "(last axis fastest); the batch dimension is sharded over batch_axes, in that order (a JAX "
      "PartitionSpec), and devices along the other axes hold replicas.")
      .def_property_readonly("processes", &JobMesh::processes)
      .def_property_readonly("devices_per_process", &JobMesh::devices_per_process)
      .def_property_readonly("axes", &JobMesh::axes, "((name, size), ...) in mesh order")
      .def_property_readonly("batch_axes", &JobMesh::batch_axes,
                             "the mesh axes the batch dimension is sharded over, in order")
      .def("__eq__",
           [](const JobMesh& a, const py::object& b) -> py::object {
             if (!py::isinstance<JobMesh>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(a.Equals(b.cast<const JobMesh&>()));
           })
      .def("__hash__",
           [](const JobMesh& m) {
             return py::hash(py::make_tuple(m.processes(), m.devices_per_process(), m.axes(), m.batch_axes()));
           })
      .def("__repr__", &JobMesh::Repr);

  py::class_<Batch, std::shared_ptr<Batch>>(m, "Batch",
                                            "One step's batch. The slot is released when the Batch, its "
                                            "Tensors and every DLPack export of them are gone.")
      .def_property_readonly("step", &Batch::step)
      .def_property_readonly(
          "tensors", &Batch::tensors,
          "one Tensor (a Ragged for variable-size samples) per local device, in the job's device "
          "order; for a job of named fields (WebDataset, MDS, TFRecord), one dict per device from field "
          "name to its Tensor or Ragged")
      .def_property_readonly("fields", &Batch::fields, "the field names; ('',) for the formats of one tensor")
      .def("field", &Batch::field, py::arg("name"), "one field's Tensor (or Ragged) per local device")
      .def_property_readonly("wait_seconds", &Batch::wait_seconds, "how long next() blocked for this batch")
      .def_property_readonly("slot", &Batch::slot)
      .def_property_readonly("mesh", &Batch::mesh, "the JobMesh of the job that staged this batch")
      .def_property_readonly("job", &Batch::job, "the DataLoadJob's name")
      .def_property_readonly("process", &Batch::process, "the process index of the sidecar that staged it")
      .def("__repr__", &Batch::Repr);

  py::class_<Client>(m, "Client", "Connects to a meshload sidecar and yields its batches in step order.")
      .def(py::init<std::string, std::optional<int64_t>, int>(), py::arg("socket_path") = "",
           py::arg("start_step") = py::none(), py::arg("max_reconnect_attempts") = 8)
      .def("next", &Client::Next, py::arg("timeout") = py::none(),
           "The next step's Batch. Blocks (without the GIL) until it is staged; TimeoutError after "
           "`timeout` seconds; reconnects transparently if the sidecar restarts; SidecarGone when "
           "it "
           "does not come back.")
      .def("close", &Client::Close,
           "Closes the connection. The sidecar takes back every slot but those of batches still "
           "alive, which keep their bytes until they are dropped.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](Client& c) { return c.Next(std::nullopt); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](Client& c, const py::object&, const py::object&, const py::object&) {
             c.Close();
             return false;
           })
      .def_property_readonly("next_step", [](const Client& c) { return c.snapshot().next_step; })
      .def_property_readonly("reconnects", [](const Client& c) { return c.snapshot().reconnects; })
      .def_property_readonly("closed", [](const Client& c) { return c.snapshot().closed; })
      .def_property_readonly("job", [](const Client& c) { return c.snapshot().hello.job; })
      .def_property_readonly("process", [](const Client& c) { return c.snapshot().hello.process; })
      .def_property_readonly(
          "mesh", [](const Client& c) { return c.snapshot().mesh; }, "the job's JobMesh, from the sidecar's hello")
      .def_property_readonly("devices", [](const Client& c) { return Devices(c.snapshot().hello); })
      .def_property_readonly("slots", [](const Client& c) { return c.snapshot().hello.slots; })
      .def_property_readonly("steps_per_epoch", [](const Client& c) { return c.snapshot().hello.steps_per_epoch; })
      .def_property_readonly("global_batch", [](const Client& c) { return c.snapshot().hello.global_batch; })
      .def_property_readonly("socket_path", &Client::socket_path)
      .def("__repr__", [](const Client& c) {
        const Snapshot s = c.snapshot();
        return "<meshload.Client socket=" + c.socket_path() + " job=" + s.hello.job +
               " next_step=" + std::to_string(s.next_step) + (s.closed ? " closed>" : ">");
      });
}
