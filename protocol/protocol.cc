#include "protocol/protocol.h"

#include <algorithm>
#include <cstring>

namespace meshload::protocol {
namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(v, 2); }
  void U32(uint32_t v) { Raw(v, 4); }
  void U64(uint64_t v) { Raw(v, 8); }
  void I64(int64_t v) { Raw(static_cast<uint64_t>(v), 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Dims(const std::vector<int64_t>& v) {
    U8(static_cast<uint8_t>(v.size()));
    for (int64_t x : v) I64(x);
  }
  std::string Finish(MessageType type) {
    std::string msg;
    msg.reserve(kHeaderBytes + out_.size());
    Writer h;
    h.U32(kMagic);
    h.U16(kProtocolVersion);
    h.U16(static_cast<uint16_t>(type));
    h.U32(static_cast<uint32_t>(out_.size()));
    msg = h.out_ + out_;
    return msg;
  }

 private:
  void Raw(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

// Bounds-checked little-endian reader; the first failure sticks and records
// its offset, so decoders can read a whole message and check once.
class Reader {
 public:
  explicit Reader(std::string_view b, size_t base = 0) : b_(b), base_(base) {}

  uint8_t U8() { return static_cast<uint8_t>(Raw(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Raw(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Raw(4)); }
  uint64_t U64() { return Raw(8); }
  int64_t I64() { return static_cast<int64_t>(Raw(8)); }
  std::string Str(const char* what) {
    const size_t at = pos_;
    uint32_t n = U32();
    if (!ok()) return {};
    if (n > kMaxString) {
      Fail(at, std::string(what) + ": string of " + std::to_string(n) + " bytes exceeds the " +
                   std::to_string(kMaxString) + "-byte limit");
      return {};
    }
    if (b_.size() - pos_ < n) {
      Truncated(n);
      return {};
    }
    std::string s(b_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::vector<int64_t> Dims(const char* what) {
    const size_t at = pos_;
    uint8_t n = U8();
    std::vector<int64_t> v;
    if (!ok()) return v;
    if (n > kMaxRank) {
      Fail(at, std::string(what) + ": rank " + std::to_string(n) + " exceeds " + std::to_string(kMaxRank));
      return v;
    }
    v.reserve(n);
    for (uint8_t i = 0; i < n && ok(); ++i) v.push_back(I64());
    return v;
  }
  // A count of repeated elements, bounded.
  uint32_t Count(const char* what, size_t max) {
    const size_t at = pos_;
    uint32_t n = U32();
    if (ok() && n > max) {
      Fail(at, std::string(what) + ": " + std::to_string(n) + " entries exceed the limit of " + std::to_string(max));
    }
    return n;
  }
  void Fail(size_t at, std::string msg) {
    if (error_.ok()) error_ = InvalidArgument(std::move(msg), "@" + std::to_string(base_ + at));
  }
  bool ok() const { return error_.ok(); }
  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }
  Status Finish() {
    if (ok() && pos_ != b_.size()) {
      Fail(pos_, std::to_string(b_.size() - pos_) + " unexpected trailing bytes");
    }
    return error_;
  }

 private:
  void Truncated(size_t want) {
    if (error_.ok()) {
      error_ =
          DataLoss("truncated: need " + std::to_string(want) + " more bytes, have " + std::to_string(b_.size() - pos_),
                   "@" + std::to_string(base_ + pos_));
    }
  }
  uint64_t Raw(size_t bytes) {
    if (!ok()) return 0;
    if (b_.size() - pos_ < bytes) {
      Truncated(bytes);
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    }
    pos_ += bytes;
    return v;
  }

  std::string_view b_;
  size_t base_;
  size_t pos_ = 0;
  Status error_;
};

void CheckDims(Reader& r, size_t at, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (!r.ok()) return;
  if (shape.size() != strides.size()) {
    r.Fail(at,
           "shape has " + std::to_string(shape.size()) + " dimensions but strides " + std::to_string(strides.size()));
    return;
  }
  for (int64_t d : shape) {
    if (d < 0) {
      r.Fail(at, "negative dimension " + std::to_string(d));
      return;
    }
  }
}

bool ValidDtype(uint8_t code, uint8_t bits) {
  switch (code) {
    case 0:
    case 1: return bits == 8 || bits == 16 || bits == 32 || bits == 64;  // int, uint
    case 2: return bits == 16 || bits == 32 || bits == 64;               // float
    case 4: return bits == 16;                                           // bfloat
    case 6: return bits == 8;                                            // bool
    default: return false;
  }
}

void CheckDtype(Reader& r, size_t at, uint8_t code, uint8_t bits) {
  if (r.ok() && !ValidDtype(code, bits)) {
    r.Fail(at, "unknown dtype (code " + std::to_string(code) + ", " + std::to_string(bits) + " bits)");
  }
}

// The fields every tensor description shares (SERVER_HELLO's layout and
// READY's tensors): offset, dtype, shape, strides.
template <typename T>
void WriteTensor(Writer& w, const T& t) {
  w.U64(t.offset);
  w.U8(t.dtype_code);
  w.U8(t.dtype_bits);
  w.Dims(t.shape);
  w.Dims(t.strides);
}

// Version 3's ragged part of a tensor: u8 0 (dense), or u8 1 then
// u64 offsets_offset, u64 samples.
void WriteRagged(Writer& w, const std::optional<RaggedInfo>& ragged) {
  w.U8(ragged ? 1 : 0);
  if (ragged) {
    w.U64(ragged->offsets_offset);
    w.U64(ragged->samples);
  }
}

// The most samples a ragged tensor may hold: its offsets must be
// addressable (8 bytes each) with room to spare.
constexpr uint64_t kMaxRaggedSamples = uint64_t{1} << 40;

template <typename T>
void ReadRagged(Reader& r, T& t) {
  const size_t at = r.pos();
  const uint8_t kind = r.U8();
  if (!r.ok()) return;
  if (kind > 1) {
    r.Fail(at, "unknown tensor kind " + std::to_string(kind) + " (0 dense, 1 ragged)");
    return;
  }
  if (kind == 0) return;
  RaggedInfo g;
  g.offsets_offset = r.U64();
  g.samples = r.U64();
  if (!r.ok()) return;
  if (g.samples > kMaxRaggedSamples) {
    r.Fail(at + 9, "a ragged tensor of " + std::to_string(g.samples) + " samples (at most 2^40)");
    return;
  }
  if (t.shape.size() != 1) {
    r.Fail(at, "a ragged tensor's values are 1-D, not " + std::to_string(t.shape.size()) + "-D");
    return;
  }
  // The offsets are 8-byte aligned and end at or before the values.
  const uint64_t offsets_bytes = (g.samples + 1) * 8;
  if (g.offsets_offset % 8 != 0 || g.offsets_offset > t.offset || offsets_bytes > t.offset - g.offsets_offset) {
    r.Fail(at + 1, "the ragged offsets at " + std::to_string(g.offsets_offset) + " (" + std::to_string(offsets_bytes) +
                       " bytes) do not lie 8-byte aligned before the values at " + std::to_string(t.offset));
    return;
  }
  t.ragged = g;
}

template <typename T>
void ReadTensor(Reader& r, T& t) {
  const size_t at = r.pos();
  t.offset = r.U64();
  t.dtype_code = r.U8();
  t.dtype_bits = r.U8();
  CheckDtype(r, at + 8, t.dtype_code, t.dtype_bits);
  t.shape = r.Dims("shape");
  t.strides = r.Dims("strides");
  CheckDims(r, at, t.shape, t.strides);
}

}  // namespace

std::string_view MessageTypeName(MessageType t) {
  switch (t) {
    case MessageType::kClientHello: return "CLIENT_HELLO";
    case MessageType::kServerHello: return "SERVER_HELLO";
    case MessageType::kReady: return "READY";
    case MessageType::kRelease: return "RELEASE";
    case MessageType::kError: return "ERROR";
    case MessageType::kBye: return "BYE";
  }
  return "UNKNOWN";
}

uint64_t SampleIdsChecksum(const uint64_t* ids, size_t count) {
  // Order-sensitive: a batch with the right samples in the wrong order is
  // the wrong batch.
  uint64_t h = 0x6D65736C6F616431ull ^ count;
  for (size_t i = 0; i < count; ++i) {
    uint64_t z = h ^ (ids[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h = z ^ (z >> 31);
  }
  return h;
}

namespace {

/// The mesh of a SERVER_HELLO must describe the devices it lists: the axes
/// multiply to processes × devices_per_process, the batch axes are distinct
/// axes, and every listed device is one of `process`'s.
Status CheckMesh(const ServerHello& m, const std::string& at) {
  const MeshInfo& mesh = m.mesh;
  if (mesh.processes == 0 || mesh.devices_per_process == 0 || mesh.axes.empty()) {
    return InvalidArgument("the mesh has " + std::to_string(mesh.processes) + " processes of " +
                               std::to_string(mesh.devices_per_process) + " devices and " +
                               std::to_string(mesh.axes.size()) + " axes; each must be at least 1",
                           at);
  }
  const uint64_t devices = uint64_t{mesh.processes} * mesh.devices_per_process;
  uint64_t product = 1;
  for (const MeshAxisInfo& a : mesh.axes) {
    if (a.name.empty() || a.size == 0 || a.size > devices) {
      return InvalidArgument("mesh axis '" + a.name + "' of size " + std::to_string(a.size) +
                                 " is not a named axis of 1 to " + std::to_string(devices) + " devices",
                             at);
    }
    product *= a.size;
    if (product > devices) break;
  }
  if (product != devices) {
    return InvalidArgument("the mesh axes do not multiply to " + std::to_string(mesh.processes) + " processes × " +
                               std::to_string(mesh.devices_per_process) + " devices",
                           at);
  }
  for (size_t i = 0; i < mesh.batch_axes.size(); ++i) {
    const std::string& b = mesh.batch_axes[i];
    const bool known =
        std::any_of(mesh.axes.begin(), mesh.axes.end(), [&](const MeshAxisInfo& a) { return a.name == b; });
    const bool repeated =
        std::find(mesh.batch_axes.begin(), mesh.batch_axes.begin() + i, b) != mesh.batch_axes.begin() + i;
    if (!known || repeated) {
      return InvalidArgument("batch axis '" + b + "' is " + (known ? "repeated" : "not an axis of the mesh"), at);
    }
  }
  if (m.process >= mesh.processes) {
    return InvalidArgument(
        "process " + std::to_string(m.process) + " is not one of the mesh's " + std::to_string(mesh.processes), at);
  }
  if (m.devices.size() != mesh.devices_per_process) {
    return InvalidArgument("the sidecar lists " + std::to_string(m.devices.size()) + " devices; the mesh gives " +
                               std::to_string(mesh.devices_per_process) + " to each process",
                           at);
  }
  for (const DeviceInfo& d : m.devices) {
    if (d.global_index / mesh.devices_per_process != m.process) {
      return InvalidArgument(
          "device " + std::to_string(d.global_index) + " is not one of process " + std::to_string(m.process) + "'s",
          at);
    }
  }
  return Status::Ok();
}

}  // namespace

std::string Encode(const Message& m) {
  Writer w;
  if (const auto* ch = std::get_if<ClientHello>(&m)) {
    w.U16(ch->version);
    w.U32(ch->pid);
    w.I64(ch->want_step);
    return w.Finish(MessageType::kClientHello);
  }
  if (const auto* sh = std::get_if<ServerHello>(&m)) {
    w.U16(sh->version);
    w.Str(sh->job);
    w.U32(sh->process);
    w.U32(static_cast<uint32_t>(sh->devices.size()));
    for (const auto& d : sh->devices) {
      w.U32(d.global_index);
      w.U8(d.kind);
      w.Str(d.uuid);
    }
    w.U8(static_cast<uint8_t>(sh->memory));
    w.U32(sh->slots);
    w.U64(sh->slot_bytes);
    w.U64(sh->pool_bytes);
    w.U32(sh->fd_count);
    w.U32(static_cast<uint32_t>(sh->layout.size()));
    for (const auto& t : sh->layout) {
      WriteTensor(w, t);
      w.U64(t.nbytes);
      WriteRagged(w, t.ragged);
    }
    w.I64(sh->first_step);
    w.U64(sh->steps_per_epoch);
    w.U64(sh->global_batch);
    w.U32(static_cast<uint32_t>(sh->ipc_handles.size()));
    for (const auto& h : sh->ipc_handles) {
      std::string fixed = h;
      fixed.resize(kIpcHandleBytes, '\0');
      for (char c : fixed) w.U8(static_cast<uint8_t>(c));
    }
    w.U32(sh->mesh.processes);
    w.U32(sh->mesh.devices_per_process);
    w.U32(static_cast<uint32_t>(sh->mesh.axes.size()));
    for (const auto& a : sh->mesh.axes) {
      w.Str(a.name);
      w.U64(a.size);
    }
    w.U32(static_cast<uint32_t>(sh->mesh.batch_axes.size()));
    for (const auto& a : sh->mesh.batch_axes) w.Str(a);
    w.U32(static_cast<uint32_t>(sh->fields.size()));
    for (const auto& f : sh->fields) w.Str(f);
    return w.Finish(MessageType::kServerHello);
  }
  if (const auto* rd = std::get_if<Ready>(&m)) {
    w.I64(rd->step);
    w.U32(rd->slot);
    w.U32(static_cast<uint32_t>(rd->tensors.size()));
    for (const auto& t : rd->tensors) {
      WriteTensor(w, t);
      w.U64(t.ids_checksum);
      WriteRagged(w, t.ragged);
    }
    return w.Finish(MessageType::kReady);
  }
  if (const auto* rl = std::get_if<Release>(&m)) {
    w.U32(rl->slot);
    w.I64(rl->step);
    w.U64(rl->wait_ns);
    return w.Finish(MessageType::kRelease);
  }
  if (const auto* bye = std::get_if<Bye>(&m)) {
    w.U32(static_cast<uint32_t>(bye->held.size()));
    for (const auto& h : bye->held) {
      w.U32(h.slot);
      w.I64(h.step);
    }
    return w.Finish(MessageType::kBye);
  }
  const auto& er = std::get<ErrorMessage>(m);
  w.U32(static_cast<uint32_t>(er.code));
  w.Str(er.message.size() > kMaxString ? er.message.substr(0, kMaxString) : er.message);
  return w.Finish(MessageType::kError);
}

Result<Message> Decode(std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes) {
    return InvalidArgument("message of " + std::to_string(bytes.size()) + " bytes exceeds the " +
                               std::to_string(kMaxMessageBytes) + "-byte limit",
                           "@0");
  }
  Reader h(bytes);
  const uint32_t magic = h.U32();
  const uint16_t version = h.U16();
  const uint16_t type = h.U16();
  const uint32_t len = h.U32();
  if (!h.ok()) return h.Finish();
  if (magic != kMagic) return InvalidArgument("bad magic; not a meshload message", "@0");
  if (version != kProtocolVersion) {
    return InvalidArgument("protocol version " + std::to_string(version) + " is not supported (this side speaks " +
                               std::to_string(kProtocolVersion) + ")",
                           "@4");
  }
  if (len != bytes.size() - kHeaderBytes) {
    return DataLoss("header says " + std::to_string(len) + " payload bytes, the message has " +
                        std::to_string(bytes.size() - kHeaderBytes),
                    "@8");
  }
  Reader r(bytes.substr(kHeaderBytes), kHeaderBytes);
  switch (static_cast<MessageType>(type)) {
    case MessageType::kClientHello: {
      ClientHello m;
      m.version = r.U16();
      m.pid = r.U32();
      const size_t at = r.pos();
      m.want_step = r.I64();
      if (r.ok() && m.want_step < -1) r.Fail(at, "want_step " + std::to_string(m.want_step) + " is negative");
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      return Message(m);
    }
    case MessageType::kServerHello: {
      ServerHello m;
      m.version = r.U16();
      m.job = r.Str("job");
      m.process = r.U32();
      const uint32_t ndev = r.Count("devices", kMaxDevices);
      for (uint32_t i = 0; i < ndev && r.ok(); ++i) {
        DeviceInfo d;
        d.global_index = r.U32();
        d.kind = r.U8();
        d.uuid = r.Str("device uuid");
        m.devices.push_back(std::move(d));
      }
      const size_t mem_at = r.pos();
      const uint8_t mem = r.U8();
      if (r.ok() && (mem < 1 || mem > 3)) r.Fail(mem_at, "unknown memory kind " + std::to_string(mem));
      m.memory = static_cast<MemoryKind>(mem);
      m.slots = r.U32();
      m.slot_bytes = r.U64();
      m.pool_bytes = r.U64();
      const size_t fd_at = r.pos();
      m.fd_count = r.U32();
      if (r.ok() && m.fd_count > kMaxFds)
        r.Fail(fd_at, "fd_count " + std::to_string(m.fd_count) + " exceeds " + std::to_string(kMaxFds));
      const uint32_t nl = r.Count("layout", kMaxDevices * kMaxFields);
      for (uint32_t i = 0; i < nl && r.ok(); ++i) {
        TensorLayout t;
        ReadTensor(r, t);
        t.nbytes = r.U64();
        ReadRagged(r, t);
        m.layout.push_back(std::move(t));
      }
      m.first_step = r.I64();
      m.steps_per_epoch = r.U64();
      m.global_batch = r.U64();
      const uint32_t nh = r.Count("ipc handles", kMaxIpcHandles);
      for (uint32_t i = 0; i < nh && r.ok(); ++i) {
        std::string h(kIpcHandleBytes, '\0');
        for (auto& c : h) c = static_cast<char>(r.U8());
        m.ipc_handles.push_back(std::move(h));
      }
      m.mesh.processes = r.U32();
      m.mesh.devices_per_process = r.U32();
      const uint32_t na = r.Count("mesh axes", kMaxMeshAxes);
      for (uint32_t i = 0; i < na && r.ok(); ++i) {
        MeshAxisInfo a;
        a.name = r.Str("mesh axis name");
        a.size = r.U64();
        m.mesh.axes.push_back(std::move(a));
      }
      const uint32_t nb = r.Count("batch axes", kMaxMeshAxes);
      for (uint32_t i = 0; i < nb && r.ok(); ++i) m.mesh.batch_axes.push_back(r.Str("batch axis name"));
      const size_t fields_at = r.pos();
      const uint32_t nf = r.Count("fields", kMaxFields);
      m.fields.clear();
      for (uint32_t i = 0; i < nf && r.ok(); ++i) m.fields.push_back(r.Str("field name"));
      if (r.ok() && nf == 0) r.Fail(fields_at, "a batch has at least one field");
      for (size_t i = 0; i < m.fields.size() && r.ok(); ++i) {
        if (m.fields[i].empty() && m.fields.size() > 1)
          r.Fail(fields_at, "field " + std::to_string(i) + " has no name");
        if (std::find(m.fields.begin(), m.fields.begin() + static_cast<std::ptrdiff_t>(i), m.fields[i]) !=
            m.fields.begin() + static_cast<std::ptrdiff_t>(i)) {
          r.Fail(fields_at, "field '" + m.fields[i] + "' is listed twice");
        }
      }
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      const std::string at_payload = "@" + std::to_string(kHeaderBytes);
      if (m.memory != MemoryKind::kHostMemfd) {
        // Device memory: every device is a CUDA device named by its UUID,
        // and there is one allocation per (device, slot).
        const uint64_t allocs = static_cast<uint64_t>(m.devices.size()) * m.slots;
        for (const auto& d : m.devices) {
          if (d.kind != 2 || d.uuid.empty()) {
            return InvalidArgument(
                "device " + std::to_string(d.global_index) + " of a CUDA pool is not a CUDA device with a UUID",
                at_payload);
          }
        }
        if (m.memory == MemoryKind::kCudaVmmFd && m.fd_count != allocs) {
          return InvalidArgument("a CUDA VMM pool of " + std::to_string(allocs) + " allocations carries " +
                                     std::to_string(m.fd_count) + " fds",
                                 at_payload);
        }
        if (m.memory == MemoryKind::kCudaIpc && (m.ipc_handles.size() != allocs || m.fd_count != 0)) {
          return InvalidArgument("a CUDA IPC pool of " + std::to_string(allocs) + " allocations carries " +
                                     std::to_string(m.ipc_handles.size()) + " handles and " +
                                     std::to_string(m.fd_count) + " fds",
                                 at_payload);
        }
        if (m.slots > 0 && m.slot_bytes > m.pool_bytes / m.slots) {
          return InvalidArgument("slot_bytes × slots exceed pool_bytes", at_payload);
        }
      } else if (!m.ipc_handles.empty()) {
        return InvalidArgument("a host pool carries IPC handles", at_payload);
      }
      if (m.layout.size() != m.devices.size() * m.fields.size()) {
        return InvalidArgument("layout has " + std::to_string(m.layout.size()) + " tensors for " +
                                   std::to_string(m.devices.size()) + " devices of " + std::to_string(m.fields.size()) +
                                   " fields",
                               "@" + std::to_string(kHeaderBytes));
      }
      if (m.memory == MemoryKind::kHostMemfd && m.slots > 0 && m.slot_bytes > m.pool_bytes / m.slots) {
        return InvalidArgument("slot_bytes " + std::to_string(m.slot_bytes) + " × " + std::to_string(m.slots) +
                                   " slots exceed the pool's " + std::to_string(m.pool_bytes) + " bytes",
                               "@" + std::to_string(kHeaderBytes));
      }
      MESHLOAD_RETURN_IF_ERROR(CheckMesh(m, at_payload));
      return Message(std::move(m));
    }
    case MessageType::kReady: {
      Ready m;
      m.step = r.I64();
      m.slot = r.U32();
      const uint32_t n = r.Count("tensors", kMaxDevices * kMaxFields);
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        TensorReady t;
        ReadTensor(r, t);
        t.ids_checksum = r.U64();
        ReadRagged(r, t);
        m.tensors.push_back(std::move(t));
      }
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      if (m.step < 0) return InvalidArgument("negative step " + std::to_string(m.step), "@12");
      return Message(std::move(m));
    }
    case MessageType::kRelease: {
      Release m;
      m.slot = r.U32();
      m.step = r.I64();
      m.wait_ns = r.U64();
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      return Message(m);
    }
    case MessageType::kBye: {
      Bye m;
      const uint32_t n = r.Count("held leases", kMaxByeLeases);
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        const size_t at = r.pos();
        Bye::Held h;
        h.slot = r.U32();
        h.step = r.I64();
        if (r.ok() && h.step < 0) r.Fail(at + 4, "negative step " + std::to_string(h.step));
        m.held.push_back(h);
      }
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
    case MessageType::kError: {
      ErrorMessage m;
      const size_t at = r.pos();
      const uint32_t code = r.U32();
      if (r.ok() && (code < 1 || code > 6)) r.Fail(at, "unknown error code " + std::to_string(code));
      m.code = static_cast<ErrorCode>(code);
      m.message = r.Str("message");
      MESHLOAD_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
  }
  return InvalidArgument("unknown message type " + std::to_string(type), "@6");
}

}  // namespace meshload::protocol
