/// \file
/// The peer exchange's handshake, without the connection: the checks of a
/// sender's HELLO, and peer authentication with the job's secret
/// (ExchangeOptions::secret; docs/protocol.md has the exchange of frames).
/// Internal to the exchange; the I/O thread (connection.cc) reads and
/// writes the frames and calls these.
///
/// Authentication: the receiver answers HELLO with CHALLENGE and a nonce Nr;
/// the sender answers AUTH: HMAC-SHA256(secret, "MLPX-auth" ‖ Nr ‖ from ‖ to
/// ‖ fingerprint) and a nonce Ns of its own; the receiver's HELLO_OK then
/// carries HMAC-SHA256(secret, "MLPX-ok" ‖ Ns ‖ from ‖ to ‖ fingerprint).
/// `from`, `to` and `fingerprint` are the HELLO's (HelloIds), each as its 8
/// bytes in memory (little-endian, as the frame header).
///
/// Thread safety: pure functions (MakeNonce reads the system's randomness).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange::internal {

using Mac = std::array<uint8_t, kMacBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;
/// AUTH's payload: the sender's MAC over the receiver's nonce, then the
/// sender's nonce.
using AuthPayload = std::array<uint8_t, kAuthBytes>;

inline constexpr std::string_view kAuthLabel = "MLPX-auth";  // AUTH's MAC
inline constexpr std::string_view kOkLabel = "MLPX-ok";      // HELLO_OK's proof

/// What a connection's MACs are bound to: the processes at both ends and
/// the job, as the HELLO names them.
struct HelloIds {
  int64_t from = 0;
  int64_t to = 0;
  uint64_t fingerprint = 0;
  static HelloIds Of(const Header& hello) { return {hello.from_process(), hello.to_process(), hello.fingerprint()}; }
};

/// HMAC-SHA256 over `label`, the other side's 32-byte `nonce`, both process
/// indexes and the job's fingerprint.
Mac PeerMac(const std::string& secret, std::string_view label, const uint8_t* nonce, int64_t from, int64_t to,
            uint64_t fingerprint);

/// Compares a received MAC (kMacBytes at `a`) with `b` in constant time.
bool SameMac(const uint8_t* a, const Mac& b);

/// A fresh random nonce. nullopt when the system has no randomness to give:
/// a predictable nonce would let a recorded handshake be replayed, so the
/// handshake is refused.
std::optional<Nonce> MakeNonce();

// ---- the sender's side ----

/// AUTH's payload: the MAC over the receiver's `challenge` (kNonceBytes),
/// then `mine`, the nonce the receiver's proof is to cover.
AuthPayload MakeAuth(const std::string& secret, const uint8_t* challenge, const Nonce& mine, const HelloIds& ids);

/// Whether the receiver's HELLO_OK proof (kMacBytes at `proof`) shows it
/// holds the secret: a MAC over this sender's nonce `mine`.
bool CheckHelloOkProof(const std::string& secret, const Nonce& mine, const HelloIds& ids, const uint8_t* proof);

// ---- the receiver's side ----

/// Whether the sender's AUTH answers this receiver's `challenge`.
bool CheckAuth(const std::string& secret, const Nonce& challenge, const HelloIds& ids, const AuthPayload& auth);

/// HELLO_OK's payload: this receiver's proof, over the sender's nonce in `auth`.
Mac HelloOkProof(const std::string& secret, const AuthPayload& auth, const HelloIds& ids);

/// Why process `self` refuses a HELLO addressed to another process, or
/// from a process its plan receives nothing from (`known_sender` false);
/// empty when neither. The frame itself was checked (HelloFrameProblem).
std::string AddresseeProblem(const Header& hello, int64_t self, bool known_sender);

/// Why a HELLO from a sender of another job (its fingerprint is not
/// `fingerprint`) is refused; empty when the jobs match. Checked only after
/// authentication: an impostor's HELLO changes nothing.
std::string JobProblem(const Header& hello, uint64_t fingerprint);

}  // namespace meshload::sidecar::exchange::internal
