/// \file
/// Structural OpenAPI v3 schemas of CRDs (`spec.versions[].schema.
/// openAPIV3Schema`): write-time defaulting and validation of custom
/// resources, the subset of apiextensions-apiserver the controller relies on.
///
/// Supported keywords: `type` (object, array, string, integer, number,
/// boolean), `properties`, `required`, `additionalProperties` (a schema for
/// map values), `items`, `enum`, `minimum`/`maximum` (and
/// `exclusiveMinimum`/`exclusiveMaximum` as booleans, OpenAPI v3.0 style),
/// `minLength`/`maxLength` (counted in UTF-8 code points), `pattern`
/// (ECMAScript std::regex, searched, not anchored, as on a real server),
/// `minItems`/`maxItems`, `minProperties`/`maxProperties`, `default`,
/// `x-kubernetes-list-type: map|set` with `x-kubernetes-list-map-keys`.
///
/// Not implemented (accepted and ignored): `x-kubernetes-validations` (CEL
/// rules: the controller re-checks what they express), `format` (int64,
/// date-time, ...), `nullable` (null is a type error unless the schema has no
/// `type`), `x-kubernetes-int-or-string`, `allOf`/`anyOf`/`oneOf`/`not`, and
/// pruning: a real server drops fields the schema does not declare (unless
/// `x-kubernetes-preserve-unknown-fields`); this fake keeps them.
///
/// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshload::fakeapi {

/// One validation failure, in the terms of a real server's field.Error.
struct SchemaError {
  /// "FieldValueInvalid", "FieldValueRequired", "FieldValueNotSupported",
  /// "FieldValueTypeInvalid", "FieldValueDuplicate", "FieldValueTooLong",
  /// "FieldValueTooMany": the `reason` of a Status cause.
  std::string reason;
  /// The field path: dotted, `[i]` for list indices ("spec.mesh.axes[0].size").
  std::string field;
  /// The error body as a real server prints it, without the field prefix
  /// ("Invalid value: 0: spec.mesh.axes[0].size in body should be greater
  /// than or equal to 1", "Required value", ...).
  std::string message;
};

/// Fills in `default`s: for every object node of `schema` that has
/// `properties`, a missing key whose property schema has a `default` gets a
/// copy of it; recurses into properties (defaulted ones included), array
/// items and `additionalProperties` values. Nodes whose type does not match
/// the schema are left alone (validation reports them). Never throws.
void ApplyDefaults(const nlohmann::json& schema, nlohmann::json& value);

/// Validates `value` against `schema` and returns every error found (empty:
/// valid). `path` is the field path of `value` ("" for the root; children
/// are then named without a leading dot). A type mismatch stops the checks
/// below that node. Never throws; an invalid `pattern` is ignored.
std::vector<SchemaError> Validate(const nlohmann::json& schema, const nlohmann::json& value,
                                  const std::string& path);

}  // namespace meshload::fakeapi
