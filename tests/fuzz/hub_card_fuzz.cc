/// \file
/// libFuzzer target for a Hugging Face Hub repository's dataset card
/// (formats/hub_repository.h): the input as README.md, parsed, and its
/// default config's train split looked up. Nothing may crash; an error
/// names README.md, and a parsed card's layouts name at least one pattern.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/hub_repository.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshload::formats;
  auto card = HubCard::Parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!card.ok()) {
    if (card.status().location().rfind("README.md", 0) != 0) __builtin_trap();
    return 0;
  }
  for (const char* split : {"train", "test"}) {
    auto layouts = HubSplitLayouts(*card, "", split);
    if (!layouts.ok()) {
      if (layouts.status().location() != "README.md") __builtin_trap();
      continue;
    }
    if (layouts->layouts.empty()) __builtin_trap();
    for (const auto& layout : layouts->layouts) {
      if (layout.empty()) __builtin_trap();
    }
  }
  return 0;
}
