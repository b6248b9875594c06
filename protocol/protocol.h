/// \file
/// The sidecar ⇄ trainer handoff protocol, version 4 (docs/protocol.md).
///
/// Transport: a Unix SOCK_SEQPACKET socket, so every message is one datagram
/// with preserved boundaries and the kernel reports a dead peer at once.
/// Every message starts with a 12-byte header, little-endian:
///
///   u32 magic 'MLD1' (0x31444C4D) | u16 version | u16 type | u32 payload bytes
///
/// followed by the payload. Messages are at most kMaxMessageBytes.
///
/// The conversation:
///   1. client → CLIENT_HELLO {version, pid, want_step}
///   2. server → SERVER_HELLO {job, process, devices, pool, layout, first step},
///      with the pool's file descriptors attached once (SCM_RIGHTS)
///      (or ERROR, then close: version mismatch, uid refused, busy)
///   3. server → READY {step, slot, per-device tensors} for consecutive steps,
///      as soon as each is staged, while the client holds fewer than
///      `slots` leases
///   4. client → RELEASE {slot, step} when the trainer is done with a batch
///   5. the client leaves with BYE {the leases it still holds}: those stay
///      lent, their RELEASEs still come on this connection, the others are
///      reclaimed. A client that dies (end of file) has every lease
///      reclaimed. It reconnects with CLIENT_HELLO{want_step}: the server
///      re-plans from there.
///   ERROR {code, message} may come from the server at any time; it then
///   sends nothing more, but reads RELEASEs and a BYE for the leases it keeps.
///
/// Decoding is strict and bounds-checked (it is fuzzed): a truncated,
/// oversized or inconsistent message is an error naming the byte offset,
/// never a crash.
///
/// Thread safety: pure functions and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"

