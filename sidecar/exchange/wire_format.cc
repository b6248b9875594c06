#include "sidecar/exchange/wire_format.h"

namespace meshload::sidecar::exchange::internal {
namespace {

Header Frame(Type t, int64_t index = 0, uint64_t length = 0, uint64_t digest = 0) {
  Header h;
  h.type = static_cast<uint16_t>(t);
  h.index = index;
  h.length = length;
  h.digest = digest;
  return h;
}

}  // namespace

Header HelloFrame(int64_t from, int64_t to, uint64_t fingerprint) {
  return Frame(Type::kHello, from, static_cast<uint64_t>(to), fingerprint);
}
Header HelloOkFrame(uint64_t proof_bytes) { return Frame(Type::kHelloOk, 0, proof_bytes); }
Header CreditFrame(int64_t step) { return Frame(Type::kCredit, step); }
Header ResetFrame(int64_t first_step) { return Frame(Type::kReset, first_step); }
Header DataFrame(int64_t step, uint64_t bytes, uint64_t checksum) { return Frame(Type::kData, step, bytes, checksum); }
Header HeartbeatFrame() { return Frame(Type::kHeartbeat); }
Header ErrorFrame(uint64_t text_bytes) { return Frame(Type::kError, 0, text_bytes); }
Header ByeFrame() { return Frame(Type::kBye); }
Header HaveThroughFrame(int64_t step) { return Frame(Type::kHaveThrough, step); }
Header HaveFrame(int64_t step) { return Frame(Type::kHave, step); }
Header ChallengeFrame() { return Frame(Type::kChallenge, 0, kNonceBytes); }
Header AuthFrame() { return Frame(Type::kAuth, 0, kAuthBytes); }

std::string HelloFrameProblem(const Header& h) {
  if (!IsFrame(h, Type::kHello)) return "not a meshload peer HELLO";
  if (h.version != kVersion) {
    return "peer protocol version " + std::to_string(h.version) + " is not " + std::to_string(kVersion);
  }
  return "";
}

}  // namespace meshload::sidecar::exchange::internal
