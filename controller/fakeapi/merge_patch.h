/// \file
/// The PATCH body formats the fake accepts:
///  - RFC 7386 JSON merge patch (`application/merge-patch+json`): objects
///    merge key by key, `null` removes a key, anything else (arrays included)
///    replaces the target value wholesale;
///  - strategic merge patch (`application/strategic-merge-patch+json`, what
///    `kubectl apply` sends for built-in kinds), simplified to a merge patch;
///  - RFC 6902 JSON patch (`application/json-patch+json`).
///
/// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace meshload::fakeapi {

/// Returns `target` with `patch` applied.
nlohmann::json ApplyMergePatch(nlohmann::json target, const nlohmann::json& patch);

/// Returns `target` with a strategic merge patch applied, as a JSON merge
/// patch in which every list is replaced. A real server merges lists whose
/// schema names a patchMergeKey (containers by name, ...) element by
/// element; this fake does not know the schemas, so a patch that carries
/// only the changed elements of such a list drops the others. kubectl apply
/// sends whole lists when they change, which is what the tests exercise.
/// Directive keys (`$patch`, `$retainKeys`, `$setElementOrder/...`,
/// `$deleteFromPrimitiveList/...`) are dropped, except that an object holding
/// `$patch: delete` removes its key and `$patch: replace` replaces it.
nlohmann::json ApplyStrategicMergePatch(nlohmann::json target, const nlohmann::json& patch);

/// Applies an RFC 6902 JSON patch (an array of operations: add, remove,
/// replace, move, copy, test). Returns false with `*error` set, leaving
/// `*target` unspecified, when an operation is malformed, names a missing
/// path, or a `test` fails.
bool ApplyJsonPatch(nlohmann::json* target, const nlohmann::json& patch, std::string* error);

}  // namespace meshload::fakeapi
