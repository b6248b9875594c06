/// \file
/// The peer exchange's wire format (docs/protocol.md, "Between sidecars"):
/// every frame is a 32-byte little-endian Header, then, for some types, a
/// payload of `length` bytes. Internal to the exchange (peer_exchange.h is
/// its interface); exposed here so that the format has one place, and for
/// tests.
///
/// A Header is sent and received as its own bytes (asio::buffer(&h, sizeof
/// h)): its layout *is* the encoding, pinned by the static_asserts below.
///
/// Thread safety: values and pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace meshload::sidecar::exchange::internal {

inline constexpr uint32_t kMagic = 0x58504c4d;  // "MLPX"
inline constexpr uint16_t kVersion = 2;         // 2: HAVE and HAVE_THROUGH (connections survive a peer's restart)
inline constexpr uint64_t kMaxErrorText = 4096;
inline constexpr size_t kHaveMemory = 4096;  // steps a receiver reports as already had (HAVE), at most

// Payload sizes of the authentication frames (see handshake.h).
inline constexpr uint64_t kNonceBytes = 32;                      // CHALLENGE's payload
inline constexpr uint64_t kMacBytes = 32;                        // HMAC-SHA256; HELLO_OK's payload with a secret
inline constexpr uint64_t kAuthBytes = kMacBytes + kNonceBytes;  // AUTH's payload: a MAC, then a nonce

/// The frame types, and what each puts in the Header's `index`, `length`
/// and `digest` (a field not named is 0). `length` bytes of payload follow
/// the header for every type but HELLO, which has no payload.
enum class Type : uint16_t {
  kHello = 1,    // index = from (the sender's process), length = to (the receiver's process),
                 // digest = the job's fingerprint
  kHelloOk = 2,  // length = 0, or kMacBytes: the receiver's proof (the receiver has a peer secret)
  kCredit = 3,   // index = step
  kReset = 4,    // index = first step the receiver still wants
  kData = 5,     // index = step, length = bytes, digest = sample-id checksum; then `length` bytes
  kHeartbeat = 6,
  kError = 7,        // length = text bytes (at most kMaxErrorText); then the text
  kBye = 8,          // the sender of it is stopping
  kHaveThrough = 9,  // index = step: the receiver has every step from its RESET step through it (on connection)
  kHave = 10,        // index = step: the receiver has that step (on connection)
  kChallenge = 11,   // length = kNonceBytes; then the receiver's nonce (the receiver has a peer secret)
  kAuth = 12,        // length = kAuthBytes; then HMAC(secret, "MLPX-auth", nonce, from, to, fingerprint)
                     // and the sender's nonce
};

/// A frame's header. The three 8-byte fields are neutral because HELLO uses
/// them otherwise than the other types (see Type); the accessors name what
/// a field holds for the types that use it.
struct Header {
  uint32_t magic = kMagic;
  uint16_t type = 0;
  uint16_t version = kVersion;
  /// A step (CREDIT, RESET, DATA, HAVE_THROUGH, HAVE); HELLO: the sender's process.
  int64_t index = 0;
  /// Bytes of payload after the header (DATA, ERROR, CHALLENGE, AUTH,
  /// HELLO_OK); HELLO, which has none: the receiver's process.
  uint64_t length = 0;
  /// A 64-bit hash: DATA: the part's sample-id checksum; HELLO: the job's fingerprint.
  uint64_t digest = 0;

  // CREDIT, RESET, DATA, HAVE_THROUGH, HAVE.
  int64_t step() const { return index; }
  // DATA, ERROR, CHALLENGE, AUTH, HELLO_OK.
  uint64_t payload_bytes() const { return length; }
  // DATA.
  uint64_t checksum() const { return digest; }
  // HELLO.
  int64_t from_process() const { return index; }
  int64_t to_process() const { return static_cast<int64_t>(length); }
  uint64_t fingerprint() const { return digest; }
};
static_assert(sizeof(Header) == 32);
static_assert(std::is_standard_layout_v<Header> && std::is_trivially_copyable_v<Header>);
static_assert(offsetof(Header, magic) == 0 && offsetof(Header, type) == 4 && offsetof(Header, version) == 6 &&
              offsetof(Header, index) == 8 && offsetof(Header, length) == 16 && offsetof(Header, digest) == 24);
// The header goes out as its bytes, which the protocol says are little-endian.
static_assert(std::endian::native == std::endian::little, "the peer wire format is little-endian");

// ---- frame builders ----

Header HelloFrame(int64_t from, int64_t to, uint64_t fingerprint);
/// `proof_bytes`: 0, or kMacBytes with a peer secret (the proof follows).
Header HelloOkFrame(uint64_t proof_bytes = 0);
Header CreditFrame(int64_t step);
Header ResetFrame(int64_t first_step);
Header DataFrame(int64_t step, uint64_t bytes, uint64_t checksum);
Header HeartbeatFrame();
/// `text_bytes` of text follow (the caller keeps them within kMaxErrorText).
Header ErrorFrame(uint64_t text_bytes);
Header ByeFrame();
Header HaveThroughFrame(int64_t step);
Header HaveFrame(int64_t step);
Header ChallengeFrame();  // kNonceBytes follow
Header AuthFrame();       // kAuthBytes follow

// ---- a received header ----

inline bool HasMagic(const Header& h) { return h.magic == kMagic; }
/// The magic is right and the frame is of type `t`.
inline bool IsFrame(const Header& h, Type t) { return HasMagic(h) && h.type == static_cast<uint16_t>(t); }
inline Type TypeOf(const Header& h) { return static_cast<Type>(h.type); }

/// Why a connection's first frame is not a HELLO this side can take (not
/// one at all, or another protocol version); empty when it is. Only the
/// first frame's version is checked.
std::string HelloFrameProblem(const Header& h);

}  // namespace meshload::sidecar::exchange::internal
