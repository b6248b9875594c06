#include "sidecar/exchange/handshake.h"

#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace meshload::sidecar::exchange::internal {

Mac PeerMac(const std::string& secret, std::string_view label, const uint8_t* nonce, int64_t from, int64_t to,
            uint64_t fingerprint) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(nonce), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(&from), sizeof from);
  msg.append(reinterpret_cast<const char*>(&to), sizeof to);
  msg.append(reinterpret_cast<const char*>(&fingerprint), sizeof fingerprint);
  Mac out{};
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out.data(), &n);
  return out;
}

bool SameMac(const uint8_t* a, const Mac& b) { return CRYPTO_memcmp(a, b.data(), b.size()) == 0; }

std::optional<Nonce> MakeNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) return std::nullopt;
  return n;
}

AuthPayload MakeAuth(const std::string& secret, const uint8_t* challenge, const Nonce& mine, const HelloIds& ids) {
  AuthPayload auth{};
  const Mac mac = PeerMac(secret, kAuthLabel, challenge, ids.from, ids.to, ids.fingerprint);
  std::memcpy(auth.data(), mac.data(), mac.size());
  std::memcpy(auth.data() + kMacBytes, mine.data(), mine.size());
  return auth;
}

bool CheckHelloOkProof(const std::string& secret, const Nonce& mine, const HelloIds& ids, const uint8_t* proof) {
  const Mac want = PeerMac(secret, kOkLabel, mine.data(), ids.from, ids.to, ids.fingerprint);
  return SameMac(proof, want);
}

bool CheckAuth(const std::string& secret, const Nonce& challenge, const HelloIds& ids, const AuthPayload& auth) {
  const Mac want = PeerMac(secret, kAuthLabel, challenge.data(), ids.from, ids.to, ids.fingerprint);
  return SameMac(auth.data(), want);
}

Mac HelloOkProof(const std::string& secret, const AuthPayload& auth, const HelloIds& ids) {
  return PeerMac(secret, kOkLabel, auth.data() + kMacBytes, ids.from, ids.to, ids.fingerprint);
}

std::string AddresseeProblem(const Header& hello, int64_t self, bool known_sender) {
  if (hello.to_process() == self && known_sender) return "";
  // `length` as sent (unsigned), as the message always showed it.
  return "process " + std::to_string(hello.from_process()) + " connected to send to process " +
         std::to_string(hello.length) + ", but this is process " + std::to_string(self) +
         " and its plan receives nothing from it: the processes run different jobs or peer lists";
}

std::string JobProblem(const Header& hello, uint64_t fingerprint) {
  if (hello.fingerprint() == fingerprint) return "";
  return "process " + std::to_string(hello.from_process()) + " runs a different job (fingerprint " +
         std::to_string(hello.fingerprint()) + ", this process " + std::to_string(fingerprint) +
         "): every process must load the same DataLoadJob";
}

}  // namespace meshload::sidecar::exchange::internal