namespace meshload::protocol {

inline constexpr uint32_t kMagic = 0x31444C4D;  // "MLD1" little-endian
// 2: SERVER_HELLO carries the job's mesh (axes, batch axes, processes).
// 3: a tensor may be ragged (variable-size samples): values, and the
//    samples' offsets into them (RaggedInfo).
// 4: a batch has named fields (WebDataset, MDS: a tensor per field and
//    device); a ragged tensor may hold no samples (all skipped).
inline constexpr uint16_t kProtocolVersion = 4;
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr size_t kMaxDevices = 64;
// The most fields a batch may have (spec.dataset.fields).
inline constexpr size_t kMaxFields = 16;
inline constexpr size_t kMaxRank = 16;
// SCM_MAX_FD: the most descriptors one message can carry on Linux.
inline constexpr size_t kMaxFds = 253;
inline constexpr size_t kMaxIpcHandles = 512;
inline constexpr size_t kIpcHandleBytes = 64;
inline constexpr size_t kMaxString = 4096;
// The most mesh axes a SERVER_HELLO may describe.
inline constexpr size_t kMaxMeshAxes = 16;
// The most leases one BYE may list (the sidecar lends at most 128).
inline constexpr size_t kMaxByeLeases = 128;

enum class MessageType : uint16_t {
  kClientHello = 1,
  kServerHello = 2,
  kReady = 3,
  kRelease = 4,
  kError = 5,
  kBye = 6,
};

/// Where slot memory lives.
enum class MemoryKind : uint8_t {
  kHostMemfd = 1,  // one memfd for the whole pool; tensors at byte offsets in it
  // One POSIX fd per (device, slot) from cuMemExportToShareableHandle,
  // device-major (fd index = device * slots + slot), each an allocation of
  // slot_bytes; a tensor's offset is from the start of its allocation.
  kCudaVmmFd = 2,
  // Legacy: one 64-byte cudaIpcMemHandle_t per (device, slot), device-major,
  // in ServerHello::ipc_handles; no fds. Offsets as for kCudaVmmFd.
  kCudaIpc = 3,
};

enum class ErrorCode : uint32_t {
  kVersionMismatch = 1,
  kPermissionDenied = 2,  // peer uid not allowed
  kBusy = 3,              // another trainer is connected
  kBadRequest = 4,        // malformed message or impossible step
  kDataError = 5,         // the sidecar cannot produce a batch (storage, format)
  kShuttingDown = 6,
};

struct ClientHello {
  uint16_t version = kProtocolVersion;
  uint32_t pid = 0;
  /// The next step the trainer wants; -1: the sidecar's start step.
  int64_t want_step = -1;
};

/// A local device of the sidecar's process.
struct DeviceInfo {
  uint32_t global_index = 0;  // device number in the mesh
  uint8_t kind = 0;           // DLPack device type: 1 = CPU, 2 = CUDA
  std::string uuid;           // "GPU-…" for CUDA devices, "" for host memory
};

/// A ragged tensor (version 3): a batch of variable-size samples is a 1-D
/// tensor of their elements back to back (the values: the tensor's offset,
/// dtype and shape) and `samples + 1` int64 offsets, in elements, at
/// `offsets_offset` in the same memory: sample k is
/// values[offsets[k], offsets[k+1]), offsets[0] = 0. The offsets come
/// before the values.
struct RaggedInfo {
  uint64_t offsets_offset = 0;  // bytes from the start of the slot (a device allocation: of it); 8-byte aligned
  uint64_t samples = 0;         // n (0: every sample of the device's batch was skipped)
  bool operator==(const RaggedInfo&) const = default;
};

/// The layout of one device's tensor of one field inside a slot.
struct TensorLayout {
  uint64_t offset = 0;     // bytes from the start of the slot; 256-byte aligned
  uint8_t dtype_code = 0;  // DLPack type code
  uint8_t dtype_bits = 0;
  std::vector<int64_t> shape;    // ragged: [the values' room in elements]
  std::vector<int64_t> strides;  // in elements, C order
  uint64_t nbytes = 0;
  std::optional<RaggedInfo> ragged;
};

/// One axis of the job's device mesh (spec.mesh.axes).
struct MeshAxisInfo {
  std::string name;
  uint64_t size = 0;
  bool operator==(const MeshAxisInfo&) const = default;
};

/// The job's device mesh, as the trainer needs it to assemble global arrays:
/// global device g belongs to process g / devices_per_process, and the axes
/// are row-major (last fastest) over the global device numbers. The batch
/// dimension is sharded over batch_axes in that order (the PartitionSpec);
/// devices along the other axes hold replicas.
struct MeshInfo {
  uint32_t processes = 0;
  uint32_t devices_per_process = 0;
  std::vector<MeshAxisInfo> axes;
  std::vector<std::string> batch_axes;
  bool operator==(const MeshInfo&) const = default;
};

struct ServerHello {
  uint16_t version = kProtocolVersion;
  std::string job;
  uint32_t process = 0;
  std::vector<DeviceInfo> devices;  // in the job's local device order
  MemoryKind memory = MemoryKind::kHostMemfd;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;  // host: stride between slots in the memfd; CUDA: bytes of each (device, slot) allocation
  uint64_t pool_bytes = 0;  // host: size of the memfd; CUDA: slot_bytes × slots, per device
  uint32_t fd_count = 0;    // file descriptors attached to this message
  std::vector<TensorLayout> layout;  // one per (device, field), device-major
  int64_t first_step = 0;            // the step the first READY will carry
  uint64_t steps_per_epoch = 0;
  uint64_t global_batch = 0;
  /// kCudaIpc only: one handle (kIpcHandleBytes) per (device, slot).
  std::vector<std::string> ipc_handles;
  MeshInfo mesh;
  /// The batch's fields (version 4), in the order each device's tensors
  /// come: one unnamed field ("") for the formats whose sample is one
  /// tensor; the names of spec.dataset.fields for WebDataset and MDS.
  std::vector<std::string> fields = {""};
};

struct TensorReady {
  uint64_t offset = 0;  // bytes from the start of the slot
  uint8_t dtype_code = 0;
  uint8_t dtype_bits = 0;
  std::vector<int64_t> shape;  // ragged: [the elements this step's values take]
  std::vector<int64_t> strides;
  uint64_t ids_checksum = 0;  // SampleIdsChecksum of the device's sample ids
  std::optional<RaggedInfo> ragged;
};

struct Ready {
  int64_t step = 0;
  uint32_t slot = 0;
  std::vector<TensorReady> tensors;  // one per (local device, field), device-major as the hello's layout
};

struct Release {
  uint32_t slot = 0;
  int64_t step = 0;
  /// How long the trainer's request for this batch blocked before READY
  /// arrived, measured by the client (0 when it was already there). The
  /// sidecar exports it as meshload_trainer_wait_seconds.
  uint64_t wait_ns = 0;
};

struct ErrorMessage {
  ErrorCode code = ErrorCode::kBadRequest;
  std::string message;
};

/// The trainer leaves this connection (it reconnects, or closes) but keeps
/// the batches it still holds: the leases listed stay lent, and their
/// RELEASEs still come on this connection; every other lease of the
/// connection (a READY sent but never handed to the trainer) is taken back
/// at once. The connection stays open until its last lease is released.
struct Bye {
  struct Held {
    uint32_t slot = 0;
    int64_t step = 0;
    bool operator==(const Held&) const = default;
    auto operator<=>(const Held&) const = default;
  };
  std::vector<Held> held;
};

using Message = std::variant<ClientHello, ServerHello, Ready, Release, ErrorMessage, Bye>;

/// Encodes a message with its header.
std::string Encode(const Message& m);

/// Decodes one whole datagram. Errors are kInvalidArgument (or kDataLoss for
/// truncation) located at "@<byte offset>".
Result<Message> Decode(std::string_view bytes);

/// The checksum the READY message carries for a device's sample ids: the
/// client recomputes it from its own plan to prove it got the batch it
/// expected.
uint64_t SampleIdsChecksum(const uint64_t* ids, size_t count);

std::string_view MessageTypeName(MessageType t);

}  // namespace meshload::protocol
