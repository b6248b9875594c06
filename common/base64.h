/// \file
/// Standard base64 (RFC 4648 §4, with padding), as Kubernetes uses for
/// kubeconfig `*-data` fields, Secret data and continue tokens.
///
/// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace meshload {

std::string Base64Encode(std::string_view in);

/// Decodes `in`; ASCII whitespace (line breaks in PEM-style data) is
/// skipped. Returns nullopt on any other character outside the alphabet, on
/// data after padding, or on a length that no encoder produces.
std::optional<std::string> Base64Decode(std::string_view in);

}  // namespace meshload
