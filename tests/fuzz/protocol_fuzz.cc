/// \file
/// libFuzzer target for the handoff protocol decoder: the sidecar decodes
/// whatever a local process sends it, and the client whatever arrives on
/// its socket, so Decode must never crash, and whatever it accepts must
/// encode back to the same bytes (no silent reinterpretation).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "protocol/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto m = meshload::protocol::Decode(bytes);
  if (!m.ok()) {
    if (m.status().location().empty() || m.status().location()[0] != '@') __builtin_trap();
    return 0;
  }
  if (meshload::protocol::Encode(*m) != bytes) __builtin_trap();
  return 0;
}
