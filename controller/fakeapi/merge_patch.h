/// \file
/// RFC 7386 JSON merge patch, the `application/merge-patch+json` PATCH body:
/// objects merge key by key, `null` removes a key, anything else (arrays
/// included) replaces the target value wholesale.
///
/// Thread safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>

namespace meshload::fakeapi {

/// Returns `target` with `patch` applied.
nlohmann::json ApplyMergePatch(nlohmann::json target, const nlohmann::json& patch);

}  // namespace meshload::fakeapi
